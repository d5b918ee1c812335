"""Label-only membership inference (Choquette-Choo, Tramèr, Carlini & Papernot 2021,
"Label-Only Membership Inference Attacks", ICML).

The attacker sees only the target's predicted labels. Members are classified correctly more
often (the gap attack, the paper's baseline after Yeom et al. 2018) and, beyond that, more
*robustly*: their label survives data augmentation (§3.2), Gaussian noise (§3.4, "robustness to
noise") and they lie further from the decision boundary (§3.3, see `boundary.py`). Every attack
here declares `Access.LABEL`; where reference models are given, decisions are calibrated on
them (the attacker owns them and knows which examples each was trained on).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from torch import Tensor

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.membership.base import (
    AttackScores,
    MembershipAttack,
    MembershipTask,
    register_attack,
)
from privacylab.attacks.membership.outputs import best_threshold
from privacylab.attacks.membership.result import AttackError
from privacylab.target import Access, Target

ClipOption = str | tuple[float, float] | None

__all__ = [
    "AugmentationAttack",
    "GapAttack",
    "NoiseRobustnessAttack",
    "augmented_copies",
    "best_threshold",
    "flip_bits",
    "is_binary",
    "resolve_clip",
]


def _positive_int(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < low:
        raise AttackError(f"{name} must be a whole number >= {low}, got {value!r}")
    return int(value)


def _positive_float(name: str, value: object, high: float = math.inf) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise AttackError(f"{name} must be a number > 0, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number) or not 0 < number <= high:
        bound = "" if math.isinf(high) else f" and <= {high:g}"
        raise AttackError(f"{name} must be a finite number > 0{bound}, got {value!r}")
    return number


def check_clip(clip: object) -> ClipOption:
    """Validate a data-range option: "data", None (unbounded) or a (low, high) pair."""
    if clip is None or clip == "data":
        return clip  # type: ignore[return-value]
    try:
        low, high = (float(v) for v in clip)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise AttackError(f'clip must be "data", None or (low, high), got {clip!r}') from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise AttackError(f"clip must be finite with low < high, got {clip!r}")
    return (low, high)


def resolve_clip(clip: ClipOption, task: MembershipTask) -> tuple[float, float] | None:
    """The (low, high) range perturbed inputs are clamped to: with "data", the range of the
    candidates and the population (data the attacker holds)."""
    if clip != "data":
        return clip  # type: ignore[return-value]
    x = task.all_x()
    if x.numel() == 0:
        return None
    return float(x.min()), float(x.max())


def _check_task(task: MembershipTask, attack: str) -> None:
    if task.n == 0:
        raise AttackError(f"{attack}: no candidate examples to score")
    if not torch.is_floating_point(task.x):
        raise AttackError(f"{attack}: needs real-valued features, got {task.x.dtype}")
    if not bool(torch.isfinite(task.x).all()):
        raise AttackError(f"{attack}: candidate features contain NaN or infinity")


CALIBRATION_REFERENCES = 8
FLIP_PROBABILITY = 0.01
"""Default bit-flip probability of the noise attack on 0/1 features: about 6 of Purchase's
600 features per copy. Our choice (the seed states no value), the best of 0.005/0.01/0.02/0.05
on the purchase-like MLP of `privacylab.data.purchase_like` (N = 20 copies: AUC 0.763 / 0.776 /
0.773 / 0.753; Gaussian σ = 0.3 clipped to [0, 1]: 0.704; loss attack: 0.772)."""
CALIBRATION_ROWS = 2000


def _reference_scores(
    task: MembershipTask, attack: str, feature: Any
) -> tuple[np.ndarray, np.ndarray]:
    """`feature(target, x, y)` on label-only references for the attacker's examples
    (candidates then population), stacked with the in/out truth from `task.keep`; at most
    CALIBRATION_REFERENCES references and CALIBRATION_ROWS seeded rows keep the cost bounded."""
    assert task.keep is not None
    rows = np.arange(task.n + task.m)
    if len(rows) > CALIBRATION_ROWS:
        rows = np.sort(np.random.default_rng(0).permutation(rows)[:CALIBRATION_ROWS])
    index = torch.from_numpy(rows)
    x, y = task.all_x()[index], task.all_y()[index]
    refs = task.reference_targets(Access.LABEL)[:CALIBRATION_REFERENCES]
    features = [feature(ref, x, y) for ref in refs]
    if not features:
        raise AttackError(f"{attack}: no reference models")
    return np.concatenate(features), task.keep[: len(refs), rows].reshape(-1)


@register_attack("gap")
class GapAttack(MembershipAttack):
    """The gap attack (Yeom et al. 2018), the label-only baseline of Choquette-Choo et al. 2021
    §3.1: member iff the target predicts the true label. Its accuracy is
    1/2 + (acc_train − acc_test)/2."""

    name: ClassVar[str] = "gap"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.LABEL, ())
    suite_order: ClassVar[float] = 90

    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        """1.0 for candidates the target classifies correctly, 0.0 otherwise (n queries)."""
        _check_task(task, self.name)
        correct = (target.labels(task.x) == task.y).numpy().astype(np.float64)
        return AttackScores(
            scores=correct, predictions=correct.astype(np.int64), params={"threshold": 1.0}
        )


def _translate(x: Tensor, di: int, dj: int) -> Tensor:
    """Images shifted by di rows and dj columns, zero-filled."""
    d = max(abs(di), abs(dj))
    if d == 0:
        return x
    h, w = x.shape[-2:]
    padded = F.pad(x, (d, d, d, d))
    return padded[..., d - di : d - di + h, d - dj : d - dj + w]


def _rotate(x: Tensor, degrees: float) -> Tensor:
    """Images rotated by `degrees` about their centre (bilinear, zero-filled)."""
    if degrees == 0:
        return x
    angle = math.radians(degrees)
    cos, sin = math.cos(angle), math.sin(angle)
    theta = torch.tensor([[cos, -sin, 0.0], [sin, cos, 0.0]], dtype=x.dtype)
    theta = theta.expand(x.shape[0], 2, 3)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False, padding_mode="zeros")


def augmentation_offsets(kind: str, r: float, d: int) -> list[tuple[float, ...]]:
    """The paper's augmentation set (§3.2): rotations by (0, +r, −r) degrees (N = 3), or every
    translation (i, j) with |i| + |j| = d plus the original (N = 4d + 1)."""
    if kind == "rotation":
        return [(0.0,), (r,), (-r,)]
    shifts = [(0, 0)]
    for i in range(-d, d + 1):
        rest = d - abs(i)
        shifts.extend({(i, rest), (i, -rest)})
    return [tuple(float(v) for v in s) for s in sorted(set(shifts), key=lambda s: (s != (0, 0), s))]


def augmented_copies(x: Tensor, kind: str, r: float = 4.0, d: int = 1) -> Tensor:
    """All augmented copies of images `x` (n, C, H, W), shape (N, n, C, H, W), in the order of
    `augmentation_offsets` (the unaugmented image first)."""
    if x.ndim != 4:
        raise AttackError(f"augmentation needs images of shape (n, C, H, W), got {tuple(x.shape)}")
    copies = []
    for offset in augmentation_offsets(kind, r, d):
        if kind == "rotation":
            copies.append(_rotate(x, offset[0]))
        else:
            copies.append(_translate(x, int(offset[0]), int(offset[1])))
    return torch.stack(copies)


@register_attack("augmentation")
class AugmentationAttack(MembershipAttack):
    """Data-augmentation attack (Choquette-Choo et al. 2021, §3.2).

    The feature of an example is the vector of correctness of the target's labels on its
    augmented copies (rotations by ±r°, N = 3; or translations with |i| + |j| = d,
    N = 4d + 1). As in the paper an attack classifier is trained on these features: here a
    logistic regression fitted on the reference models' features for the attacker's examples,
    labelled in/out by `task.keep`; the score is its decision function on the target's
    features. Without references the score is the number of correctly labelled copies.
    """

    name: ClassVar[str] = "augmentation"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.LABEL, ("population", "references"))
    suite_order: ClassVar[float] = 100

    def __init__(self, kind: str = "translation", r: float = 4.0, d: int = 1) -> None:
        if kind not in ("rotation", "translation"):
            raise AttackError(
                f'augmentation kind must be "rotation" or "translation", got {kind!r}'
            )
        self.kind = kind
        self.r = _positive_float("rotation r (degrees)", r, high=180.0)
        self.d = _positive_int("translation d (pixels)", d)

    def features(self, target: Target, x: Tensor, y: Tensor) -> np.ndarray:
        """(n, N) 0/1 correctness of the target's labels on each augmented copy (n·N queries)."""
        copies = augmented_copies(x, self.kind, self.r, self.d)
        count, n = copies.shape[:2]
        labels = target.labels(copies.reshape(count * n, *x.shape[1:])).reshape(count, n)
        return (labels == y.unsqueeze(0)).T.numpy().astype(np.float64)

    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        """Attack-classifier scores of the candidates (n·N queries to the target)."""
        _check_task(task, self.name)
        if task.x.ndim != 4:
            raise AttackError(
                f"augmentation needs images of shape (n, C, H, W), got {tuple(task.x.shape)}"
            )
        feats = self.features(target, task.x, task.y)
        params: dict[str, Any] = {
            "kind": self.kind,
            "copies": int(feats.shape[1]),
            **({"r": self.r} if self.kind == "rotation" else {"d": self.d}),
        }
        if not task.references:
            params["classifier"] = "none (no reference models): score = correct augmented copies"
            return AttackScores(scores=feats.sum(1), params=params)
        ref_x, ref_in = _reference_scores(task, self.name, self.features)
        if ref_in.all() or not ref_in.any():
            raise AttackError("augmentation: the keep mask needs both in and out examples")
        clf = LogisticRegression(class_weight="balanced", max_iter=1000)
        clf.fit(ref_x, ref_in.astype(np.int64))
        params["classifier"] = "logistic regression on reference models"
        params["references"] = len(task.references)
        return AttackScores(
            scores=clf.decision_function(feats).astype(np.float64),
            predictions=clf.predict(feats).astype(np.int64),
            params=params,
        )


