"""`ModelSpec`: what `build_model` needs to rebuild a model, in JSON-ready form."""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from privacylab.models.errors import ModelError
from privacylab.models.registry import build_model
from privacylab.models.transforms import apply_transforms


@dataclass(frozen=True)
class ModelSpec:
    """A model's registry name, input shape, class count and builder options.

    Options are stored as their JSON form (tuples become lists), so a spec equals the spec read
    back from its `to_dict()`.
    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    options: dict[str, Any] = field(default_factory=dict)
    transforms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ModelError(f"model spec name must be a non-empty string, got {self.name!r}")
        try:
            shape = tuple(operator.index(s) for s in self.input_shape)
            num_classes = operator.index(self.num_classes)
            options = json.loads(json.dumps(dict(self.options)))
        except (TypeError, ValueError) as error:
            raise ModelError(
                f"model spec {self.name!r}: input_shape and num_classes must be integers and "
                f"options JSON-serialisable ({error})"
            ) from None
        object.__setattr__(self, "input_shape", shape)
        object.__setattr__(self, "num_classes", num_classes)
        object.__setattr__(self, "options", options)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {
            "name": self.name,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "options": dict(self.options),
            **({"transforms": list(self.transforms)} if self.transforms else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        """The spec a `to_dict()` wrote, or ModelError naming what is wrong."""
        if not isinstance(data, Mapping):
            raise ModelError(f"model spec must be a JSON object, got {type(data).__name__}")
        missing = [k for k in ("name", "input_shape", "num_classes") if k not in data]
        if missing:
            raise ModelError(f"model spec lacks {', '.join(missing)}")
        shape, options = data["input_shape"], data.get("options", {})
        if not isinstance(shape, list | tuple) or not isinstance(options, Mapping):
            raise ModelError("model spec: input_shape must be a list and options an object")
        transforms = data.get("transforms", [])
        if not isinstance(transforms, list | tuple) or not all(
            isinstance(t, str) for t in transforms
        ):
            raise ModelError("model spec: transforms must be a list of names")
        return cls(
            data["name"], tuple(shape), data["num_classes"], dict(options), tuple(transforms)
        )

    def build(self, *, seed: int | None = None) -> nn.Module:
        """`build_model(name, input_shape, num_classes, seed=seed, **options)`, then the
        `transforms` in order (`privacylab.models.transforms`)."""
        model = build_model(
            self.name, self.input_shape, self.num_classes, seed=seed, **self.options
        )
        return apply_transforms(model, self.transforms)
