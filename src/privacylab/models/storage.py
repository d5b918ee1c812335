"""Saving and loading models as safetensors weights plus a JSON sidecar; nothing is unpickled.

A saved model is a folder holding

- `model.safetensors`: the state dict, written by `safetensors.torch.save`;
- `model.json`: `{"format": "privacylab-model/1", "spec": ModelSpec.to_dict(), "metadata": {...},
  "weights": "model.safetensors", "sha256": <hex digest of the weights file>}`, where metadata is
  free-form JSON (training config, data, privacy spent).

Loading rebuilds the architecture from the spec through the model registry and fills it with
`safetensors.torch.load`, so no file can make the loader run code (no torch.load, no pickle).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save
from torch import nn

from privacylab.models._checks import parameter_shapes
from privacylab.models.errors import ModelError
from privacylab.models.spec import ModelSpec

FORMAT = "privacylab-model/1"
WEIGHTS_FILE = "model.safetensors"
SIDECAR_FILE = "model.json"


def save_model(
    model: nn.Module,
    path: str | Path,
    spec: ModelSpec,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write `model` to the folder `path` (created if needed); returns the folder.

    The weights must fit `spec` (same parameter names and shapes), so that `load_model` can
    rebuild the model; both files are written to temporary names and renamed into place.
    """
    if not isinstance(spec, ModelSpec):
        raise ModelError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ModelError(f"metadata must be a dict, got {type(metadata).__name__}")
    try:
        sidecar: dict[str, Any] = {
            "format": FORMAT,
            "spec": spec.to_dict(),
            "metadata": json.loads(json.dumps(dict(metadata or {}))),
        }
    except (TypeError, ValueError) as error:
        raise ModelError(f"metadata is not JSON-serialisable: {error}") from None
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    _check_fits(spec, spec.build(seed=0), tensors, "the model to save")
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        blob = save(tensors, metadata={"format": "pt", "privacylab": FORMAT})
        sidecar["weights"] = WEIGHTS_FILE
        sidecar["sha256"] = hashlib.sha256(blob).hexdigest()
        _write_durably(folder / WEIGHTS_FILE, blob)
        text = json.dumps(sidecar, indent=2, sort_keys=True) + "\n"
        _write_durably(folder / SIDECAR_FILE, text.encode("utf-8"))
    except (OSError, RuntimeError) as error:
        raise ModelError(f"cannot save model to {folder}: {error}") from None
    return folder


def _write_durably(path: Path, blob: bytes) -> None:
    """Replace `path` by `blob`: write `<name>.partial`, fsync it, ``os.replace`` it into place,
    fsync the folder. The sidecar is committed last and holds the weights' sha256, so a kill
    between the two commits leaves a pair that `load_model` rejects, never a silent mismatch."""
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(blob)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial, path)
    try:
        folder_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(folder_fd)
    except OSError:
        pass
    finally:
        os.close(folder_fd)


def load_model(
    path: str | Path, *, device: str | torch.device = "cpu"
) -> tuple[nn.Module, ModelSpec, dict[str, Any]]:
    """`(model, spec, metadata)` from a folder written by `save_model` (or a file in it).

    The model is returned in eval mode on `device`. Missing or corrupt files, an unknown format
    and weights that do not fit the spec raise ModelError with one line.
    """
    folder = Path(path)
    if folder.is_file() and folder.name in (SIDECAR_FILE, WEIGHTS_FILE):
        folder = folder.parent
    sidecar_path = folder / SIDECAR_FILE
    if not sidecar_path.is_file():
        raise ModelError(
            f"no saved model at {folder}: expected {SIDECAR_FILE} and {WEIGHTS_FILE} there"
        )
    sidecar = _read_sidecar(sidecar_path)
    spec = ModelSpec.from_dict(sidecar["spec"])
    metadata = sidecar.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ModelError(f"corrupt model sidecar {sidecar_path}: metadata is not an object")
    weights_name = sidecar.get("weights", WEIGHTS_FILE)
    if not isinstance(weights_name, str) or not weights_name:
        raise ModelError(f"corrupt model sidecar {sidecar_path}: weights is not a file name")
    weights = folder / weights_name
    if weights.name != weights_name or not weights.is_file():
        raise ModelError(f"no weights file {weights} next to {sidecar_path}")
    expected = sidecar.get("sha256")
    if expected is not None and not isinstance(expected, str):
        raise ModelError(f"corrupt model sidecar {sidecar_path}: sha256 is not a string")
    try:
        blob = weights.read_bytes()
    except OSError as error:
        raise ModelError(f"cannot read weights file {weights}: {error.strerror}") from None
    if expected is not None and hashlib.sha256(blob).hexdigest() != expected:
        raise ModelError(f"weights file {weights} does not match the sha256 in {sidecar_path}")
    header = _safetensors_header(blob, weights)
    if not spec.transforms:  # a transformed architecture is checked once built, below
        shapes = parameter_shapes(spec.name, spec.input_shape, spec.num_classes, spec.options)
        if shapes is not None:
            _check_shapes(spec, shapes, header, str(weights))
    try:
        tensors = load(blob)
    except Exception as error:
        raise ModelError(f"corrupt weights file {weights}: {error}") from None
    model = spec.build(seed=0)
    _check_fits(spec, model, tensors, str(weights))
    model.load_state_dict(tensors, strict=True)
    return model.to(device).eval(), spec, metadata