NOISE_KINDS = ("auto", "gaussian", "flip")


def is_binary(x: Tensor) -> bool:
    """True when every feature value is 0 or 1 (Purchase, Texas, Location in the paper)."""
    return x.numel() > 0 and bool(((x == 0) | (x == 1)).all())


def flip_bits(x: Tensor, probability: float, count: int, generator: torch.Generator) -> Tensor:
    """`count` noisy copies of 0/1 features `x`, shape (count, *x.shape): every feature of every
    copy flipped independently with `probability`: the noise-robustness attack of Choquette-Choo
    et al. 2021 (§3.4) on their binary datasets (Texas, Purchase, Location), where Gaussian
    noise would leave {0, 1}. The seed states only the Gaussian form and no flip rate."""
    flips = torch.rand((count, *x.shape), generator=generator) < probability
    return torch.where(flips, 1 - x.unsqueeze(0), x.unsqueeze(0))


@register_attack("noise")
class NoiseRobustnessAttack(MembershipAttack):
    """Robustness to noise (Choquette-Choo et al. 2021, §3.4): the accuracy of the target on N
    noisy copies of an example is a proxy for its distance to the boundary; the score is that
    accuracy. Continuous features get Gaussian copies x̂_i = x + N(0, σ²I) (clamped to the data
    range); binary features (the paper's Texas, Purchase and Location) get copies in which each
    bit is flipped independently with probability p, so the copies stay in {0, 1}. `kind="auto"`
    picks flips when the candidates and population are all 0/1, Gaussian otherwise. With
    reference models, predictions use the threshold of best balanced accuracy on the references'
    in/out scores."""

    name: ClassVar[str] = "noise"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.LABEL, ("population", "references"))
    suite_order: ClassVar[float] = 110

    def __init__(
        self,
        sigma: float = 0.3,
        n_samples: int = 50,
        clip: ClipOption = "data",
        seed: int = 0,
        kind: str = "auto",
        flip_probability: float = FLIP_PROBABILITY,
    ) -> None:
        self.sigma = _positive_float("sigma", sigma)
        self.n_samples = _positive_int("n_samples", n_samples)
        self.clip = check_clip(clip)
        self.seed = _positive_int("seed", seed, low=0)
        if kind not in NOISE_KINDS:
            raise AttackError(f"noise kind must be one of {', '.join(NOISE_KINDS)}, got {kind!r}")
        self.kind = kind
        self.flip_probability = _positive_float("flip_probability", flip_probability, high=0.5)

    def resolve_kind(self, task: MembershipTask) -> str:
        """ "flip" or "gaussian" for this task; an explicit "flip" needs 0/1 features."""
        if self.kind == "gaussian":
            return "gaussian"
        binary = is_binary(task.all_x())
        if self.kind == "flip" and not binary:
            raise AttackError('noise kind "flip" needs features that are all 0 or 1')
        return "flip" if binary else "gaussian"

    def accuracy(
        self,
        target: Target,
        x: Tensor,
        y: Tensor,
        clip: tuple[float, float] | None,
        generator: torch.Generator,
        kind: str = "gaussian",
    ) -> np.ndarray:
        """Fraction of N noisy copies of each example labelled correctly (n·N queries)."""
        correct = torch.zeros(x.shape[0], dtype=torch.float64)
        chunk = max(1, 65536 // max(1, self.n_samples))
        for start in range(0, x.shape[0], chunk):
            xb, yb = x[start : start + chunk], y[start : start + chunk]
            if kind == "flip":
                noisy = flip_bits(xb, self.flip_probability, self.n_samples, generator)
            else:
                noisy = xb.unsqueeze(0) + self.sigma * torch.randn(
                    (self.n_samples, *xb.shape), generator=generator, dtype=xb.dtype
                )
                if clip is not None:
                    noisy = noisy.clamp(*clip)
            labels = target.labels(noisy.reshape(-1, *xb.shape[1:])).reshape(self.n_samples, -1)
            correct[start : start + chunk] = (labels == yb).double().mean(0)
        return correct.numpy()

    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        """Noisy accuracy of every candidate (n·N queries to the target)."""
        _check_task(task, self.name)
        kind = self.resolve_kind(task)
        clip = resolve_clip(self.clip, task) if kind == "gaussian" else None
        scores = self.accuracy(
            target, task.x, task.y, clip, torch.Generator().manual_seed(self.seed), kind
        )
        params: dict[str, Any] = {"kind": kind, "n_samples": self.n_samples, "seed": self.seed}
        if kind == "flip":
            params["flip_probability"] = self.flip_probability
        else:
            params["sigma"] = self.sigma
            params["clip"] = list(clip) if clip is not None else None
        if not task.references:
            return AttackScores(scores=scores, params=params)
        ref_gen = torch.Generator().manual_seed(self.seed + 1)
        ref_scores, ref_in = _reference_scores(
            task, self.name, lambda t, x, y: self.accuracy(t, x, y, clip, ref_gen, kind)
        )
        threshold = best_threshold(ref_scores, ref_in)
        params["threshold"] = threshold
        return AttackScores(
            scores=scores, predictions=(scores >= threshold).astype(np.int64), params=params
        )
