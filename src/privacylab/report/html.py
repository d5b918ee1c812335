"""The JSON results file and the self-contained HTML report of one run.

`write_report` writes `results.json` (the payload, NaN/inf as null) and `index.html` (inline CSS,
no scripts, no network; plots as PNG files beside it, referenced by relative links with alt text).
"""

from __future__ import annotations

import html
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("target", "target"),
    ("accuracy", "accuracy (test / train)"),
    ("epsilon", "ε"),
    ("attack", "attack"),
    ("access", "access"),
    ("auc", "AUC"),
    ("tpr_at_1pct_fpr", "TPR@1% FPR"),
    ("tpr_at_01pct_fpr", "TPR@0.1% FPR"),
    ("balanced_accuracy", "balanced accuracy"),
    ("epsilon_lower_bound", "ε lower bound"),
    ("queries", "queries"),
    ("seconds", "seconds"),
)
"""(key, header) of each column of `summary_table_rows`, in display order."""

MISSING = "—"

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; color: #1b1b1b; line-height: 1.45; }
h1 { margin-bottom: 0.2rem; }
.meta { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.92rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.55rem; text-align: right; }
th { background: #f1f1f1; }
td.text, th.text { text-align: left; }
tr.violation td { background: #fde2e2; color: #a40000; font-weight: 600; }
.note { background: #f6f8fa; border-left: 4px solid #888; padding: 0.6rem 0.9rem; }
.note.warn { border-left-color: #c00; }
figure { display: inline-block; margin: 0.5rem 1rem 1rem 0; vertical-align: top; }
figure img { max-width: 34rem; width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-size: 0.85rem; color: #555; }
.missing { color: #a40000; font-style: italic; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; }
"""


def _json_safe(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "to_dict"):
        return _json_safe(value.to_dict())
    return str(value)


def atomic_write_bytes(target: Path, data: bytes) -> None:
    """Write `data` to `target` through a temporary file and a rename, so no reader sees half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _fmt(value: Any, digits: int = 3) -> str:
    number = _number(value)
    if number is None:
        return MISSING if value is None or isinstance(value, (int, float)) else str(value)
    if math.isinf(number):
        return "∞" if number > 0 else "-∞"
    return f"{number:.{digits}f}"


def _fmt_int(value: Any) -> str:
    number = _number(value)
    if number is None or math.isinf(number):
        return MISSING if value is None else str(value)
    return str(int(number))


def _target_epsilon(target: Mapping[str, Any]) -> float | None:
    number = _number(target.get("epsilon"))
    return None if number is None or math.isinf(number) else number


def _epsilon_text(target: Mapping[str, Any]) -> str:
    epsilon = _target_epsilon(target)
    if epsilon is None:
        return "∞ (non-private)"
    delta = _number(target.get("delta"))
    return f"{epsilon:.3g}" if delta is None else f"{epsilon:.3g} (δ={delta:.1e})"


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    if not isinstance(value, (list, tuple)):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def summary_table_rows(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per target × attack, as display strings keyed by `SUMMARY_COLUMNS`.

    Each row also carries `violation` (bool): the attack's ε lower bound exceeds the target's
    claimed ε, which a correct DP accountant and a valid bound never allow. A target without
    attacks yields one row with empty attack columns. Missing keys show as "—".
    """
    rows: list[dict[str, Any]] = []
    for target in _mappings(payload.get("targets")):
        epsilon = _target_epsilon(target)
        base = {
            "target": str(target.get("name", MISSING)),
            "accuracy": (
                f"{_fmt(target.get('test_accuracy'))} / {_fmt(target.get('train_accuracy'))}"
            ),
            "epsilon": _epsilon_text(target),
        }
        attacks = _mappings(target.get("attacks")) or [{}]
        for attack in attacks:
            bound = _number(attack.get("epsilon_lower_bound"))
            violation = epsilon is not None and bound is not None and bound > epsilon
            rows.append(
                {
                    **base,
                    "attack": str(attack.get("attack", MISSING)),
                    "access": str(attack.get("access", MISSING)),
                    "auc": _fmt(attack.get("auc")),
                    "tpr_at_1pct_fpr": _fmt(attack.get("tpr_at_1pct_fpr")),
                    "tpr_at_01pct_fpr": _fmt(attack.get("tpr_at_01pct_fpr")),
                    "balanced_accuracy": _fmt(attack.get("balanced_accuracy")),
                    "epsilon_lower_bound": _fmt(attack.get("epsilon_lower_bound")),
                    "queries": _fmt_int(attack.get("queries")),
                    "seconds": _fmt(attack.get("seconds"), 2),
                    "violation": violation,
                }
            )
    return rows


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _summary_html(rows: list[dict[str, Any]]) -> str:
    text_keys = {"target", "epsilon", "attack", "access"}
    head = "".join(
        f'<th class="text">{_e(h)}</th>' if k in text_keys else f"<th>{_e(h)}</th>"
        for k, h in SUMMARY_COLUMNS
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="text">{_e(row[k])}</td>' if k in text_keys else f"<td>{_e(row[k])}</td>"
            for k, _ in SUMMARY_COLUMNS
        )
        if row["violation"]:
            title = "ε lower bound exceeds the claimed ε"
            body.append(f'<tr class="violation" title="{_e(title)}">{cells}</tr>')
        else:
            body.append(f"<tr>{cells}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(SUMMARY_COLUMNS)}">no results</td></tr>')
    return (
        f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n"
        + "\n".join(body)
        + "\n</tbody>\n</table>"
    )


def _figure(folder: Path, name: Any, alt: str, caption: str) -> str:
    if not isinstance(name, str) or not name or not _safe_name(name):
        return ""
    if not (folder / name).is_file():
        return f'<p class="missing">{_e(caption)}: image {_e(name)} is missing.</p>'
    return (
        f'<figure><img src="{_e(quote(name))}" alt="{_e(alt)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _target_html(folder: Path, target: Mapping[str, Any]) -> str:
    name = str(target.get("name", MISSING))
    parts = [f"<section>\n<h2>{_e(name)}</h2>"]
    accountant = target.get("accountant")
    meta = [
        f"ε = {_epsilon_text(target)}",
        f"accountant: {accountant}" if accountant else None,
        f"train accuracy {_fmt(target.get('train_accuracy'))}",
        f"test accuracy {_fmt(target.get('test_accuracy'))}",
    ]
    parts.append(f'<p class="meta">{_e(" · ".join(m for m in meta if m))}</p>')
    images = target.get("images")
    images = images if isinstance(images, Mapping) else {}
    roc = _figure(
        folder,
        images.get("roc"),
        f"Log-log ROC curves of every membership attack on target {name}",
        f"ROC curves, {name}",
    )
    if roc:
        parts.append(roc)
    histograms = images.get("histograms")
    if isinstance(histograms, Mapping) and histograms:
        parts.append("<h3>Score histograms</h3>")
        for attack, file in histograms.items():
            figure = _figure(
                folder,
                file,
                f"Histogram of {attack} scores for members and non-members of target {name}",
                f"{attack} on {name}",
            )
            if figure:
                parts.append(figure)
    parts.append("</section>")
    return "\n".join(parts)


def _safe_name(name: str) -> bool:
    return (
        name not in {".", "..", "index.html", "results.json"}
        and "/" not in name
        and "\\" not in name
        and not name.startswith(".")
        and "\x00" not in name
    )


def render_html(folder: str | os.PathLike[str], payload: Mapping[str, Any]) -> str:
    """The report page for `payload`; image links are checked against the files in `folder`."""
    base = Path(folder)
    title = str(payload.get("title") or "privacylab report")
    meta = []
    for key, label in (("dataset", "dataset"), ("model", "model"), ("created", "created")):
        if payload.get(key) is not None:
            meta.append(f"{label}: {payload[key]}")
    if _number(payload.get("seconds")) is not None:
        meta.append(f"run time: {_fmt(payload.get('seconds'), 1)} s")
    rows = summary_table_rows(payload)
    violations = sum(bool(row["violation"]) for row in rows)
    note_class = "note warn" if violations else "note"
    note = (
        "The ε lower bound is the privacy loss an attack's error rates prove (Jagielski et al. "
        "2020; Nasr et al. 2021): with the stated confidence, no (ε, δ)-DP model lets a fixed "
        "test reach these FPR/FNR. For a DP model it must not exceed the model's ε; a row in red "
        "means it does, which points to a bug in training or accounting, or to a bound computed "
        "with a threshold chosen on the evaluated examples (optimistic)."
    )
    if violations:
        note += f" {violations} row(s) exceed the claimed ε."
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">{_e(" · ".join(meta))}</p>' if meta else "",
        "<h2>Summary</h2>",
        _summary_html(rows),
        f'<p class="{note_class}">{_e(note)}</p>',
    ]
    parts.extend(_target_html(base, target) for target in _mappings(payload.get("targets")))
    audit = payload.get("audit")
    if audit is not None:
        parts.append(_audit_html(audit))
    notes = payload.get("notes")
    if isinstance(notes, (list, tuple)) and notes:
        items = "".join(f"<li>{_e(n)}</li>" for n in notes)
        parts.append(f"<section>\n<h2>Notes</h2>\n<ul>{items}</ul>\n</section>")
    parts.extend(["</body>", "</html>", ""])
    return "\n".join(p for p in parts if p is not None)


AUDIT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("method", "method"),
    ("epsilon_theory", "ε (accountant)"),
    ("epsilon_lower_bound", "ε lower bound"),
    ("confidence", "confidence"),
    ("trials", "trials"),
    ("seconds", "seconds"),
)
"""(key, header) of each column of the audit table, in display order."""


def _audit_html(audit: Any) -> str:
    """The audit section: one row per audit, red where the lower bound refutes the accountant."""
    rows = [a for a in (audit if isinstance(audit, (list, tuple)) else [audit]) if a]
    head = "".join(f"<th>{_e(h)}</th>" for _, h in AUDIT_COLUMNS)
    body = []
    for row in _mappings(rows):
        cells = []
        for key, _ in AUDIT_COLUMNS:
            value = row.get(key)
            number = _number(value)
            text = f"{number:.3f}" if number is not None and key != "trials" else value
            cells.append(f"<td>{_e(MISSING if text is None else str(text))}</td>")
        style = ' class="violation"' if row.get("violated") else ""
        body.append(f"<tr{style}>{''.join(cells)}</tr>")
    note = (
        "An audit attacks our own DP-SGD to measure a lower bound on ε; a lower bound above the "
        "accountant's ε means the implementation or its accounting is wrong."
    )
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return f"<section>\n<h2>Audit</h2>\n<p>{_e(note)}</p>\n{table}\n</section>"


def write_report(
    folder: str | os.PathLike[str], payload: Mapping[str, Any], images: Mapping[str, bytes]
) -> Path:
    """Write `results.json`, the PNG `images` and `index.html` into `folder`; return the page.

    `images` maps plain file names (no directories) to PNG bytes; the payload refers to them by
    those names. Every file is written atomically (temporary file, then `os.replace`).
    """
    base = Path(folder)
    for name in images:
        if not isinstance(name, str) or not _safe_name(name):
            raise ValueError(f"image name must be a plain file name, got {name!r}")
    base.mkdir(parents=True, exist_ok=True)
    data = json.dumps(_json_safe(payload), indent=2, ensure_ascii=False, allow_nan=False)
    atomic_write_bytes(base / "results.json", (data + "\n").encode("utf-8"))
    for name, content in images.items():
        atomic_write_bytes(base / name, bytes(content))
    page = base / "index.html"
    atomic_write_bytes(page, render_html(base, payload).encode("utf-8"))
    return page
