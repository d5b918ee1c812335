"""Read-merge-write of a report folder's results.json by one section's runs: the file read
strictly and the folder locked between processes while a run is merged in."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def read_results(path: Path, error: type[Exception]) -> dict[str, object]:
    """The JSON object in `path` ({} when it does not exist), or a one-line `error`."""
    if not path.exists():
        return {}
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise error(f"cannot read {path}: {first}") from None
    if not isinstance(payload, dict):
        raise error(f"{path} does not hold a JSON object")
    return payload


@contextlib.contextmanager
def locked(folder: Path, name: str) -> Iterator[None]:
    """Serialise read-merge-write of one report folder between processes (POSIX flock on
    `folder`/.`name`.lock; no lock where flock does not exist)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(folder / f".{name}.lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def same_folder(stored: Any, folder: str) -> bool:
    """Whether a run entry's stored folder is `folder` (as written, or the same real path):
    how a re-run finds and replaces its own entry."""
    if stored is None:
        return False
    if str(stored) == folder:
        return True
    try:
        return os.path.realpath(str(stored)) == os.path.realpath(folder)
    except (OSError, ValueError):
        return False


def check_tables(tables: Any, error: type[Exception]) -> dict[str, list[dict[str, Any]]]:
    """A payload's benchmark tables ``{name: [row mapping, ...]}`` made JSON-ready, each name
    lowercase letters, digits, '-' or '_' (it becomes an HTML class); else one `error` line."""
    from privacylab.report._format import mappings
    from privacylab.report.jsonable import json_ready

    if not isinstance(tables, Mapping) or not tables:
        raise error("payload['tables'] must be a non-empty mapping of name -> rows")
    out = {}
    for name, rows in tables.items():
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_-]{1,40}", name):
            raise error(f"table name must be lowercase letters, digits, '-' or '_', got {name!r}")
        if not isinstance(rows, (list, tuple)) or len(mappings(rows)) != len(rows):
            raise error(f"payload['tables'][{name!r}] must be a list of mappings")
        out[name] = [dict(r) for r in json_ready(list(rows))]
    return out
