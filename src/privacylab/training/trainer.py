"""The one trainer: ordinary or DP-SGD training, with history, privacy spent, hooks and
resumable checkpoints.

Private training is DP-SGD (Abadi et al. 2016, Alg. 1) through `privacylab.training.dp.DPSGD`
with Poisson sampling, accounted by `privacylab.accounting`. Leading layers without parameters
(e.g. a ScatterNet front end, Tramèr & Boneh 2021) are applied once to the whole data set when no
augmentation is asked for: they are data-independent, so this changes nothing but the cost.

The privacy spent is computed from the events the DP-SGD engine actually executed (its
`EventLedger`), not from the configuration; the composed event is returned (and saved in model
sidecars) so that any run can be re-accounted (`privacylab.training.reaccount`). A regulariser
and callbacks (`privacylab.training.hooks`) make training-time defences options, not forks.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.accounting import (
    PrivacyParameterError,
    calibrate_noise_multiplier,
    make_accountant,
    max_steps,
)
from privacylab.accounting.calibration import dp_sgd_epsilon
from privacylab.accounting.events import Event, EventLedger, dp_sgd
from privacylab.data import Dataset
from privacylab.models.scattering import Scattering2D
from privacylab.training.checkpoint import CHECKPOINT_FORMAT, Checkpoint
from privacylab.training.config import TrainConfig, TrainingError
from privacylab.training.dp import DPSGD, PoissonSampler, ShuffleSampler, check_no_batch_norm
from privacylab.training.dp.clipping import split_threshold
from privacylab.training.hooks import (
    Callback,
    Regularizer,
    TrainState,
    check_callbacks,
    regularization_term,
)
from privacylab.training.inputs import (
    as_training_data,
    check_class_labels,
    check_label_range,
    resolve_batch_size,
    sample_rate,
)

__all__ = ["CHECKPOINT_FORMAT", "EpochRecord", "PrivacySpent", "TrainResult", "train"]


@dataclass
class EpochRecord:
    """Loss and accuracy after one epoch on the members (training data) and non-members.

    The loss is the mean per-example loss (cross-entropy without label smoothing by default).
    Accuracy is None where it means nothing: targets that are not class indices (regression,
    multi-label).
    """

    epoch: int
    train_loss: float
    train_accuracy: float | None
    eval_loss: float | None
    eval_accuracy: float | None
    epsilon: float | None = None


@dataclass
class PrivacySpent:
    """The (ε, δ) certified for the training run, and how it was obtained.

    `event` is the JSON form (`Event.to_dict`) of the composition of the privacy events the run
    executed; `privacylab.training.reaccount` bounds it again with any accountant.
    """

    epsilon: float
    delta: float
    accountant: str
    noise_multiplier: float
    sample_rate: float
    steps: int
    max_grad_norm: float
    sampling: str
    note: str | None = None
    event: dict[str, Any] | None = None


@dataclass
class TrainResult:
    """The trained model, its per-epoch history and, when private, the privacy spent."""

    model: nn.Module
    history: list[EpochRecord] = field(default_factory=list)
    privacy: PrivacySpent | None = None
    stopped: str | None = None

    @property
    def eval_accuracy(self) -> float | None:
        """Non-member (test) accuracy after the last epoch."""
        return self.history[-1].eval_accuracy if self.history else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary (no weights)."""
        return {
            "history": [asdict(r) for r in self.history],
            "privacy": asdict(self.privacy) if self.privacy else None,
            "stopped": self.stopped,
        }


