"""Durable audit trials: each finished trial is one row of the result store, keyed by a hash
of the audit configuration, so a killed audit resumes with no trial lost or counted twice."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from privacylab.execution import Executor, ResultStore, SerialExecutor, config_key, durable_map

NAMESPACE = "audit-trials"

Trial = Callable[[dict[str, Any]], dict[str, Any]]
"""A top-level (picklable) function of {"config": ..., "trial": i} returning a JSON dict."""


def run_trials(
    trial: Trial,
    config: Mapping[str, Any],
    trials: int,
    *,
    store: ResultStore,
    executor: Executor | None = None,
    first: int = 0,
    on_done: Callable[[str, dict[str, Any], bool], None] | None = None,
) -> list[dict[str, Any]]:
    """Run trials `first .. first + trials - 1` of `trial` under `config` (each seeded by its
    index), skipping those already stored; results in trial order."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a whole number >= 1, got {trials!r}")
    name = f"{trial.__module__}.{trial.__qualname__}"
    key = config_key({"trial": name, "config": dict(config)})[:20]
    tasks = {
        f"{key}/{i:06d}": {"config": dict(config), "trial": i} for i in range(first, first + trials)
    }
    results = durable_map(
        trial, tasks, store, NAMESPACE, executor or SerialExecutor(), on_done=on_done
    )
    return [results[k] for k in tasks]
