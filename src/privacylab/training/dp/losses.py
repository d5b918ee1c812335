"""Per-example losses: the one contract both clipping strategies rely on."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from privacylab.training.dp.errors import DPSGDError


def per_example_losses(
    loss_fn: Callable[..., Tensor],
    outputs: Tensor,
    targets: Tensor,
    batch: int,
    inputs: tuple[Tensor, ...] = (),
) -> Tensor:
    """``loss_fn(outputs, targets)`` checked to be a (B,) vector of per-example losses.

    DP-SGD clips each example's gradient, so the loss must not be reduced over the batch
    (use e.g. ``nn.CrossEntropyLoss(reduction='none')``).  A loss_fn with the attribute
    ``takes_inputs = True`` is called as ``loss_fn(outputs, targets, inputs)``, where inputs are
    the same examples' model inputs (how the trainer adds a per-example regulariser).
    """
    if getattr(loss_fn, "takes_inputs", False):
        losses = loss_fn(outputs, targets, inputs)
    else:
        losses = loss_fn(outputs, targets)
    if not isinstance(losses, Tensor) or tuple(losses.shape) != (batch,):
        shape = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
        raise DPSGDError(
            f"loss_fn must return per-example losses of shape ({batch},), got {shape}; "
            "use reduction='none'"
        )
    return losses
