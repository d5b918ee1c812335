"""Read-merge-write of a report folder's results.json by one section's runs: the file read
strictly and the folder locked between processes while a run is merged in."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path


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
