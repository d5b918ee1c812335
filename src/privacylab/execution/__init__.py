"""Where work runs (executors) and where its results are kept (the durable SQLite result store)."""

from typing import TYPE_CHECKING

from privacylab.execution.executor import (
    EXECUTORS,
    Executor,
    LocalExecutor,
    SerialExecutor,
    TaskError,
    durable_map,
    make_executor,
    progress_counter,
)
from privacylab.execution.store import SCHEMA_VERSION, ResultStore, StoreError, config_key

if TYPE_CHECKING:
    from privacylab.execution.ray_executor import RayExecutor

__all__ = [
    "EXECUTORS",
    "SCHEMA_VERSION",
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "ResultStore",
    "SerialExecutor",
    "StoreError",
    "TaskError",
    "config_key",
    "durable_map",
    "make_executor",
    "progress_counter",
]


def __getattr__(name: str) -> object:
    """Load :class:`RayExecutor` on first use, so importing this package never imports ray."""
    if name == "RayExecutor":
        from privacylab.execution.ray_executor import RayExecutor

        return RayExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
