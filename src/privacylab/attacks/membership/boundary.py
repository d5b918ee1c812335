"""Decision-boundary distance attacks (Choquette-Choo, Tramèr, Carlini & Papernot 2021, §3.3).

A member is predicted when its L2 distance to the target's decision boundary is large
(dist_h(x, y) = 0 for misclassified points). The label-only attack estimates that distance
with HopSkipJump (Chen, Jordan & Wainwright 2020, "HopSkipJumpAttack: A Query-Efficient
Decision-Based Attack", Alg. 1), batched over all candidates in one vectorised loop; the
white-box baseline uses Carlini & Wagner's L2 attack (Carlini & Wagner 2017, §V).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.membership.base import (
    AttackScores,
    MembershipAttack,
    MembershipTask,
    register_attack,
)
from privacylab.attacks.membership.label_only import (
    ClipOption,
    _check_task,
    _positive_float,
    _positive_int,
    best_threshold,
    check_clip,
    resolve_clip,
)
from privacylab.attacks.membership.result import AttackError
from privacylab.target import Access, Target

__all__ = [
    "BoundaryDistanceAttack",
    "BoundaryPoints",
    "CarliniWagnerAttack",
    "carlini_wagner_l2",
    "hop_skip_jump",
]


@dataclass
class BoundaryPoints:
    """Per-example result of a boundary search: `adversarial` (same shape as x; x itself for
    points already misclassified), `distance` (L2; 0 when misclassified; the diameter of the
    data range when no adversarial example was found), `found` (an adversarial example exists),
    `correct` (the model labelled x correctly) and `queries` (per example, label queries)."""

    adversarial: Tensor
    distance: np.ndarray
    found: np.ndarray
    correct: np.ndarray
    queries: np.ndarray


class _Oracle:
    """φ(x') = 1 iff the target's label of x' differs from y (the untargeted Boolean oracle of
    Chen et al. 2020, Eq. 3), counting queries per example."""

    def __init__(self, target: Target, y: Tensor, shape: tuple[int, ...]) -> None:
        self.target, self.y, self.shape = target, y, shape
        self.used = np.zeros(y.shape[0], dtype=np.int64)

    def __call__(self, flat: Tensor, index: Tensor) -> Tensor:
        """Adversarial (bool) for flat inputs `flat` (k, d) belonging to examples `index` (k,)."""
        if flat.shape[0] == 0:
            return torch.zeros(0, dtype=torch.bool)
        labels = self.target.labels(flat.reshape(-1, *self.shape))
        np.add.at(self.used, index.numpy(), 1)
        return labels != self.y[index]


def _project(x: Tensor, adv: Tensor, alpha: Tensor) -> Tensor:
    return (1 - alpha).unsqueeze(1) * x + alpha.unsqueeze(1) * adv


def _binary_search(oracle: _Oracle, x: Tensor, adv: Tensor, index: Tensor, steps: int) -> Tensor:
    """Bin-search to the boundary (Chen et al. 2020, Alg. 1 / Alg. 2 for ℓ2): on the segment
    from x (clean) to adv (adversarial) halve [low, high] `steps` times (until
    high − low ≤ θ) and return the point at `high`, which stays adversarial."""
    low = torch.zeros(x.shape[0], dtype=x.dtype)
    high = torch.ones(x.shape[0], dtype=x.dtype)
    for _ in range(steps):
        mid = (low + high) / 2
        is_adv = oracle(_project(x, adv, mid), index)
        high = torch.where(is_adv, mid, high)
        low = torch.where(is_adv, low, mid)
    return _project(x, adv, high)


def _clamp(x: Tensor, clip: tuple[float, float] | None) -> Tensor:
    return x if clip is None else x.clamp(*clip)


def _estimate_gradient(
    oracle: _Oracle,
    boundary: Tensor,
    index: Tensor,
    delta: Tensor,
    evals: int,
    clip: tuple[float, float] | None,
    generator: torch.Generator,
) -> Tensor:
    """Monte Carlo estimate of the direction of ∇S at boundary points (Chen et al. 2020,
    Eq. 9 with the baseline subtraction of Eq. 10): ṽ = Σ_b (φ(x + δu_b) − mean φ) u_b over
    `evals` random unit directions u_b; when all φ agree, their common sign times the mean of
    u_b. Returns unit vectors (k, d)."""
    k, d = boundary.shape
    chunk = max(1, int(2e7) // max(1, evals * d))
    out = torch.empty_like(boundary)
    for s in range(0, k, chunk):
        xb, db, ib = boundary[s : s + chunk], delta[s : s + chunk], index[s : s + chunk]
        u = torch.randn((xb.shape[0], evals, d), generator=generator, dtype=xb.dtype)
        u = u / u.norm(dim=2, keepdim=True)
        perturbed = _clamp(xb.unsqueeze(1) + db.view(-1, 1, 1) * u, clip)
        u = (perturbed - xb.unsqueeze(1)) / db.view(-1, 1, 1)
        phi = oracle(perturbed.reshape(-1, d), ib.repeat_interleave(evals)).view(-1, evals)
        phi = phi.to(xb.dtype) * 2 - 1
        mean = phi.mean(1, keepdim=True)
        agree = mean.abs().squeeze(1) == 1
        centred = torch.where(agree.unsqueeze(1), torch.ones_like(phi) * mean, phi - mean)
        grad = (centred.unsqueeze(2) * u).mean(1)
        out[s : s + chunk] = grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return out


def _initial_adversarial(
    oracle: _Oracle,
    x: Tensor,
    todo: Tensor,
    predicted: Tensor,
    y: Tensor,
    init: str,
    clip: tuple[float, float] | None,
    scale: tuple[float, float],
    tries: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """A starting adversarial point for each example in `todo` (Chen et al. 2020, §4.1
    initialisation): uniform noise in the data range until φ = 1 ("noise"), or the nearest
    attacker-held example that the target labels differently ("blend", no extra queries).
    Returns the points (k, d) and a mask of those found."""
    start = torch.zeros(todo.shape[0], x.shape[1], dtype=x.dtype)
    found = torch.zeros(todo.shape[0], dtype=torch.bool)
    if init == "noise":
        for _ in range(tries):
            need = (~found).nonzero().squeeze(1)
            if need.numel() == 0:
                break
            noise = torch.rand((need.numel(), x.shape[1]), generator=generator, dtype=x.dtype)
            noise = _clamp(scale[0] + (scale[1] - scale[0]) * noise, clip)
            ok = oracle(noise, todo[need])
            start[need[ok]] = noise[ok]
            found[need[ok]] = True
    need = (~found).nonzero().squeeze(1)
    if need.numel():
        dist = torch.cdist(x[todo[need]], x)
        other = predicted.unsqueeze(0) != y[todo[need]].unsqueeze(1)
        dist = torch.where(other, dist, torch.full_like(dist, math.inf))
        best = dist.argmin(1)
        ok = torch.isfinite(dist.gather(1, best.unsqueeze(1)).squeeze(1))
        start[need[ok]] = x[best[ok]]
        found[need[ok]] = True
    return start, found


def hop_skip_jump(
    target: Target,
    x: Tensor,
    y: Tensor,
    *,
    max_queries: int = 2500,
    iterations: int = 64,
    init_evals: int = 100,
    max_evals: int = 10_000,
    gamma: float = 1.0,
    max_halvings: int = 16,
    init: str = "blend",
    init_tries: int = 10,
    clip: tuple[float, float] | None = (0.0, 1.0),
    seed: int = 0,
) -> BoundaryPoints:
    """Untargeted ℓ2 HopSkipJumpAttack (Chen, Jordan & Wainwright 2020, Alg. 1) on every
    example at once, with label queries only.

    Per iteration t: the number of Monte Carlo directions is B_t = init_evals·√t (≤
    max_evals); the probe size is δ_t = √d·θ·‖x_{t−1} − x*‖ (δ_1 = 0.1·range), θ = γ/d^{3/2};
    the gradient direction is estimated by sign queries with baseline subtraction (Eq. 9–10);
    the step ξ_t = ‖x_{t−1} − x*‖/√t is halved until x_{t−1} + ξ_t·v is adversarial
    (geometric stepsize search, Alg. 1 line 7, at most `max_halvings` times); then binary
    search back to the boundary between x* and that point (Alg. 2, to precision θ). An example
    stops when its next iteration could exceed `max_queries` label queries. Examples the target
    already misclassifies cost one query and get distance 0.
    """
    if init not in ("blend", "noise"):
        raise AttackError(f'HopSkipJump init must be "blend" or "noise", got {init!r}')
    shape = tuple(x.shape[1:])
    flat = x.reshape(x.shape[0], -1).to(torch.float32)
    y = torch.as_tensor(y, dtype=torch.int64)
    n, d = flat.shape
    generator = torch.Generator().manual_seed(seed)
    if clip is not None:
        scale = clip
    elif n:
        scale = (float(flat.min()), float(flat.max()))
    else:
        scale = (0.0, 1.0)
    span = max(scale[1] - scale[0], 1e-12)
    theta = gamma / (d * math.sqrt(d))
    bin_steps = max(1, math.ceil(math.log2(1.0 / theta)))
    oracle = _Oracle(target, y, shape)

    predicted = target.labels(x) if n else torch.zeros(0, dtype=torch.int64)
    oracle.used += 1
    correct = predicted == y
    adversarial = flat.clone()
    distance = np.zeros(n)
    found = ~correct.clone()
    todo = correct.nonzero().squeeze(1)
    if todo.numel():
        start, ok = _initial_adversarial(
            oracle, flat, todo, predicted, y, init, clip, scale, init_tries, generator
        )
        todo, start = todo[ok], start[ok]
        found[todo] = True
        if todo.numel():
            adversarial[todo] = _binary_search(oracle, flat[todo], start, todo, bin_steps)

    current = adversarial[todo]
    dist = (current - flat[todo]).norm(dim=1)
    for t in range(1, iterations + 1):
        evals = min(int(init_evals * math.sqrt(t)), max_evals)
        remaining = max_queries - oracle.used[todo.numpy()]
        active = torch.from_numpy(remaining >= evals + max_halvings + bin_steps)
        if not bool(active.any()):
            break
        rows = active.nonzero().squeeze(1)
        index, origin, point = todo[rows], flat[todo[rows]], current[rows]
        delta = (
            torch.full((rows.numel(),), 0.1 * span)
            if t == 1
            else (math.sqrt(d) * theta * dist[rows]).clamp_min(1e-6 * span)
        )
        direction = _estimate_gradient(oracle, point, index, delta, evals, clip, generator)
        step = dist[rows] / math.sqrt(t)
        moved = point.clone()
        searching = torch.ones(rows.numel(), dtype=torch.bool)
        for _ in range(max_halvings):
            which = searching.nonzero().squeeze(1)
            if which.numel() == 0:
                break
            trial = _clamp(point[which] + step[which].unsqueeze(1) * direction[which], clip)
            ok = oracle(trial, index[which])
            moved[which[ok]] = trial[ok]
            searching[which[ok]] = False
            step[which[~ok]] /= 2
        done = (~searching).nonzero().squeeze(1)
        if done.numel():
            refined = _binary_search(oracle, origin[done], moved[done], index[done], bin_steps)
            new_dist = (refined - origin[done]).norm(dim=1)
            better = new_dist < dist[rows[done]]
            current[rows[done[better]]] = refined[better]
            dist[rows[done[better]]] = new_dist[better]

    if todo.numel():
        adversarial[todo] = current
        distance[todo.numpy()] = dist.numpy()
    lost = (correct & ~found).numpy()
    distance[lost] = span * math.sqrt(d)
    return BoundaryPoints(
        adversarial=adversarial.reshape(x.shape),
        distance=distance,
        found=found.numpy(),
        correct=correct.numpy(),
        queries=oracle.used.copy(),
    )


def carlini_wagner_l2(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    steps: int = 200,
    search_steps: int = 6,
    initial_c: float = 1.0,
    lr: float = 0.05,
    confidence: float = 0.0,
    clip: tuple[float, float] | None = (0.0, 1.0),
    device: str | torch.device = "cpu",
    batch_size: int = 1024,
) -> BoundaryPoints:
    """Untargeted Carlini & Wagner L2 attack (Carlini & Wagner 2017, §V.A), batched.

    Minimises ‖x' − x‖²₂ + c·max(Z_y(x') − max_{i≠y} Z_i(x'), −κ) with Adam over w where
    x' = low + (tanh(w) + 1)/2·(high − low) (the change of variables of §V.A; without a
    clip range x' = w directly), and binary-searches c per example over `search_steps`
    rounds (×10 until the first success). Returns the smallest-L2 misclassified point found;
    `queries` counts each example's forward passes (1 + search_steps·steps, plus one for the
    first example of each batch), what a counting white-box `Target.model` records.
    """
    model = model.eval()
    shape = tuple(x.shape[1:])
    device = torch.device(device)
    n = x.shape[0]
    y = torch.as_tensor(y, dtype=torch.int64)
    adversarial = x.detach().clone().float()
    distance = np.zeros(n)
    found = np.zeros(n, dtype=bool)
    correct = np.zeros(n, dtype=bool)
    params = list(model.parameters())
    required = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        for s in range(0, n, batch_size):
            xb = x[s : s + batch_size].detach().float().to(device)
            yb = y[s : s + batch_size].to(device)
            out = _cw_batch(model, xb, yb, steps, search_steps, initial_c, lr, confidence, clip)
            adversarial[s : s + batch_size] = out[0].cpu()
            distance[s : s + batch_size] = out[1]
            found[s : s + batch_size] = out[2]
            correct[s : s + batch_size] = out[3]
    finally:
        for p, r in zip(params, required, strict=True):
            p.requires_grad_(r)
    queries = np.full(n, 1 + search_steps * steps, dtype=np.int64)
    queries[::batch_size] += 1  # the pass on one example that reads the number of classes
    lost = correct & ~found
    if lost.any():
        flat = x.reshape(n, -1)
        span = (clip[1] - clip[0]) if clip is not None else float(flat.max() - flat.min())
        distance[lost] = span * math.sqrt(flat.shape[1])
    return BoundaryPoints(
        adversarial=adversarial.reshape(n, *shape),
        distance=distance,
        found=found,
        correct=correct,
        queries=queries,
    )


def _cw_batch(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    steps: int,
    search_steps: int,
    initial_c: float,
    lr: float,
    confidence: float,
    clip: tuple[float, float] | None,
) -> tuple[Tensor, np.ndarray, np.ndarray, np.ndarray]:
    k = x.shape[0]
    with torch.no_grad():
        correct = model(x).argmax(1) == y
    if clip is not None:
        low, high = clip
        unit = ((x - low) / (high - low) * 2 - 1).clamp(-1 + 1e-6, 1 - 1e-6)
        w0 = torch.atanh(unit)

        def to_x(w: Tensor) -> Tensor:
            return low + (torch.tanh(w) + 1) / 2 * (high - low)
    else:
        w0 = x.clone()

        def to_x(w: Tensor) -> Tensor:
            return w

    best_dist = torch.full((k,), math.inf, device=x.device)
    best_adv = x.clone()
    c = torch.full((k,), float(initial_c), device=x.device)
    lower = torch.zeros(k, device=x.device)
    upper = torch.full((k,), math.inf, device=x.device)
    dims = tuple(range(1, x.ndim))
    own = torch.nn.functional.one_hot(y, num_classes=model(x[:1]).shape[1]).bool()
    for _ in range(search_steps):
        w = w0.clone().requires_grad_(True)
        optimizer = torch.optim.Adam([w], lr=lr)
        success = torch.zeros(k, dtype=torch.bool, device=x.device)
        for _ in range(steps):
            adv = to_x(w)
            logits = model(adv)
            true = logits.gather(1, y.unsqueeze(1)).squeeze(1)
            rival = logits.masked_fill(own, -math.inf).amax(1)
            margin = (true - rival + confidence).clamp_min(0)
            sq = (adv - x).pow(2).sum(dims)
            loss = (sq + c * margin).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                hit = (logits.argmax(1) != y) & correct
                l2 = sq.sqrt()
                better = hit & (l2 < best_dist)
                best_dist = torch.where(better, l2, best_dist)
                best_adv[better] = adv[better].detach()
                success |= hit
        with torch.no_grad():
            upper = torch.where(success, torch.minimum(upper, c), upper)
            lower = torch.where(success, lower, torch.maximum(lower, c))
            c = torch.where(torch.isfinite(upper), (lower + upper) / 2, c * 10)
    found = torch.isfinite(best_dist) | ~correct
    best_adv[~correct] = x[~correct]
    dist = torch.where(correct, best_dist, torch.zeros_like(best_dist))
    dist = torch.where(torch.isfinite(dist), dist, torch.zeros_like(dist))
    return best_adv, dist.cpu().numpy(), found.cpu().numpy(), correct.cpu().numpy()


def _calibrate(task: MembershipTask, size: int, seed: int, distances: Any) -> float:
    """Threshold of best balanced accuracy on reference in/out distances, measured on up to
    `size` examples per reference drawn from the attacker's own examples."""
    assert task.keep is not None
    x, y = task.all_x(), task.all_y()
    rng = np.random.default_rng(seed)
    scores, truth = [], []
    for j, ref in enumerate(task.reference_targets(Access.WHITEBOX)):
        pick = rng.choice(x.shape[0], size=min(size, x.shape[0]), replace=False)
        index = torch.from_numpy(np.sort(pick))
        scores.append(distances(ref, x[index], y[index]))
        truth.append(task.keep[j, index.numpy()])
    return best_threshold(np.concatenate(scores), np.concatenate(truth))


