"""Named model transforms applied after a model is built (`ModelSpec.transforms`).

A transform rewrites the architecture of a freshly built model — e.g. DP-SGD's `fix` replaces
BatchNorm by GroupNorm and stock recurrent layers by their DP drop-ins — so a saved model records
the transforms by name and `load_model` rebuilds the same architecture before loading weights.
Transforms are registered by the package that defines them (training registers ``"dp-fix"``);
this module imports nothing above `models`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from privacylab.models.errors import ModelError
from privacylab.registry import Registry

Transform = Callable[[nn.Module], nn.Module]

TRANSFORMS: Registry[Transform] = Registry("model transform", error=ModelError)
"""Every model transform by name."""

PROVIDERS: dict[str, str] = {"dp-fix": "privacylab.training"}
"""Where a transform is registered, for the error message when it is not (yet) imported."""


def register_transform(name: str) -> Callable[[Transform], Transform]:
    """Decorator registering `transform(model) -> model` under `name`."""
    return TRANSFORMS.register(name)


def apply_transforms(model: nn.Module, names: Sequence[str]) -> nn.Module:
    """`model` after each named transform in turn; ModelError for an unregistered name."""
    for name in names:
        if name not in TRANSFORMS:
            where = PROVIDERS.get(name)
            hint = f" (import {where} first)" if where else ""
            raise ModelError(f"model transform {name!r} is not registered{hint}")
        model = TRANSFORMS[name](model)
    return model
