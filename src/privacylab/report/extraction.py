"""The extraction section's figure and row helpers: the thief's test accuracy and its fidelity
(agreement with the victim's labels on held-out data, Jagielski et al. 2020, Sec. 3) against
the queries it spent, one curve per attack and deployment (Tramèr et al. 2016, Fig. 4-style
learning curves; Orekondy et al. 2019, Fig. 4).

numpy/matplotlib only (no torch): the report imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from privacylab.report._format import mappings, number
from privacylab.report.plots import COLORS, FONT_PT, LEGEND_FONT_PT, _to_png

__all__ = [
    "curve_points",
    "extraction_curves_figure",
    "extraction_curves_plot",
    "row_label",
]

DEFENDED_STYLE = (0, (5, 2))
"""Line style of a curve measured through a defence (undefended curves are solid)."""


def row_label(row: Mapping[str, Any]) -> str:
    """ "knockoff (scores)" or "knockoff (scores, prada)": method, output and any defence."""
    parts = [str(row.get("output") or row.get("access") or "?")]
    defense = row.get("defense")
    if defense and defense != "none":
        parts.append(str(defense))
    return f"{row.get('method', '?')} ({', '.join(parts)})"


def curve_points(row: Mapping[str, Any]) -> list[tuple[float, float | None, float | None]]:
    """(queries, accuracy, fidelity) of a row's curve, in query order; the row's final point
    when it has no curve but has a result."""
    points = []
    for point in mappings(row.get("curve")):
        queries = number(point.get("queries"))
        if queries is None or queries <= 0:
            continue
        points.append((queries, number(point.get("accuracy")), number(point.get("fidelity"))))
    if not points:
        queries = number(row.get("queries"))
        if queries is not None and queries > 0:
            points.append((queries, number(row.get("accuracy")), number(row.get("fidelity"))))
    return sorted(points, key=lambda p: p[0])


def _plain(value: float, _: Any) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def _minor(value: float, _: Any) -> str:
    """Label the minor ticks 2 and 5 of each decade (the log axis is otherwise bare)."""
    lead = value / 10 ** math.floor(math.log10(value)) if value > 0 else 0.0
    return _plain(value, None) if round(lead, 6) in (2.0, 5.0) else ""


def extraction_curves_plot(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """The figure of `extraction_curves_figure` (for tests that inspect its lines)."""
    fig = Figure(figsize=(7.6, 6.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    methods: list[str] = []
    drawn = 0
    for row in rows:
        method = str(row.get("method", "?"))
        if method not in methods:
            methods.append(method)
        points = curve_points(row)
        if not points:
            continue
        color = COLORS[methods.index(method) % len(COLORS)]
        defended = row.get("defense") not in (None, "none")
        style = DEFENDED_STYLE if defended else "-"
        xs = [p[0] for p in points]
        for ax, index in ((top, 2), (bottom, 1)):
            ys = [p[index] for p in points]
            kept = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if kept:
                ax.plot(
                    *zip(*kept, strict=True),
                    marker="s" if defended else "o",
                    markersize=7 if defended else 4,
                    markerfacecolor="none" if defended else color,
                    color=color,
                    linestyle=style,
                    linewidth=1.8,
                    label=row_label(row) if ax is top else None,
                )
        drawn += 1
    victim = [number(r.get("victim_accuracy")) for r in rows]
    victim = [v for v in victim if v is not None]
    if victim:
        bottom.axhline(
            victim[0], color="0.4", linestyle=":", linewidth=1.2, label="victim's accuracy"
        )
    top.set_ylabel("fidelity\n(agreement with the victim)", fontsize=FONT_PT)
    bottom.set_ylabel("thief's test accuracy", fontsize=FONT_PT)
    bottom.set_xlabel("queries sent (log scale)", fontsize=FONT_PT)
    for ax in (top, bottom):
        ax.set_ylim(0.0, 1.02)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(_plain))
        ax.xaxis.set_minor_formatter(FuncFormatter(_minor))
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=FONT_PT - 1)
    if drawn == 0:
        top.text(0.5, 0.5, "no curve to draw", ha="center", va="center", transform=top.transAxes)
    else:
        handles, labels = top.get_legend_handles_labels()
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncol=2,
            fontsize=LEGEND_FONT_PT,
            frameon=False,
        )
    if victim:
        bottom.legend(loc="lower right", fontsize=LEGEND_FONT_PT, frameon=False)
    top.set_title(
        "Model extraction: fidelity and accuracy against queries "
        "(solid: undefended; dashed, hollow squares: defended)",
        fontsize=FONT_PT + 1,
    )
    return fig


def extraction_curves_figure(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """PNG of fidelity (top) and the thief's test accuracy (bottom) against queries (log
    scale) for every attack row; colour per method, dashed when measured through a defence;
    the victim's own accuracy as a dotted line."""
    return _to_png(extraction_curves_plot(rows))
