"""DP-SGD inside your own training loop: `make_private`, for users coming from Opacus.

The mechanism is DP-SGD (Abadi et al. 2016, Alg. 1): every step takes a Poisson sample of the
data (each example independently with probability q = batch_size / N), clips each example's
gradient to norm C, sums, adds N(0, σ²C²) noise and divides by the expected batch size q·N.
The steps are executed by the engine `privacylab.training.dp.DPSGD` (ghost clipping, Li et al.
2022 with Bu et al. 2023's book-keeping, or `torch.func` per-example gradients), which records
each step's event `PoissonSampled(q, Gaussian(σ))`; the accountant bounds their composition
(PLD by default, as `privacylab account`; RDP of Mironov et al. 2019 and GDP of Dong et al. 2022
on request).

The user's loop keeps Opacus's shape::

    private = make_private(model, optimizer, data, epsilon=1.0, epochs=5, batch_size=64)
    for x, y in private.loader:
        private.optimizer.zero_grad()
        loss = private.criterion(private.model(x), y)
        loss.backward()
        private.optimizer.step()
    private.accountant.get_epsilon(1e-5)

How it works, and why the loop must use the returned objects: per-example clipping needs the
loss of each example, so `private.model(x)` records its inputs and returns its outputs without a
gradient graph; `private.criterion(outputs, y)` records the targets and returns the batch's mean
loss as a `PrivateLoss`, whose `backward()` marks the batch ready; `private.optimizer.step()` then
runs the engine's step on exactly these inputs and targets (forward with hooks, per-example
norms, clipping, noise, the update of your optimizer). The random state is rewound to what it
was at `private.model(x)`, so dropout in the step draws the same masks as the outputs you saw.

Refused in one line (a `DPSGDError`), because each would make the ε reported wrong or the
clipping inexact: a backward through the model's outputs other than `private.criterion`'s loss,
outputs changed between the model and the criterion, a step without a new batch from
`private.loader` (your own DataLoader is not Poisson sampling), a batch of the loader skipped
without a step (skipping an empty batch reveals its size), two `backward()` calls for one step
(accumulate with `physical_batch_size` instead), and `step(closure)`. What is done to a batch
between the loader and the model (moving it to a device, augmenting each example) must act on
each example alone: mixing examples (mixup, batch statistics) or bringing in other data is
outside what the accountant covers, and cannot be detected.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.accounting import (
    PrivacyParameterError,
    calibrate_noise_multiplier,
    make_accountant,
)
from privacylab.accounting.calibration import dp_sgd_epsilon
from privacylab.accounting.events import dp_sgd
from privacylab.training.config import TrainingError
from privacylab.training.dp import DPSGD, PoissonSampler
from privacylab.training.dp.errors import DPSGDError
from privacylab.training.inputs import (
    TrainingData,
    as_training_data,
    check_class_labels,
    sample_rate,
)

__all__ = [
    "PoissonLoader",
    "PrivacyAccountant",
    "PrivateCriterion",
    "PrivateLoss",
    "PrivateModel",
    "PrivateOptimizer",
    "PrivateTraining",
    "make_private",
]


class PoissonLoader:
    """Poisson-sampled batches of the data (Abadi et al. 2016, Alg. 1, "sampling probability q").

    Each batch includes every example independently with probability q, so batch sizes vary
    around q·N and may be 0. One pass yields `len(loader) = round(1/q)` batches (one epoch in
    expectation). A batch is `(x, y)`; `x` is a tensor, or a tuple of tensors for a model with
    several inputs (call `model(*x)`).
    """

    def __init__(self, data: TrainingData, q: float, generator: torch.Generator) -> None:
        self.data = data
        self.sampler = PoissonSampler(len(data), q, generator=generator)
        self.drawn = 0
        self.last_size: int | None = None

    @property
    def sample_rate(self) -> float:
        """q, the probability that an example is in a batch."""
        return self.sampler.sample_rate

    @property
    def expected_batch_size(self) -> float:
        """q·N."""
        return self.sampler.expected_batch_size

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch

    def __iter__(self) -> Iterator[tuple[Tensor | tuple[Tensor, ...], Tensor]]:
        for _ in range(len(self)):
            inputs, targets = self.data.select(self.sampler.sample())
            self.drawn += 1
            self.last_size = len(targets)
            yield (inputs[0] if len(inputs) == 1 else inputs), targets


class _Guard(torch.autograd.Function):
    """Identity on the private model's outputs whose backward refuses: the gradient of the
    parameters must come from the engine's per-example clipping, never from a plain backward."""

    @staticmethod
    def forward(ctx: Any, out: Tensor, anchor: Tensor) -> Tensor:
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, None]:
        raise DPSGDError(
            "a backward pass went through the private model's outputs: compute the loss with "
            "private.criterion(outputs, y) and call backward() on what it returns"
        )


