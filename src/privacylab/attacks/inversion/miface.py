"""Model inversion, MI-Face (Fredrikson, Jha & Ristenpart 2015, "Model Inversion Attacks that
Exploit Confidence Information and Basic Countermeasures", Sec. 5, Algorithm 1).

For a class `label`, Algorithm 1 descends on the input from x_0 = 0:

    c(x) = 1 - f_label(x) + AuxTerm(x)
    x_i = Process(x_{i-1} - lambda * grad c(x_{i-1}))

stops after alpha steps, when c(x_i) >= max(c(x_{i-1}), ..., c(x_{i-beta})), or when
c(x_i) <= gamma, and returns the x_i of the lowest cost. Here `alpha` caps the cost
evaluations (x_0 ... x_{alpha-1}: alpha - 1 steps, so that white-box one evaluation is one
query); `beta` is read as patience: stop when the lowest cost has not improved for `beta`
iterations (the literal test against the *largest* of the last beta costs, ART's window,
never fires while the cost keeps falling, however slowly); `gamma` stops as soon as
c(x_i) <= gamma. The paper ran alpha = 5000, beta = 100, gamma = 0.99, lambda = 0.1 (ART's
defaults but max_iter); the defaults here (alpha 300, beta 50, gamma 0, a normalised step
of 0.05, the log cost) invert 8x8 and 28x28 digits in seconds (`benchmarks/miface_mnist.py`).
Choices made here, each an option:

- `cost="confidence"` is the paper's 1 - f_label(x); `cost="log"` (default) is -log f_label(x),
  the same minimiser without the saturation of 1 - f once f is near 1 (the gradient of 1 - f
  vanishes there in float32 long before the picture is formed).
- AuxTerm: `tv` times the anisotropic total variation (mean absolute difference of neighbouring
  pixels), computed and differentiated locally (no query); 0 by default as in the paper's
  experiments with softmax models.
- The step: `normalize=True` (default) scales the gradient by its largest absolute entry, so
  `step` (lambda) is the largest pixel change per iteration whatever the model's scale (the
  paper's plain step, lambda * grad c, is `normalize=False`).
- Process: the paper denoises and sharpens with image filters (Sec. 5.2). Here Process is a
  Gaussian denoise blended in, x <- (1 - rho) x + rho (G_s * x) (`denoise` = rho, `blur` = s
  pixels, default 1 for images of side >= 14 and 0.5 below, 5x5 kernel, replicated edges),
  then the clamp to the task's box `bounds`. Inputs that are not images (C, H, W) are only
  clamped.

Threat model. `miface` needs only SCORES (the issue: "from scores access"): grad c is
estimated by zeroth-order finite differences with antithetic Gaussian directions (NES, Ilyas
et al. 2018, "Black-box Adversarial Attacks with Limited Queries and Information", Eq. 2):
grad c(x) ~ 1/(2 n sigma) sum_k (c(x + sigma u_k) - c(x - sigma u_k)) u_k, with `directions`
= n pairs drawn at a coarse `resolution` and upsampled bilinearly (the "tiling" prior of Ilyas
et al. 2019, "Prior Convictions", Sec. 4: fewer dimensions to estimate, smooth steps). The
current point and the 2n probes go to the target as one batch per iteration, 1 + 2n queries;
probes are not clamped to the box (that would bias the estimate at its faces), so a target
that refuses inputs outside it cannot be attacked this way.
`miface-whitebox` (WHITEBOX) takes the exact gradient by autograd through `target.model`, one
query per iteration.

Side information ("prior"): an image the attacker may start from instead of the paper's
x_0 = 0 (e.g. the mean of unlabelled public data); only used when declared in the task.

Scoring (`run_model_inversion`) happens after the attack, with what only the evaluator holds
(`InversionTruth`: an independent classifier and the class means), through
`privacylab.stats.images`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.attacks.core import ThreatModel, execute
from privacylab.attacks.inversion.base import (
    InversionAttack,
    InversionError,
    number_option,
    register_inversion,
    whole_option,
)
from privacylab.stats.images import mse, psnr, ssim, to_unit
from privacylab.target import Access, Target

__all__ = [
    "COSTS",
    "MODEL_SIDE_INFORMATION",
    "ClassInversion",
    "InversionTruth",
    "MIFace",
    "MIFaceWhitebox",
    "ModelInversion",
    "ModelInversionResult",
    "ModelInversionTask",
    "class_score",
    "run_model_inversion",
]

MODEL_SIDE_INFORMATION = ("prior",)
"""What a model-inversion task may give beyond the model: `prior`, an image to start from."""

COSTS = ("log", "confidence")


@dataclass(eq=False)
class ModelInversionTask:
    """What the MI-Face attacker knows: the model's `input_shape` and `num_classes`, the box
    `bounds` of its inputs, the `classes` to invert (None: all), a `seed` for the random
    directions, and optionally a `prior` image of `input_shape` (side information "prior")."""

    input_shape: tuple[int, ...]
    num_classes: int
    classes: tuple[int, ...] | None = None
    bounds: tuple[float, float] = (0.0, 1.0)
    seed: int = 0
    prior: Tensor | None = None

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(s) for s in self.input_shape)
        if not self.input_shape or any(s < 1 for s in self.input_shape):
            raise InversionError(f"input shape must be positive sizes, got {self.input_shape}")
        if isinstance(self.num_classes, bool) or int(self.num_classes) < 2:
            raise InversionError(f"num_classes must be >= 2, got {self.num_classes!r}")
        self.num_classes = int(self.num_classes)
        low, high = (float(b) for b in self.bounds)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise InversionError(f"bounds must be finite with low < high, got {self.bounds!r}")
        self.bounds = (low, high)
        if self.classes is not None:
            chosen = []
            for c in self.classes:
                if isinstance(c, bool) or int(c) != c or not 0 <= int(c) < self.num_classes:
                    last = self.num_classes - 1
                    raise InversionError(
                        f"class {c!r} is out of range: the model has classes 0..{last}"
                    )
                if int(c) not in chosen:
                    chosen.append(int(c))
            if not chosen:
                raise InversionError("no class to invert")
            self.classes = tuple(chosen)
        if self.prior is not None:
            prior = torch.as_tensor(self.prior, dtype=torch.float32)
            if tuple(prior.shape) != self.input_shape:
                raise InversionError(
                    f"prior has shape {tuple(prior.shape)}, expected {self.input_shape}"
                )
            if not bool(torch.isfinite(prior).all()):
                raise InversionError("prior contains NaN or infinite pixels")
            self.prior = prior
        if isinstance(self.seed, bool) or int(self.seed) < 0:
            raise InversionError(f"seed must be a whole number >= 0, got {self.seed!r}")

    def chosen(self) -> tuple[int, ...]:
        """The classes to invert, in order."""
        return self.classes if self.classes is not None else tuple(range(self.num_classes))

    def restricted_to(self, side_information: Iterable[str]) -> ModelInversionTask:
        """The task without the side information not named."""
        side = set(side_information)
        unknown = sorted(side - set(MODEL_SIDE_INFORMATION))
        if unknown:
            raise InversionError(
                f"unknown side information {', '.join(unknown)}; "
                f"choose from {', '.join(MODEL_SIDE_INFORMATION)}"
            )
        return replace(self, prior=self.prior if "prior" in side else None)


@dataclass
class ClassInversion:
    """One class inverted: the image `x` (input shape, within the bounds) of the lowest cost,
    that `cost`, the target's `confidence` f_label(x) as the attack observed it, the
    `iterations` run, why it `stopped` ("alpha", "beta" or "gamma"), the iteration of the
    kept image (`best_iteration`) and the cost per iteration (`history`)."""

    label: int
    x: Tensor
    cost: float
    confidence: float
    iterations: int
    stopped: str
    best_iteration: int
    history: list[float] = field(default_factory=list)


@dataclass
class ModelInversion:
    """What an MI-Face attack returns: one `ClassInversion` per class asked, and its settings."""

    classes: list[ClassInversion]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class InversionTruth:
    """What only the evaluator holds: an independent classifier `evaluator` (a module mapping
    a batch of inputs to logits) and `class_means` (num_classes, *input_shape), the mean of
    each class over the evaluator's data (rows of a class it has none of are NaN)."""

    evaluator: nn.Module
    class_means: Tensor


