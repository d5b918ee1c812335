"""A federation's state after each round, so that a killed run resumes where it stopped.

The global model's `state_dict` and the bookkeeping (format, the federation's fingerprint, the
last finished round, the per-round records) are ONE safetensors file, the bookkeeping as JSON
in its metadata, committed atomically (`privacylab.training.checkpoint.write_durably`): a kill
leaves the previous round or the new one, never weights of one round with the record of
another. A JSON copy of the record (with the weights' sha256) is written beside it for people
and tools; resuming reads only the safetensors file. Nothing is unpickled.

No random state is saved: every random draw of round r is seeded by (seed, r, client), so a
resumed run gives the same numbers as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import save
from torch import nn

from privacylab.federated.protocol import FederatedError

__all__ = ["FORMAT", "RECORD_FILE", "WEIGHTS_FILE", "load_round", "save_round"]

FORMAT = "privacylab-federation/1"
WEIGHTS_FILE = "federation.safetensors"
RECORD_FILE = "federation.json"
_KEY = "privacylab"


def save_round(
    folder: Path, model: nn.Module, fingerprint: str, round: int, record: dict[str, Any]
) -> None:
    """Commit the global `model` after `round` with `record` (JSON: config, history)."""
    from privacylab.training.checkpoint import write_durably  # not for a client's import

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    meta = {"format": FORMAT, "fingerprint": fingerprint, "round": round, "record": record}
    blob = save(tensors, metadata={_KEY: json.dumps(meta)})
    write_durably(folder / WEIGHTS_FILE, blob)
    sidecar = {**meta, "weights": WEIGHTS_FILE, "sha256": hashlib.sha256(blob).hexdigest()}
    text = json.dumps(sidecar, indent=2, sort_keys=True) + "\n"
    write_durably(folder / RECORD_FILE, text.encode("utf-8"))


def load_round(
    folder: Path, model: nn.Module, fingerprint: str
) -> tuple[int, dict[str, Any]] | None:
    """Load the last committed round into `model` (in place) and return (round, record), or
    None when `folder` holds no checkpoint. A damaged checkpoint, or one written by another
    federation (config, defence, data or model differ), raises FederatedError (one line)."""
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as handle:
            raw = (handle.metadata() or {}).get(_KEY)
            if raw is None:
                raise ValueError("it holds no federation record")
            meta = json.loads(raw)
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    except Exception as error:  # safetensors raises its own error types
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise FederatedError(f"cannot read the federation checkpoint {path}: {message}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FederatedError(f"{path} is not a federation checkpoint of format {FORMAT}")
    if meta.get("fingerprint") != fingerprint:
        raise FederatedError(
            f"the checkpoint in {folder} is for a different federation (config, defence, data "
            "or model); use another folder or delete it"
        )
    round, record = meta.get("round"), meta.get("record")
    if not isinstance(round, int) or round < 0 or not isinstance(record, dict):
        raise FederatedError(f"damaged federation checkpoint {path}: bad round or record")
    try:
        device = next(iter(model.state_dict().values())).device
        model.load_state_dict({k: v.to(device) for k, v in tensors.items()}, strict=True)
    except RuntimeError as error:
        message = str(error).splitlines()[0]
        raise FederatedError(f"damaged federation checkpoint {path}: {message}") from None
    return round, record
