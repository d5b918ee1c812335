"""Models by name: builders register themselves with `@register_model`.

Every model's parameters live only in the module types of `PARAMETER_MODULES` (nn.Linear,
nn.Conv2d, nn.Embedding, nn.LayerNorm, nn.GroupNorm). The DP-SGD engine relies on this: its ghost
clipping computes per-example gradient norms layer by layer from a rule per module type, so a
parameter anywhere else would escape clipping. `build_model` checks it on every model it builds.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from privacylab.models._checks import integer
from privacylab.models.errors import ModelError
from privacylab.registry import Registry

PARAMETER_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Conv2d,
    nn.Embedding,
    nn.LayerNorm,
    nn.GroupNorm,
)

Builder = Callable[..., nn.Module]

MODELS: Registry[Builder] = Registry("model", error=ModelError, choices="available:")
"""Every model builder by name (names normalised as `privacylab.registry.Registry.key`)."""


def register_model(name: str) -> Callable[[Builder], Builder]:
    """Decorator registering `builder(input_shape, num_classes, **options) -> nn.Module`."""
    return MODELS.register(name)


def model_names() -> list[str]:
    """Names accepted by `build_model`, sorted."""
    return sorted(MODELS.names())


def model_options(name: str) -> dict[str, Any]:
    """The options model `name` accepts, with their defaults (`inspect.Parameter.empty` if none)."""
    return _options(_builder(name))


def unsupported_parameter_modules(model: nn.Module) -> list[str]:
    """Names of modules that hold parameters directly but are not of a `PARAMETER_MODULES` type."""
    return [
        f"{name or '<root>'} ({type(module).__name__})"
        for name, module in model.named_modules()
        if any(True for _ in module.parameters(recurse=False))
        and not isinstance(module, PARAMETER_MODULES)
    ]


def build_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    seed: int | None = None,
    **options: Any,
) -> nn.Module:
    """Build model `name` for examples of `input_shape` and `num_classes` classes.

    With `seed`, parameters are initialised from `torch.manual_seed(seed)` inside
    `torch.random.fork_rng`, so the same seed gives the same weights and the caller's global RNG
    state is left untouched. Unknown names and options, and bad values, raise ModelError. A name
    `package.module:function` builds the user's own model (`privacylab.models.factory`); its
    layers are not restricted here: the DP engine refuses what it cannot clip before training.
    """
    from privacylab.models.factory import build_from_factory, is_factory

    if is_factory(name):
        return build_from_factory(name, input_shape, num_classes, seed=seed, **options)
    builder = _builder(name)
    shape = _shape(input_shape)
    num_classes = integer("num_classes", num_classes, 2)
    accepted = _options(builder)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        allowed = ", ".join(accepted) or "none"
        raise ModelError(
            f"model {name!r} has no option {', '.join(unknown)}; its options: {allowed}"
        )
    missing = [k for k, v in accepted.items() if v is inspect.Parameter.empty and k not in options]
    if missing:
        raise ModelError(f"model {name!r} needs option {', '.join(missing)}")
    if seed is None:
        model = builder(shape, num_classes, **options)
    else:
        seed = integer("seed", seed, 0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = builder(shape, num_classes, **options)
    stray = unsupported_parameter_modules(model)
    if stray:
        raise ModelError(f"model {name!r} holds parameters outside the supported layers: {stray}")
    return model


def _builder(name: str) -> Builder:
    return MODELS.get(name)


def _options(builder: Builder) -> dict[str, Any]:
    parameters = list(inspect.signature(builder).parameters.values())[2:]
    return {p.name: p.default for p in parameters}


def _shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence):
        raise ModelError(f"input_shape must be a tuple of sizes, got {input_shape!r}")
    if not input_shape:
        raise ModelError("input_shape must not be empty")
    return tuple(integer("input_shape entries", s, 1) for s in input_shape)
