"""What the resumable jobs (`privacylab.backdoor`, `privacylab.memorize`) share about their run
folders and options: atomic JSON files, a finished model folder, the trainer summary a model
folder keeps, progress ticks, and the one-line checks of whole and positive options, each
raising the job's own error class."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "config_from_dict",
    "model_saved",
    "positive",
    "read_json",
    "tick",
    "trainer_summary",
    "victim_recipe",
    "whole",
    "write_json",
]

Progress = Callable[[str, float, float], None]
T = TypeVar("T")


def config_from_dict(cls: type[T], data: object, error: type[Exception], what: str) -> T:
    """The dataclass `cls` built from the JSON object `data` (a job's `config.json`); one
    `error` line for a non-object or unknown keys (`what` names the config in it)."""
    if not isinstance(data, Mapping):
        raise error(f"a {what} config must be a JSON object")
    extra = sorted(set(data) - {f.name for f in fields(cls)})  # type: ignore[arg-type]
    if extra:
        raise error(f"unknown {what} config keys: {', '.join(extra)}")
    return cls(**dict(data))


def victim_recipe(
    error: type[Exception],
    overrides: Mapping[str, Any] | None,
    epsilon: float | None,
    delta: float,
    seed: int,
    who: str = "victim",
) -> Any:
    """The `VictimRecipe` a job trains with: the defaults, the user's `overrides`, at
    (`epsilon`, `delta`) — ε and δ are the job's own options and refused inside the overrides
    unless equal — with its trainer configuration checked, so a bad recipe is one `error`
    line before any work."""
    from privacylab.attacks.poisoning import PoisonError
    from privacylab.attacks.poisoning.recipe import VictimRecipe
    from privacylab.errors import PrivacylabError

    given = dict(overrides or {})
    for key, flag, value in (("epsilon", "ε", epsilon), ("delta", "δ", delta)):
        if given.get(key, value) != value:
            raise error(f"bad victim recipe: give the {who}'s {flag} with --{key}, not in it")
    try:
        recipe = VictimRecipe.from_dict({**VictimRecipe().to_dict(), **given})
    except (PoisonError, TypeError) as caught:
        raise error(f"bad victim recipe: {caught}") from None
    whole(error, "recipe epochs", recipe.epochs, 1)
    whole(error, "recipe batch_size", recipe.batch_size, 1)
    recipe = replace(recipe.private(epsilon), delta=delta)
    try:
        recipe.config(seed).validate()
    except PrivacylabError as caught:
        raise error(f"bad victim recipe: {caught}") from None
    return recipe


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
