"""Re-accounting a saved run: bound the privacy event it recorded with any accountant.

A private training run saves the composition of the privacy events it executed
(``metadata["privacy_event"]`` in the model sidecar, see `privacylab.training.job`); following
dp_accounting's split of *what happened* (events) from *who bounds it* (accountants), any
accountant can certify that event again — e.g. PLD (Koskela et al. 2020; Doroshenko et al.
2022) for the tightest bound or RDP (Mironov 2017; Mironov, Talwar & Zhang 2019) as a check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privacylab.accounting import Guarantee, PrivacyParameterError, make_accountant
from privacylab.accounting import _validate as check
from privacylab.accounting.events import Event, event_from_dict
from privacylab.training.config import TrainingError

SIDECAR_FILE = "model.json"
MAX_SIDECAR_BYTES = 16 * 1024 * 1024
"""Largest sidecar read for re-accounting (a sidecar is a few kB)."""


def _read_sidecar(path: Path) -> dict[str, Any]:
    file = path / SIDECAR_FILE if path.is_dir() else path
    try:
        size = file.stat().st_size
        if size > MAX_SIDECAR_BYTES:
            raise TrainingError(f"{file} is {size} bytes; a model sidecar is at most 16 MiB")
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TrainingError(f"cannot read the model sidecar {file}: {error}") from None
    if not isinstance(data, dict):
        raise TrainingError(f"the model sidecar {file} is not a JSON object")
    return data


def recorded_event(sidecar: Mapping[str, Any]) -> tuple[Event, dict[str, Any]]:
    """The privacy event recorded in a sidecar (or its ``metadata``), and that metadata."""
    metadata = sidecar.get("metadata", sidecar)
    if not isinstance(metadata, Mapping):
        raise TrainingError("the sidecar's metadata is not an object")
    if "privacy_event" not in metadata or metadata["privacy_event"] is None:
        raise TrainingError(
            "this model records no privacy event: it was trained without DP or by an older "
            "privacylab"
        )
    try:
        event = event_from_dict(metadata["privacy_event"])
    except PrivacyParameterError as error:
        raise TrainingError(f"the recorded privacy event is invalid: {error}") from None
    return event, dict(metadata)


def reaccount(
    source: str | Path | Mapping[str, Any], accountant: str = "pld", delta: float | None = None
) -> Guarantee:
    """(ε, δ) of the privacy event a saved model recorded, by the named accountant.

    Args:
        source: a saved model's folder, its ``model.json``, or the sidecar (or its metadata)
            as a dict.
        accountant: any name `privacylab.accounting.make_accountant` knows (pld, rdp, gdp, ...).
        delta: δ; by default the δ the run was trained for (``metadata["summary"]["delta"]``).

    Returns the accountant's `Guarantee` (an upper bound on ε, except the GDP/CLT value, whose
    note says so). Bad input raises a PrivacylabError with one line.
    """
    sidecar = (
        source if isinstance(source, Mapping) else _read_sidecar(Path(source))  # type: ignore[arg-type]
    )
    event, metadata = recorded_event(sidecar)
    if delta is None:
        summary = metadata.get("summary")
        delta = summary.get("delta") if isinstance(summary, Mapping) else None
        if delta is None:
            raise TrainingError("the sidecar records no delta; pass delta")
    delta = check.delta(delta)
    return make_accountant(accountant).compose(event).guarantee(delta)
