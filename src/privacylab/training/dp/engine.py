"""The DP-SGD step: clip per-example gradients, sum, add Gaussian noise, average, update.

Abadi et al. 2016 ("Deep learning with differential privacy", CCS), Algorithm 1:

    g̃ = (1/L) (Σ_{i∈batch} ḡ_i + N(0, σ²C² I)),   ḡ_i = g_i · min(1, C / ‖g_i‖₂)

with L the *expected* batch size q·N — a fixed denominator, not the realised (Poisson) batch
size, so that the released average is the Gaussian mechanism applied to a sum with
sensitivity C.  An empty batch still adds noise and takes a step.  The noise is drawn by a
:class:`privacylab.mechanisms.GaussianMechanism`, and every step records the event it executed
(``PoissonSampled(q, Gaussian(σ))``, or ``Gaussian(σ)`` without a sample rate) in
``engine.ledger``; ``engine.privacy_event`` is their composition, which an accountant bounds.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from privacylab.accounting.events import Event, EventLedger, PoissonSampled
from privacylab.mechanisms.gaussian_tensor import GaussianMechanism
from privacylab.training.dp.clipping import ClippedBatch, ClipThresholds, GradientBuffers
from privacylab.training.dp.errors import (
    DPSGDError,
    GhostClippingError,
    check_count,
    check_number,
)
from privacylab.training.dp.ghost.clipper import GhostClipping, describe, ghost_layers
from privacylab.training.dp.per_sample import PerSampleClipping

Clipping = Literal["ghost", "per_sample", "auto"]
STRATEGIES: tuple[str, ...] = ("ghost", "per_sample", "auto")


@dataclass(frozen=True)
class StepResult:
    """What one DP-SGD step reports.

    Attributes:
        loss_mean: mean per-example loss over the realised batch (NaN for an empty batch).
        batch_size: realised batch size.
        norms: (B,) per-example gradient norms before clipping.
    """

    loss_mean: float
    batch_size: int
    norms: Tensor


@dataclass(frozen=True)
class StepInfo:
    """White-box view of one step, given to step hooks before the optimizer update.

    ``(clipped_sum[name] + noise[name]) / expected_batch_size`` is the gradient written to the
    parameter's ``.grad``.

    Attributes:
        step: 1-based index of this step (``engine.steps`` once it completes).
        clipped_sum: parameter name -> Σ_i clipped per-example gradient.
        noise: parameter name -> the N(0, σ²C²) noise added to that sum.
        batch_size: realised batch size.
        norms: (B,) per-example gradient norms before clipping.
    """

    step: int
    clipped_sum: dict[str, Tensor]
    noise: dict[str, Tensor]
    batch_size: int
    norms: Tensor


StepHook = Callable[[StepInfo], None]


def check_no_batch_norm(model: nn.Module) -> None:
    """Reject layers that mix the examples of a batch or keep non-private data statistics."""
    for path, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise DPSGDError(
                f"layer {describe(path, module)} normalises with batch statistics, which mixes "
                "examples and breaks per-example clipping; use nn.GroupNorm (privacylab train "
                "--fix, or privacylab.training.dp.fix_model, does it)"
            )
        if isinstance(module, nn.modules.instancenorm._InstanceNorm) and (
            module.track_running_stats
        ):
            raise DPSGDError(
                f"layer {describe(path, module)} tracks running statistics of the data without "
                "noise; use track_running_stats=False (privacylab train --fix does it)"
            )


class DPSGD:
    """Differentially private SGD steps for a model and optimizer (Abadi et al. 2016, Alg. 1).

    Args:
        model: the network.  Must not contain BatchNorm (it mixes examples).
        optimizer: any ``torch.optim`` optimizer over the model's trainable parameters; it sees
            the privatised gradient (so momentum/Adam are post-processing).
        loss_fn: ``loss_fn(outputs, targets) -> (B,)`` per-example losses
            (``reduction='none'``); a loss_fn with attribute ``takes_inputs = True`` is called as
            ``loss_fn(outputs, targets, inputs)`` with the same examples' model inputs (a tuple).
        noise_multiplier: σ; the noise added to the clipped sum has std σ·C.  It may be changed
            between steps (``engine.noise_multiplier = σ'``); the ledger then records a
            composition of the different steps' events.
        max_grad_norm: C, the L2 bound on one example's clipped gradient.
        expected_batch_size: the fixed denominator L = q·N of Alg. 1.
        clipping: ``"ghost"`` (ghost clipping with book-keeping; errors on a layer without a
            rule), ``"per_sample"`` (``torch.func`` vmap, any layer) or ``"auto"`` (ghost if
            possible, else per_sample for the whole model, with one warning — also when ghost
            clipping meets a problem only visible while running, such as a layer called on an
            unbatched tensor; ``engine.clipping`` tells which is in use).
        per_layer_thresholds: ``None`` for flat clipping, else per-parameter thresholds C_k
            (mapping name -> C_k, or a sequence in ``named_parameters`` order) with
            ‖(C_k)‖₂ = max_grad_norm (McMahan et al. 2018); see :func:`split_threshold`.
        physical_batch_size: split each (logical) batch into micro-batches of at most this size;
            their clipped sums are accumulated and noised once per step — the same mechanism,
            so the same privacy guarantee, with bounded memory.
        secure_noise: draw the noise from the OS CSPRNG (see :mod:`privacylab.mechanisms.secure`
            for the floating-point caveat of Mironov 2012).  Cannot be combined with ``generator``.
        generator: ``torch.Generator`` (on the parameters' device) for reproducible noise.
        sample_rate: q of the Poisson sampler that forms the batches; each step is then recorded
            as ``PoissonSampled(q, Gaussian(σ))``.  ``None`` records ``Gaussian(σ)`` — no
            amplification by sampling is claimed, which is always a valid bound.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        *,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: float,
        clipping: Clipping = "ghost",
        per_layer_thresholds: Mapping[str, float] | Sequence[float] | None = None,
        physical_batch_size: int | None = None,
        secure_noise: bool = False,
        generator: torch.Generator | None = None,
        sample_rate: float | None = None,
    ) -> None:
        if clipping not in STRATEGIES:
            raise DPSGDError(f"clipping must be one of {', '.join(STRATEGIES)}, got {clipping!r}")
        if not callable(loss_fn):
            raise DPSGDError("loss_fn must be callable: loss_fn(outputs, targets) -> (B,) losses")
        sigma = check_number("noise_multiplier", noise_multiplier, positive=False)
        self.expected_batch_size = check_number(
            "expected_batch_size", expected_batch_size, positive=False
        )
        if self.expected_batch_size == 0:
            raise DPSGDError("expected_batch_size must be > 0 (it is q·N)")
        if physical_batch_size is not None:
            check_count("physical_batch_size", physical_batch_size)
        if secure_noise and generator is not None:
            raise DPSGDError(
                "secure_noise draws from the OS and cannot be seeded; pass no generator"
            )
        check_no_batch_norm(model)
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.params = OrderedDict((n, p) for n, p in model.named_parameters() if p.requires_grad)
        if not self.params:
            raise DPSGDError("the model has no trainable parameters")
        self.thresholds = ClipThresholds(max_grad_norm, list(self.params), per_layer_thresholds)
        self.max_grad_norm = self.thresholds.max_grad_norm
        self.physical_batch_size = physical_batch_size
        if sample_rate is not None:
            q = check_number("sample_rate", sample_rate, positive=True)
            if q > 1.0:
                raise DPSGDError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
            sample_rate = q
        self.sample_rate = sample_rate
        self.mechanism = GaussianMechanism(
            sigma, self.max_grad_norm, generator=generator, secure=secure_noise
        )
        self.ledger = EventLedger()
        self.unbounded_steps = 0
        self._auto = clipping == "auto"
        self._ghost_problem: str | None = None
        self.clipping = self._resolve(clipping)
        self._clipper: GhostClipping | PerSampleClipping
        if self.clipping == "ghost":
            self._clipper = GhostClipping(model, loss_fn, self.thresholds)
        else:
            self._clipper = PerSampleClipping(model, loss_fn, self.thresholds)
        self._step_hooks: OrderedDict[int, StepHook] = OrderedDict()
        self._grad_buffers: dict[str, Tensor] = {}
        self.steps = 0

    def _resolve(self, clipping: str) -> str:
        if clipping != "auto":
            return clipping
        _, problems = ghost_layers(self.model)
        if not problems:
            return "ghost"
        self._ghost_problem = problems[0]
        warnings.warn(
            f"clipping='auto' uses per_sample for the whole model: {problems[0]}",
            stacklevel=3,
        )
        return "per_sample"

    @property
    def noise_multiplier(self) -> float:
        """σ of the next step (the mechanism's)."""
        return self.mechanism.noise_multiplier

    @noise_multiplier.setter
    def noise_multiplier(self, value: float) -> None:
        self.mechanism.noise_multiplier = check_number("noise_multiplier", value, positive=False)

    @property
    def noise_std(self) -> float:
        """σ·C: standard deviation of the noise added to each coordinate of the clipped sum."""
        return self.mechanism.std

    @property
    def step_event(self) -> Event | None:
        """The privacy event of one step (None when σ = 0: no guarantee)."""
        event = self.mechanism.event
        if event is None or self.sample_rate is None or self.sample_rate == 1.0:
            return event
        return PoissonSampled(self.sample_rate, event)

    @property
    def privacy_event(self) -> Event | None:
        """The composition of the events of every step taken (None before the first step).

        Raises DPSGDError if a step ran without noise: nothing bounds such a run.
        """
        if self.unbounded_steps:
            raise DPSGDError(
                f"{self.unbounded_steps} steps ran with noise multiplier 0: no privacy guarantee"
            )
        return self.ledger.event

    def add_step_hook(self, hook: StepHook) -> RemovableHandle:
        """Call ``hook(StepInfo)`` at every step, after ``.grad`` is written and before the update.

        Building the clipped-sum and noise dictionaries costs a copy of the gradient; it only
        happens while at least one hook is registered.  ``handle.remove()`` unregisters.
        """
        handle = RemovableHandle(self._step_hooks)
        self._step_hooks[handle.id] = hook
        return handle

    @property
    def has_step_hooks(self) -> bool:
        """Whether a step hook is registered (``add_step_hook``)."""
        return bool(self._step_hooks)

    def clipped_batch(
        self,
        x: Tensor | Sequence[Tensor],
        y: Tensor,
        into: GradientBuffers | None = None,
    ) -> ClippedBatch:
        """Σ_i clipped ∇L_i over the batch (no noise), in micro-batches if configured.

        ``into.init(name, parameter)`` is called for each parameter when its sum is first formed
        — the order in which :meth:`step` draws the noise.
        """
        return self._clip(x, y, into if into is not None else GradientBuffers(self.params))

    def _clip(self, x: Tensor | Sequence[Tensor], y: Tensor, into: GradientBuffers) -> ClippedBatch:
        inputs = tuple(map(self._as_tensor, x if isinstance(x, (tuple, list)) else (x,)))
        y = self._as_tensor(y)
        batch = int(y.shape[0])
        for t in inputs:
            if t.shape[0] != batch:
                raise DPSGDError(f"inputs have {t.shape[0]} examples but targets have {batch}")
        if batch == 0:
            p = next(iter(self.params.values()))
            empty = torch.zeros(0, dtype=p.dtype, device=p.device)
            return ClippedBatch(into.tensors(), empty, empty.clone(), 0)
        try:
            return self._clip_batch(inputs, y, into)
        except GhostClippingError as error:
            if not (self._auto and self.clipping == "ghost"):
                raise
            warnings.warn(
                f"clipping='auto' switches to per_sample for the whole model: {error}",
                stacklevel=3,
            )
            self._ghost_problem = str(error)
            self.clipping = "per_sample"
            self._clipper = PerSampleClipping(self.model, self.loss_fn, self.thresholds)
            return self._per_sample_fallback(inputs, y, GradientBuffers(self.params, into.init))
        except DPSGDError as error:
            if self._auto and self._ghost_problem is not None:
                raise DPSGDError(f"{error}; ghost clipping: {self._ghost_problem}") from error
            raise

    def _per_sample_fallback(
        self, inputs: tuple[Tensor, ...], y: Tensor, into: GradientBuffers
    ) -> ClippedBatch:
        try:
            return self._clip_batch(inputs, y, into)
        except DPSGDError as error:
            raise DPSGDError(f"{error}; ghost clipping: {self._ghost_problem}") from error

    def _clip_batch(
        self, inputs: tuple[Tensor, ...], y: Tensor, into: GradientBuffers
    ) -> ClippedBatch:
        batch = int(y.shape[0])
        size = self.physical_batch_size or batch
        if size >= batch:
            return self._clipper.clip(inputs, y, into)
        norms, losses = [], []
        for start in range(0, batch, size):
            s = slice(start, start + size)
            part = self._clipper.clip(tuple(t[s] for t in inputs), y[s], into)
            norms.append(part.norms)
            losses.append(part.loss)
        return ClippedBatch(into.tensors(), torch.cat(norms), torch.cat(losses), batch)

    def step(self, x: Tensor | Sequence[Tensor], y: Tensor) -> StepResult:
        """One DP-SGD step on a (possibly empty) batch; see the module docstring.

        Each parameter's noise is drawn when its layer's clipped sum is about to be formed, into
        the buffer that sum is added to (no second gradient-sized buffer), unless a step hook
        needs the two apart; the order of the draws is the same either way.  That buffer
        becomes the parameter's ``.grad`` and is reused at the next step (the optimizer's
        ``zero_grad`` lets go of it), so a step allocates no gradient-sized memory: keep a copy,
        not a reference, of ``.grad`` across steps.
        """
        self.check_generator()
        watched = bool(self._step_hooks)
        noise: dict[str, Tensor] = {}

        def init(name: str, p: Tensor) -> Tensor:
            if watched:
                noise[name] = self.mechanism.noise(p)
                return torch.zeros_like(p)
            buffer = self._grad_buffers.get(name)
            if buffer is None or buffer.shape != p.shape or buffer.dtype != p.dtype:
                buffer = self._grad_buffers[name] = torch.empty_like(
                    p, memory_format=torch.contiguous_format
                )
            return self.mechanism.noise(p, out=buffer)

        with torch.no_grad():
            batch = self._clip(x, y, GradientBuffers(self.params, init))
            scale = 1.0 / self.expected_batch_size
            for name, p in self.params.items():
                total = batch.grad_sum[name]
                if watched:
                    p.grad = (total + noise[name]).mul_(scale)
                else:
                    p.grad = total.mul_(scale)
            self.record_step()
            if watched:
                info = StepInfo(self.steps, batch.grad_sum, noise, batch.batch_size, batch.norms)
                for hook in list(self._step_hooks.values()):
                    hook(info)
        self.optimizer.step()
        self.optimizer.zero_grad()
        loss = batch.loss.mean().item() if batch.batch_size else math.nan
        return StepResult(loss, batch.batch_size, batch.norms)

    def _as_tensor(self, value: object) -> Tensor:
        """A numpy array (or anything ``torch.as_tensor`` takes) on the parameters' device;
        floating-point inputs take the parameters' dtype, as a float64 numpy array would
        otherwise fail against float32 weights."""
        if isinstance(value, Tensor):
            return value
        p = next(iter(self.params.values()))
        try:
            tensor = torch.as_tensor(value, device=p.device)
        except (TypeError, ValueError, RuntimeError) as error:
            raise DPSGDError(
                f"inputs and targets must be tensors or arrays, got {type(value).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}"
            ) from None
        return tensor.to(p.dtype) if tensor.is_floating_point() else tensor

    def record_step(self) -> None:
        """Count one released step and record its privacy event in the ledger (or count it as
        unbounded when σ = 0); :meth:`step` calls it once the noisy gradient is written."""
        self.steps += 1
        event = self.step_event
        if event is None:
            self.unbounded_steps += 1
        else:
            self.ledger.record(event)

    def check_generator(self) -> None:
        """DPSGDError unless the noise generator is on the parameters' device type."""
        generator = self.mechanism.generator
        if generator is None:
            return
        for p in self.params.values():
            if generator.device.type != p.device.type:
                raise DPSGDError(
                    f"the noise generator is on {generator.device} but the parameters are on "
                    f"{p.device}; create it with torch.Generator(device=...)"
                )
