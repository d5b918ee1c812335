"""The model-extraction section: how much of the victim each attack stole for how many
queries, defended and not, and whether the query watch (PRADA, Juuti et al. 2019) noticed.

Its page anchor is `#model-extraction` (tests/report/test_sections.py registers a stand-in
section under the key "extraction" to show that a family is one module). Renders
``payload["extraction"]`` (what `privacylab attack extraction` writes): the victim's
facts (`target`), one row per attack and deployment (`attacks`: the `ExtractionResult`
dict plus `defense`, `output`, `precision`) and the curve figure (`images.curves`). Tables:
every run (queries, accuracy, fidelity, the victim's accuracy, seconds); the exact attacks'
recovery (neurons recovered, max |weight error| after alignment, max output error as log₂ —
Carlini, Jagielski & Mironov 2020 report the same two errors); the watches' detection (whether
and after how many queries each run was flagged, Juuti et al. 2019, Table 3's measure).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privacylab.report._format import (
    MISSING,
    e,
    figure,
    fmt,
    fmt_int,
    mappings,
    num_cell,
    number,
    section_block,
    sortable_table,
    text_cell,
)
from privacylab.report.extraction import row_label
from privacylab.report.sections import register_section

RUN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("method", "method", "the extraction attack"),
    ("output", "output", "what a query returned (labels, scores, rounded scores, logits)"),
    ("defense", "defence", "output defences and query watches in front of the victim"),
    ("queries", "queries", "queries the attack sent (counted by the target)"),
    ("accuracy", "accuracy", "the stolen copy's accuracy on held-out data"),
    ("fidelity", "fidelity", "agreement of the copy's labels with the victim's on held-out data"),
    ("victim_accuracy", "victim acc.", "the victim's own accuracy on the same rows"),
    ("seconds", "seconds", "wall-clock time of the attack"),
    ("stopped", "stopped", "why the attack stopped early (budget, refused), if it did"),
)
"""(key, header, tooltip) of the table of every run."""

EXACT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("method", "method"),
    ("defense", "defence"),
    ("queries", "queries"),
    ("neurons_recovered", "neurons recovered"),
    ("neurons_total", "neurons"),
    ("neurons_missed", "missed"),
    ("neurons_unobservable", "unobservable"),
    ("max_weight_error", "max |weight error|"),
    ("max_output_error_log2", "max output error (log₂)"),
    ("fidelity", "fidelity"),
    ("precision", "precision"),
)
"""(key, header) of the exact attacks' table."""

DETECTION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("method", "method"),
    ("output", "output"),
    ("watch", "watch"),
    ("detected", "detected"),
    ("queries_until_detection", "queries until detection"),
    ("queries", "queries sent"),
)
"""(key, header) of the detection table."""

EXACT_KEYS = ("max_weight_error", "max_output_error_log2", "neurons_recovered", "neurons_total")

READING_GUIDE = (
    "Each curve is one attack through one deployment: the thief's copy after a number of "
    "queries, measured on held-out rows the thief never saw. Fidelity is the share of those "
    "rows on which the copy gives the victim's label (what a thief who wants a drop-in "
    "replacement cares about); accuracy is the copy's own test accuracy, bounded in practice "
    "by the victim's (dotted). Solid curves are undefended; dashed ones with hollow squares "
    "were measured through a defence. A query watch such as PRADA does not change the "
    "answers; it says whether, and after how many queries, it would have flagged the client."
)


_TEXT = {"method", "output", "defense", "stopped", "watch", "detected", "precision"}


def _cell(key: str, value: Any) -> str:
    if key in _TEXT:
        if key == "detected" and isinstance(value, bool):
            return text_cell("yes" if value else "no")
        return text_cell(value)
    if key in {"queries", "queries_until_detection"} or key.startswith("neurons_"):
        return num_cell(value, fmt_int(value))
    if key == "seconds":
        return num_cell(value, fmt(value, 2))
    if key == "max_weight_error":
        x = number(value)
        return num_cell(value, MISSING if x is None else f"{x:.3g}")
    if key == "max_output_error_log2":
        return num_cell(value, fmt(value, 1))
    return num_cell(value)


