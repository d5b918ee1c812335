"""PNG plots of membership attacks: log-log ROC curves and score histograms.

Figures are built as `matplotlib.figure.Figure` objects rendered by the Agg canvas, never through
pyplot, so no global figure state is created or leaked.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from privacylab.report.html import atomic_write_bytes
from privacylab.report.metrics import auc, roc_curve, tpr_at_fpr

if TYPE_CHECKING:
    from privacylab.attacks.membership.result import MembershipResult

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _to_png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def roc_figure(results: Sequence[MembershipResult], title: str) -> bytes:
    """PNG of the ROC curves of several attacks on one log-log plot.

    Log-log axes follow Carlini et al. 2022 ("Membership Inference Attacks From First
    Principles", Sec. 4), which argue the low-FPR region is what matters. The axes start at
    min(1e-3, 1/n) for n the largest number of non-members, so 0.1% FPR is always visible; each
    legend entry gives the attack's AUC and TPR at 0.1% FPR. The chance line TPR = FPR is dashed.
    """
    if len(results) == 0:
        raise ValueError("roc_figure needs at least one result")
    curves = []
    negatives = 1
    for result in results:
        fpr, tpr, _ = roc_curve(result.scores, result.membership)
        curves.append((result.attack, fpr, tpr))
        negatives = max(negatives, int(np.sum(np.asarray(result.membership) == 0)))
    low = min(1e-3, 1.0 / negatives)

    fig = Figure(figsize=(9.5, 5.0), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([low, 1.0], [low, 1.0], linestyle="--", color="0.5", linewidth=1, label="chance")
    colors = matplotlib.colormaps["tab20"].colors
    styles = ("-", "--", "-.", ":")
    for i, (name, fpr, tpr) in enumerate(curves):
        label = f"{name} (AUC {auc(fpr, tpr):.3f}, TPR@0.1%FPR {tpr_at_fpr(fpr, tpr, 1e-3):.3f})"
        ax.plot(
            np.clip(fpr, low, 1.0),
            np.clip(tpr, low, 1.0),
            linewidth=1.6,
            color=colors[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20],
            linestyle=styles[(i // 10) % len(styles)] if i >= 10 else "-",
            label=label,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, 1.0)
    ax.set_ylim(low, 1.0)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    return _to_png(fig)


def histogram_figure(result: MembershipResult, title: str) -> bytes:
    """PNG of the member and non-member score distributions of one attack, overlaid.

    Both histograms share bins and are normalised to densities so unequal class sizes compare.
    Infinite scores are left out of the histogram and counted in the legend.
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

    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    for label, mask, color in (
        ("non-members", membership == 0, "tab:blue"),
        ("members", membership == 1, "tab:orange"),
    ):
        chosen = scores[mask & finite]
        dropped = int(np.sum(mask & ~finite))
        text = f"{label} (n={int(mask.sum())}" + (f", {dropped} infinite)" if dropped else ")")
        if chosen.size:
            ax.hist(chosen, bins=bins, density=True, alpha=0.5, color=color, label=text)
        else:
            ax.plot([], [], color=color, label=text)
    ax.set_xlabel("attack score (higher = more likely member)")
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    return _to_png(fig)


def save_png(data: bytes, path: str | os.PathLike[str]) -> Path:
    """Write PNG bytes to `path` atomically (temporary file, then `os.replace`)."""
    if not bytes(data[:8]) == PNG_SIGNATURE:
        raise ValueError(f"not PNG data, refusing to write {os.fspath(path)}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target, data)
    return target
