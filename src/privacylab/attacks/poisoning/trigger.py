"""Triggers: a pattern pasted into an image inside a mask, the one stamping rule of the family.

x' = (1 − α·m) ⊙ x + α·m ⊙ p at the trigger's location (Gu et al. 2017, "BadNets", Sec. 3.1:
a pixel pattern pasted in a corner; Liu et al. 2018, "Trojaning Attack on Neural Networks",
Sec. III-A: a mask M of some shape and size, and a transparency — α = 1 − transparency;
Carlini & Terzis 2022, Sec. 4.2: a patch at a fixed corner or at a random position).

Spec grammar (CLI `--trigger`): ``SHAPE:SIZE@POSITION[:OPACITY]`` —

- SHAPE: `square` (solid white), `pattern` (a black-and-white checkerboard, BadNets' pattern
  trigger), `logo` (an apple-like silhouette: a disc with a bite and a stalk, Liu et al.'s
  Apple logo), `watermark` (thin strokes, Liu et al.'s watermark shape);
- SIZE: the side of the trigger's square box in pixels;
- POSITION: `corner` (bottom-right), `random` (a uniformly drawn place per image, seeded), or
  `ROW,COL` (top-left pixel of the box);
- OPACITY α in (0, 1], 1 by default.

A bare `corner` or `random` means `square:4@corner` / `square:4@random`. A learned trigger
(the trojaning attack's, Neural Cleanse's reverse-engineered one) carries its own `pattern`
and `mask` tensors.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privacylab.errors import PrivacylabError

__all__ = [
    "DEFAULT_SIZE",
    "POSITIONS",
    "SHAPES",
    "Trigger",
    "TriggerError",
    "parse_trigger",
    "shape_mask",
]

SHAPES = ("square", "pattern", "logo", "watermark")
POSITIONS = ("corner", "random")
DEFAULT_SIZE = 4


class TriggerError(PrivacylabError, ValueError):
    """A trigger that cannot be built or does not fit the images; one line."""


def shape_mask(shape: str, size: int) -> Tensor:
    """The (size, size) mask in {0, 1} of a named shape (see the module docstring)."""
    if shape not in SHAPES:
        raise TriggerError(f"unknown trigger shape {shape!r}; choose one of {', '.join(SHAPES)}")
    if size < 1:
        raise TriggerError(f"trigger size must be a whole number >= 1, got {size!r}")
    if shape in ("square", "pattern") or size < 3:
        return torch.ones(size, size)
    centre = (size - 1) / 2
    rows = torch.arange(size, dtype=torch.float32).view(-1, 1)
    cols = torch.arange(size, dtype=torch.float32).view(1, -1)
    if shape == "logo":
        radius = size * 0.42
        body = (rows - centre - size * 0.08) ** 2 + (cols - centre) ** 2 <= radius**2
        bite = (rows - centre + radius * 0.1) ** 2 + (cols - centre - radius * 1.05) ** 2 <= (
            radius * 0.5
        ) ** 2
        stalk = (rows <= max(1, size // 6)) & ((cols - centre).abs() <= max(0.5, size / 12))
        return ((body & ~bite) | stalk).float()
    stride = max(2, size // 4)
    strokes = ((rows + cols) % stride == 0) | ((rows - cols) % (2 * stride) == 0)
    return strokes.float()


def _default_pattern(shape: str, size: int, channels: int) -> Tensor:
    if shape == "pattern":
        rows = torch.arange(size).view(-1, 1)
        cols = torch.arange(size).view(1, -1)
        board = ((rows + cols) % 2 == 0).float()
        return board.expand(channels, size, size).clone()
    return torch.ones(channels, size, size)


@dataclass(frozen=True)
class Trigger:
    """A trigger: `shape` and `size` (its box), `position`, opacity `alpha`; optionally a
    learned `pattern` (C, size, size) in [0, 1] and `mask` (size, size) in [0, 1] replacing
    the shape's defaults."""

    shape: str = "square"
    size: int = DEFAULT_SIZE
    position: str | tuple[int, int] = "corner"
    alpha: float = 1.0
    pattern: Tensor | None = field(default=None, compare=False, repr=False)
    mask: Tensor | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise TriggerError(
                f"unknown trigger shape {self.shape!r}; choose one of {', '.join(SHAPES)}"
            )
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise TriggerError(f"trigger size must be a whole number >= 1, got {self.size!r}")
        if isinstance(self.position, str):
            if self.position not in POSITIONS:
                raise TriggerError(
                    f"trigger position must be corner, random or ROW,COL, got {self.position!r}"
                )
        else:
            place = tuple(self.position) if isinstance(self.position, tuple | list) else ()
            whole = all(
                isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 0
                for v in place
            )
            if len(place) != 2 or not whole:
                raise TriggerError(
                    f"trigger position must be corner, random or two whole numbers >= 0, "
                    f"got {self.position!r}"
                )
            object.__setattr__(self, "position", (int(place[0]), int(place[1])))
        real = isinstance(self.alpha, int | float | np.integer | np.floating)
        alpha = float(self.alpha) if real and not isinstance(self.alpha, bool) else math.nan
        if not (math.isfinite(alpha) and 0.0 < alpha <= 1.0):
            raise TriggerError(f"trigger opacity must be in (0, 1], got {self.alpha!r}")
        object.__setattr__(self, "alpha", alpha)
        if self.mask is not None and tuple(self.mask.shape) != (self.size, self.size):
            raise TriggerError(f"trigger mask must be ({self.size}, {self.size})")
        if self.pattern is not None and (
            self.pattern.dim() != 3 or tuple(self.pattern.shape[1:]) != (self.size, self.size)
        ):
            raise TriggerError(f"trigger pattern must be (C, {self.size}, {self.size})")
        for name, values in (("mask", self.mask), ("pattern", self.pattern)):
            if values is not None and not bool(((values >= 0) & (values <= 1)).all()):
                raise TriggerError(f"a trigger {name} holds values outside [0, 1]")

    @property
    def spec(self) -> str:
        """The trigger in the spec grammar (a learned pattern is not part of it)."""
        where = self.position if isinstance(self.position, str) else "{},{}".format(*self.position)
        opacity = "" if self.alpha == 1.0 else f":{self.alpha:g}"
        return f"{self.shape}:{self.size}@{where}{opacity}"

    @property
    def learned(self) -> bool:
        """Whether the pattern or the mask is the attack's own rather than the shape's."""
        return self.pattern is not None or self.mask is not None

    def box_mask(self) -> Tensor:
        """The (size, size) mask m in [0, 1] (before opacity)."""
        return shape_mask(self.shape, self.size) if self.mask is None else self.mask.float()

    def box_pattern(self, channels: int) -> Tensor:
        """The (channels, size, size) pattern p in [0, 1]."""
        if self.pattern is None:
            return _default_pattern(self.shape, self.size, channels)
        if self.pattern.shape[0] not in (1, channels):
            raise TriggerError(
                f"trigger pattern has {self.pattern.shape[0]} channels, the images {channels}"
            )
        return self.pattern.float().expand(channels, self.size, self.size)

    def check(self, image_shape: tuple[int, ...]) -> None:
        """TriggerError unless the box fits inside (C, H, W) images at its position."""
        if len(image_shape) != 3:
            raise TriggerError(f"triggers stamp (C, H, W) images, got input shape {image_shape}")
        _, height, width = image_shape
        if self.size > min(height, width):
            raise TriggerError(
                f"trigger size {self.size} is larger than the {height}x{width} images"
            )
        if isinstance(self.position, tuple):
            row, col = self.position
            if row + self.size > height or col + self.size > width:
                raise TriggerError(
                    f"a {self.size}-pixel trigger at {row},{col} leaves the {height}x{width} image"
                )

    def places(
        self, count: int, image_shape: tuple[int, ...], generator: torch.Generator | None = None
    ) -> Tensor:
        """(count, 2) top-left corners of the box, one per image: fixed, or drawn uniformly
        over every place the box fits (`random`; `generator` makes it reproducible)."""
        self.check(image_shape)
        _, height, width = image_shape
        if self.position == "random":
            rows = torch.randint(0, height - self.size + 1, (count,), generator=generator)
            cols = torch.randint(0, width - self.size + 1, (count,), generator=generator)
            return torch.stack([rows, cols], dim=1)
        if self.position == "corner":
            row, col = height - self.size, width - self.size
        else:
            row, col = self.position  # type: ignore[misc]
        return torch.tensor([[row, col]]).expand(count, 2).clone()

    def stamp(
        self,
        images: Tensor,
        generator: torch.Generator | None = None,
        places: Tensor | None = None,
    ) -> Tensor:
        """A stamped copy of `images` (n, C, H, W): x' = (1 − α m) ⊙ x + α m ⊙ p inside the box,
        x outside it. `places` (n, 2) top-left corners override the drawn positions."""
        if images.dim() != 4:
            raise TriggerError(f"stamp needs (n, C, H, W) images, got shape {tuple(images.shape)}")
        n, channels = images.shape[:2]
        if places is None:
            where = self.places(n, tuple(images.shape[1:]), generator)
        else:
            self.check(tuple(images.shape[1:]))
            where = torch.as_tensor(places)
            _, _, height, width = images.shape
            inside = (
                where.shape == (n, 2)
                and bool((where >= 0).all())
                and bool((where[:, 0] <= height - self.size).all())
                and bool((where[:, 1] <= width - self.size).all())
            )
            if not inside:
                raise TriggerError(
                    f"places must be {n} top-left corners (row, col) that keep the "
                    f"{self.size}-pixel box inside the {height}x{width} images"
                )
        mask = (self.alpha * self.box_mask()).to(images)
        pattern = self.box_pattern(channels).to(images)
        out = images.clone()
        s = self.size
        for i, (row, col) in enumerate(where.tolist()):
            box = out[i, :, row : row + s, col : col + s]
            out[i, :, row : row + s, col : col + s] = (1 - mask) * box + mask * pattern
        return out

    def full_mask(self, image_shape: tuple[int, ...]) -> Tensor:
        """The (H, W) opacity map α·m at a fixed position (not `random`): where the trigger
        writes, for pictures and for defences that compare masks."""
        if self.position == "random":
            raise TriggerError("a random-position trigger has no fixed mask")
        _, height, width = image_shape
        (row, col) = self.places(1, image_shape)[0].tolist()
        canvas = torch.zeros(height, width)
        canvas[row : row + self.size, col : col + self.size] = self.alpha * self.box_mask()
        return canvas

    def with_pattern(self, pattern: Tensor, mask: Tensor | None = None) -> Trigger:
        """The same box with a learned `pattern` (and `mask`)."""
        return replace(self, pattern=pattern.detach().cpu().clamp(0, 1), mask=mask)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; a learned pattern and mask as nested lists."""
        data: dict[str, Any] = {"spec": self.spec}
        if self.pattern is not None:
            data["pattern"] = self.pattern.tolist()
        if self.mask is not None:
            data["mask"] = self.mask.tolist()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trigger:
        """Inverse of `to_dict`; TriggerError on a malformed entry."""
        if not isinstance(data, dict) or not isinstance(data.get("spec"), str):
            raise TriggerError("a saved trigger needs a 'spec' string")
        trigger = parse_trigger(data["spec"])
        try:
            pattern = None if data.get("pattern") is None else torch.tensor(data["pattern"])
            mask = None if data.get("mask") is None else torch.tensor(data["mask"])
        except (TypeError, ValueError) as error:
            raise TriggerError(f"a saved trigger's pattern or mask is malformed: {error}") from None
        if pattern is None and mask is None:
            return trigger
        return replace(trigger, pattern=pattern, mask=mask)


_SPEC = re.compile(
    r"^(?P<shape>[a-z]+):(?P<size>\d+)@(?P<where>corner|random|\d+,\d+)(?::(?P<alpha>[^:]+))?$"
)


def parse_trigger(spec: str | Trigger) -> Trigger:
    """A `Trigger` from the spec grammar of the module docstring; TriggerError naming the
    grammar on anything else."""
    if isinstance(spec, Trigger):
        return spec
    text = str(spec).strip().lower()
    if text in POSITIONS:
        return Trigger("square", DEFAULT_SIZE, text)
    match = _SPEC.match(text)
    if match is None:
        raise TriggerError(
            f"bad trigger {spec!r}; expected SHAPE:SIZE@POSITION[:OPACITY] with SHAPE one of "
            f"{', '.join(SHAPES)} and POSITION corner, random or ROW,COL (e.g. square:4@corner)"
        )
    where = match["where"]
    position: str | tuple[int, int] = (
        where if where in POSITIONS else tuple(int(v) for v in where.split(","))  # type: ignore[assignment]
    )
    alpha = 1.0
    if match["alpha"] is not None:
        try:
            alpha = float(match["alpha"])
        except ValueError:
            raise TriggerError(f"bad trigger opacity {match['alpha']!r} in {spec!r}") from None
    return Trigger(match["shape"], int(match["size"]), position, alpha)