def _table(rows: list[Mapping[str, Any]], columns: Any, klass: str, empty: str) -> str:
    body = []
    for row in rows:
        cells = "".join(_cell(c[0], row.get(c[0])) for c in columns)
        error = row.get("error")
        title = f' title="{e(error)}"' if error else ""
        body.append(f"<tr{title}>{cells}</tr>")
    return sortable_table(klass, columns, body, text=_TEXT, empty=empty)


def _watch_rows(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (run, watch): runs whose result holds a watch verdict."""
    out = []
    for row in rows:
        if "detected" not in row and "watches" not in row:
            continue
        watches = mappings(row.get("watches")) or [row]
        for watch in watches:
            out.append(
                {
                    "method": row.get("method"),
                    "output": row.get("output"),
                    "watch": watch.get("watch") or row.get("defense"),
                    "detected": watch.get("detected"),
                    "queries_until_detection": watch.get("queries_until_detection"),
                    "queries": row.get("queries"),
                }
            )
    return out


def _facts(target: Mapping[str, Any]) -> str:
    shape = target.get("input_shape")
    parts = [
        f"victim: {target.get('name')}" if target.get("name") else None,
        f"dataset: {target.get('dataset')}" if target.get("dataset") else None,
        f"model: {target.get('model')}" if target.get("model") else None,
        f"input {'x'.join(str(s) for s in shape)}" if isinstance(shape, list) else None,
        f"{target.get('num_classes')} classes" if target.get("num_classes") else None,
        f"{fmt_int(target.get('parameters'))} parameters" if target.get("parameters") else None,
        f"thief's pool: {fmt_int(target.get('pool_rows'))} rows"
        if target.get("pool_rows") is not None
        else None,
        f"evaluation: {fmt_int(target.get('eval_rows'))} rows"
        if target.get("eval_rows") is not None
        else None,
    ]
    return " · ".join(p for p in parts if p)


@register_section
class ExtractionSection:
    """Model extraction: curves, every run, exact recovery and detection."""

    key = "model-extraction"
    title = "Model extraction"
    order = 30
    css = """
table.extraction-runs tr[title] td { color: #a40000; }
"""

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload has an extraction block with at least one run."""
        return bool(mappings(section_block(payload, "extraction").get("attacks")))

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """Facts, the curve figure and guide, the run table, exact recovery, detection."""
        block = section_block(payload, "extraction")
        rows = list(mappings(block.get("attacks")))
        target = block.get("target")
        target = target if isinstance(target, Mapping) else {}
        images = block.get("images")
        images = images if isinstance(images, Mapping) else {}
        methods = sorted({str(r.get("method")) for r in rows})
        picture = figure(
            folder,
            images.get("curves"),
            "Fidelity and accuracy of each stolen copy against the queries it cost",
            "Fidelity (top) and accuracy (bottom) against queries: "
            + ", ".join(row_label(r) for r in rows),
        )
        exact = [r for r in rows if any(k in r for k in EXACT_KEYS)]
        watched = _watch_rows(rows)
        failed = [r for r in rows if r.get("error")]
        parts = [
            f'<section id="{self.key}">',
            f"<h2>{e(self.title)}</h2>",
            f'<p class="meta">{e(_facts(target))}</p>' if _facts(target) else "",
            f'<p class="small">{e(READING_GUIDE)}</p>',
            picture,
            f"<h3>Every run ({len(rows)}: {e(', '.join(methods))})</h3>",
            _table(rows, RUN_COLUMNS, "extraction-runs", "no runs"),
        ]
        for row in failed:
            parts.append(
                f'<p class="small">{e(row_label(row))} stopped before a copy was made: '
                f"{e(row.get('error'))}</p>"
            )
        if exact:
            parts += [
                "<h3>Exact extraction: recovered weights</h3>",
                '<p class="small">Recovered layers are aligned with the victim\'s (neuron '
                "permutation and positive scaling, the symmetries of a ReLU network) before "
                "the weight error is taken; the output error is the largest difference over "
                "random inputs, as log₂ (−25 means within 2⁻²⁵).</p>",
                _table(exact, EXACT_COLUMNS, "extraction-exact", "no exact attack"),
            ]
        if watched:
            parts += [
                "<h3>Detection by query watches</h3>",
                '<p class="small">Each attack is one client with a fresh watch; a watch that '
                "never flagged it shows “no”.</p>",
                _table(watched, DETECTION_COLUMNS, "extraction-detection", "no watch"),
            ]
        parts.append("</section>")
        return "\n".join(p for p in parts if p)
