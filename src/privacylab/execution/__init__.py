"""Where work runs (executors) and where its results are kept (the durable SQLite result store)."""

from privacylab.execution.executor import (
    EXECUTORS,
    Executor,
    LocalExecutor,
    SerialExecutor,
    TaskError,
    durable_map,
    make_executor,
)
from privacylab.execution.store import SCHEMA_VERSION, ResultStore, StoreError, config_key

__all__ = [
    "EXECUTORS",
    "SCHEMA_VERSION",
    "Executor",
    "LocalExecutor",
    "ResultStore",
    "SerialExecutor",
    "StoreError",
    "TaskError",
    "config_key",
    "durable_map",
    "make_executor",
]
