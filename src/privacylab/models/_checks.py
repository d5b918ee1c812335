"""Option checks shared by the model builders (one clear line per bad value)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from privacylab.models.errors import ModelError

MAX_WIDTH = 1 << 20
"""Widest hidden layer a builder accepts."""

MAX_PARAMETERS = 10**9
"""Most parameters a model may have (4 GB of float32 weights)."""

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


def activation_type(name: str, model: str) -> type[nn.Module]:
    """The activation class by name (relu, tanh, sigmoid), or ModelError."""
    if name not in ACTIVATIONS:
        raise ModelError(
            f"{model}: activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}"
        )
    return ACTIVATIONS[name]


def activation(name: str, model: str) -> nn.Module:
    """A fresh activation module by name (relu, tanh, sigmoid)."""
    return activation_type(name, model)()


def integer(label: str, value: object, minimum: int) -> int:
    """`value` as an int >= `minimum` (bools refused), or ModelError starting with `label`."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        number = None
    if isinstance(value, bool) or number is None or number < minimum:
        raise ModelError(f"{label} must be an integer >= {minimum}, got {value!r}")
    return int(number)


def positive_int(name: str, value: object, model: str) -> int:
    """`value` as an int >= 1, or ModelError."""
    return integer(f"{model}: {name}", value, 1)


def widths(value: object, model: str) -> tuple[int, ...]:
    """Hidden-layer widths as a tuple of ints >= 1 (possibly empty), or ModelError."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ModelError(f"{model}: widths must be a list of positive ints, got {value!r}")
    sizes = tuple(positive_int("widths entries", w, model) for w in value)
    if any(w > MAX_WIDTH for w in sizes):
        raise ModelError(
            f"{model}: widths entries must be at most {MAX_WIDTH:,}, got {list(sizes)}"
        )
    return sizes


def dropout(value: object, model: str) -> float:
    """A dropout probability in [0, 1), or ModelError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and 0 <= value < 1)
    ):
        raise ModelError(f"{model}: dropout must be a number in [0, 1), got {value!r}")
    return float(value)


def image_shape(input_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    """`input_shape` as (channels, height, width), or ModelError."""
    if len(input_shape) != 3:
        raise ModelError(f"{model} needs image inputs of shape (C, H, W), got {input_shape}")
    return input_shape  # type: ignore[return-value]


def flat_size(features: nn.Module, input_shape: tuple[int, ...], model: str) -> int:
    """The number of outputs of `features` for one example, found with a dummy forward pass."""
    with torch.no_grad():
        try:
            out = features(torch.zeros(1, *input_shape))
        except RuntimeError:
            raise ModelError(f"{model}: input_shape {input_shape} is too small") from None
    return int(out[0].numel())


def parameter_shapes(
    name: str, input_shape: Sequence[int], num_classes: int, options: dict[str, Any]
) -> dict[str, tuple[int, ...]] | None:
    """The state-dict shapes model `name` would have, found by building it on the meta device
    (no memory is allocated); ModelError for a bad name or option or more than
    `MAX_PARAMETERS` parameters. None when the builder cannot run on the meta device."""
    from privacylab.models.registry import build_model

    try:
        with torch.device("meta"):
            model = build_model(name, input_shape, num_classes, **options)
    except ModelError:
        raise
    except Exception:
        return None
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    count = sum(p.numel() for p in model.parameters())
    if count > MAX_PARAMETERS:
        raise ModelError(
            f"model {name!r} with options {options} would have {count:,} parameters, more than "
            f"the {MAX_PARAMETERS:,} allowed"
        )
    return shapes
