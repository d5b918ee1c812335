"""The gradient-inversion section's pictures: each run's ground truth beside its
reconstruction (matched order, per-image PSNR/SSIM under each, as in Zhu et al. 2019, Fig. 3-4
and Geiping et al. 2020, Fig. 1), a grid over defences and strengths (rows: the runs, e.g.
one per update defence as in Zhu et al. 2019, Fig. 8; columns: the examples), and the
attack's objective over iterations.

Pixels are shown in [0, 1] (`privacylab.stats.images.to_unit` from the run's bounds), never
rescaled per image, so a washed-out reconstruction looks washed out. Rows are what
`privacylab.reconstruct.result_row` writes (`images`: flat `truth` and `reconstruction`
pixels, their `shape`; `order`: reconstruction `order[i]` is paired with true image i).

numpy/matplotlib only (no torch): the report imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from privacylab.report._format import mappings, number
from privacylab.report.plots import COLORS, FONT_PT, LEGEND_FONT_PT, _to_png
from privacylab.stats.images import to_unit

__all__ = [
    "MAX_COLUMNS",
    "grid_plot",
    "labels_given",
    "objective_plot",
    "pairs_plot",
    "reconstruction_images",
    "run_arrays",
    "run_labels",
]

MAX_COLUMNS = 16
"""Examples shown per picture row (a batch of 32 shows its first 16 true images)."""

CELL_IN = 1.05
"""Inches per image cell."""

VARYING = (
    ("method", "{}"),
    ("defense", "{}"),
    ("batch_size", "B={}"),
    ("local_steps", "S={}"),
    ("clients", "k={}"),
    ("labels_known", "labels {}"),
)
"""Facts a run's label names when they differ between runs (key, format)."""


def labels_given(row: Mapping[str, Any]) -> bool:
    """Whether the run's attack was given the labels (side information "labels") rather than
    recovering them: its label accuracy is then 1 by construction, not a finding."""
    params = row.get("params")
    return isinstance(params, Mapping) and params.get("labels") == "given"


def run_arrays(
    row: Mapping[str, Any],
) -> tuple[np.ndarray, np.ndarray, list[Mapping[str, Any]]] | None:
    """(truth, reconstruction paired with it, per-image scores) of a row, both (n, C, H, W) in
    [0, 1]; None when the row holds no pictures."""
    images = row.get("images")
    if not isinstance(images, Mapping):
        return None
    shape = images.get("shape")
    truth, rec = images.get("truth"), images.get("reconstruction")
    if not isinstance(shape, list) or len(shape) < 2 or not truth or not rec:
        return None
    shape = [int(s) for s in shape]
    if len(shape) == 3:
        shape = [shape[0], 1, *shape[1:]]
    if len(shape) != 4 or len(truth) != math.prod(shape) or len(rec) != math.prod(shape):
        return None
    bounds = row.get("bounds")
    low, high = (0.0, 1.0)
    if isinstance(bounds, list) and len(bounds) == 2:
        low, high = float(bounds[0]), float(bounds[1])
    t = to_unit(np.asarray(truth, dtype=np.float64).reshape(shape), (low, high))
    r = to_unit(np.asarray(rec, dtype=np.float64).reshape(shape), (low, high))
    order = row.get("order")
    if isinstance(order, list) and sorted(int(i) for i in order) == list(range(len(r))):
        r = r[[int(i) for i in order]]
    return t, r, list(mappings(row.get("per_example")))


