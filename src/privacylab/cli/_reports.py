"""What the report-writing `attack` commands share (gradients, extraction, inversion,
property): the `--options` JSON object, the checks of `--root`, `--target` and `--out` made
before any work, and the terminal summary (a heading, a plain table of the runs and the path of
the report written with `--out`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from privacylab.cli._common import _plain_table, _writable_folder
from privacylab.errors import PrivacylabError


def json_options(text: str | None, example: str) -> dict[str, Any]:
    """`--options` as a JSON object ({} when not given), or one-line PrivacylabError naming
    `example` (the JSON a user could write instead)."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise PrivacylabError(f"--options is not JSON: {error.msg} at {error.pos}") from None
    if not isinstance(value, dict):
        raise PrivacylabError(f"--options must be a JSON object, e.g. {example}")
    return value


def check_paths(
    *, root: Path | None = None, target: Path | None = None, out: Path | None = None
) -> None:
    """One-line PrivacylabError, before any work, when `--root` is not a folder, `--target` is
    not a model folder, or `--out` cannot be written."""
    if root is not None and not root.is_dir():
        raise PrivacylabError(f"--root {root} is not a folder")
    if target is not None and not target.is_dir():
        raise PrivacylabError(f"--target {target} is not a model folder")
    if out is not None:
        _writable_folder(out, "--out")


def summary_cell(value: Any) -> str:
    """A terminal-table cell: "-" for nothing, yes/no, 4 significant digits for a float."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_summary(
    heading: str,
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Mapping[str, Any]],
    out: Path | None = None,
) -> None:
    """Print `heading`, a plain table of `rows` with `columns` ((key, header) pairs) and, when a
    report was written to `out`, the path of its page."""
    print(heading)
    cells = [[summary_cell(row.get(key)) for key, _ in columns] for row in rows]
    print(_plain_table([header for _, header in columns], cells))
    if out is not None:
        print(f"report: {out / 'index.html'}")
