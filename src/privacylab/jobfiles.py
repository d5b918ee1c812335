"""What the resumable jobs (`privacylab.backdoor`, `privacylab.memorize`) share about their run
folders and options: atomic JSON files, a finished model folder, the trainer summary a model
folder keeps, progress ticks, and the one-line checks of whole and positive options, each
raising the job's own error class."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["model_saved", "positive", "read_json", "tick", "trainer_summary", "whole", "write_json"]

Progress = Callable[[str, float, float], None]


def whole(error: type[Exception], name: str, value: object, low: int) -> int:
    """`value` as a whole number >= `low` (bools refused), else one `error` line."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise error(f"{name} must be a whole number >= {low}, got {value!r}")
    return int(value)


def positive(error: type[Exception], name: str, value: object) -> float:
    """`value` as a finite number > 0 (bools refused), else one `error` line."""
    real = isinstance(value, int | float | np.floating) and not isinstance(value, bool)
    number = float(value) if real else math.nan  # type: ignore[arg-type]
    if not (math.isfinite(number) and number > 0):
        raise error(f"{name} must be a finite number > 0, got {value!r}")
    return number


def write_json(path: Path, payload: Any) -> None:
    """Write `payload` (made JSON-ready, NaN refused) to `path` atomically: a partial file
    renamed over it, so a killed run never leaves half a file."""
    from privacylab.report.jsonable import json_ready

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(json_ready(payload), allow_nan=False, indent=1) + "\n")
    os.replace(partial, path)


def read_json(path: Path, error: type[Exception]) -> Any:
    """The JSON in `path`, or one `error` line saying why it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as caught:
        first = str(caught).splitlines()[0] if str(caught) else type(caught).__name__
        raise error(f"cannot read {path}: {first}") from None


def model_saved(folder: Path) -> bool:
    """Whether `folder` holds a finished model (`privacylab.models.save_model`: weights and
    sidecar)."""
    from privacylab.models.storage import SIDECAR_FILE, WEIGHTS_FILE

    return (folder / SIDECAR_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()


def trainer_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What a model folder keeps of the trainer's summary: the privacy spent and the last
    epoch."""
    history = summary.get("history") or []
    return {"privacy": summary.get("privacy"), "last_epoch": history[-1] if history else None}


def tick(progress: Progress | None, stage: str, done: float, total: float) -> None:
    """Report `done` of `total` for `stage` to `progress`, if any."""
    if progress is not None:
        progress(stage, float(done), float(total))
