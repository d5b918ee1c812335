"""Trigger sets for ownership watermarks (Adi et al. 2018, "Turning Your Weakness Into a
Strength: Watermarking Deep Neural Networks by Backdooring", Sec. 4).

A trigger set is n inputs in the model's input domain, each with a label drawn uniformly at
random from the K classes, independently of the inputs and of any model (the paper's abstract
images with random labels, Sec. 5.1). Because the labels are drawn independently of everything
a model that never saw them depends on, such a model's prediction on each trigger equals its
label with probability exactly 1/K, independently across triggers: the null distribution of the
verification test (`privacylab.defenses.watermark.verify`) is exact.

Two kinds of inputs, both seeded:

- ``noise``: every feature independently uniform in [low, high];
- ``patterns``: abstract block images — a random coarse grid (2 to 4 cells a side over the last
  two axes, per channel) upsampled to the input's size, plus a little uniform noise, clipped to
  [low, high]. Closer to the paper's abstract images than white noise.

Storage: ``watermark.safetensors`` (tensors ``inputs``, ``labels``) and ``watermark.json`` (the
spec below and the weights' sha256), next to the model's own files; nothing is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load, save
from torch import Tensor

from privacylab.defenses.base import DefenseError
from privacylab.training.checkpoint import write_durably

__all__ = [
    "TRIGGER_FILE",
    "TRIGGER_KINDS",
    "TRIGGER_SPEC_FILE",
    "TriggerSet",
    "WatermarkError",
    "has_trigger_set",
    "load_trigger_set",
    "make_trigger_set",
    "save_trigger_set",
]

TRIGGER_KINDS = ("noise", "patterns")
TRIGGER_FORMAT = "privacylab-watermark/1"
TRIGGER_FILE = "watermark.safetensors"
TRIGGER_SPEC_FILE = "watermark.json"
MAX_TRIGGERS = 100_000
MAX_SPEC_BYTES = 1 << 20

PAPER = (
    "Adi, Baum, Cisse, Pinkas & Keshet 2018, Turning Your Weakness Into a Strength: "
    "Watermarking Deep Neural Networks by Backdooring (USENIX Security), Sec. 4-5"
)


class WatermarkError(DefenseError):
    """A bad trigger set, a damaged watermark file, or a suspect that does not fit it; one
    line."""


@dataclass(eq=False)
class TriggerSet:
    """n trigger inputs of shape `input_shape` with labels in [0, num_classes).

    `kind` and `seed` say how they were drawn (`make_trigger_set`), `low`/`high` the domain."""

    inputs: Tensor
    labels: Tensor
    num_classes: int
    kind: str = "noise"
    seed: int = 0
    low: float = 0.0
    high: float = 1.0
    paper: str = field(default=PAPER, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, Tensor) or not isinstance(self.labels, Tensor):
            raise WatermarkError("trigger inputs and labels must be torch tensors")
        if self.inputs.ndim < 2 or not self.inputs.is_floating_point():
            raise WatermarkError(
                f"trigger inputs must be a float tensor of shape (n, ...), got "
                f"{self.inputs.dtype} of shape {tuple(self.inputs.shape)}"
            )
        if self.labels.ndim != 1 or self.labels.dtype != torch.int64:
            raise WatermarkError(
                f"trigger labels must be a 1-D int64 tensor, got {self.labels.dtype} of shape "
                f"{tuple(self.labels.shape)}"
            )
        if len(self.inputs) != len(self.labels) or len(self.labels) == 0:
            raise WatermarkError(
                f"a trigger set needs as many labels as inputs (>= 1): {len(self.inputs)} "
                f"inputs, {len(self.labels)} labels"
            )
        if isinstance(self.num_classes, bool) or int(self.num_classes) < 2:
            raise WatermarkError(f"num_classes must be >= 2, got {self.num_classes!r}")
        self.num_classes = int(self.num_classes)
        if self.labels.min() < 0 or self.labels.max() >= self.num_classes:
            raise WatermarkError(f"trigger labels must lie in [0, {self.num_classes})")
        if not bool(torch.isfinite(self.inputs).all()):
            raise WatermarkError("trigger inputs contain NaN or infinite values")
        if self.kind not in TRIGGER_KINDS:
            raise WatermarkError(
                f"unknown trigger kind {self.kind!r}; choose one of {', '.join(TRIGGER_KINDS)}"
            )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one trigger input."""
        return tuple(int(s) for s in self.inputs.shape[1:])

    def spec(self) -> dict[str, Any]:
        """The JSON description stored beside the tensors (and in the model's sidecar)."""
        return {
            "format": TRIGGER_FORMAT,
            "kind": self.kind,
            "triggers": len(self),
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            "seed": self.seed,
            "low": self.low,
            "high": self.high,
            "labels": "uniform over the classes, independent of inputs and models",
            "paper": self.paper,
        }


