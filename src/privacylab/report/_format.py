"""Formatting and file helpers shared by the HTML page and its sections (no matplotlib)."""

from __future__ import annotations

import html
import math
import os
import tempfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

MISSING = "—"

FILE_MODE = 0o666
"""Mode asked for report files before the umask applies (0644 under the usual umask 022)."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(target: Path, data: bytes) -> None:
    """Write `data` to `target` through a temporary file and a rename, so no reader sees half.

    `tempfile.mkstemp` creates its file 0600; the file gets `FILE_MODE & ~umask` before the
    rename, the mode `open(target, "w")` would have given it (0644 under umask 022).
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), FILE_MODE & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def number(value: Any) -> float | None:
    """`value` as a float, or None for None, bools, NaN and anything not a number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def fmt(value: Any, digits: int = 3) -> str:
    """A fixed-point number, "∞" for infinity, "—" when missing."""
    x = number(value)
    if x is None:
        return MISSING if value is None or isinstance(value, (int, float)) else str(value)
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return f"{x:.{digits}f}"


def fmt_int(value: Any) -> str:
    """A whole number, "—" when missing."""
    x = number(value)
    if x is None or math.isinf(x):
        return MISSING if value is None else str(value)
    return str(int(x))


def percent(value: Any) -> str:
    """A rate in [0, 1] as a percentage with a sensible number of digits ("12.3%", "0.1%")."""
    x = number(value)
    if x is None:
        return MISSING
    pct = 100.0 * x
    if pct == 0 or pct >= 10:
        return f"{pct:.0f}%" if pct == round(pct) else f"{pct:.1f}%"
    return f"{pct:.2g}%" if pct < 1 else f"{pct:.1f}%"


def target_epsilon(target: Mapping[str, Any]) -> float | None:
    """The target's claimed ε, or None for a non-private target."""
    x = number(target.get("epsilon"))
    return None if x is None or math.isinf(x) else x


def epsilon_text(target: Mapping[str, Any]) -> str:
    """ "∞ (non-private)" or "1 (δ=1.0e-05)"."""
    epsilon = target_epsilon(target)
    if epsilon is None:
        return "∞ (non-private)"
    delta = number(target.get("delta"))
    return f"{epsilon:.3g}" if delta is None else f"{epsilon:.3g} (δ={delta:.1e})"


def mappings(value: Any) -> list[Mapping[str, Any]]:
    """The mappings in a list (anything else in it, or a non-list, is skipped)."""
    if not isinstance(value, (list, tuple)):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def e(value: Any) -> str:
    """HTML-escaped text (quotes included)."""
    return html.escape(str(value), quote=True)


def safe_name(name: str) -> bool:
    """A plain file name in the report folder that is not one of the report's own files."""
    return (
        name not in {".", "..", "index.html", "results.json"}
        and "/" not in name
        and "\\" not in name
        and not name.startswith(".")
        and "\x00" not in name
    )


def figure(folder: Path, name: Any, alt: str, caption: str, css: str = "") -> str:
    """A <figure> whose image links to the full-size file; "" when `name` is no plain file
    name, a visible "missing" line when the file is absent."""
    if not isinstance(name, str) or not name or not safe_name(name):
        return ""
    if not (folder / name).is_file():
        return f'<p class="missing">{e(caption)}: image {e(name)} is missing.</p>'
    link = e(quote(name))
    klass = f' class="{e(css)}"' if css else ""
    return (
        f'<figure{klass}><a href="{link}" title="open full size">'
        f'<img src="{link}" alt="{e(alt)}"></a>'
        f"<figcaption>{e(caption)}</figcaption></figure>"
    )


def section_block(payload: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """The `key` block of a results payload, {} when it is absent or not a mapping."""
    block = payload.get(key)
    return block if isinstance(block, Mapping) else {}


def sort_key(value: Any) -> str:
    """A table cell's `data-sort` for a number: its repr, "Infinity"/"-Infinity" for infinities
    (what the page's `parseFloat` reads), "-Infinity" when missing, so blanks sort last."""
    x = number(value)
    if x is None or math.isinf(x):
        return "Infinity" if x is not None and x > 0 else "-Infinity"
    return repr(x)


def num_cell(value: Any, text: str | None = None, title: str = "") -> str:
    """A numeric <td>: shows `text` (default `fmt(value)`), sorts by the number (`sort_key`)."""
    shown = fmt(value) if text is None else text
    attr = f' title="{e(title)}"' if title else ""
    return f'<td data-sort="{e(sort_key(value))}"{attr}>{e(shown)}</td>'


def text_cell(value: Any, sort: str | None = None, klass: str = "", title: str = "") -> str:
    """A text <td> ("—" for None or ""), sorted by its text unless `sort` is given."""
    text = MISSING if value is None or value == "" else str(value)
    classes = " ".join(c for c in ("text", klass) if c)
    attr = f' title="{e(title)}"' if title else ""
    return (
        f'<td class="{classes}" data-sort="{e(text if sort is None else sort)}"{attr}>'
        f"{e(text)}</td>"
    )


def sortable_table(
    css: str,
    columns: Sequence[Sequence[str]],
    rows: Sequence[str],
    *,
    text: Collection[str] = (),
    empty: str | None = None,
) -> str:
    """A `<table class="sortable CSS">` (the page's script sorts it by the cells' data-sort):
    one header cell per column ((key, header[, tooltip])), classed "text" for the keys in
    `text` and "num" for the others, then `rows` (each a whole `<tr>`), or one row saying
    `empty` when there are none."""
    head = []
    for column in columns:
        klass = "text" if column[0] in text else "num"
        tip = f' title="{e(column[2])}"' if len(column) > 2 and column[2] else ""
        head.append(f'<th class="{klass}"{tip} scope="col">{e(column[1])}</th>')
    body = list(rows)
    if not body and empty is not None:
        body.append(f'<tr><td colspan="{len(columns)}">{e(empty)}</td></tr>')
    classes = " ".join(c for c in ("sortable", css) if c)
    return (
        f'<table class="{classes}">\n<thead><tr>{"".join(head)}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + "\n</tbody>\n</table>"
    )


def check_image(value: Any, where: str, error: type[Exception], max_side: int = 512) -> np.ndarray:
    """`value` as a finite float image, (H, W) or (C, H, W) with C = 1 or 3 and sides up to
    `max_side`, else one `error` line naming `where` (the payload key it came from)."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise error(f"{where} must be an array of numbers") from None
    if arr.ndim == 3 and arr.shape[0] not in (1, 3):
        raise error(f"{where} must be (H, W) or (C, H, W) with C = 1 or 3, got shape {arr.shape}")
    if arr.ndim not in (2, 3) or arr.size == 0 or max(arr.shape) > max_side:
        raise error(
            f"{where} must be (H, W) or (C, H, W) with sides <= {max_side}, got shape {arr.shape}"
        )
    if not np.isfinite(arr).all():
        raise error(f"{where} holds NaN or infinite values")
    return arr