def run_labels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A short label per run naming what differs between the runs ("noise:0.01", or "dlg,
    none, S=2"); the defence when nothing differs."""
    varying = [
        (key, form) for key, form in VARYING if len({str(r.get(key)) for r in rows}) > 1
    ] or [("defense", "{}")]
    labels = []
    for row in rows:
        parts = []
        for key, form in varying:
            value = row.get(key)
            if key == "labels_known":
                value = "known" if value else "recovered"
            parts.append(form.format(value if value is not None else "none"))
        labels.append(", ".join(parts))
    return labels


def _show(ax: Axes, image: np.ndarray) -> None:
    """One image in [0, 1]: grey for one channel, RGB for three."""
    if image.shape[0] == 1:
        ax.imshow(image[0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        ax.imshow(np.clip(np.transpose(image[:3], (1, 2, 0)), 0, 1), interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_linewidth(0.4)


def _scores_text(score: Mapping[str, Any] | None) -> str:
    if not score:
        return ""
    p, s = number(score.get("psnr")), number(score.get("ssim"))
    return f"{p:.1f} dB\nSSIM {s:.2f}" if p is not None and s is not None else ""


def pairs_plot(row: Mapping[str, Any], label: str | None = None) -> Figure:
    """One run: the true images (top) and the reconstructions paired with them (bottom),
    each reconstruction's PSNR and SSIM under it; the run's means in the title."""
    arrays = run_arrays(row)
    if arrays is None:
        raise ValueError("this run holds no pictures")
    truth, rec, scores = arrays
    n = min(len(truth), MAX_COLUMNS)
    fig = Figure(figsize=(max(2.6, CELL_IN * n + 0.6), 2 * CELL_IN + 1.2), layout="constrained")
    axes = np.asarray(fig.subplots(2, n, squeeze=False))
    true_labels = (row.get("images") or {}).get("true_labels") or []
    for i in range(n):
        _show(axes[0, i], truth[i])
        _show(axes[1, i], rec[i])
        if i < len(true_labels):
            axes[0, i].set_title(f"label {true_labels[i]}", fontsize=FONT_PT - 2)
        axes[1, i].set_xlabel(_scores_text(scores[i] if i < len(scores) else None), fontsize=8)
    axes[0, 0].set_ylabel("truth", fontsize=FONT_PT - 1)
    axes[1, 0].set_ylabel("reconstruction", fontsize=FONT_PT - 1)
    shown = "" if n == len(truth) else f" (first {n} of {len(truth)})"
    title = (
        f"{label or run_labels([row])[0]}: PSNR {_num(row.get('psnr'), 1)} dB, SSIM "
        f"{_num(row.get('ssim'), 2)}, baseline {_num(row.get('baseline_psnr'), 1)} dB{shown}"
    )
    fig.suptitle(title, fontsize=FONT_PT)
    return fig


def _num(value: Any, digits: int) -> str:
    x = number(value)
    return "—" if x is None else f"{x:.{digits}f}"


def _same_examples(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of the rows that attacked the same examples as the first row with pictures."""
    first = None
    kept = []
    for i, row in enumerate(rows):
        if run_arrays(row) is None:
            continue
        key = (str(row.get("dataset")), str(row.get("examples")))
        if first is None:
            first = key
        if key == first:
            kept.append(i)
    return kept


def grid_plot(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """The grid over defences and strengths: the true images, then one row per run
    (labelled by what differs between runs) of reconstructions paired with them, PSNR under
    each; for one or two examples the grid is laid out across (a column per run, as Zhu et
    al. 2019, Fig. 8). Runs on other examples than the first are left out (their pairs
    pictures show them)."""
    kept = _same_examples(rows)
    if not kept:
        raise ValueError("no run holds pictures")
    labels = ["truth", *run_labels([rows[i] for i in kept])]
    first = run_arrays(rows[kept[0]])
    assert first is not None
    n = min(len(first[0]), MAX_COLUMNS)
    cells: list[list[tuple[np.ndarray, str]]] = [[(first[0][j], "") for j in range(n)]]
    for i in kept:
        arrays = run_arrays(rows[i])
        assert arrays is not None
        _, rec, scores = arrays
        line = []
        for j in range(n):
            p = number(scores[j].get("psnr")) if j < len(scores) else None
            line.append((rec[j], "" if p is None else f"{p:.1f} dB"))
        cells.append(line)
    across = n <= 2 and len(cells) > n
    grid = [list(c) for c in zip(*cells, strict=True)] if across else cells
    height, width = len(grid), len(grid[0])
    fig = Figure(
        figsize=(max(3.0, CELL_IN * width + (0.4 if across else 1.8)), CELL_IN * height + 0.9),
        layout="constrained",
    )
    axes = np.asarray(fig.subplots(height, width, squeeze=False))
    for r in range(height):
        for c in range(width):
            image, caption = grid[r][c]
            _show(axes[r, c], image)
            if caption:
                axes[r, c].set_xlabel(caption, fontsize=8, labelpad=1)
    if across:
        for c, label in enumerate(labels):
            axes[0, c].set_title(label, fontsize=FONT_PT - 2)
    else:
        for r, label in enumerate(labels):
            axes[r, 0].set_ylabel(label, fontsize=FONT_PT - 1, rotation=0, ha="right", va="center")
    fig.suptitle("Reconstruction per run; PSNR under each", fontsize=FONT_PT)
    return fig


def objective_plot(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Each run's attack objective (gradient distance, as the attack defines it) against
    iterations; log scale when every value is positive."""
    fig = Figure(figsize=(7.2, 4.2), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    labels = run_labels(rows)
    drawn = 0
    positive = True
    for i, (row, label) in enumerate(zip(rows, labels, strict=True)):
        points = []
        for point in row.get("history") or []:
            if isinstance(point, (list, tuple)) and len(point) == 2:
                x, y = number(point[0]), number(point[1])
                if x is not None and y is not None and math.isfinite(y):
                    points.append((x, y))
        if not points:
            continue
        positive = positive and all(y > 0 for _, y in points)
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, color=COLORS[i % len(COLORS)], linewidth=1.6, label=label)
        drawn += 1
    if drawn and positive:
        ax.set_yscale("log")
    ax.set_xlabel("iteration", fontsize=FONT_PT)
    ax.set_ylabel("attack objective", fontsize=FONT_PT)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=LEGEND_FONT_PT, frameon=False)
    else:
        ax.text(0.5, 0.5, "no history recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("Attack objective over iterations", fontsize=FONT_PT + 1)
    return fig


def reconstruction_images(
    rows: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The section's PNGs for `rows`: (names to put under the block's `images`, {file name:
    PNG bytes}). `pairs`: one picture per run (None for a run without pictures); `grid`: the
    grid over runs (None for fewer than two runs with pictures); `objective`: the curves."""
    labels = run_labels(rows)
    files: dict[str, bytes] = {}
    pairs: list[str | None] = []
    for i, (row, label) in enumerate(zip(rows, labels, strict=True)):
        if run_arrays(row) is None:
            pairs.append(None)
            continue
        name = f"gradient_pairs_{i:02d}.png"
        files[name] = _to_png(pairs_plot(row, label))
        pairs.append(name)
    names: dict[str, Any] = {"pairs": pairs, "grid": None, "objective": None}
    if len(_same_examples(rows)) > 1:
        files["gradient_grid.png"] = _to_png(grid_plot(rows))
        names["grid"] = "gradient_grid.png"
    if any(r.get("history") for r in rows):
        files["gradient_objective.png"] = _to_png(objective_plot(rows))
        names["objective"] = "gradient_objective.png"
    return names, files