def class_score(
    x: Tensor, label: int, truth: InversionTruth, bounds: tuple[float, float]
) -> dict[str, Any]:
    """The evaluator's view of one inversion: its `predicted` label, whether it is `correct`,
    and the distance to the class mean in [0, 1] pixels (`distance_to_mean`: MSE, with its
    PSNR and SSIM; `privacylab.stats.images`)."""
    model = truth.evaluator
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None else torch.float32
    with torch.no_grad():
        predicted = int(model(x.unsqueeze(0).to(device, dtype)).argmax(1).item())
    out: dict[str, Any] = {"predicted": predicted, "correct": predicted == int(label)}
    mean = truth.class_means[int(label)].detach().cpu()
    if bool(torch.isfinite(mean).all()) and x.ndim >= 2:
        a = to_unit(x.detach().cpu().numpy(), bounds)
        b = to_unit(mean.numpy(), bounds)
        a4, b4 = a.reshape(1, *a.shape[-3:]), b.reshape(1, *b.shape[-3:])
        out["distance_to_mean"] = float(mse(a4, b4)[0])
        out["psnr_to_mean"] = float(psnr(a4, b4)[0])
        out["ssim_to_mean"] = float(ssim(a4, b4)[0])
    else:
        out["distance_to_mean"] = out["psnr_to_mean"] = out["ssim_to_mean"] = None
    return out


