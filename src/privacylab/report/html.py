"""The JSON results file and the self-contained HTML report of one run.

`write_report` writes `results.json` (the payload, NaN/inf as null) and `index.html` (inline CSS,
one small inline script that sorts tables when a header is clicked, no network; plots as PNG
files beside it, referenced by relative links with alt text). The page is a header, then the
registered sections (`privacylab.report.sections`, one per attack family) in order, then notes.
Every file is created with mode 0644 (under the usual umask 022).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privacylab.report._format import (
    MISSING,
    atomic_write_bytes,
    e,
    epsilon_text,
    fmt,
    fmt_int,
    mappings,
    number,
    safe_name,
    target_epsilon,
)
from privacylab.report.jsonable import json_ready
from privacylab.report.sections import sections
from privacylab.report.sections.audit import AUDIT_COLUMNS
from privacylab.report.verdict import strength_key

__all__ = [
    "AUDIT_COLUMNS",
    "MISSING",
    "SUMMARY_COLUMNS",
    "atomic_write_bytes",
    "render_html",
    "summary_table_rows",
    "target_tables",
    "write_report",
]

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

TARGET_KEYS = ("target", "accuracy", "epsilon")
"""Columns of `SUMMARY_COLUMNS` that are facts of the target, not of the attack."""

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; color: #1b1b1b; line-height: 1.45; }
h1 { margin-bottom: 0.2rem; }
h3 { margin-top: 2rem; border-bottom: 1px solid #ddd; }
.meta { color: #555; margin-top: 0; }
.small { font-size: 0.88rem; color: #444; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.92rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.55rem; text-align: right; }
th { background: #f1f1f1; }
td.text, th.text { text-align: left; }
tr.violation td { background: #fde2e2; color: #a40000; font-weight: 600; }
.note { background: #f6f8fa; border-left: 4px solid #888; padding: 0.6rem 0.9rem; margin: 1rem 0; }
.note.warn { border-left-color: #c00; }
figure { display: inline-block; margin: 0.5rem 1rem 1rem 0; vertical-align: top; }
figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-size: 0.85rem; color: #555; }
details { margin: 0.8rem 0; }
summary { cursor: pointer; font-weight: 600; }
.missing { color: #a40000; font-style: italic; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; }
"""

_SORT_SCRIPT = """<script>
document.querySelectorAll("table.sortable").forEach(function (table) {
  var heads = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var dir = th.getAttribute("aria-sort") === "descending" ? 1 : -1;
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute("data-sort"), y = b.cells[col].getAttribute("data-sort");
        var nx = parseFloat(x), ny = parseFloat(y);
        if (isNaN(nx) || isNaN(ny)) { return dir * String(x).localeCompare(String(y)); }
        return nx === ny ? 0 : dir * (nx < ny ? -1 : 1);
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
</script>"""


def _dumps(value: Any) -> str:
    """JSON indented by 2, except that long lists of plain numbers or strings (per-example
    columns) stay on one line each, so results.json stays readable and small."""
    compact: list[str] = []
    tag = secrets.token_hex(8)

    def fold(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: fold(x) for k, x in v.items()}
        if isinstance(v, list):
            if len(v) > 8 and all(x is None or isinstance(x, (int, float, str)) for x in v):
                compact.append(json.dumps(v, separators=(",", ":"), ensure_ascii=False))
                return f"\x00{tag}{len(compact) - 1}\x00"
            return [fold(x) for x in v]
        return v

    text = json.dumps(fold(value), indent=2, ensure_ascii=False, allow_nan=False)
    return re.sub(rf'"\\u0000{tag}(\d+)\\u0000"', lambda m: compact[int(m.group(1))], text)


def _attack_row(attack: Mapping[str, Any], epsilon: float | None) -> dict[str, Any]:
    bound = number(attack.get("epsilon_lower_bound"))
    return {
        "attack": str(attack.get("attack", MISSING)),
        "access": str(attack.get("access", MISSING)),
        "auc": fmt(attack.get("auc")),
        "tpr_at_1pct_fpr": fmt(attack.get("tpr_at_1pct_fpr")),
        "tpr_at_01pct_fpr": fmt(attack.get("tpr_at_01pct_fpr")),
        "balanced_accuracy": fmt(attack.get("balanced_accuracy")),
        "epsilon_lower_bound": fmt(attack.get("epsilon_lower_bound")),
        "queries": fmt_int(attack.get("queries")),
        "seconds": fmt(attack.get("seconds"), 2),
        "violation": epsilon is not None and bound is not None and bound > epsilon,
    }


