"""The model-inversion section's pictures: each class's MI-Face inversion (Fredrikson et al.
2015, Fig. 6-style: the inversion beside a picture of the class) as its own PNG and as a
grid, inversions on the top row and the evaluator's class means below.

numpy/matplotlib only (no torch): the report imports this module.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from privacylab.report._format import number
from privacylab.report.plots import FONT_PT, _to_png
from privacylab.stats.images import to_unit

__all__ = ["image_png", "inversion_grid_figure", "inversion_grid_plot", "to_display"]


def to_display(image: Any, bounds: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """An image (C, H, W), (H, W) or flat with a square size, in [0, 1] as (H, W) or
    (H, W, 3) for display."""
    arr = to_unit(np.asarray(image, dtype=np.float64), bounds)
    if arr.ndim == 1:
        side = math.isqrt(arr.size)
        arr = arr.reshape(side, side) if side * side == arr.size else arr.reshape(1, -1)
    if arr.ndim == 3:
        arr = arr[0] if arr.shape[0] == 1 else np.moveaxis(arr[:3], 0, -1)
    return arr


def image_png(image: Any, bounds: tuple[float, float] = (0.0, 1.0), scale: int = 4) -> bytes:
    """One image as a PNG at its own pixels, each enlarged `scale` times (nearest)."""
    from matplotlib.image import imsave

    arr = to_display(image, bounds)
    big = (
        np.kron(arr, np.ones((scale, scale)))
        if arr.ndim == 2
        else arr.repeat(scale, 0).repeat(scale, 1)
    )
    buf = io.BytesIO()
    imsave(buf, big, cmap="gray", vmin=0.0, vmax=1.0, format="png")
    return buf.getvalue()


def _caption(row: Mapping[str, Any]) -> str:
    confidence = number(row.get("confidence"))
    predicted = row.get("predicted")
    parts = [f"class {row.get('label')}"]
    if confidence is not None:
        parts.append(f"conf {confidence:.2f}")
    if predicted is not None:
        parts.append(f"eval: {predicted}" + (" ✓" if row.get("correct") else " ✗"))
    return "\n".join(parts)


def inversion_grid_plot(
    inversions: Sequence[Any],
    means: Sequence[Any],
    rows: Sequence[Mapping[str, Any]],
    bounds: tuple[float, float] = (0.0, 1.0),
) -> Figure:
    """The figure of `inversion_grid_figure` (for tests that inspect its axes)."""
    n = max(1, len(inversions))
    fig = Figure(figsize=(max(3.0, 1.3 * n), 3.3), layout="constrained")
    axes = np.asarray(fig.subplots(2, n, squeeze=False))
    for i in range(n):
        top, bottom = axes[0, i], axes[1, i]
        for ax in (top, bottom):
            ax.set_xticks([])
            ax.set_yticks([])
        if i >= len(inversions):
            continue
        top.imshow(to_display(inversions[i], bounds), cmap="gray", vmin=0, vmax=1)
        row = rows[i] if i < len(rows) else {}
        top.set_title(_caption(row), fontsize=FONT_PT - 2)
        mean = np.asarray(means[i], dtype=np.float64) if i < len(means) else None
        if mean is not None and np.isfinite(mean).all():
            bottom.imshow(to_display(mean, bounds), cmap="gray", vmin=0, vmax=1)
        else:
            bottom.text(0.5, 0.5, "no mean", ha="center", va="center", fontsize=FONT_PT - 2)
    axes[0, 0].set_ylabel("MI-Face", fontsize=FONT_PT)
    axes[1, 0].set_ylabel("class mean", fontsize=FONT_PT)
    return fig


def inversion_grid_figure(
    inversions: Sequence[Any],
    means: Sequence[Any],
    rows: Sequence[Mapping[str, Any]],
    bounds: tuple[float, float] = (0.0, 1.0),
) -> bytes:
    """PNG: each class's inversion (top, captioned with the target's confidence and the
    evaluator's label) above the class mean over the evaluator's data (bottom)."""
    return _to_png(inversion_grid_plot(inversions, means, rows, bounds))