_STATELESS: frozenset[type[nn.Module]] = frozenset(
    {
        nn.Identity,
        nn.Flatten,
        nn.Unflatten,
        # activations (not RReLU: its slope is random in training)
        nn.ReLU,
        nn.ReLU6,
        nn.LeakyReLU,
        nn.ELU,
        nn.SELU,
        nn.CELU,
        nn.GELU,
        nn.SiLU,
        nn.Mish,
        nn.Tanh,
        nn.Sigmoid,
        nn.Hardtanh,
        nn.Hardsigmoid,
        nn.Hardswish,
        nn.Softplus,
        nn.Softsign,
        nn.Tanhshrink,
        nn.Softshrink,
        nn.Hardshrink,
        nn.LogSigmoid,
        nn.Threshold,
        nn.GLU,
        nn.Softmax,
        nn.Softmin,
        nn.LogSoftmax,
        nn.Softmax2d,
        # pooling
        nn.MaxPool1d,
        nn.MaxPool2d,
        nn.MaxPool3d,
        nn.AvgPool1d,
        nn.AvgPool2d,
        nn.AvgPool3d,
        nn.AdaptiveMaxPool1d,
        nn.AdaptiveMaxPool2d,
        nn.AdaptiveMaxPool3d,
        nn.AdaptiveAvgPool1d,
        nn.AdaptiveAvgPool2d,
        nn.AdaptiveAvgPool3d,
        nn.LPPool1d,
        nn.LPPool2d,
        # padding and resampling
        nn.ZeroPad1d,
        nn.ZeroPad2d,
        nn.ZeroPad3d,
        nn.ConstantPad1d,
        nn.ConstantPad2d,
        nn.ConstantPad3d,
        nn.ReflectionPad1d,
        nn.ReflectionPad2d,
        nn.ReflectionPad3d,
        nn.ReplicationPad1d,
        nn.ReplicationPad2d,
        nn.ReplicationPad3d,
        nn.CircularPad1d,
        nn.CircularPad2d,
        nn.CircularPad3d,
        nn.PixelShuffle,
        nn.PixelUnshuffle,
        nn.Upsample,
        # per-example normalisation without parameters (checked below: no running statistics)
        nn.LayerNorm,
        nn.GroupNorm,
        nn.RMSNorm,
        nn.LocalResponseNorm,
        nn.InstanceNorm1d,
        nn.InstanceNorm2d,
        nn.InstanceNorm3d,
        # privacylab's wavelet scattering front end (Tramèr & Boneh 2021): fixed filters
        Scattering2D,
    }
)
"""Layer types whose output depends on their input only — the same in training and evaluation
mode, with no randomness and no state updated by a forward pass. Exact types: a subclass may
override `forward`, so it is not trusted."""


def _cacheable(layer: nn.Module) -> bool:
    """True when `layer` is deterministic, mode-independent and parameter-free."""
    if type(layer) not in _STATELESS or any(True for _ in layer.parameters()):
        return False
    return not getattr(layer, "track_running_stats", False)