@register_attack("boundary")
class BoundaryDistanceAttack(MembershipAttack):
    """Label-only boundary-distance attack (Choquette-Choo et al. 2021, §3.3): the score is the
    L2 distance from x to the HopSkipJump adversarial example (`hop_skip_jump`), 0 for points
    the target misclassifies. With `calibrate`, predictions threshold it at the best balanced
    accuracy on reference in/out examples (a subsample of `calibration_size` per reference,
    attacked with the same label-only budget)."""

    name: ClassVar[str] = "boundary"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.LABEL, ("population", "references"))
    suite_order: ClassVar[float] = 120
    subsampled: ClassVar[bool] = True
    aliases: ClassVar[tuple[str, ...]] = ("hopskipjump",)

    def __init__(
        self,
        max_queries: int = 2500,
        iterations: int = 64,
        init_evals: int = 100,
        init: str = "blend",
        clip: ClipOption = "data",
        seed: int = 0,
        calibrate: bool = False,
        calibration_size: int = 100,
    ) -> None:
        self.max_queries = _positive_int("max_queries", max_queries, low=50)
        self.iterations = _positive_int("iterations", iterations)
        self.init_evals = _positive_int("init_evals", init_evals)
        if init not in ("blend", "noise"):
            raise AttackError(f'boundary init must be "blend" or "noise", got {init!r}')
        self.init = init
        self.clip = check_clip(clip)
        self.seed = _positive_int("seed", seed, low=0)
        self.calibrate = bool(calibrate)
        self.calibration_size = _positive_int("calibration_size", calibration_size, low=2)

    def _run(
        self, target: Target, x: Tensor, y: Tensor, clip: tuple[float, float] | None, seed: int
    ) -> BoundaryPoints:
        return hop_skip_jump(
            target,
            x,
            y,
            max_queries=self.max_queries,
            iterations=self.iterations,
            init_evals=self.init_evals,
            init=self.init,
            clip=clip,
            seed=seed,
        )

    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        """HopSkipJump distances of all candidates (≤ max_queries label queries each)."""
        _check_task(task, self.name)
        clip = resolve_clip(self.clip, task)
        points = self._run(target, task.x, task.y, clip, self.seed)
        params: dict[str, Any] = {
            "max_queries": self.max_queries,
            "iterations": self.iterations,
            "init_evals": self.init_evals,
            "init": self.init,
            "clip": list(clip) if clip is not None else None,
            "seed": self.seed,
            "misclassified": int((~points.correct).sum()),
            "no_adversarial_found": int((points.correct & ~points.found).sum()),
            "median_queries": float(np.median(points.queries)),
        }
        predictions = None
        if self.calibrate:
            task.require_references(self.name)
            threshold = _calibrate(
                task,
                self.calibration_size,
                self.seed,
                lambda ref, x, y: (
                    self._run(ref.with_access(Access.LABEL), x, y, clip, self.seed + 1).distance
                ),
            )
            params["threshold"] = threshold
            predictions = (points.distance >= threshold).astype(np.int64)
        return AttackScores(scores=points.distance, predictions=predictions, params=params)


