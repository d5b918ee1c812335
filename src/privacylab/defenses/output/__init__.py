"""Output (post-processing) defences: one module per defence, each registered with
`@register_defense`; every module here is imported by `privacylab.defenses`.

Two helpers the defences share: `check_rows` (a one-line error for input that is not a 2-D
floating tensor of probability rows) and `first_max` (the label-keeping step of the defences
whose float arithmetic can make an earlier class tie with the model's arg-max)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from privacylab.defenses.base import DefenseError


def check_rows(defense: Any, probs: Any) -> None:
    """DefenseError (one line, naming `defense`) unless `probs` is a 2-D floating tensor, the
    (n, classes) probability rows every `OutputDefense.transform` takes."""
    if not isinstance(probs, Tensor):
        raise DefenseError(
            f"{defense.label}: expected a torch tensor of probability rows, got "
            f"{type(probs).__name__}"
        )
    if probs.ndim != 2 or not probs.is_floating_point():
        raise DefenseError(
            f"{defense.label}: expected floating probability rows of shape (n, classes), got "
            f"shape {tuple(probs.shape)} of {probs.dtype}"
        )


def first_max(rows: Tensor, label: Tensor) -> Tensor:
    """`rows` with the entry at `label` (n, 1) moved to the next float up in the rows where an
    earlier class equals it, so that `argmax` (the first maximum) is `label`. The entry at
    `label` must already be a maximum of its row (ties only: one float step lifts it above
    every other entry)."""
    moved = rows.argmax(1, keepdim=True) != label
    if not bool(moved.any()):
        return rows
    top = rows.gather(1, label)
    up = top.nextafter(top.new_full((), 2.0).expand_as(top))
    return rows.scatter(1, label, top.where(~moved, up))