@dataclass
class _Pending:
    inputs: tuple[Tensor, ...]
    output: Tensor | None
    targets: Tensor | None
    rng: list[tuple[str, Tensor]]
    ready: bool = False


def _rng_state(devices: set[torch.device]) -> list[tuple[str, Tensor]]:
    states = [("cpu", torch.get_rng_state())]
    for device in sorted(devices, key=str):
        if device.type == "cuda":
            states.append((str(device), torch.cuda.get_rng_state(device)))
    return states


def _set_rng_state(states: list[tuple[str, Tensor]]) -> None:
    for where, state in states:
        if where == "cpu":
            torch.set_rng_state(state)
        else:
            torch.cuda.set_rng_state(state, torch.device(where))


class PrivateModel(nn.Module):
    """The user's model (`.module`), whose training-mode calls with gradients enabled are
    recorded for the next DP-SGD step; in evaluation mode or under `torch.no_grad()` it is the
    model itself."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self._anchor = torch.zeros((), requires_grad=True)
        self.pending: _Pending | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not (self.training and torch.is_grad_enabled()):
            return self.module(*args, **kwargs)
        if kwargs or not args or not all(isinstance(a, Tensor) for a in args):
            raise DPSGDError(
                "the private model takes its batch as positional tensors, model(x) or "
                "model(x1, ..., xk), so that each example's gradient can be clipped"
            )
        devices = {a.device for a in args}
        rng = _rng_state(devices)
        with torch.no_grad():
            out = self.module(*args)
        if not isinstance(out, Tensor):
            raise DPSGDError(
                f"the private model must return a tensor, got {type(out).__name__}; wrap it so "
                "that forward returns the outputs the loss takes"
            )
        guarded = _Guard.apply(out, self._anchor)
        self.pending = _Pending(tuple(a.detach() for a in args), guarded, None, rng)
        return guarded


class PrivateLoss:
    """The mean loss of a batch (what `loss.item()` shows) whose `backward()` marks the batch
    ready for `private.optimizer.step()`, which clips each example's gradient."""

    def __init__(self, value: Tensor, pending: _Pending) -> None:
        self.value = value
        self._pending = pending

    def backward(self) -> None:
        """Mark the batch ready for the DP-SGD step (no gradient is formed here)."""
        if self._pending.ready:
            raise DPSGDError(
                "backward() was called twice for one step; call optimizer.step() after each "
                "backward (to bound memory use physical_batch_size, not accumulation)"
            )
        self._pending.ready = True

    def item(self) -> float:
        """The batch's mean loss as a float (NaN for an empty batch)."""
        return float(self.value)

    def detach(self) -> Tensor:
        """The batch's mean loss as a tensor."""
        return self.value

    def __float__(self) -> float:
        return self.item()

    def __repr__(self) -> str:
        return f"PrivateLoss({self.item():.6g})"


