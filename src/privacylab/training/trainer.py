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

__all__ = ["CHECKPOINT_FORMAT", "EpochRecord", "PrivacySpent", "TrainResult", "train"]


@dataclass
class EpochRecord:
    """Loss and accuracy after one epoch on the members (training data) and non-members."""

    epoch: int
    train_loss: float
    train_accuracy: float
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


def _frozen_prefix(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """Split an nn.Sequential into its leading parameter-free deterministic part and the rest."""
    if not isinstance(model, nn.Sequential):
        return nn.Identity(), model
    cut = 0
    for layer in model:
        if any(True for _ in layer.parameters()) or isinstance(layer, nn.Dropout):
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
    return torch.cat(
        [prefix(features[i : i + chunk].to(device)) for i in range(0, len(features), chunk)]
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


@torch.no_grad()
def _evaluate(model: nn.Module, x: Tensor, y: Tensor, chunk: int = 2048) -> tuple[float, float]:
    if len(y) == 0:
        return math.nan, math.nan
    model.eval()
    loss, correct = 0.0, 0
    for i in range(0, len(y), chunk):
        out = model(x[i : i + chunk])
        loss += float(F.cross_entropy(out, y[i : i + chunk], reduction="sum"))
        correct += int((out.argmax(1) == y[i : i + chunk]).sum())
    return loss / len(y), correct / len(y)


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
    train_data: Dataset,
    config: TrainConfig | None = None,
    eval_data: Dataset | None = None,
    *,
    checkpoint_dir: str | Path | None = None,
    progress: Callable[[EpochRecord], None] | None = None,
    regularizer: Regularizer | None = None,
    callbacks: Iterable[Callback] = (),
) -> TrainResult:
    """Train `model` on `train_data` (the members) and return it with its history and, when
    `config.privacy` is set, the (ε, δ) spent by DP-SGD (Abadi et al. 2016, Alg. 1).

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
    if len(train_data) == 0:
        raise TrainingError("the training data is empty")
    device = torch.device(config.device)
    privacy = config.privacy
    if privacy is not None:
        check_no_batch_norm(model)
    model.to(device)
    prefix, body = _frozen_prefix(model) if not config.augmentation else (nn.Identity(), model)
    x_train = _transform(prefix, train_data.features, device)
    y_train = train_data.labels.to(device)
    x_eval = _transform(prefix, eval_data.features, device) if eval_data is not None else None
    y_eval = eval_data.labels.to(device) if eval_data is not None else None

    n = len(train_data)
    sample_gen = torch.Generator().manual_seed(config.seed)
    noise_gen = torch.Generator(device=device).manual_seed(config.seed + 1)
    aug_gen = torch.Generator().manual_seed(config.seed + 2)
    params = [p for p in body.parameters() if p.requires_grad]
    if not params:
        raise TrainingError("the model has no trainable parameters")
    optimizer = _optimizer(params, config)

    def per_example_loss(out: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(
            out, target, reduction="none", label_smoothing=config.label_smoothing
        )

    engine_loss: Callable[..., Tensor] = per_example_loss
    if regularizer is not None:

        def regularized_loss(out: Tensor, target: Tensor, inputs: tuple[Tensor, ...]) -> Tensor:
            losses = per_example_loss(out, target)
            term = regularizer(body, inputs[0], target, out)
            return losses + regularization_term(term, len(target), private=True)

        regularized_loss.takes_inputs = True  # type: ignore[attr-defined]
        engine_loss = regularized_loss

    engine: DPSGD | None = None
    sampler: PoissonSampler | ShuffleSampler
    spent_template: dict[str, Any] = {}
    step_limit: int | None = None
    q = min(1.0, config.batch_size / n)
    if privacy is not None and privacy.sampling == "poisson":
        sampler = PoissonSampler(n, q, generator=sample_gen)
    else:
        sampler = ShuffleSampler(n, config.batch_size, generator=sample_gen)
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
    checkpoint = Checkpoint(checkpoint_dir, json.dumps(config.to_dict(), sort_keys=True))
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
            xb, yb = x_train[index], y_train[index]
            if config.augmentation and xb.dim() == 4:
                xb = _augment(xb, config.rotation, config.translation, aug_gen)
            if engine is not None:
                loss_value: Tensor | float = engine.step(xb, yb).loss_mean
            else:
                optimizer.zero_grad(set_to_none=True)
                out = body(xb)
                loss = per_example_loss(out, yb).mean()
                if regularizer is not None:
                    term = regularization_term(regularizer(body, xb, yb, out), len(yb), False)
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
        train_loss, train_acc = _evaluate(body, x_train, y_train)
        eval_loss, eval_acc = (None, None)
        if x_eval is not None and y_eval is not None:
            eval_loss, eval_acc = _evaluate(body, x_eval, y_eval)
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
