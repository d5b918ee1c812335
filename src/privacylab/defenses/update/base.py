"""What a federated client does to its update before sending it (`privacylab.federated`'s
`ClientDefense`): add noise, prune, quantise, or train locally with DP-SGD.

The defences of Zhu et al. 2019 (Deep Leakage from Gradients, Sec. 5) against gradient
inversion, plus DP-SGD inside the client (Abadi et al. 2016, Alg. 1). Each is a small `Defense`
of kind "update" (same `Parameter` checks and spec grammar as the output and training defences)
in its own registry, `UPDATE_DEFENSES`: the names "noise" and "dp" already mean output noise and
DP training in `privacylab.defenses.DEFENSES`. `parse_update_defense("noise:1e-2")` builds one
from the CLI's spelling; "none" is None (the client sends its update unchanged).

`apply(update, generator)` returns new tensors (the caller's dict and tensors are never
written), drawing all randomness from `generator`, so one seed gives one update.
`local_privacy(...)` tells the client how to train (None: as usual; `LocalPrivacy`: DP-SGD).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from privacylab.defenses.base import Defense, DefenseError, _fmt, parse_defense
from privacylab.federated.protocol import LocalPrivacy, LocalTraining
from privacylab.registry import Registry

__all__ = [
    "UPDATE_DEFENSES",
    "UpdateDefense",
    "check_update",
    "draw",
    "make_update_defense",
    "parse_update_defense",
    "register_update_defense",
    "update_defense_names",
]


class UpdateDefense(Defense):
    """A transformation a federated client applies to its update (kind "update").

    Subclasses implement `transform(tensor, generator)` for one tensor (a new tensor, same
    shape, dtype and device), or override `apply`; a defence that changes the local training
    overrides `local_privacy`. A parameter whose default is None must be given. `spec` is the
    canonical CLI spelling: the first parameter positional, the others as `key=value` where
    they differ from their default (`noise:0.01`, `dp:8:clip=0.5`, `fp16`), and
    `parse_update_defense(d.spec)` rebuilds `d`.
    """

    kind = "update"
    changes = ("updates",)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        missing = [p.name for p in self.parameters if self.params[p.name] is None]
        if missing:
            raise DefenseError(
                f"{self.name} needs its {missing[0]} ({self.name}:{missing[0].upper()})"
            )

    @property
    def spec(self) -> str:
        parts = [self.name]
        for i, p in enumerate(self.parameters):
            value = self.params[p.name]
            if i == 0:
                parts.append(_fmt(value))
            elif value != p.default:
                parts.append(f"{p.name}={_fmt(value)}")
        return ":".join(parts)

    @property
    def label(self) -> str:
        return self.spec

    def local_privacy(
        self, *, training: LocalTraining, examples: int, rounds: int
    ) -> LocalPrivacy | None:
        """How the client trains locally under this defence (default: unchanged, None)."""
        return None

    def transform(self, tensor: Tensor, generator: torch.Generator) -> Tensor:
        """The defended form of one update tensor (default: the tensor itself)."""
        return tensor

    def apply(self, update: Mapping[str, Tensor], generator: torch.Generator) -> dict[str, Tensor]:
        """The update as sent: `transform` of each tensor, in `update`'s order, as new
        tensors (the caller's are never written)."""
        out: dict[str, Tensor] = {}
        for name, tensor in check_update(update).items():
            result = self.transform(tensor.detach(), generator)
            shares = result.numel() and result.data_ptr() == tensor.data_ptr()
            out[name] = result.clone() if shares else result
        return out

    def __call__(
        self, update: Mapping[str, Tensor], generator: torch.Generator
    ) -> dict[str, Tensor]:
        return self.apply(update, generator)


def check_update(update: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
    """`update` if it maps names to floating-point tensors, else one-line DefenseError."""
    if not isinstance(update, Mapping):
        raise DefenseError(f"an update is a dict of name -> tensor, got {type(update).__name__}")
    for name, tensor in update.items():
        if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
            kind = tensor.dtype if isinstance(tensor, Tensor) else type(tensor).__name__
            raise DefenseError(f"update {name!r} must be a floating-point tensor, got {kind}")
    return update


def draw(tensor: Tensor, generator: torch.Generator, sample: str, scale: float) -> Tensor:
    """Noise shaped like `tensor` (its dtype and device), drawn from `generator` on the
    generator's own device: `sample` "gaussian" (standard deviation `scale`) or "laplace"
    (scale b = `scale`, as b·(E1 − E2) with E1, E2 standard exponentials)."""
    if not isinstance(generator, torch.Generator):
        got = type(generator).__name__
        raise DefenseError(f"a noisy update needs a torch.Generator, got {got}")
    dtype = tensor.dtype if tensor.dtype in (torch.float32, torch.float64) else torch.float32
    shape, where = tuple(tensor.shape), generator.device
    if sample == "gaussian":
        noise = torch.randn(shape, generator=generator, dtype=dtype, device=where)
    else:
        pair = torch.empty((2, *shape), dtype=dtype, device=where).exponential_(
            1.0, generator=generator
        )
        noise = pair[0] - pair[1]
    return (noise * scale).to(device=tensor.device, dtype=tensor.dtype)


UPDATE_DEFENSES: Registry[type[UpdateDefense]] = Registry(
    "update defense", error=DefenseError, choices="choose none or one of"
)
"""Every update defence class by name ("none" is not an entry: it is no defence)."""


def register_update_defense(cls: type[UpdateDefense]) -> type[UpdateDefense]:
    """Class decorator: make an update defence buildable by name (`cls.name`) and spec."""
    return UPDATE_DEFENSES.register(cls.name, cls)


def update_defense_names() -> list[str]:
    """ "none" and the registered update defences, in registration order."""
    return ["none", *UPDATE_DEFENSES.names()]


def make_update_defense(name: str, **params: Any) -> UpdateDefense:
    """The update defence `name` with `params`, or DefenseError."""
    return UPDATE_DEFENSES.make(name, **params)


def parse_update_defense(spec: str | None) -> UpdateDefense | None:
    """The update defence of `spec` (`noise:1e-2`, `laplace:1e-3`, `prune:0.2`, `fp16`,
    `int8`, `dp:8`, `dp:8:clip=0.5:delta=1e-6`): `name`, then `:`-separated values,
    positional in the class's `parameters` order or `key=value` — the grammar of
    `privacylab.defenses.parse_defense`. None or "none": None. Bad specs: one-line
    DefenseError."""
    if spec is None:
        return None
    if not isinstance(spec, str) or not spec.strip():
        raise DefenseError(
            f"empty update defence spec; write none or one of {', '.join(UPDATE_DEFENSES)}"
        )
    name, *values = [part.strip() for part in spec.strip().split(":")]
    if UPDATE_DEFENSES.key(name) == "none":
        if values:
            raise DefenseError(f"{spec!r}: none takes no parameters")
        return None
    return parse_defense(spec, UPDATE_DEFENSES)  # type: ignore[return-value]
