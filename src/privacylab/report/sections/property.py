"""The property-inference section: how well a meta-classifier trained on shadow models tells
which world (without / with the property) each evaluation target's training set came from
(Ganju et al. 2018, Sec. 5 report the meta-classifier's accuracy; we add its AUC, the chance
level, a Clopper-Pearson interval and a binomial p-value against chance).

Its page anchor is `#property-inference`. Renders ``payload["property_inference"]`` (what
`privacylab attack property` writes): the facts (property, dataset, model, shadows, pools),
one row per attack (`attacks`: `PropertyResult.to_dict()`), and the score figure
(`images.scores`, made by `property_scores_figure`): every target's predicted probability of
world 1, by true world, one row of points per attack.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

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
from privacylab.report.plots import COLORS, FONT_PT, _to_png
from privacylab.report.sections import register_section

__all__ = ["COLUMNS", "PropertySection", "property_scores_figure", "property_scores_plot"]

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("method", "method", "the property-inference attack"),
    ("access", "access", "what the attack read of each target"),
    ("accuracy", "accuracy", "share of targets whose world was guessed right (threshold 0.5)"),
    ("accuracy_interval", "95% interval", "Clopper-Pearson interval of the accuracy"),
    ("auc", "AUC", "area under the ROC curve of the scores against the true worlds"),
    ("chance", "chance", "accuracy of always guessing the commoner world"),
    ("p_value", "p (vs chance)", "two-sided binomial test of the correct count against chance"),
    ("targets", "targets", "evaluation targets (half per world)"),
    ("queries", "queries", "queries sent to all targets (white-box reads none)"),
    ("meta_train_accuracy", "meta train acc.", "the meta-classifier's accuracy on its shadows"),
    ("seconds", "seconds", "meta-classifier fit plus scoring"),
)
"""(key, header, tooltip) of the table."""

_TEXT = {"method", "access", "accuracy_interval"}

WORLD_STYLE = ((COLORS[0], "o", "world 0 (without)"), (COLORS[1], "^", "world 1 (with)"))

READING_GUIDE = (
    "Each point is one evaluation target: the meta-classifier's probability that its training "
    "set has the property (world 1), placed by its true world. A working attack puts the "
    "world-1 targets (triangles) right of 0.5 and the world-0 targets (circles) left of it; on a "
    "property the training data does not vary in, both mix around the middle and accuracy "
    "stays within its binomial interval around chance."
)


def property_scores_plot(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """One row of points per attack: each target's score (probability of world 1) by its
    true world, the 0.5 threshold dashed; the label names accuracy and AUC."""
    rows = [r for r in rows if isinstance(r.get("scores"), list)]
    height = 1.2 + 0.7 * max(1, len(rows))
    fig = Figure(figsize=(7.6, height))
    ax = fig.add_subplot(1, 1, 1)
    rng = np.random.default_rng(0)
    labels = []
    for i, row in enumerate(rows):
        scores = np.asarray([number(s) for s in row["scores"]], dtype=float)
        worlds = np.asarray(row.get("worlds") or [0] * len(scores), dtype=int)
        for world, (color, marker, name) in enumerate(WORLD_STYLE):
            chosen = worlds == world
            offset = (world - 0.5) * 0.3 + rng.uniform(-0.08, 0.08, int(chosen.sum()))
            ax.scatter(
                scores[chosen],
                i + offset,
                s=28,
                marker=marker,
                facecolors="none" if world == 0 else color,
                edgecolors=color,
                label=name if i == 0 else None,
            )
        labels.append(
            f"{row.get('method', '?')}\nacc {fmt(row.get('accuracy'), 2)}, "
            f"AUC {fmt(row.get('auc'), 2)}"
        )
    ax.axvline(0.5, color="#7f7f7f", linestyle="--", linewidth=1)
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(max(1, len(rows)) - 0.4, -0.6)
    ax.set_yticks(range(len(rows)), labels, fontsize=FONT_PT)
    ax.set_xlabel("predicted probability of world 1 (the property holds)", fontsize=FONT_PT)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(axis="x", alpha=0.3)
    if rows:
        ax.legend(fontsize=FONT_PT, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)
    return fig


def property_scores_figure(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """`property_scores_plot` as PNG bytes."""
    return _to_png(property_scores_plot(rows))


def _value(row: Mapping[str, Any], key: str) -> Any:
    if key == "meta_train_accuracy":
        params = row.get("params")
        return params.get(key) if isinstance(params, Mapping) else None
    return row.get(key)


def _cell(key: str, value: Any) -> str:
    if key in _TEXT:
        if key == "accuracy_interval" and isinstance(value, list) and len(value) == 2:
            text = f"[{fmt(value[0], 2)}, {fmt(value[1], 2)}]"
        else:
            text = value
        return text_cell(text)
    if key in ("targets", "queries"):
        return num_cell(value, fmt_int(value))
    if key == "p_value":
        x = number(value)
        return num_cell(value, MISSING if x is None else f"{x:.2g}")
    if key == "seconds":
        return num_cell(value, fmt(value, 2))
    return num_cell(value)


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    body = [
        "<tr>" + "".join(_cell(k, _value(row, k)) for k, _, _ in COLUMNS) + "</tr>" for row in rows
    ]
    return sortable_table("property-runs", COLUMNS, body, text=_TEXT, empty="no attack")


def _facts(block: Mapping[str, Any]) -> str:
    counts = (
        ("parameters", "{} parameters"),
        ("shadows_per_world", "{} shadows per world"),
        ("train_size", "training sets of {} rows"),
        ("attacker_pool", "attacker's pool: {} rows"),
        ("owner_pool", "owners' pool: {} rows"),
    )
    parts = [f"{key}: {block[key]}" for key in ("dataset", "model") if block.get(key)]
    parts += [text.format(fmt_int(block[key])) for key, text in counts if block.get(key)]
    if block.get("models_trained") is not None:
        parts.append(
            f"models trained: {fmt_int(block.get('models_trained'))}, from the store: "
            f"{fmt_int(block.get('models_from_store'))}"
        )
    return " · ".join(parts)


def _shares(block: Mapping[str, Any]) -> str:
    cells = []
    for role, name in (("shadow", "shadows"), ("target", "targets")):
        values = [block.get(f"{role}_share_world{w}") for w in (0, 1)]
        if all(number(v) is not None for v in values):
            cells.append(f"{name}: {fmt(values[0], 3)} (world 0) vs {fmt(values[1], 3)} (world 1)")
    return "measured property in the training sets — " + "; ".join(cells) if cells else ""


@register_section
class PropertySection:
    """Property inference: facts, the score figure, the table of attacks."""

    key = "property-inference"
    title = "Property inference"
    order = 45

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload has a property-inference block with at least one attack."""
        return bool(mappings(section_block(payload, "property_inference").get("attacks")))

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """Property, facts, the score figure and guide, the table."""
        block = section_block(payload, "property_inference")
        rows = list(mappings(block.get("attacks")))
        images = block.get("images")
        images = images if isinstance(images, Mapping) else {}
        description = block.get("description") or block.get("property") or ""
        picture = figure(
            folder,
            images.get("scores"),
            "Each target's predicted probability of the property, by its true world",
            "Meta-classifier scores of the evaluation targets by true world: "
            + ", ".join(str(r.get("method")) for r in rows),
        )
        shares = _shares(block)
        facts = _facts(block)
        parts = [
            f'<section id="{self.key}">',
            f"<h2>{e(self.title)}</h2>",
            f"<p>Property <code>{e(block.get('property'))}</code>: {e(description)}.</p>"
            if block.get("property")
            else "",
            f'<p class="meta">{e(facts)}</p>' if facts else "",
            f'<p class="small">{e(shares)}</p>' if shares else "",
            f'<p class="small">{e(READING_GUIDE)}</p>',
            picture,
            f"<h3>Attacks ({len(rows)})</h3>",
            _table(rows),
            "</section>",
        ]
        return "\n".join(p for p in parts if p)
