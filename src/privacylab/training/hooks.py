"""Trainer hooks: a per-example regulariser added to the loss, and callbacks that see an explicit
training state after every step and epoch and may stop the run.

Training-time defences and attacks are options of the one trainer, not forks of it: adversarial
regularisation (Nasr et al. 2018, eq. 7: the loss plus λ times an inference gain), MixUp+MMD
(Li et al. 2021), early stopping, or backdoor retraining (Gu et al. 2017) are a `Regularizer`
and/or a `Callback`.

Regulariser contract: ``regularizer(model, x, y, logits) -> Tensor`` returns one value per
example, shape (B,), added to the per-example loss; without DP a scalar (one value for the whole
batch, e.g. λ‖w‖²) is also accepted and added to the mean loss. Under DP-SGD (Abadi et al. 2016,
Alg. 1) every example's gradient is clipped, so the regulariser must be per-example — a scalar is
refused — and it must reach the trainable parameters only through ``logits`` (the model is given
for reading; calling it again, or a term of the weights themselves such as λ‖w‖², is not an
example's loss and is not clipped correctly: use ``weight_decay``, which is post-processing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from privacylab.accounting.events import Event
from privacylab.training.config import TrainingError

if TYPE_CHECKING:
    from privacylab.training.trainer import EpochRecord

Regularizer = Callable[[nn.Module, Tensor, Tensor, Tensor], Tensor]
"""``regularizer(model, x, y, logits) -> (B,) or scalar`` — see the module docstring."""


@dataclass
class TrainState:
    """What a callback sees: the run so far, and a way to stop it.

    Attributes:
        epoch: the epoch in progress (1-based); after `on_epoch_end` it has finished.
        step: optimizer steps taken so far in the whole run.
        model: the model being trained (the full model, in train mode during an epoch).
        optimizer: its optimizer.
        privacy_event: composition of the privacy events executed so far (None without DP).
        loss: mean loss of the last step's batch (`on_step_end`), else None.
        record: the epoch's record (`on_epoch_end`), else None.
    """

    epoch: int
    step: int
    model: nn.Module
    optimizer: torch.optim.Optimizer
    privacy_event: Event | None = None
    loss: float | None = None
    record: EpochRecord | None = None
    stop_reason: str | None = None
    _epsilon: Callable[[], float | None] = field(default=lambda: None, repr=False)

    @property
    def epsilon(self) -> float | None:
        """ε spent so far by the run's accountant at its δ (None without DP or before a step);
        computed on first access."""
        return self._epsilon()

    def request_stop(self, reason: str) -> None:
        """Stop training after this step or epoch; `reason` becomes the result's `stopped`."""
        if not isinstance(reason, str) or not reason:
            raise TrainingError("request_stop needs a non-empty reason")
        self.stop_reason = reason


class Callback:
    """Base class of trainer callbacks; override either method (both do nothing by default).

    A callback's own state is its own: a resumed run calls it only for the epochs it runs.
    """

    def on_step_end(self, state: TrainState) -> None:
        """Called after every optimizer step."""

    def on_epoch_end(self, state: TrainState) -> None:
        """Called after every epoch, once it is evaluated and before it is checkpointed."""


def check_callbacks(callbacks: Any) -> tuple[Callback, ...]:
    """The callbacks as a tuple, each having callable `on_step_end` or `on_epoch_end`."""
    items = tuple(callbacks or ())
    for item in items:
        if not any(callable(getattr(item, m, None)) for m in ("on_step_end", "on_epoch_end")):
            raise TrainingError(
                f"a callback needs on_step_end or on_epoch_end, got {type(item).__name__}"
            )
    return items


def regularization_term(value: object, batch: int, private: bool) -> Tensor:
    """The regulariser's output checked: (B,) always, a scalar only without DP."""
    if not isinstance(value, Tensor):
        raise TrainingError(f"the regulariser must return a tensor, got {type(value).__name__}")
    if tuple(value.shape) == (batch,):
        return value
    if value.dim() == 0 and not private:
        return value
    shape = tuple(value.shape)
    if value.dim() == 0:
        raise TrainingError(
            "under DP-SGD the regulariser must return one value per example, shape "
            f"({batch},), not a scalar: each example's gradient is clipped on its own"
        )
    raise TrainingError(f"the regulariser must return shape ({batch},) or a scalar, got {shape}")