class PrivateCriterion:
    """`criterion(outputs, y)`: the mean of the per-example losses, for the private model's
    outputs as it returned them."""

    def __init__(self, model: PrivateModel, loss_fn: Callable[[Tensor, Tensor], Tensor]) -> None:
        self.model = model
        self.loss_fn = loss_fn

    def __call__(self, outputs: Tensor, targets: Tensor) -> PrivateLoss:
        pending = self.model.pending
        if pending is None or outputs is not pending.output:
            raise DPSGDError(
                "private.criterion needs the private model's outputs exactly as it returned "
                "them (in training mode); put any post-processing into loss_fn"
            )
        if not isinstance(targets, Tensor) or targets.ndim == 0:
            raise DPSGDError("the targets must be a tensor with one row per example")
        batch = len(pending.inputs[0])
        if len(targets) != batch:
            raise DPSGDError(f"the outputs have {batch} examples but the targets {len(targets)}")
        with torch.no_grad():
            losses = self.loss_fn(outputs.detach(), targets)
        if not isinstance(losses, Tensor) or tuple(losses.shape) != (batch,):
            shape = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
            raise DPSGDError(
                f"loss_fn must return per-example losses of shape ({batch},), got {shape}; use "
                "reduction='none' and average over the other dimensions"
            )
        pending.targets = targets.detach()
        value = losses.mean() if batch else torch.tensor(math.nan)
        return PrivateLoss(value, pending)


class PrivateOptimizer:
    """The user's optimizer (`.original`) whose `step()` is one DP-SGD step (Abadi et al. 2016,
    Alg. 1) on the batch of the last `private.criterion(...).backward()`.

    `param_groups` and `state` are the original's: change the learning rate there, or give
    `.original` to a learning-rate scheduler.
    """

    def __init__(
        self, engine: DPSGD, model: PrivateModel, loader: PoissonLoader, original: Any
    ) -> None:
        self.engine = engine
        self.original = original
        self._model = model
        self._loader = loader
        self._used = 0

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The original optimizer's parameter groups."""
        return self.original.param_groups

    @property
    def state(self) -> Any:
        """The original optimizer's state."""
        return self.original.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The original's `zero_grad` (the DP step writes `.grad` itself)."""
        self.original.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The original optimizer's state dict."""
        return self.original.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load the original optimizer's state dict."""
        self.original.load_state_dict(state)

    def step(self, closure: Callable[[], Any] | None = None) -> float:
        """One DP-SGD step on the batch of the last backward; returns its mean loss."""
        if closure is not None:
            raise DPSGDError(
                "step(closure) is not supported: run the forward, criterion and backward, "
                "then call step()"
            )
        pending = self._model.pending
        if pending is None or not pending.ready or pending.targets is None:
            raise DPSGDError(
                "optimizer.step() needs loss.backward() first, on the loss from "
                "private.criterion(private.model(x), y)"
            )
        fresh = self._loader.drawn - self._used
        if fresh < 1:
            raise DPSGDError(
                "each DP-SGD step needs a new batch from private.loader (Poisson sampling is "
                "what the accountant assumes); batches from elsewhere are not accounted"
            )
        if fresh > 1:
            raise DPSGDError(
                f"{fresh - 1} batch(es) of private.loader were skipped without a step; take a "
                "step on every batch, empty ones too (skipping reveals a batch's size)"
            )
        if len(pending.targets) != self._loader.last_size:
            raise DPSGDError(
                f"the step's batch has {len(pending.targets)} examples but private.loader's "
                f"last batch has {self._loader.last_size}"
            )
        self._model.pending = None
        self._used = self._loader.drawn
        _set_rng_state(pending.rng)
        return self.engine.step(pending.inputs, pending.targets).loss_mean


class PrivacyAccountant:
    """(ε, δ) of the DP-SGD steps taken so far, from the events the engine executed: ε is
    `privacylab.accounting.calibration.dp_sgd_epsilon(σ, q, steps, δ, accountant)` — the number
    `privacylab account` prints for the same σ, q and steps."""

    def __init__(self, engine: DPSGD, accountant: str, delta: float) -> None:
        self.engine = engine
        self.name = accountant
        self.delta = delta

    @property
    def steps(self) -> int:
        """DP-SGD steps taken."""
        return self.engine.steps

    def get_epsilon(self, delta: float | None = None) -> float:
        """ε at `delta` (default: the δ given to `make_private`) for the steps taken."""
        delta = self.delta if delta is None else delta
        if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
            raise DPSGDError(f"delta must be in (0, 1), got {delta!r}")
        event = self.engine.privacy_event
        if event is None:
            return 0.0
        sigma, q = self.engine.noise_multiplier, self.engine.sample_rate
        if q is not None and event == dp_sgd(sigma, q, self.steps):
            return dp_sgd_epsilon(sigma, q, self.steps, float(delta), self.name)
        return make_accountant(self.name).compose(event).epsilon(float(delta))


