"""The memorization section: training code that hides its training data in the model it
returns (Song, Ristenpart & Shmatikov, "Machine Learning Models that Remember Too Much", CCS
2017) — least significant bits, correlated value and sign encoding of the weights (white-box),
capacity abuse through label queries (black-box) — and the checks that catch it.

Its page anchor is `#memorization`. Renders ``payload["memorization"]`` (what
`privacylab.report.memorization.add_memorization_run` merges): a one-line verdict, then per
run the training images beside what was decoded from the released model (Song et al.'s
Figs. 2-4), then the table of every run (method, ε, clean accuracy against the honest
model's, items recovered of the total, bit accuracy, PSNR, queries, bits recovered per
parameter or per query, weight checks flagged) and any benchmark table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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
    percent,
    section_block,
    sortable_table,
    text_cell,
)
from privacylab.report.memorization import checks_flagged, run_label, verdict
from privacylab.report.sections import register_section

__all__ = ["RUN_COLUMNS", "MemorizationSection", "runs_table", "table"]

RUN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run", "run", "the run's folder (hover: its full path)"),
    ("method", "method", "lsb, correlation, sign (white-box) or capacity (label queries)"),
    ("epsilon", "ε", "DP-SGD's ε of the holder's training (∞: non-private)"),
    (
        "accuracy",
        "clean acc. (honest)",
        "the released model on the test rows; in brackets an honest model of the same recipe",
    ),
    (
        "recovered",
        "recovered",
        "secret items decoded nearer to their original than to any other training row",
    ),
    ("bit_accuracy", "bit acc.", "share of the secret's bits decoded right"),
    ("psnr", "PSNR (dB)", "mean peak signal-to-noise ratio of the decoded images (capped 100)"),
    ("queries", "queries", "label queries of the decoder (counted by the target)"),
    (
        "rate",
        "bits / param or query",
        "bits recovered (bits × (1 − h(bit error))) per parameter (white-box) or per query",
    ),
    (
        "checks",
        "checks flagged",
        "weight checks that flag the released model (hover: the honest model's)",
    ),
)
"""(key, header, tooltip) of the runs table."""

GUIDE = (
    "The data holder trained on its own rows with training code it did not write and "
    "released the model. The decoder sees only the released model (white-box) or its labels "
    "on chosen inputs (capacity abuse), and the secret's public layout; the originals are "
    "compared afterwards. An item counts as recovered when its decoding is nearer to its own "
    "training image than to any other training row. The honest model's accuracy is that of "
    "the same recipe and seed without the encoding; the weight checks run on both models, "
    "so a check flagging the honest one is a false positive."
)


def _short(folder: Any) -> str:
    return Path(str(folder)).name or str(folder)


def _epsilon_cell(entry: Mapping[str, Any]) -> str:
    epsilon = number(entry.get("epsilon"))
    if epsilon is None:
        return num_cell(float("inf"), "∞", title="non-private")
    delta = number(entry.get("delta"))
    return num_cell(epsilon, f"{epsilon:.3g}" + ("" if delta is None else f" (δ={delta:.0e})"))


def _rate_cell(entry: Mapping[str, Any]) -> str:
    per_param = number(entry.get("bits_per_parameter"))
    per_query = number(entry.get("bits_per_query"))
    if per_param is not None:
        return num_cell(per_param, f"{per_param:.3g} / param")
    if per_query is not None:
        return num_cell(per_query, f"{per_query:.3g} / query")
    return num_cell(None)


def _checks_cell(entry: Mapping[str, Any]) -> str:
    checks = entry.get("checks")
    if not isinstance(checks, Mapping) or not checks:
        return text_cell(None)
    flagged = checks_flagged(entry)
    honest = checks_flagged(entry, honest=True)
    title = "honest model flagged by: " + (", ".join(honest) if honest else "none")
    return text_cell(", ".join(flagged) if flagged else "none", title=title)


def runs_table(runs: Sequence[Mapping[str, Any]]) -> str:
    """One sortable row per run (`RUN_COLUMNS`)."""
    body = []
    for r in runs:
        clean, honest = r.get("clean_accuracy"), r.get("honest_accuracy")
        accuracy = MISSING if number(clean) is None else percent(clean)
        if number(honest) is not None:
            accuracy += f" ({percent(honest)})"
        items, recovered = r.get("items"), r.get("recovered")
        cells = [
            text_cell(run_label(r), title=str(r.get("folder"))),
            text_cell(r.get("method")),
            _epsilon_cell(r),
            num_cell(clean, accuracy),
            num_cell(recovered, f"{fmt_int(recovered)} / {fmt_int(items)}"),
            num_cell(r.get("bit_accuracy"), percent(r.get("bit_accuracy"))),
            num_cell(r.get("psnr"), fmt(r.get("psnr"), 1)),
            num_cell(r.get("queries"), fmt_int(r.get("queries"))),
            _rate_cell(r),
            _checks_cell(r),
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return sortable_table(
        "memorization-runs", RUN_COLUMNS, body, text={"run", "method", "checks"}, empty="no run"
    )


def _value_cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return text_cell(None if value is None else ("yes" if value else "no"))
    if isinstance(value, int):
        return num_cell(value, fmt_int(value))
    if isinstance(value, float):
        return num_cell(value, fmt(value, 3))
    if isinstance(value, (Mapping, list, tuple)):
        text = json.dumps(value, ensure_ascii=False, default=str)
        return text_cell(text if len(text) <= 80 else text[:79] + "…", title=text[:500])
    return text_cell(value)


def table(name: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """A benchmark table as it comes: one column per key in first-seen order, numbers
    formatted, nested values as short JSON, every text escaped."""
    keys: list[str] = []
    for row in rows:
        keys += [str(k) for k in row if str(k) not in keys]
    columns = [(k, k.replace("_", " ")) for k in keys]
    text = {k for k in keys if all(not isinstance(r.get(k), (int, float)) for r in rows)}
    body = ["<tr>" + "".join(_value_cell(r.get(k)) for k in keys) + "</tr>" for r in rows]
    return sortable_table(
        f"memorization-table-{e(name)}", columns, body, text=text, empty="no rows"
    )


def _pictures(folder: Path, entry: Mapping[str, Any]) -> str:
    images = entry.get("images") if isinstance(entry.get("images"), Mapping) else {}
    count = images.get("count")
    rows = images.get("rows") or []
    below = "decoded from the released model"
    if "requantized" in rows:
        below += ", and from the re-quantised model"
    caption = f"{run_label(entry)}: training images (top) and {below}" + (
        "" if number(count) is None else f" (first {fmt_int(count)})"
    )
    shown = figure(
        folder,
        images.get("pairs"),
        "the secret's training images above their decodings",
        caption,
        "memorization-pairs",
    )
    if not shown:
        return ""
    return f'<h3 class="memorization-run">{e(run_label(entry))}</h3>\n{shown}'


@register_section
class MemorizationSection:
    """Memorization attacks: originals beside decodings, then the runs and benchmark tables."""

    key = "memorization"
    title = "Memorization: training code that hides its data"
    order = 57
    css = """
figure.memorization-pairs img { image-rendering: pixelated; max-width: 100%; }
"""

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload holds a memorization run or table."""
        block = section_block(payload, "memorization")
        tables = block.get("tables")
        return bool(
            mappings(block.get("runs")) or (isinstance(tables, Mapping) and any(tables.values()))
        )

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """Verdict, pictures per run, the runs table and the benchmark tables."""
        block = section_block(payload, "memorization")
        runs = mappings(block.get("runs"))
        tables = block.get("tables") if isinstance(block.get("tables"), Mapping) else {}
        parts = [
            f'<section id="{self.key}">',
            f"<h2>{e(self.title)}</h2>",
            f'<p class="verdict">{e(verdict(block))}</p>',
            f'<p class="small">{e(GUIDE)}</p>',
        ]
        parts += [_pictures(folder, r) for r in runs]
        if runs:
            parts += ['<h3 id="memorization-runs">Runs</h3>', runs_table(runs)]
        for name, rows in tables.items():
            rows = mappings(rows)
            if rows:
                parts.append(f'<h3 id="memorization-table-{e(name)}">Table: {e(name)}</h3>')
                parts.append(table(name, rows))
        parts.append("</section>")
        return "\n".join(p for p in parts if p)