MAX_SIDECAR_BYTES = 64 * 1024**2
"""Largest sidecar read (a sidecar holds a spec and metadata: kilobytes)."""

MAX_HEADER_BYTES = 100 * 1024**2
"""Largest safetensors header read (the format's own limit)."""

SAFETENSORS_DTYPES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
"""Item size of each safetensors dtype."""


def _safetensors_header(blob: bytes, path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """`{name: (dtype, shape)}` from a safetensors file's JSON header, checked against the
    file's size (every tensor's bytes inside the file, sizes matching shapes) before any tensor
    is built: a damaged file is refused without allocating what it claims."""
    bad = f"corrupt weights file {path}"
    size = len(blob)
    if size < 8:
        raise ModelError(f"{bad}: shorter than a safetensors header")
    length = int.from_bytes(blob[:8], "little")
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise ModelError(f"{bad}: header of {length:,} bytes in a {size:,}-byte file")
    raw = blob[8 : 8 + length]
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelError(f"{bad}: header is not JSON") from None
    if not isinstance(header, dict):
        raise ModelError(f"{bad}: header is not a JSON object")
    data = size - 8 - length
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ModelError(f"{bad}: entry {name!r} is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in SAFETENSORS_DTYPES:
            raise ModelError(f"{bad}: tensor {name!r} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ModelError(f"{bad}: tensor {name!r} has shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data
            or offsets[1] - offsets[0] != math.prod(shape) * SAFETENSORS_DTYPES[dtype]
        ):
            raise ModelError(f"{bad}: tensor {name!r} does not fit its bytes in the file")
        out[name] = (dtype, tuple(shape))
    return out


def _check_shapes(
    spec: ModelSpec,
    reference: Mapping[str, tuple[int, ...]],
    header: Mapping[str, tuple[str, tuple[int, ...]]],
    where: str,
) -> None:
    _check_fits_shapes(spec, reference, {k: shape for k, (_, shape) in header.items()}, where)


def _read_sidecar(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_SIDECAR_BYTES:
            raise ModelError(
                f"corrupt model sidecar {path}: larger than {MAX_SIDECAR_BYTES:,} bytes"
            )
        sidecar = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelError(f"corrupt model sidecar {path}: {error}") from None
    if not isinstance(sidecar, dict):
        raise ModelError(f"corrupt model sidecar {path}: not a JSON object")
    if sidecar.get("format") != FORMAT:
        raise ModelError(
            f"{path}: unsupported format {sidecar.get('format')!r}, expected {FORMAT!r}"
        )
    if "spec" not in sidecar:
        raise ModelError(f"corrupt model sidecar {path}: no spec")
    return sidecar


def _check_fits(
    spec: ModelSpec, model: nn.Module, tensors: Mapping[str, torch.Tensor], where: str
) -> None:
    reference = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    _check_fits_shapes(spec, reference, {k: tuple(v.shape) for k, v in tensors.items()}, where)


def shape_mismatch(
    reference: Mapping[str, tuple[int, ...]], tensors: Mapping[str, tuple[int, ...]]
) -> list[str]:
    """What keeps the tensor shapes `tensors` from filling a model whose state dict has the
    shapes `reference`: missing, unexpected and resized entries (empty when they fit)."""
    missing = sorted(set(reference) - set(tensors))
    unexpected = sorted(set(tensors) - set(reference))
    resized = sorted(
        f"{k} {tensors[k]} != {reference[k]}"
        for k in set(reference) & set(tensors)
        if tensors[k] != reference[k]
    )
    return [
        f"{label}: {', '.join(items[:5])}{' ...' if len(items) > 5 else ''}"
        for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", resized))
        if items
    ]


def _check_fits_shapes(
    spec: ModelSpec,
    reference: Mapping[str, tuple[int, ...]],
    tensors: Mapping[str, tuple[int, ...]],
    where: str,
) -> None:
    problems = shape_mismatch(reference, tensors)
    if problems:
        raise ModelError(f"weights of {where} do not fit spec {spec.name!r}: {'; '.join(problems)}")