@dataclass
class PrivateTraining:
    """What `make_private` returns: use `model`, `criterion`, `optimizer` and `loader` in your
    loop and ask `accountant.get_epsilon(delta)` for the privacy spent.

    Attributes:
        model: the private model (`model.module` is yours).
        optimizer: its `step()` is the DP-SGD step (`optimizer.original` is yours).
        criterion: `criterion(outputs, y)`, the mean of the per-example losses.
        loader: Poisson-sampled `(x, y)` batches of the data.
        accountant: `get_epsilon(delta)` for the steps taken.
        engine: the `DPSGD` engine that executes the steps.
        noise_multiplier: σ (calibrated when `epsilon` was given).
        sample_rate: q = batch_size / N.
        delta: δ.
    """

    model: PrivateModel
    optimizer: PrivateOptimizer
    criterion: PrivateCriterion
    loader: PoissonLoader
    accountant: PrivacyAccountant
    engine: DPSGD
    noise_multiplier: float
    sample_rate: float
    delta: float

    def get_epsilon(self, delta: float | None = None) -> float:
        """ε spent so far at `delta` (default: the δ given)."""
        return self.accountant.get_epsilon(delta)


def _per_example(loss_fn: Callable[..., Tensor] | None) -> Callable[[Tensor, Tensor], Tensor]:
    if loss_fn is None:

        def cross_entropy(out: Tensor, target: Tensor) -> Tensor:
            return F.cross_entropy(out, target, reduction="none")

        return cross_entropy
    if not callable(loss_fn):
        raise DPSGDError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if isinstance(loss_fn, nn.modules.loss._Loss) and getattr(loss_fn, "reduction", None):
        # A torch loss module: the same loss per element, averaged per example.
        elementwise = copy.copy(loss_fn)
        elementwise.reduction = "none"

        def per_example(out: Tensor, target: Tensor) -> Tensor:
            losses = elementwise(out, target)
            return losses.reshape(len(losses), -1).mean(1) if losses.dim() > 1 else losses

        return per_example
    return loss_fn


