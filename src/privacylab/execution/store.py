"""The durable result store: one SQLite file, one row per finished unit of work.

Long work (reference models, audit trials) writes each unit here as soon as it finishes, so a
killed run loses at most the units that were still running, and a re-run skips every key that is
already stored. Stdlib only (no numpy, no torch).

Durability choices
------------------
* ``journal_mode=WAL``: readers never block the writer and several processes (each with its own
  connection) can write to one file; a commit is one append to the write-ahead log.
* ``synchronous=FULL``: in WAL mode, ``NORMAL`` fsyncs only at checkpoints, so a power loss or OS
  crash may roll back the last few *committed* units; ``FULL`` fsyncs the log at every commit, so a
  unit that :meth:`ResultStore.put` reported as stored survives anything short of disk failure.
  One fsync per unit is negligible next to a unit (training a model, running a trial), and
  "nothing lost" is the contract.
* ``INSERT OR IGNORE`` on ``PRIMARY KEY(namespace, key)``: the first write wins, so a unit that two
  processes both finished is never counted twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from privacylab.errors import PrivacylabError

T = TypeVar("T")

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 60_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (namespace, key)
)
"""


def _retry_locked(action: Callable[[], T], seconds: float = BUSY_TIMEOUT_MS / 1000) -> T:
    """Run `action`, retrying while SQLite says the database is locked. Switching to WAL and
    the first schema transaction take locks for which SQLite's busy handler is not always
    consulted, so two processes opening one new store at once need this loop."""
    deadline = time.monotonic() + seconds
    pause = 0.01
    while True:
        try:
            return action()
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.25)


class StoreError(PrivacylabError, ValueError):
    """The result store file cannot be used; the message is one line naming the file."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _canonical(value: Any, where: str) -> Any:
    """Return `value` as plain JSON types (dict/list/str/int/float/bool/None), or raise ValueError.

    Mapping keys must be strings (``{1: x}`` and ``{"1": x}`` would otherwise collide), floats
    must be finite, and numpy-style scalars (``numbers.Integral``/``numbers.Real``) become Python
    numbers.
    """
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{where} must be finite, got {number!r} (NaN/inf is not JSON)")
        return number
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where} has a non-string key {k!r}; JSON keys must be strings")
            out[k] = _canonical(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ValueError(f"{where} is not JSON-serialisable: {type(value).__name__} {value!r:.80}")


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def config_key(config: Mapping[str, Any]) -> str:
    """Return the sha256 hex digest of the canonical JSON of `config`.

    Canonical means sorted keys, no whitespace, ASCII escapes, shortest round-trip float repr and
    tuples written as lists, so the key is the same for any key order, in any process, on any run.
    ``1`` and ``1.0`` are different values and give different keys. Non-JSON values (objects, NaN,
    inf, non-string keys) raise ValueError with one line.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a mapping, got {type(config).__name__}")
    return hashlib.sha256(_dumps(_canonical(config, "config")).encode("ascii")).hexdigest()


def encode_value(value: Mapping[str, Any]) -> str:
    """Return the canonical JSON text stored for `value` (a mapping), or raise ValueError."""
    if not isinstance(value, Mapping):
        raise ValueError(f"a stored value must be a dict, got {type(value).__name__}")
    return _dumps(_canonical(value, "value"))