def _check_domain(low: float, high: float) -> tuple[float, float]:
    try:
        low, high = float(low), float(high)
    except (TypeError, ValueError):
        raise WatermarkError(f"trigger bounds must be numbers, got {low!r}, {high!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise WatermarkError(f"trigger bounds must be finite with low < high, got {low}, {high}")
    return low, high


def make_trigger_set(
    input_shape: tuple[int, ...],
    num_classes: int,
    n: int = 100,
    *,
    seed: int = 0,
    kind: str = "noise",
    low: float = 0.0,
    high: float = 1.0,
) -> TriggerSet:
    """Draw a trigger set of `n` inputs of `input_shape` in [low, high] (Adi et al. 2018,
    Sec. 4: abstract images; `kind` "noise" or "patterns") and labels uniform over
    `num_classes` (Sec. 5.1: "random labels"), from `seed` alone.

    The labels come from their own random stream (numpy `SeedSequence(seed).spawn`), so they
    are independent of the inputs."""
    if kind not in TRIGGER_KINDS:
        raise WatermarkError(
            f"unknown trigger kind {kind!r}; choose one of {', '.join(TRIGGER_KINDS)}"
        )
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TRIGGERS:
        raise WatermarkError(f"the number of triggers must be in [1, {MAX_TRIGGERS:,}], got {n!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise WatermarkError(f"num_classes must be a whole number >= 2, got {num_classes!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise WatermarkError(f"the trigger seed must be a whole number >= 0, got {seed!r}")
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s < 1 for s in shape):
        raise WatermarkError(f"input_shape must be positive sizes, got {input_shape!r}")
    low, high = _check_domain(low, high)
    input_stream, label_stream = np.random.SeedSequence(seed).spawn(2)
    rng = np.random.default_rng(input_stream)
    unit = rng.random((n, *shape)) if kind == "noise" else _patterns(rng, n, shape)
    inputs = torch.from_numpy(low + (high - low) * unit).float()
    labels = torch.from_numpy(np.random.default_rng(label_stream).integers(0, num_classes, n))
    return TriggerSet(inputs, labels.to(torch.int64), num_classes, kind, seed, low, high)


def _patterns(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """Abstract block images in [0, 1]: a random grid of 2-4 cells a side over the last two
    axes (one axis for 1-D inputs), upsampled by nearest neighbour, plus 10% uniform noise."""
    spatial = shape[-2:] if len(shape) >= 2 else shape
    lead = shape[: len(shape) - len(spatial)]
    out = np.empty((n, *shape))
    for i in range(n):
        cells = [int(rng.integers(2, 5)) for _ in spatial]
        coarse = torch.from_numpy(rng.random((1, math.prod(lead) or 1, *cells)))
        mode = "nearest"
        fine = F.interpolate(coarse, size=tuple(spatial), mode=mode)[0].numpy()
        out[i] = fine.reshape(shape)
    out = 0.9 * out + 0.1 * rng.random(out.shape)
    return np.clip(out, 0.0, 1.0)


def save_trigger_set(trigger: TriggerSet, folder: str | Path) -> Path:
    """Write `trigger` to `folder` as ``watermark.safetensors`` + ``watermark.json`` (the spec
    and the tensors' sha256); returns the spec's path."""
    folder = Path(folder)
    tensors = {
        "inputs": trigger.inputs.detach().cpu().float().contiguous(),
        "labels": trigger.labels.detach().cpu().contiguous(),
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        blob = save(tensors, metadata={"privacylab": TRIGGER_FORMAT})
        spec = {**trigger.spec(), "weights": TRIGGER_FILE}
        spec["sha256"] = hashlib.sha256(blob).hexdigest()
        write_durably(folder / TRIGGER_FILE, blob)
        write_durably(folder / TRIGGER_SPEC_FILE, (json.dumps(spec, indent=2) + "\n").encode())
    except OSError as error:
        raise WatermarkError(f"cannot save the trigger set to {folder}: {error}") from None
    return folder / TRIGGER_SPEC_FILE


def has_trigger_set(folder: str | Path) -> bool:
    """Whether `folder` holds a trigger set's spec file."""
    return (Path(folder) / TRIGGER_SPEC_FILE).is_file()


def load_trigger_set(folder: str | Path) -> TriggerSet:
    """The trigger set `save_trigger_set` wrote to `folder` (or the spec file itself), checked:
    format, sha256, tensor names, shapes and label range; WatermarkError with one line."""
    folder = Path(folder)
    if folder.is_file() and folder.name in (TRIGGER_SPEC_FILE, TRIGGER_FILE):
        folder = folder.parent
    spec_path = folder / TRIGGER_SPEC_FILE
    if not spec_path.is_file():
        raise WatermarkError(
            f"no watermark at {folder}: expected {TRIGGER_SPEC_FILE} and {TRIGGER_FILE} there "
            "(written by `privacylab watermark embed`)"
        )
    try:
        if spec_path.stat().st_size > MAX_SPEC_BYTES:
            raise WatermarkError(f"corrupt watermark spec {spec_path}: too large")
        spec = json.loads(spec_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WatermarkError(f"corrupt watermark spec {spec_path}: {error}") from None
    if not isinstance(spec, dict) or spec.get("format") != TRIGGER_FORMAT:
        raise WatermarkError(f"{spec_path}: not a {TRIGGER_FORMAT} spec")
    weights = folder / TRIGGER_FILE
    try:
        blob = weights.read_bytes()
    except OSError as error:
        raise WatermarkError(f"cannot read {weights}: {error.strerror or error}") from None
    if spec.get("sha256") != hashlib.sha256(blob).hexdigest():
        raise WatermarkError(f"{weights} does not match the sha256 in {spec_path}")
    try:
        tensors = load(blob)
    except Exception as error:  # safetensors raises its own error types
        raise WatermarkError(f"corrupt trigger file {weights}: {error}") from None
    if set(tensors) != {"inputs", "labels"}:
        raise WatermarkError(f"{weights}: expected tensors 'inputs' and 'labels'")
    try:
        trigger = TriggerSet(
            tensors["inputs"],
            tensors["labels"],
            int(spec["num_classes"]),
            str(spec["kind"]),
            int(spec["seed"]),
            float(spec["low"]),
            float(spec["high"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, WatermarkError):
            raise
        raise WatermarkError(f"corrupt watermark spec {spec_path}: {error}") from None
    if len(trigger) != spec.get("triggers") or list(trigger.input_shape) != spec.get("input_shape"):
        raise WatermarkError(f"{weights} does not match the sizes in {spec_path}")
    return trigger