@register_attack("boundary-cw")
class CarliniWagnerAttack(MembershipAttack):
    """White-box boundary-distance baseline (Choquette-Choo et al. 2021, §3.3 and Fig. 2c): the
    score is the L2 norm of the Carlini & Wagner (2017) untargeted adversarial perturbation
    (`carlini_wagner_l2`), 0 for misclassified points."""

    name: ClassVar[str] = "boundary-cw"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.WHITEBOX, ("population", "references"))
    suite_order: ClassVar[float] = 130
    subsampled: ClassVar[bool] = True
    aliases: ClassVar[tuple[str, ...]] = ("cw",)

    def __init__(
        self,
        steps: int = 200,
        search_steps: int = 6,
        initial_c: float = 1.0,
        lr: float = 0.05,
        confidence: float = 0.0,
        clip: ClipOption = "data",
        calibrate: bool = False,
        calibration_size: int = 200,
        seed: int = 0,
    ) -> None:
        self.steps = _positive_int("steps", steps)
        self.search_steps = _positive_int("search_steps", search_steps)
        self.initial_c = _positive_float("initial_c", initial_c)
        self.lr = _positive_float("lr", lr)
        if isinstance(confidence, bool) or not math.isfinite(float(confidence)) or confidence < 0:
            raise AttackError(f"confidence must be a finite number >= 0, got {confidence!r}")
        self.confidence = float(confidence)
        self.clip = check_clip(clip)
        self.calibrate = bool(calibrate)
        self.calibration_size = _positive_int("calibration_size", calibration_size, low=2)
        self.seed = _positive_int("seed", seed, low=0)

    def _run(
        self, target: Target, x: Tensor, y: Tensor, clip: tuple[float, float] | None
    ) -> BoundaryPoints:
        return carlini_wagner_l2(
            target.model,
            x,
            y,
            steps=self.steps,
            search_steps=self.search_steps,
            initial_c=self.initial_c,
            lr=self.lr,
            confidence=self.confidence,
            clip=clip,
            device=target.device,
        )

    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        """C&W distances of all candidates (white-box: every example of every forward pass of
        the target's model counts as one query, about steps × search_steps per candidate)."""
        target.require(Access.WHITEBOX)
        _check_task(task, self.name)
        clip = resolve_clip(self.clip, task)
        points = self._run(target, task.x, task.y, clip)
        params: dict[str, Any] = {
            "steps": self.steps,
            "search_steps": self.search_steps,
            "initial_c": self.initial_c,
            "lr": self.lr,
            "confidence": self.confidence,
            "clip": list(clip) if clip is not None else None,
            "misclassified": int((~points.correct).sum()),
            "no_adversarial_found": int((points.correct & ~points.found).sum()),
        }
        predictions = None
        if self.calibrate:
            task.require_references(self.name)
            threshold = _calibrate(
                task,
                self.calibration_size,
                self.seed,
                lambda ref, x, y: self._run(ref, x, y, clip).distance,
            )
            params["threshold"] = threshold
            predictions = (points.distance >= threshold).astype(np.int64)
        return AttackScores(scores=points.distance, predictions=predictions, params=params)
