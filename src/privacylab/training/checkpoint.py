"""Per-epoch training checkpoints that are one atomic unit.

Everything a resumed run needs — model weights, optimizer slots, the random generators' states
(as uint8 tensors) and the bookkeeping (epoch, steps, history, the ledger of privacy events
executed) — goes into ONE safetensors file, the bookkeeping as a JSON string in its metadata.
The file is written under a temporary name, flushed to disk (fsync), and committed by a single
``os.replace``; the folder is then fsynced so that the rename itself survives a power cut. A kill
at any point leaves either the previous checkpoint or the new one, never weights of epoch k with
the bookkeeping of epoch k−1 (which would report fewer DP steps, and a smaller ε, than were
taken). Nothing is unpickled: the file is read with ``safetensors`` and ``json``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save
from torch import Tensor, nn

from privacylab.training.config import TrainingError

CHECKPOINT_FORMAT = "privacylab-checkpoint/2"
CHECKPOINT_FILE = "checkpoint.safetensors"
PARTIAL_SUFFIX = ".partial"
_METADATA_KEY = "privacylab"


def write_durably(path: Path, blob: bytes) -> None:
    """Replace `path` by `blob` atomically: write a temporary file, fsync it, ``os.replace`` it
    into place, fsync the folder. Readers see the old content or the new, never a mix."""
    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(blob)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial, path)
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _header_metadata(blob: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob, read from its length-prefixed JSON header."""
    if len(blob) < 8:
        raise ValueError("file too short for a safetensors header")
    (size,) = struct.unpack("<Q", blob[:8])
    if size > len(blob) - 8:
        raise ValueError("safetensors header is longer than the file")
    header = json.loads(blob[8 : 8 + size])
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not an object")
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise ValueError("safetensors metadata is not an object")
    return metadata


class Checkpoint:
    """The training state in `folder`, saved after every epoch and loaded on a re-run.

    `fingerprint` identifies the training configuration; a checkpoint made under another one is
    refused rather than resumed.
    """

    def __init__(self, folder: str | Path | None, fingerprint: str) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.fingerprint = fingerprint

    @property
    def path(self) -> Path | None:
        """The checkpoint file (None when checkpointing is off)."""
        return self.folder / CHECKPOINT_FILE if self.folder is not None else None

    def save(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: Mapping[str, Any],
        generators: Mapping[str, torch.Generator],
    ) -> None:
        """Commit weights, optimizer, generators and `state` (JSON) as one file."""
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        tensors = {
            f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()
        }
        optim = optimizer.state_dict()
        plain: dict[str, Any] = {"param_groups": optim["param_groups"], "state": {}}
        for index, slots in optim["state"].items():
            plain["state"][str(index)] = {}
            for key, value in slots.items():
                if isinstance(value, Tensor):
                    tensors[f"optim.{index}.{key}"] = value.detach().cpu().contiguous()
                else:
                    plain["state"][str(index)][key] = value
        for name, gen in generators.items():
            tensors[f"rng.{name}"] = gen.get_state()
        meta = {
            "format": CHECKPOINT_FORMAT,
            "config": self.fingerprint,
            "state": dict(state),
            "optimizer": plain,
        }
        blob = save(tensors, metadata={_METADATA_KEY: json.dumps(meta)})
        write_durably(self.folder / CHECKPOINT_FILE, blob)

    def load(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        generators: Mapping[str, torch.Generator],
    ) -> dict[str, Any] | None:
        """Restore model, optimizer and generators in place; return the saved `state`, or None
        when there is no checkpoint. A damaged or foreign checkpoint raises TrainingError."""
        path = self.path
        if path is None or not path.exists():
            return None
        try:
            blob = path.read_bytes()
            raw = _header_metadata(blob).get(_METADATA_KEY)
            if raw is None:
                raise ValueError(
                    "it was written by an older privacylab (weights and bookkeeping apart); "
                    "delete it"
                )
            meta = json.loads(raw)
            tensors = load(blob)
        except Exception as error:  # safetensors raises its own error types
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise TrainingError(f"cannot read the checkpoint {path}: {message}") from None
        if (
            not isinstance(meta, dict)
            or meta.get("format") != CHECKPOINT_FORMAT
            or meta.get("config") != self.fingerprint
        ):
            raise TrainingError(
                f"the checkpoint in {self.folder} is for a different training configuration; "
                "use another output folder or delete it"
            )
        try:
            weights = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
            model.load_state_dict(weights, strict=True)
            plain = meta["optimizer"]
            slots: dict[int, dict[str, Any]] = {
                int(index): dict(values) for index, values in plain["state"].items()
            }
            for key, value in tensors.items():
                if key.startswith("optim."):
                    _, index, slot = key.split(".", 2)
                    slots.setdefault(int(index), {})[slot] = value
            optimizer.load_state_dict({"state": slots, "param_groups": plain["param_groups"]})
            for name, gen in generators.items():
                gen.set_state(tensors[f"rng.{name}"])
            state = meta["state"]
            if not isinstance(state, dict):
                raise ValueError("its state is not an object")
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise TrainingError(f"damaged checkpoint {path}: {message}") from None
        return state