@dataclass
class ModelInversionResult:
    """An MI-Face run scored by the evaluator: the family's result type for kind "model".

    `classes`: per class `label`, `confidence` (the target's, at the inversion), `predicted`
    (the evaluator's label), `correct`, `distance_to_mean` (MSE to the class mean in [0, 1]
    pixels, with `psnr_to_mean`, `ssim_to_mean`), `cost`, `iterations`, `stopped`;
    `evaluator_accuracy` the share of inversions the evaluator labels as their class;
    `queries` and `seconds` of the attack; `images` (label -> image) are kept for pictures,
    not in `to_dict`."""

    method: str
    access: str
    queries: int
    seconds: float
    evaluator_accuracy: float
    classes: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    images: dict[int, Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def mean_confidence(self) -> float:
        """Mean target confidence over the inverted classes."""
        values = [float(c["confidence"]) for c in self.classes]
        return float(np.mean(values)) if values else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (images left out)."""
        return {
            "method": self.method,
            "access": self.access,
            "evaluator_accuracy": self.evaluator_accuracy,
            "mean_confidence": self.mean_confidence,
            "queries": self.queries,
            "seconds": self.seconds,
            "classes": [dict(c) for c in self.classes],
            "params": dict(self.params),
        }


def run_model_inversion(
    attack: MIFace, target: Target, task: ModelInversionTask, truth: InversionTruth
) -> ModelInversionResult:
    """Run `attack` on `target` (narrowed to its access) with the task narrowed to its declared
    side information, then score each inversion with `truth`, which the attack never sees."""
    narrowed = task.restricted_to(attack.threat_model.side_information)
    done = execute(attack, target, narrowed)
    inversion: ModelInversion = done.output
    rows, images = [], {}
    for inv in inversion.classes:
        x = inv.x.detach().cpu()
        if tuple(x.shape) != task.input_shape:
            raise InversionError(
                f"{attack.name} returned an image of shape {tuple(x.shape)}, "
                f"expected {task.input_shape}"
            )
        images[inv.label] = x
        rows.append(
            {
                "label": inv.label,
                "confidence": inv.confidence,
                **class_score(x, inv.label, truth, task.bounds),
                "cost": inv.cost,
                "iterations": inv.iterations,
                "best_iteration": inv.best_iteration,
                "stopped": inv.stopped,
            }
        )
    accuracy = float(np.mean([r["correct"] for r in rows])) if rows else float("nan")
    return ModelInversionResult(
        method=attack.name,
        access=done.access.value,
        queries=done.queries,
        seconds=done.seconds,
        evaluator_accuracy=accuracy,
        classes=rows,
        params=dict(inversion.params),
        images=images,
    )


def _gaussian_kernel(sigma: float) -> Tensor:
    k = torch.arange(-2, 3, dtype=torch.float32)
    k = torch.exp(-(k**2) / (2 * sigma * sigma))
    return k / k.sum()


def _blur(x: Tensor, kernel: Tensor) -> Tensor:
    """Separable 5x5 Gaussian of a batch (n, C, H, W), replicated edges, per channel."""
    n, c, h, w = x.shape
    flat = x.reshape(n * c, 1, h, w)
    k = kernel.to(x.device, x.dtype)
    flat = F.conv2d(F.pad(flat, (2, 2, 0, 0), mode="replicate"), k.view(1, 1, 1, 5))
    flat = F.conv2d(F.pad(flat, (0, 0, 2, 2), mode="replicate"), k.view(1, 1, 5, 1))
    return flat.reshape(n, c, h, w)


def _total_variation(x: Tensor) -> Tensor:
    """Anisotropic total variation per example: mean |neighbour difference| over both axes."""
    if x.ndim < 4:
        return x.new_zeros(x.shape[0])
    dh = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
    dw = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1)
    return dh + dw


@register_inversion("miface")
class MIFace(InversionAttack):
    """MI-Face (Fredrikson et al. 2015, Alg. 1) from SCORES access, with gradients estimated
    by antithetic finite differences (NES, Ilyas et al. 2018), one batched query per
    iteration of 1 + 2 `directions` examples.

    `alpha`: most iterations; `beta`: stop when the best cost has not improved for this many
    iterations; `gamma`: stop once the cost is <= gamma; `step`: lambda; `normalize`: scale the
    gradient by its largest entry (else the paper's plain step); `cost`: "log" (-log f) or
    "confidence" (the paper's 1 - f); `tv`: AuxTerm weight of total variation; `denoise`,
    `blur`: Process's Gaussian blend weight and width in pixels (0: clamp only);
    `directions`, `sigma`, `resolution`: the NES estimate (pairs, probe radius in pixel units
    of the box, side of the coarse direction grid; None: half the image side)."""

    kind: ClassVar[str] = "model"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.SCORES, MODEL_SIDE_INFORMATION)
    paper: ClassVar[str] = (
        "Fredrikson, Jha & Ristenpart 2015, Model Inversion Attacks that Exploit Confidence "
        "Information and Basic Countermeasures (Alg. 1, MI-Face)"
    )
    gradient: ClassVar[str] = "nes"

    def __init__(
        self,
        *,
        alpha: int = 300,
        beta: int = 50,
        gamma: float = 0.0,
        step: float = 0.05,
        normalize: bool = True,
        cost: str = "log",
        tv: float = 0.0,
        denoise: float = 0.5,
        blur: float | None = None,
        directions: int = 20,
        sigma: float = 0.05,
        resolution: int | None = None,
    ) -> None:
        self.alpha = whole_option(self.name, "alpha", alpha, 1)
        self.beta = whole_option(self.name, "beta", beta, 1)
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or math.isnan(gamma):
            raise InversionError(f"gamma must be a number, got {gamma!r}")
        self.gamma = float(gamma)
        self.step = number_option(self.name, "step", step, zero=True)
        self.normalize = bool(normalize)
        if cost not in COSTS:
            raise InversionError(f"unknown cost {cost!r}; choose one of {', '.join(COSTS)}")
        self.cost = cost
        self.tv = number_option(self.name, "tv", tv, zero=True)
        self.denoise = number_option(self.name, "denoise", denoise, zero=True)
        if self.denoise > 1:
            raise InversionError(f"denoise must lie in [0, 1], got {denoise!r}")
        self.blur = None if blur is None else number_option(self.name, "blur", blur)
        self.directions = whole_option(self.name, "directions", directions, 1)
        self.sigma = number_option(self.name, "sigma", sigma)
        self.resolution = (
            None if resolution is None else whole_option(self.name, "resolution", resolution, 1)
        )

    def params(self) -> dict[str, Any]:
        """The settings, JSON-ready."""
        out = {
            "alpha": self.alpha,
            "beta": self.beta,
            "gamma": self.gamma,
            "step": self.step,
            "normalize": self.normalize,
            "cost": self.cost,
            "tv": self.tv,
            "denoise": self.denoise,
            "blur": self.blur,
            "gradient": self.gradient,
        }
        if self.gradient == "nes":
            out.update(directions=self.directions, sigma=self.sigma, resolution=self.resolution)
        return out

    # -- the cost ---------------------------------------------------------------------------

    def _cost_from_probabilities(self, p: Tensor) -> Tensor:
        if self.cost == "log":
            return -torch.log(p.clamp_min(1e-38))
        return 1.0 - p

    def _aux(self, x: Tensor) -> Tensor:
        return self.tv * _total_variation(x) if self.tv > 0 else x.new_zeros(x.shape[0])

    def _aux_gradient(self, x: Tensor) -> Tensor:
        if self.tv == 0:
            return torch.zeros_like(x)
        probe = x.detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(self._aux(probe).sum(), probe)
        return grad

    def _cost_and_gradient(
        self, target: Target, x: Tensor, label: int, generator: torch.Generator, scale: float
    ) -> tuple[float, float, Tensor]:
        """(cost, confidence, grad cost) at `x` (1, *shape): NES from one batched query of the
        point and 2n antithetic probes; the AuxTerm is exact and local."""
        n = self.directions
        u = self._directions(x, n, generator)
        radius = self.sigma * scale
        batch = torch.cat([x, x + radius * u, x - radius * u])
        p = target.probabilities(batch)[:, label].to(torch.float64)
        c = self._cost_from_probabilities(p)
        diff = (c[1 : n + 1] - c[n + 1 :]).to(x.dtype)
        grad = (diff.view(-1, *([1] * (x.ndim - 1))) * u).sum(0, keepdim=True) / (2 * radius * n)
        grad = grad + self._aux_gradient(x)
        cost = float(c[0]) + float(self._aux(x)[0])
        return cost, float(p[0]), grad

    def _directions(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        shape = tuple(x.shape[1:])
        if len(shape) == 3 and shape[1] > 1 and shape[2] > 1:
            c, h, w = shape
            side = self.resolution or max(1, min(h, w) // 2)
            rh, rw = min(side, h), min(side, w)
            coarse = torch.randn(n, c, rh, rw, generator=generator, dtype=x.dtype)
            if (rh, rw) == (h, w):
                return coarse
            return F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
        return torch.randn(n, *shape, generator=generator, dtype=x.dtype)

    # -- Algorithm 1 ------------------------------------------------------------------------

    def _blur_for(self, shape: tuple[int, ...]) -> float:
        """Process's blur width: the option, else 1 pixel for images of side >= 14 and half
        a pixel for smaller ones (8x8 digits)."""
        if self.blur is not None:
            return self.blur
        return 1.0 if min(shape[-2:]) >= 14 else 0.5

    def _process(self, x: Tensor, kernel: Tensor | None, bounds: tuple[float, float]) -> Tensor:
        if kernel is not None and self.denoise > 0:
            x = (1 - self.denoise) * x + self.denoise * _blur(x, kernel)
        return x.clamp(*bounds)

    def invert(self, target: Target, task: ModelInversionTask, label: int) -> ClassInversion:
        """Algorithm 1 for one class."""
        low, high = task.bounds
        scale = high - low
        shape = task.input_shape
        if task.prior is not None:
            x = task.prior.clone().reshape(1, *shape).clamp(low, high)
        else:
            x = torch.zeros(1, *shape).clamp(low, high)
        is_image = len(shape) == 3 and shape[1] > 1 and shape[2] > 1
        kernel = _gaussian_kernel(self._blur_for(shape)) if is_image else None
        generator = torch.Generator().manual_seed(int(task.seed) * 100_003 + int(label))
        best_cost, best_x, best_conf, best_i = math.inf, x.clone(), float("nan"), 0
        history: list[float] = []
        stopped = "alpha"
        for i in range(self.alpha):
            cost, confidence, grad = self._cost_and_gradient(target, x, label, generator, scale)
            history.append(cost)
            if cost < best_cost:
                best_cost, best_x, best_conf, best_i = cost, x.clone(), confidence, i
            if cost <= self.gamma:
                stopped = "gamma"
                break
            if i - best_i >= self.beta:
                stopped = "beta"
                break
            if i == self.alpha - 1:
                break
            grad = torch.nan_to_num(grad)
            if self.normalize:
                grad = grad / grad.abs().max().clamp_min(1e-12) * scale
            x = self._process(x - self.step * grad, kernel, task.bounds).detach()
        return ClassInversion(
            label=int(label),
            x=best_x.reshape(shape).detach().cpu(),
            cost=float(best_cost),
            confidence=float(best_conf),
            iterations=len(history),
            stopped=stopped,
            best_iteration=int(best_i),
            history=history,
        )

    def run(self, target: Target, task: ModelInversionTask) -> ModelInversion:
        """Invert every class of the task, one after the other."""
        if target.num_classes != task.num_classes:
            raise InversionError(
                f"the task says {task.num_classes} classes but the target has {target.num_classes}"
            )
        classes = [self.invert(target, task, label) for label in task.chosen()]
        return ModelInversion(classes=classes, params=self.params())


@register_inversion("miface-whitebox")
class MIFaceWhitebox(MIFace):
    """MI-Face (Fredrikson et al. 2015, Alg. 1) with the exact gradient of the cost by
    autograd through the white-box model (`target.model`): one query per iteration. The
    settings are `MIFace`'s (the NES ones unused)."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.WHITEBOX, MODEL_SIDE_INFORMATION)
    gradient: ClassVar[str] = "autograd"

    def _cost_and_gradient(
        self, target: Target, x: Tensor, label: int, generator: torch.Generator, scale: float
    ) -> tuple[float, float, Tensor]:
        model = target.model
        probe = x.detach().to(target.device, target.dtype).requires_grad_(True)
        out = model(probe)
        if target.outputs == "probabilities":
            log_p = torch.log(out[0, label].clamp_min(1e-38))
        else:
            log_p = F.log_softmax(out, dim=1)[0, label]
        p = log_p.exp()
        c = -log_p if self.cost == "log" else 1.0 - p
        total = c + self._aux(probe)[0]
        (grad,) = torch.autograd.grad(total, probe)
        return float(total.detach()), float(p.detach()), grad.detach().to("cpu", x.dtype)
