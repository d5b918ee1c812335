"""PNG plots of a report: log-log ROC curves, score histograms and privacy–utility.

Figures are built as `matplotlib.figure.Figure` objects rendered by the Agg canvas, never through
pyplot, so no global figure state is created or leaked. Sizes are chosen for the page: the HTML
shows each PNG at no more than its natural width, so `LEGEND_FONT_PT` at `DPI` is what a reader
sees (at least 9 pt).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from privacylab.report._format import atomic_write_bytes
from privacylab.report.metrics import auc, roc_curve, tpr_at_fpr

if TYPE_CHECKING:
    from privacylab.report.metrics import ScoredResult

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DPI = 110
"""Dots per inch of every PNG (the page shows them at 1 image pixel per CSS pixel or less)."""
LEGEND_FONT_PT = 10
FONT_PT = 10
ROC_SIZE_IN = (7.6, 5.2)
"""Width and height of the ROC axes area in inches; the legend below adds to the height."""

COLORS = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#000000", "#7f7f7f", "#aa6600", "#004d40", "#880e4f", "#3949ab", "#689f38",
)  # fmt: skip
"""16 qualitative colours; with `LINESTYLES` (4, coprime cycle) 16 attacks differ in colour and
48 in (colour, line style)."""
LINESTYLES = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)))


def _to_png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", pad_inches=0.08)
    return buf.getvalue()


def line_style(i: int) -> tuple[str, Any]:
    """(colour, line style) of the i-th curve: no two of the first 16 share a colour."""
    return COLORS[i % len(COLORS)], LINESTYLES[(i // len(COLORS) + i) % len(LINESTYLES)]


def roc_plot(results: Sequence[ScoredResult], title: str) -> Figure:
    """The figure of `roc_figure` (for tests that measure its legend)."""
    if len(results) == 0:
        raise ValueError("roc_figure needs at least one result")
    curves = []
    negatives = 1
    for result in results:
        fpr, tpr, _ = roc_curve(result.scores, result.membership)
        low_tpr = tpr_at_fpr(fpr, tpr, 1e-3)
        curves.append((low_tpr, auc(fpr, tpr), result.attack, fpr, tpr))
        negatives = max(negatives, int(np.sum(np.asarray(result.membership) == 0)))
    low = min(1e-3, 1.0 / negatives)
    curves.sort(key=lambda c: (-c[0], -c[1]))

    fig = Figure(figsize=ROC_SIZE_IN, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([low, 1.0], [low, 1.0], linestyle="--", color="0.55", linewidth=1, label="chance")
    for fpr_mark in (1e-3, 1e-2):
        ax.axvline(fpr_mark, color="0.8", linewidth=0.8, zorder=0)
    for i, (low_tpr, area, name, fpr, tpr) in enumerate(curves):
        color, style = line_style(i)
        ax.plot(
            np.clip(fpr, low, 1.0),
            np.clip(tpr, low, 1.0),
            linewidth=2.4 if i == 0 else 1.5,
            color=color,
            linestyle=style,
            label=f"{name}: TPR@0.1%FPR {low_tpr:.3f}, AUC {area:.3f}",
            drawstyle="steps-post",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, 1.0)
    ax.set_ylim(low, 1.0)
    ax.set_xlabel("false positive rate (non-members wrongly accused)", fontsize=FONT_PT)
    ax.set_ylabel("true positive rate (members found)", fontsize=FONT_PT)
    ax.tick_params(labelsize=FONT_PT)
    ax.set_title(title, fontsize=FONT_PT + 1)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2,
        fontsize=LEGEND_FONT_PT,
        frameon=False,
        handlelength=3.0,
        columnspacing=1.5,
    )
    return fig


def roc_figure(results: Sequence[ScoredResult], title: str) -> bytes:
    """PNG of the ROC curves of several attacks on one log-log plot, legend below the axes.

    Log-log axes follow Carlini et al. 2022 ("Membership Inference Attacks From First
    Principles", Sec. 4), which argue the low-FPR region is what matters. The axes start at
    min(1e-3, 1/n) for n the largest number of non-members, so 0.1% FPR is always visible (grey
    lines mark 0.1% and 1% FPR); curves and legend entries are ordered by TPR at 0.1% FPR, the
    strongest drawn thicker. The chance line TPR = FPR is dashed grey.
    """
    return _to_png(roc_plot(results, title))


def histogram_informative(result: ScoredResult) -> bool:
    """Whether a histogram of the attack's scores shows anything: at least 10 distinct finite
    values, none holding more than half the examples (not a single spike or a 0/1 attack)."""
    scores = np.asarray(result.scores, dtype=np.float64).reshape(-1)
    values = scores[np.isfinite(scores)]
    if values.size < 10:
        return False
    _, counts = np.unique(values, return_counts=True)
    return counts.size >= 10 and counts.max() <= 0.5 * values.size


def histogram_figure(result: ScoredResult, title: str) -> bytes:
    """PNG of the member and non-member score counts of one attack, overlaid, log-scale counts.

    Both histograms share 50 bins; infinite scores are left out and counted in the legend.
    """
    scores = np.asarray(result.scores, dtype=np.float64).reshape(-1)
    membership = np.asarray(result.membership).reshape(-1)
    if scores.shape != membership.shape:
        raise ValueError(f"{scores.size} scores but {membership.size} membership labels")
    finite = np.isfinite(scores)
    values = scores[finite]
    if values.size and values.min() < values.max():
        bins = np.linspace(values.min(), values.max(), 51)
    else:
        centre = float(values[0]) if values.size else 0.0
        bins = np.linspace(centre - 0.5, centre + 0.5, 51)

    fig = Figure(figsize=(5.4, 3.4), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    for label, mask, color in (
        ("non-members", membership == 0, "tab:blue"),
        ("members", membership == 1, "tab:orange"),
    ):
        chosen = scores[mask & finite]
        dropped = int(np.sum(mask & ~finite))
        text = f"{label} (n={int(mask.sum())}" + (f", {dropped} infinite)" if dropped else ")")
        if chosen.size:
            ax.hist(chosen, bins=bins, alpha=0.55, color=color, label=text, histtype="stepfilled")
        else:
            ax.plot([], [], color=color, label=text)
    ax.set_yscale("log")
    ax.set_xlabel("attack score (higher = more likely member)", fontsize=FONT_PT)
    ax.set_ylabel("examples (log scale)", fontsize=FONT_PT)
    ax.tick_params(labelsize=FONT_PT - 1)
    ax.set_title(title, fontsize=FONT_PT)
    ax.legend(loc="best", fontsize=FONT_PT - 1)
    return _to_png(fig)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def privacy_utility_figure(
    targets: Sequence[Mapping[str, Any]], *, threshold: float | None = None
) -> bytes:
    """PNG of test accuracy (top) and the strongest attack's TPR at 0.1% FPR (bottom, log
    scale) against each target's ε (log scale); a non-private target sits at the right at "∞".

    `targets` are payload targets: `epsilon` (None for non-private), `test_accuracy` and
    `verdict` (from `report.verdict.target_verdict`) or `attacks`. Chance (0.1%) and the
    verdict `threshold` are drawn as horizontal lines. A TPR of 0 is drawn at the axis floor.
    """
    from privacylab.report.verdict import target_verdict

    points = []
    for target in targets:
        verdict = target.get("verdict")
        if not isinstance(verdict, Mapping):
            verdict = target_verdict(target)
        points.append(
            (
                _finite(target.get("epsilon")),
                _finite(target.get("test_accuracy")),
                _finite(verdict.get("tpr_at_01pct_fpr")),
                str(target.get("name", "")),
            )
        )
    if not points:
        raise ValueError("privacy_utility_figure needs at least one target")
    eps = [p[0] for p in points if p[0] is not None and p[0] > 0]
    lo, hi = (min(eps), max(eps)) if eps else (1.0, 1.0)
    inf_x = hi * 4.0
    xs = [p[0] if p[0] is not None and p[0] > 0 else inf_x for p in points]
    order = np.argsort(xs, kind="stable")
    floor = 3e-4

    fig = Figure(figsize=(6.4, 5.0), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    acc = [(xs[i], points[i][1]) for i in order if points[i][1] is not None]
    if acc:
        top.plot(*zip(*acc, strict=True), marker="o", color="#1f77b4", linewidth=1.8)
    top.set_ylabel("test accuracy", fontsize=FONT_PT)
    top.set_ylim(0.0, 1.02)
    tprs = [(xs[i], max(points[i][2], floor)) for i in order if points[i][2] is not None]
    if tprs:
        bottom.plot(*zip(*tprs, strict=True), marker="s", color="#d62728", linewidth=1.8)
        for x, y in tprs:
            bottom.annotate(
                f"{100 * y:.2g}%" if y > floor else "0%",
                (x, y),
                textcoords="offset points",
                xytext=(6, 4),
                fontsize=FONT_PT - 1,
            )
    bottom.axhline(1e-3, color="0.5", linestyle="--", linewidth=1, label="chance (0.1%)")
    if threshold is not None and threshold > 0:
        bottom.axhline(
            threshold, color="#d62728", linestyle=":", linewidth=1.2, label="verdict threshold"
        )
    bottom.set_yscale("log")
    bottom.set_ylim(floor * 0.8, 1.0)
    bottom.set_ylabel("strongest attack:\nTPR at 0.1% FPR", fontsize=FONT_PT)
    bottom.legend(loc="upper left", fontsize=FONT_PT - 1, frameon=False)
    bottom.set_xscale("log")
    bottom.set_xlim(lo / 2.0, inf_x * 2.0)
    ticks, names = sorted(set(eps)), [f"{t:.3g}" for t in sorted(set(eps))]
    if any(p[0] is None or p[0] <= 0 for p in points):
        ticks, names = [*ticks, inf_x], [*names, "∞\nnon-private"]
    bottom.set_xticks(ticks, names)
    bottom.minorticks_off()
    bottom.set_xlabel("ε (privacy budget; smaller is more private)", fontsize=FONT_PT)
    for ax in (top, bottom):
        ax.tick_params(labelsize=FONT_PT - 1)
        ax.grid(True, alpha=0.3)
    top.set_title("Privacy–utility: accuracy and attack success against ε", fontsize=FONT_PT + 1)
    return _to_png(fig)


def save_png(data: bytes, path: str | os.PathLike[str]) -> Path:
    """Write PNG bytes to `path` atomically (temporary file, then `os.replace`)."""
    if not bytes(data[:8]) == PNG_SIGNATURE:
        raise ValueError(f"not PNG data, refusing to write {os.fspath(path)}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target, data)
    return target