def make_private(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Any,
    *,
    epsilon: float | None = None,
    noise_multiplier: float | None = None,
    delta: float = 1e-5,
    epochs: float | None = None,
    max_grad_norm: float = 1.0,
    batch_size: int | None = None,
    clipping: str = "ghost",
    loss_fn: Callable[..., Tensor] | None = None,
    accountant: str = "pld",
    seed: int | None = None,
    physical_batch_size: int | None = None,
    secure_noise: bool = False,
) -> PrivateTraining:
    """Make `model` and `optimizer` train with DP-SGD (Abadi et al. 2016, Alg. 1) in your loop.

    Args:
        model: your network, already on its device (BatchNorm is refused: use GroupNorm).
        optimizer: your optimizer over the model's parameters; it receives the privatised
            gradient, so momentum or Adam are post-processing.
        data: anything `train()` takes (`privacylab.training.inputs`): `(x, y)` arrays or
            tensors, `((x1, ..., xk), y)`, a `TensorDataset`, a torch `Dataset` of `(x, y)`
            items, a `DataLoader` (its dataset, and its batch size unless `batch_size` is given),
            or a privacylab `Dataset`.
        epsilon: target ε at `delta` after `epochs` epochs; σ is then calibrated by
            `privacylab.accounting.calibrate_noise_multiplier` for
            epochs · round(1/q) steps. Give this or `noise_multiplier`.
        noise_multiplier: σ, when not calibrated from `epsilon`.
        delta: δ.
        epochs: passes over the data planned (needed with `epsilon`).
        max_grad_norm: C, the per-example clipping norm.
        batch_size: expected batch size q·N of the Poisson sampler.
        clipping: "ghost", "per_sample" or "auto" (see `DPSGD`).
        loss_fn: `loss_fn(outputs, targets) -> (B,)` per-example losses, or a torch loss module
            (its elementwise loss is averaged per example); default cross-entropy.
        accountant: "pld" (default, as `privacylab account`), "rdp", "rdp-classic" or "gdp".
        seed: seeds the sampler and the noise (same seed, same run); None draws both from
            torch's global generator.
        physical_batch_size: clip each batch in pieces of at most this many examples (bounded
            memory, the same step; Opacus's BatchMemoryManager).
        secure_noise: draw the noise from the OS CSPRNG (then `seed` seeds the sampler only).

    Raises:
        DPSGDError or TrainingError (one line) for bad settings or data, q > 1, an unsupported
        layer.
    """
    if (epsilon is None) == (noise_multiplier is None):
        raise DPSGDError("give either epsilon (with epochs) or noise_multiplier")
    if not isinstance(model, nn.Module):
        raise DPSGDError(f"model must be a torch nn.Module, got {type(model).__name__}")
    if isinstance(model, PrivateModel):
        raise DPSGDError("this model is already private")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise DPSGDError(f"optimizer must be a torch optimizer, got {type(optimizer).__name__}")
    mine = {id(p) for p in model.parameters()}
    if any(id(p) not in mine for g in optimizer.param_groups for p in g["params"]):
        raise DPSGDError("the optimizer updates parameters that are not the model's")
    params = [p for p in model.parameters() if p.requires_grad]
    dtype = next((p.dtype for p in params if p.is_floating_point()), torch.float32)
    prepared = as_training_data(data, float_dtype=dtype)
    if loss_fn is None:
        check_class_labels(prepared.targets)
    size = batch_size if batch_size is not None else prepared.batch_size
    if size is None:
        raise TrainingError("give batch_size (the expected batch size q·N)")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise TrainingError(f"batch_size must be a whole number >= 1, got {size!r}")
    q = sample_rate(size, len(prepared), prepared.source)
    steps_per_epoch = max(1, round(1.0 / q))
    try:
        make_accountant(accountant)
        if isinstance(delta, bool) or not (isinstance(delta, (int, float)) and 0 < delta < 1):
            raise DPSGDError(f"delta must be in (0, 1), got {delta!r}")
        if epsilon is not None:
            if epochs is None:
                raise DPSGDError("with epsilon, give epochs: σ is calibrated for that many steps")
            if isinstance(epochs, bool) or not (
                isinstance(epochs, (int, float)) and math.isfinite(epochs) and epochs > 0
            ):
                raise DPSGDError(f"epochs must be a number > 0, got {epochs!r}")
            steps = max(1, math.ceil(epochs * steps_per_epoch - 1e-9))
            sigma = calibrate_noise_multiplier(epsilon, delta, q, steps, accountant=accountant)
        else:
            dp_sgd(noise_multiplier, q, 1)  # type: ignore[arg-type]
            sigma = float(noise_multiplier)  # type: ignore[arg-type]
    except PrivacyParameterError as error:
        raise DPSGDError(str(error)) from None
    device = params[0].device if params else torch.device("cpu")
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
        noise_gen = None
    else:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise DPSGDError(f"seed must be a whole number >= 0, got {seed!r}")
        noise_gen = None if secure_noise else torch.Generator(device=device).manual_seed(seed + 1)
    per_example = _per_example(loss_fn)
    engine = DPSGD(
        model,
        optimizer,
        per_example,
        noise_multiplier=sigma,
        max_grad_norm=max_grad_norm,
        expected_batch_size=q * len(prepared),
        clipping=clipping,  # type: ignore[arg-type]
        physical_batch_size=physical_batch_size,
        secure_noise=secure_noise,
        generator=noise_gen,
        sample_rate=q,
    )
    loader = PoissonLoader(prepared, q, torch.Generator().manual_seed(seed))
    private_model = PrivateModel(model)
    private_model.train(model.training)
    return PrivateTraining(
        model=private_model,
        optimizer=PrivateOptimizer(engine, private_model, loader, optimizer),
        criterion=PrivateCriterion(private_model, per_example),
        loader=loader,
        accountant=PrivacyAccountant(engine, accountant, delta),
        engine=engine,
        noise_multiplier=sigma,
        sample_rate=q,
        delta=delta,
    )