class ResultStore:
    """A durable key/value store of JSON dicts, grouped by namespace, in one SQLite file.

    Each process (and each worker) opens its own ``ResultStore``; SQLite's WAL mode and a busy
    timeout make concurrent writers safe. Use as a context manager or call :meth:`close`.

    Args:
        path: the SQLite file; created (with its parent folder) if missing.

    Raises:
        StoreError: the file is not a readable result store (corrupt, not SQLite, a folder, or
            written by a newer schema version).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not str(path).strip():
            raise StoreError("result store path must not be empty")
        self.path = Path(path).expanduser().resolve()
        if self.path.is_dir():
            raise StoreError(f"result store {self.path} is a directory, not a file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreError(
                f"cannot create the folder of result store {self.path}: {err}"
            ) from None
        self._conn: sqlite3.Connection | None = None
        with self._guard("open"):
            conn = sqlite3.connect(
                str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None
            )
            self._conn = conn
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            mode = _retry_locked(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            if str(mode).lower() != "wal":
                raise sqlite3.DatabaseError(f"cannot switch to WAL journal mode (got {mode!r})")
            conn.execute("PRAGMA synchronous = FULL")
            _retry_locked(lambda: self._init_schema(conn))

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"result store {self.path} has schema version {version}; this privacylab "
                    f"reads version {SCHEMA_VERSION} (upgrade privacylab)"
                )
            conn.execute(_SCHEMA)
            columns = [row[1] for row in conn.execute("PRAGMA table_info(results)")]
            if columns != ["namespace", "key", "value", "created"]:
                raise StoreError(
                    f"result store {self.path} has a 'results' table with unexpected columns "
                    f"{columns}"
                )
            if version < SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """Turn any SQLite failure into a one-line StoreError naming the file."""
        try:
            yield
        except StoreError:
            self._close_quietly()
            raise
        except sqlite3.DatabaseError as err:
            if action == "open":
                self._close_quietly()
            raise StoreError(
                f"result store {self.path} is unreadable ({action}): {_one_line(err)}"
            ) from None

    def _close_quietly(self) -> None:
        if self._conn is not None:
            with suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"result store {self.path} is closed")
        return self._conn

    @staticmethod
    def _check_name(kind: str, name: object) -> str:
        if not isinstance(name, str):
            raise ValueError(f"{kind} must be a string, got {type(name).__name__} {name!r}")
        return name

    def get(self, namespace: str, key: str) -> dict[str, Any] | None:
        """Return the value stored under (`namespace`, `key`), or None if there is none."""
        self._check_name("namespace", namespace)
        self._check_name("key", key)
        with self._guard("get"):
            row = self._db.execute(
                "SELECT value FROM results WHERE namespace = ? AND key = ?", (namespace, key)
            ).fetchone()
        return None if row is None else self._decode(row[0], namespace, key)

    def put(self, namespace: str, key: str, value: Mapping[str, Any]) -> bool:
        """Store `value` under (`namespace`, `key`) unless a value is already there.

        The first write wins: a later ``put`` for the same key changes nothing and returns False,
        so a unit of work is never counted twice. The row is committed (and fsynced) before this
        returns True.

        Raises:
            ValueError: `value` is not a dict of JSON values (NaN and inf are refused).
        """
        self._check_name("namespace", namespace)
        self._check_name("key", key)
        text = encode_value(value)
        with self._guard("put"):
            cursor = self._db.execute(
                "INSERT OR IGNORE INTO results (namespace, key, value, created) "
                "VALUES (?, ?, ?, ?)",
                (namespace, key, text, time.time()),
            )
        return cursor.rowcount == 1

    def items(self, namespace: str) -> dict[str, dict[str, Any]]:
        """Return every stored value of `namespace`, keyed, in insertion order."""
        self._check_name("namespace", namespace)
        with self._guard("items"):
            rows = self._db.execute(
                "SELECT key, value FROM results WHERE namespace = ? ORDER BY created, rowid",
                (namespace,),
            ).fetchall()
        return {key: self._decode(text, namespace, key) for key, text in rows}

    def keys(self, namespace: str) -> set[str]:
        """Return the set of keys stored in `namespace`."""
        self._check_name("namespace", namespace)
        with self._guard("keys"):
            rows = self._db.execute(
                "SELECT key FROM results WHERE namespace = ?", (namespace,)
            ).fetchall()
        return {row[0] for row in rows}

    def count(self, namespace: str) -> int:
        """Return how many keys are stored in `namespace`."""
        self._check_name("namespace", namespace)
        with self._guard("count"):
            row = self._db.execute(
                "SELECT COUNT(*) FROM results WHERE namespace = ?", (namespace,)
            ).fetchone()
        return int(row[0])

    def namespaces(self) -> set[str]:
        """Return the set of namespaces that hold at least one key."""
        with self._guard("namespaces"):
            rows = self._db.execute("SELECT DISTINCT namespace FROM results").fetchall()
        return {row[0] for row in rows}

    def delete_namespace(self, namespace: str) -> int:
        """Delete every key of `namespace`; return how many rows were deleted."""
        self._check_name("namespace", namespace)
        with self._guard("delete_namespace"):
            cursor = self._db.execute("DELETE FROM results WHERE namespace = ?", (namespace,))
        return int(cursor.rowcount)

    def close(self) -> None:
        """Close the connection; further calls raise StoreError. Closing twice is harmless."""
        self._close_quietly()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._conn is None else "open"
        return f"ResultStore({str(self.path)!r}, {state})"

    def _decode(self, text: str, namespace: str, key: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except ValueError:
            raise StoreError(
                f"result store {self.path} holds invalid JSON at {namespace!r}/{key!r}"
            ) from None
        if not isinstance(value, dict):
            raise StoreError(f"result store {self.path} holds a non-dict at {namespace!r}/{key!r}")
        return value