def _target_facts(target: Mapping[str, Any]) -> dict[str, str]:
    return {
        "target": str(target.get("name", MISSING)),
        "accuracy": f"{fmt(target.get('test_accuracy'))} / {fmt(target.get('train_accuracy'))}",
        "epsilon": epsilon_text(target),
    }


def summary_table_rows(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per target × attack, as display strings keyed by `SUMMARY_COLUMNS`, in payload
    order.

    Each row also carries `violation` (bool): the attack's ε lower bound exceeds the target's
    claimed ε, which a correct DP accountant and a valid bound never allow. A target without
    attacks yields one row with empty attack columns. Missing keys show as "—".
    """
    rows: list[dict[str, Any]] = []
    for target in mappings(payload.get("targets")):
        base = _target_facts(target)
        epsilon = target_epsilon(target)
        for attack in mappings(target.get("attacks")) or [{}]:
            rows.append({**base, **_attack_row(attack, epsilon)})
    return rows


def target_tables(payload: Mapping[str, Any]) -> list[tuple[dict[str, str], list[dict[str, Any]]]]:
    """Per target: its facts (`TARGET_KEYS`) once, and its attack rows (display strings keyed
    like `SUMMARY_COLUMNS`, plus `violation`) strongest first by TPR at 0.1% FPR, then TPR at
    1% FPR, then AUC — never by the ε lower bound."""
    out = []
    for target in mappings(payload.get("targets")):
        epsilon = target_epsilon(target)
        attacks = sorted(mappings(target.get("attacks")), key=strength_key, reverse=True)
        out.append((_target_facts(target), [_attack_row(a, epsilon) for a in attacks]))
    return out


def render_html(folder: str | os.PathLike[str], payload: Mapping[str, Any]) -> str:
    """The report page for `payload`; image links are checked against the files in `folder`."""
    base = Path(folder)
    title = str(payload.get("title") or "privacylab report")
    meta = []
    for key, label in (("dataset", "dataset"), ("model", "model"), ("created", "created")):
        if payload.get(key) is not None:
            meta.append(f"{label}: {payload[key]}")
    if number(payload.get("seconds")) is not None:
        meta.append(f"run time: {fmt(payload.get('seconds'), 1)} s")
    chosen = [s for s in sections() if s.applies(payload)]
    css = _CSS + "".join(str(getattr(s, "css", "")) for s in chosen)
    body = [s.render(base, payload) for s in chosen]
    if not chosen:
        body.append("<p>No results.</p>")
    nav = " · ".join(f'<a href="#{e(s.key)}">{e(s.title)}</a>' for s in chosen)
    notes = payload.get("notes")
    if isinstance(notes, (list, tuple)) and notes:
        items = "".join(f"<li>{e(n)}</li>" for n in notes)
        body.append(f'<section id="notes">\n<h2>Notes</h2>\n<ul>{items}</ul>\n</section>')
        nav += ' · <a href="#notes">Notes</a>' if nav else '<a href="#notes">Notes</a>'
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title>",
        f"<style>{css}</style>",
        "</head>",
        "<body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="meta">{e(" · ".join(meta))}</p>' if meta else "",
        f"<nav>{nav}</nav>" if nav else "",
        *body,
        _SORT_SCRIPT if "sortable" in "".join(body) else "",
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(p for p in parts if p is not None)


def write_report(
    folder: str | os.PathLike[str], payload: Mapping[str, Any], images: Mapping[str, bytes]
) -> Path:
    """Write `results.json`, the PNG `images` and `index.html` into `folder`; return the page.

    `images` maps plain file names (no directories) to PNG bytes; the payload refers to them by
    those names. Every file is written atomically (temporary file, then `os.replace`) with the
    mode a plain `open` would give it (0644 under umask 022).
    """
    base = Path(folder)
    for name in images:
        if not isinstance(name, str) or not safe_name(name):
            raise ValueError(f"image name must be a plain file name, got {name!r}")
    base.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(base / "results.json", (_dumps(json_ready(payload)) + "\n").encode("utf-8"))
    for name, content in images.items():
        atomic_write_bytes(base / name, bytes(content))
    page = base / "index.html"
    atomic_write_bytes(page, render_html(base, payload).encode("utf-8"))
    return page
