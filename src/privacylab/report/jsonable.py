"""Plain JSON from results: what every job writes to `results.json`, the result store and
`--json` output."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["json_ready"]


def json_ready(value: Any) -> Any:
    """`value` as plain JSON: mappings and sequences recursively, tensors and numpy arrays as
    lists, numpy scalars as Python numbers, non-finite floats as None (JSON has no inf/NaN),
    paths and unknown objects as strings, objects with `to_dict` by it. The one cleaner every
    job, report and `--json` output uses."""
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    if isinstance(value, np.generic):
        return json_ready(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "to_dict"):
        return json_ready(value.to_dict())
    return str(value)