def _frozen_prefix(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """Split an nn.Sequential into its leading run of cacheable layers (an allow-list of
    deterministic, mode-independent, parameter-free layers: `_STATELESS`) and the rest.

    The prefix is applied once to the whole data set; a layer not on the list (dropout of any
    kind, RReLU, a user's module) ends it, so it runs in training mode at every step.
    """
    if not isinstance(model, nn.Sequential):
        return nn.Identity(), model
    cut = 0
    for layer in model:
        if not _cacheable(layer):
            break
        cut += 1
    if cut == 0 or cut == len(model):
        return nn.Identity(), model
    return model[:cut], model[cut:]


@torch.no_grad()
def _transform(
    prefix: nn.Module, features: Tensor, device: torch.device, chunk: int = 1024
) -> Tensor:
    if isinstance(prefix, nn.Identity):
        return features.to(device)
    prefix.eval()
    # A copy per chunk: an in-place layer (ReLU(inplace=True)) must not write to the caller's data.
    return torch.cat(
        [
            prefix(features[i : i + chunk].to(device, copy=True))
            for i in range(0, len(features), chunk)
        ]
    )


def _augment(x: Tensor, rotation: float, translation: int, generator: torch.Generator) -> Tensor:
    """Random rotation (±`rotation` degrees) and translation (±`translation` pixels) per image."""
    n = x.shape[0]
    if n == 0:
        return x
    angle = (torch.rand(n, generator=generator) * 2 - 1) * math.radians(rotation)
    shift = (torch.randint(-translation, translation + 1, (n, 2), generator=generator)).float()
    shift = shift * 2.0 / torch.tensor([x.shape[-1], x.shape[-2]], dtype=torch.float32)
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.stack(
        [torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1
    )
    grid = F.affine_grid(theta.to(x), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False, padding_mode="zeros")


def _optimizer(params: list[Tensor], config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    momentum = config.momentum if config.optimizer == "momentum" else 0.0
    return torch.optim.SGD(
        params, lr=config.lr, momentum=momentum, weight_decay=config.weight_decay
    )


def _lr_factor(schedule: str, progress: float) -> float:
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    if schedule == "step":
        return 1.0 if progress < 0.5 else 0.1 if progress < 0.75 else 0.01
    return 1.0


LossFn = Callable[[Tensor, Tensor], Tensor]


@torch.no_grad()
def _evaluate(
    model: nn.Module,
    inputs: tuple[Tensor, ...],
    y: Tensor,
    loss_fn: LossFn | None,
    chunk: int = 2048,
) -> tuple[float, float | None]:
    """Mean loss per example and, for integer targets with one score per class (a class index
    per example, or per token), the fraction of argmax predictions that are right."""
    if len(y) == 0:
        return math.nan, math.nan
    model.eval()
    loss, correct, total = 0.0, 0, 0
    scored = not (y.is_floating_point() or y.dtype == torch.bool)
    for i in range(0, len(y), chunk):
        target = y[i : i + chunk]
        out = model(*(t[i : i + chunk] for t in inputs))
        if loss_fn is None:
            loss += float(F.cross_entropy(out, target, reduction="sum"))
        else:
            losses = loss_fn(out, target)
            loss += float(losses.sum() if losses.dim() else losses * len(target))
        if scored and isinstance(out, Tensor) and out.shape[:-1] == target.shape:
            correct += int((out.argmax(-1) == target).sum())
            total += target.numel()
        else:
            scored = False
    return loss / len(y), (correct / total if scored and total else None)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def _check_model_output(
    body: nn.Module,
    inputs: tuple[Tensor, ...],
    y: Tensor,
    loss_fn: LossFn | None,
    private: bool,
) -> None:
    """Run the model on two examples (evaluation mode, no gradient) and check that the loss can
    take its outputs: class indices (already checked by `check_class_labels`) within the outputs
    for cross-entropy, and, under DP, a loss that returns one value per example (each example's
    gradient is clipped on its own)."""
    with torch.no_grad():
        body.eval()
        try:
            out = body(*(t[:2] for t in inputs))
        except (RuntimeError, ValueError, TypeError, IndexError) as error:
            shapes = ", ".join(str(tuple(t.shape[1:])) for t in inputs)
            raise TrainingError(
                f"the model fails on examples of shape {shapes}: {_first_line(error)}"
            ) from None
        target = y[:2]
        if loss_fn is None:
            if not isinstance(out, Tensor) or out.dim() != 2:
                shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise TrainingError(
                    f"the default loss (cross-entropy) needs (batch, classes) outputs, got "
                    f"{shape}; pass loss_fn= for other outputs"
                )
            check_label_range(y, out.shape[1])
            return
        try:
            losses = loss_fn(out, target)
        except (RuntimeError, ValueError, TypeError, IndexError) as error:
            raise TrainingError(
                f"loss_fn fails on the model's outputs: {_first_line(error)}"
            ) from None
        if not isinstance(losses, Tensor):
            raise TrainingError(f"loss_fn must return a tensor, got {type(losses).__name__}")
        if private and tuple(losses.shape) != (len(target),):
            raise TrainingError(
                f"under DP-SGD loss_fn must return one loss per example, shape ({len(target)},), "
                f"got {tuple(losses.shape)}; use reduction='none' (and average over the other "
                "dimensions, e.g. tokens)"
            )
        if losses.dim() > 1 or (losses.dim() == 1 and len(losses) != len(target)):
            raise TrainingError(
                f"loss_fn must return ({len(target)},) per-example losses or a scalar, got "
                f"{tuple(losses.shape)}"
            )


@functools.lru_cache(maxsize=256)
def _event_epsilon(event: Event, delta: float, accountant: str) -> float:
    return make_accountant(accountant).compose(event).epsilon(delta)


def _checked_state(state: dict[str, Any], ledger_expected: bool) -> dict[str, Any]:
    """The bookkeeping of a checkpoint, with every field of the right type."""
    try:
        steps, epoch = state["steps"], state["epoch"]
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (steps, epoch)
        ):
            raise ValueError("steps and epoch must be whole numbers >= 0")
        if not isinstance(state["waited"], int) or not isinstance(state["best"], (int, float)):
            raise ValueError("early-stopping state has the wrong type")
        if state["stopped"] is not None and not isinstance(state["stopped"], str):
            raise ValueError("stopped must be text or null")
        history = [EpochRecord(**r) for r in state["history"]]
        ledger = None
        if ledger_expected:
            ledger = EventLedger.from_dict(state["ledger"])
            if ledger.releases != steps:
                raise ValueError(f"its ledger holds {ledger.releases} steps, not {steps}")
    except (KeyError, TypeError, ValueError, PrivacyParameterError) as error:
        raise TrainingError(f"damaged checkpoint bookkeeping: {error}") from None
    return {**state, "history": history, "ledger": ledger}


def train(
    model: nn.Module,
    train_data: Dataset | Any,
    config: TrainConfig | None = None,
    eval_data: Dataset | Any | None = None,
    *,
    checkpoint_dir: str | Path | None = None,
    progress: Callable[[EpochRecord], None] | None = None,
    regularizer: Regularizer | None = None,
    callbacks: Iterable[Callback] = (),
    loss_fn: LossFn | None = None,
) -> TrainResult:
    """Train `model` on `train_data` (the members) and return it with its history and, when
    `config.privacy` is set, the (ε, δ) spent by DP-SGD (Abadi et al. 2016, Alg. 1) with Poisson
    sampling at q = batch size / N, accounted from the steps executed.

    Data (`privacylab.training.inputs`): a privacylab `Dataset`, `(x, y)` numpy arrays or
    tensors, `((x1, ..., xk), y)` for a model called as `model(x1, ..., xk)`, a `TensorDataset`,
    any map-style torch `Dataset` of `(x, y)` / `(x1, ..., xk, y)` items (read into memory
    once, up to `inputs.MAX_MATERIALISED_BYTES`; a random transform is thus applied once), or a
    `DataLoader` — its dataset is used and its `batch_size` is the expected batch size unless
    `config.batch_size` is set to something other than its default; its own sampler is not used
    (under DP the batches are Poisson-resampled from its dataset: the q reported is the one
    used, and a batch size above N is refused).

    `loss_fn(outputs, targets)` returns per-example losses, shape (B,) (`reduction='none'`):
    regression (MSE), multi-label (BCE with logits), next-token (the mean over tokens) all work;
    under DP a scalar loss is refused. The default is cross-entropy (with
    `config.label_smoothing`) on integer class labels. Accuracy is recorded when the targets
    are integers with one score per class in the outputs (classification, next-token), else it
    is None.

    `eval_data` (non-members) is evaluated after each epoch and drives early stopping. With
    `checkpoint_dir`, the state is saved after every epoch as one atomic file
    (`privacylab.training.checkpoint`) and a re-run resumes from it, to the same weights and ε.

    `regularizer(model, x, y, logits)` is added to the loss (per example, shape (B,); a scalar
    only without DP) and `callbacks` (`on_step_end`/`on_epoch_end`) receive a `TrainState` and
    may stop the run: see `privacylab.training.hooks`. Neither is part of the checkpoint's
    configuration fingerprint: resume with the same ones.
    """
    config = (config or TrainConfig()).validate()
    hooks = check_callbacks(callbacks)
    if regularizer is not None and not callable(regularizer):
        raise TrainingError(f"the regulariser must be callable, got {type(regularizer).__name__}")
    if loss_fn is not None and not callable(loss_fn):
        raise TrainingError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if loss_fn is not None and config.label_smoothing:
        raise TrainingError(
            "label smoothing applies to the default cross-entropy loss; put it in loss_fn"
        )
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    data = as_training_data(train_data, float_dtype=dtype)
    held_out = (
        as_training_data(eval_data, name="evaluation data", float_dtype=dtype)
        if eval_data is not None
        else None
    )
    if loss_fn is None:
        check_class_labels(data.targets)
        if held_out is not None:
            check_class_labels(held_out.targets, "evaluation data")
    device = torch.device(config.device)
    privacy = config.privacy
    if privacy is not None:
        check_no_batch_norm(model)
    model.to(device)
    single = len(data.inputs) == 1
    cache = single and not config.augmentation
    prefix, body = _frozen_prefix(model) if cache else (nn.Identity(), model)

    def placed(inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """The inputs on `device`, a single one through the cached prefix."""
        if single:
            return (_transform(prefix, inputs[0], device),)
        return tuple(t.to(device) for t in inputs)

    x_train = placed(data.inputs)
    y_train = data.targets.to(device)
    x_eval: tuple[Tensor, ...] | None = None
    y_eval: Tensor | None = None
    if held_out is not None:
        if len(held_out.inputs) != len(data.inputs):
            raise TrainingError(
                f"the evaluation data has {len(held_out.inputs)} inputs per example but the "
                f"training data has {len(data.inputs)}"
            )
        x_eval = placed(held_out.inputs)
        y_eval = held_out.targets.to(device)
    _check_model_output(body, x_train, y_train, loss_fn, privacy is not None)
    if loss_fn is None and y_eval is not None and x_eval is not None:
        _check_model_output(body, x_eval, y_eval, None, False)

    n = len(data)
    batch_size = resolve_batch_size(
        config.batch_size, TrainConfig.__dataclass_fields__["batch_size"].default, data.batch_size
    )
    if privacy is not None and data.batch_size is not None:
        sample_rate(batch_size, n, data.source)
    sample_gen = torch.Generator().manual_seed(config.seed)
    noise_gen = torch.Generator(device=device).manual_seed(config.seed + 1)
    aug_gen = torch.Generator().manual_seed(config.seed + 2)
    params = [p for p in body.parameters() if p.requires_grad]
    if not params:
        raise TrainingError("the model has no trainable parameters")
    optimizer = _optimizer(params, config)

    def per_example_loss(out: Tensor, target: Tensor) -> Tensor:
        if loss_fn is not None:
            return loss_fn(out, target)
        return F.cross_entropy(
            out, target, reduction="none", label_smoothing=config.label_smoothing
        )

    def regularizer_inputs(inputs: tuple[Tensor, ...]) -> Tensor | tuple[Tensor, ...]:
        return inputs[0] if len(inputs) == 1 else inputs

    engine_loss: Callable[..., Tensor] = per_example_loss
    if regularizer is not None:

        def regularized_loss(out: Tensor, target: Tensor, inputs: tuple[Tensor, ...]) -> Tensor:
            losses = per_example_loss(out, target)
            term = regularizer(body, regularizer_inputs(inputs), target, out)
            return losses + regularization_term(term, len(target), private=True)

        regularized_loss.takes_inputs = True  # type: ignore[attr-defined]
        engine_loss = regularized_loss

    engine: DPSGD | None = None
    sampler: PoissonSampler | ShuffleSampler
    spent_template: dict[str, Any] = {}
    step_limit: int | None = None
    q = min(1.0, batch_size / n)
    if privacy is not None and privacy.sampling == "poisson":
        sampler = PoissonSampler(n, q, generator=sample_gen)
    else:
        sampler = ShuffleSampler(n, batch_size, generator=sample_gen)
    total_steps = config.epochs * sampler.steps_per_epoch
    if privacy is not None:
        sigma = privacy.noise_multiplier
        if sigma is None:
            assert privacy.epsilon is not None
            sigma = calibrate_noise_multiplier(
                privacy.epsilon, privacy.delta, q, total_steps, accountant=privacy.accountant
            )
        elif privacy.epsilon is not None:
            step_limit = max_steps(
                sigma, q, privacy.epsilon, privacy.delta, privacy.accountant, limit=total_steps
            )
            if step_limit == 0:
                raise TrainingError(
                    f"one step with noise multiplier {sigma:g} already exceeds "
                    f"epsilon {privacy.epsilon:g}"
                )
        thresholds = None
        if privacy.per_layer:
            names = [name for name, p in body.named_parameters() if p.requires_grad]
            thresholds = split_threshold(names, privacy.max_grad_norm)
        engine = DPSGD(
            body,
            optimizer,
            engine_loss,
            noise_multiplier=sigma,
            max_grad_norm=privacy.max_grad_norm,
            expected_batch_size=q * n,
            clipping=privacy.clipping,  # type: ignore[arg-type]
            per_layer_thresholds=thresholds,
            physical_batch_size=privacy.physical_batch_size,
            secure_noise=privacy.secure_noise,
            generator=None if privacy.secure_noise else noise_gen,
            sample_rate=q,
        )
        note = None
        if not sampler.poisson:
            note = (
                "batches were shuffled, not Poisson-sampled: this epsilon is that of Poisson "
                "sampling with the same rate and is not a proven bound for shuffling"
            )
        spent_template = {
            "delta": privacy.delta,
            "accountant": privacy.accountant,
            "noise_multiplier": sigma,
            "sample_rate": q,
            "max_grad_norm": privacy.max_grad_norm,
            "sampling": privacy.sampling,
            "note": note,
        }

    def epsilon_spent() -> float | None:
        """ε of the events the engine executed (memoised; the plain DP-SGD run shares the
        calibration's cache)."""
        if engine is None or privacy is None:
            return None
        event = engine.privacy_event
        if event is None:
            return None
        sigma = spent_template["noise_multiplier"]
        if event == dp_sgd(sigma, q, engine.ledger.releases):
            return dp_sgd_epsilon(
                sigma, q, engine.ledger.releases, privacy.delta, privacy.accountant
            )
        return _event_epsilon(event, privacy.delta, privacy.accountant)

    def state_now(epoch: int, **extra: Any) -> TrainState:
        return TrainState(
            epoch=epoch,
            step=steps,
            model=model,
            optimizer=optimizer,
            privacy_event=engine.privacy_event if engine is not None else None,
            _epsilon=epsilon_spent,
            **extra,
        )

    history: list[EpochRecord] = []
    steps, start_epoch, best, waited, stopped = 0, 0, math.inf, 0, None
    # The batch size used (a DataLoader's may differ from the configuration's) is fingerprinted.
    fingerprint = {**config.to_dict(), "batch_size": batch_size}
    checkpoint = Checkpoint(checkpoint_dir, json.dumps(fingerprint, sort_keys=True))
    generators = {"sample": sample_gen, "noise": noise_gen, "augment": aug_gen}
    saved = checkpoint.load(body, optimizer, generators)
    if saved is not None:
        resumed = _checked_state(saved, ledger_expected=engine is not None)
        steps, start_epoch = resumed["steps"], resumed["epoch"]
        best, waited, stopped = resumed["best"], resumed["waited"], resumed["stopped"]
        history = resumed["history"]
        if engine is not None:
            engine.steps = steps
            engine.ledger = resumed["ledger"]

    for epoch in range(start_epoch, config.epochs):
        if stopped:
            break
        body.train()
        for batch in sampler:
            if step_limit is not None and steps >= step_limit:
                stopped = "privacy budget spent"
                break
            for group in optimizer.param_groups:
                group["lr"] = config.lr * _lr_factor(config.schedule, steps / total_steps)
            index = batch.to(device)
            xb, yb = tuple(t[index] for t in x_train), y_train[index]
            if config.augmentation and single and xb[0].dim() == 4:
                xb = (_augment(xb[0], config.rotation, config.translation, aug_gen),)
            if engine is not None:
                loss_value: Tensor | float = engine.step(xb, yb).loss_mean
            else:
                optimizer.zero_grad(set_to_none=True)
                out = body(*xb)
                loss = per_example_loss(out, yb)
                loss = loss.mean() if loss.dim() else loss
                if regularizer is not None:
                    value = regularizer(body, regularizer_inputs(xb), yb, out)
                    term = regularization_term(value, len(yb), False)
                    loss = loss + term.mean()
                loss.backward()
                optimizer.step()
                loss_value = loss.detach()
            steps += 1
            if any(hasattr(h, "on_step_end") for h in hooks):
                step_state = state_now(epoch + 1, loss=float(loss_value))
                for hook in hooks:
                    if hasattr(hook, "on_step_end"):
                        hook.on_step_end(step_state)
                if step_state.stop_reason:
                    stopped = step_state.stop_reason
                    break
        train_loss, train_acc = _evaluate(body, x_train, y_train, loss_fn)
        eval_loss, eval_acc = (None, None)
        if x_eval is not None and y_eval is not None:
            eval_loss, eval_acc = _evaluate(body, x_eval, y_eval, loss_fn)
        eps = epsilon_spent() if privacy is not None and steps else None
        record = EpochRecord(epoch + 1, train_loss, train_acc, eval_loss, eval_acc, eps)
        history.append(record)
        if progress is not None:
            progress(record)
        if config.early_stopping is not None and eval_loss is not None:
            if eval_loss < best - 1e-6:
                best, waited = eval_loss, 0
            else:
                waited += 1
                if waited >= config.early_stopping:
                    stopped = f"early stopping: no better non-member loss for {waited} epochs"
        if any(hasattr(h, "on_epoch_end") for h in hooks):
            epoch_state = state_now(epoch + 1, record=record)
            for hook in hooks:
                if hasattr(hook, "on_epoch_end"):
                    hook.on_epoch_end(epoch_state)
            stopped = stopped or epoch_state.stop_reason
        state = {
            "steps": steps,
            "epoch": epoch + 1,
            "best": best,
            "waited": waited,
            "stopped": stopped,
            "history": [asdict(r) for r in history],
        }
        if engine is not None:
            state["ledger"] = engine.ledger.to_dict()
        checkpoint.save(body, optimizer, state, generators)

    spent = None
    if privacy is not None:
        # The last epoch's record already holds ε for every step taken.
        last = history[-1].epsilon if history else None
        assert engine is not None
        event = engine.privacy_event
        spent = PrivacySpent(
            epsilon=last or 0.0,
            steps=steps,
            event=event.to_dict() if event is not None else None,
            **spent_template,
        )
    model.eval()
    return TrainResult(model=model, history=history, privacy=spent, stopped=stopped)
