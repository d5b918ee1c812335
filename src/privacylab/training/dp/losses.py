"""Per-example losses: the one contract both clipping strategies rely on."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from privacylab.training.dp.errors import DPSGDError


def per_example_losses(
    loss_fn: Callable[[Tensor, Tensor], Tensor], outputs: Tensor, targets: Tensor, batch: int
) -> Tensor:
    """``loss_fn(outputs, targets)`` checked to be a (B,) vector of per-example losses.

    DP-SGD clips each example's gradient, so the loss must not be reduced over the batch
    (use e.g. ``nn.CrossEntropyLoss(reduction='none')``).
    """
    losses = loss_fn(outputs, targets)
    if not isinstance(losses, Tensor) or tuple(losses.shape) != (batch,):
        shape = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
        raise DPSGDError(
            f"loss_fn must return per-example losses of shape ({batch},), got {shape}; "
            "use reduction='none'"
        )
    return losses
