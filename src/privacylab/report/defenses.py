"""The privacy–utility frontier of a set of defended models, and the release gate.

Pure functions over the rows of `privacylab defend --json` (``payload["defenses"]["rows"]``):
each row is one defence at one parameter setting, with its `test_accuracy` and its strongest
attack (`best`: TPR at 0.1% FPR, AUC, ...; `best_auc`: the attack with the largest AUC).

- `pareto_indices` / `pareto_set`: the defences no other defence beats on both axes — higher
  test accuracy and a lower strongest-attack TPR at 0.1% FPR (Carlini et al. 2022, "Membership
  Inference Attacks From First Principles", Sec. 4, for why TPR at low FPR is the privacy axis).
- `gate`: the release gate for a user threshold (``--max-tpr-at-0.1``): a defended model passes
  when its strongest attack's TPR at 0.1% FPR is at most the threshold *and* it was attacked
  adaptively (an attacker who knows the defence, Kerckhoffs' principle; Tramèr et al. 2020, "On
  Adaptive Attacks to Adversarial Example Defenses"). A defence is never passed on the strength
  of non-adaptive attacks alone; the undefended model has nothing to adapt to, so its attacks
  count as adaptive.
- `annotate`: both at once, as the payload's `pareto`, `passing` and per-row flags.
- `defense_frontier_figure`: the picture (PNG bytes): accuracy against TPR at 0.1% FPR (log) and
  against AUC, one labelled point per defence, the Pareto set highlighted and connected.

numpy/matplotlib only (no torch): the report imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from privacylab.errors import PrivacylabError
from privacylab.report._format import mappings, number, percent
from privacylab.report.plots import FONT_PT, _to_png
from privacylab.report.verdict import strongest_attack

METRICS = ("tpr_at_01pct_fpr", "auc")
"""The privacy axes a frontier can be drawn on; the gate and the payload's Pareto set use the
first."""
CHANCE_TPR = 1e-3
"""TPR at 0.1% FPR of an attack that guesses."""

KIND_STYLE: dict[str, tuple[str, str, str]] = {
    "none": ("*", "#000000", "undefended"),
    "output": ("o", "#1f77b4", "output defence"),
    "training": ("s", "#2ca02c", "training-time defence"),
    "dp": ("D", "#9467bd", "DP-SGD"),
}
"""Marker, colour and legend text of each kind of point."""


class FrontierError(PrivacylabError, ValueError):
    """A bad gate threshold, an unknown frontier metric or no rows to draw; one line. (Not
    `defenses.base.DefenseError`: report and defenses are on the same layer of the import
    graph and may not import each other; the CLI maps any PrivacylabError to exit 2.)"""


def _raise(message: str) -> None:
    raise FrontierError(message)


def label(row: Mapping[str, Any]) -> str:
    """The display label of a row: `defense`, else `spec`, else `name`, else "?"."""
    for key in ("defense", "spec", "name"):
        if row.get(key) not in (None, ""):
            return str(row[key])
    return "?"


def best_attack(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The row's strongest attack: `best` when present, else the strongest of `attacks` by TPR
    at 0.1% FPR, then TPR at 1% FPR, then AUC (`report.verdict.strength_key`)."""
    best = row.get("best")
    if isinstance(best, Mapping):
        return best
    return strongest_attack(mappings(row.get("attacks")))


def best_auc(row: Mapping[str, Any]) -> float | None:
    """The largest AUC of any attack on the row: `best_auc.auc`, else the maximum over
    `attacks`, else `best.auc`; None when there is none."""
    top = row.get("best_auc")
    if isinstance(top, Mapping) and number(top.get("auc")) is not None:
        return number(top.get("auc"))
    values = [number(a.get("auc")) for a in mappings(row.get("attacks"))]
    values = [v for v in values if v is not None]
    if values:
        return max(values)
    best = best_attack(row)
    return None if best is None else number(best.get("auc"))


def best_tpr(row: Mapping[str, Any]) -> float | None:
    """The strongest attack's TPR at 0.1% FPR, None when missing or NaN."""
    best = best_attack(row)
    return None if best is None else number(best.get("tpr_at_01pct_fpr"))


def privacy_value(row: Mapping[str, Any], metric: str = "tpr_at_01pct_fpr") -> float | None:
    """The row's leakage on `metric` ("tpr_at_01pct_fpr" or "auc"), None when missing."""
    if metric not in METRICS:
        _raise(f"frontier metric must be one of {', '.join(METRICS)}, got {metric!r}")
    value = best_tpr(row) if metric == "tpr_at_01pct_fpr" else best_auc(row)
    return None if value is None or math.isinf(value) else value


def point(row: Mapping[str, Any], metric: str = "tpr_at_01pct_fpr") -> tuple[float, float] | None:
    """(test accuracy, leakage on `metric`) of a row, None when either is missing/NaN/inf."""
    accuracy = number(row.get("test_accuracy"))
    if accuracy is None or math.isinf(accuracy):
        return None
    leak = privacy_value(row, metric)
    return None if leak is None else (accuracy, leak)


def exclusion(row: Mapping[str, Any], metric: str = "tpr_at_01pct_fpr") -> str | None:
    """Why a row is left off the frontier (no test accuracy, no attack result), or None."""
    accuracy = number(row.get("test_accuracy"))
    missing = []
    if accuracy is None or math.isinf(accuracy):
        missing.append("test accuracy")
    if privacy_value(row, metric) is None:
        missing.append("TPR at 0.1% FPR" if metric == "tpr_at_01pct_fpr" else "AUC")
    if not missing:
        return None
    return f"left off the frontier: no {' and no '.join(missing)}"


def pareto_indices(
    rows: Sequence[Mapping[str, Any]], metric: str = "tpr_at_01pct_fpr"
) -> list[int]:
    """Indices of the Pareto-optimal rows, in row order: maximise test accuracy, minimise the
    strongest attack's leakage on `metric`.

    A row is dominated when another has accuracy ≥ and leakage ≤ with at least one strict
    inequality (the usual Pareto order, e.g. Deb 2001, Def. 2.5). Rows with the same point do
    not dominate each other, so both stay — the set does not depend on the order of the rows.
    Rows without a finite accuracy or leakage (None, NaN) are left out (see `exclusion`).
    """
    points = [(i, p) for i, row in enumerate(rows) if (p := point(row, metric)) is not None]
    keep = []
    for i, (acc, leak) in points:
        dominated = any(
            a >= acc and lk <= leak and (a > acc or lk < leak) for j, (a, lk) in points if j != i
        )
        if not dominated:
            keep.append(i)
    return keep


def pareto_set(rows: Sequence[Mapping[str, Any]], metric: str = "tpr_at_01pct_fpr") -> list[str]:
    """Labels of the Pareto-optimal rows (see `pareto_indices`), in row order."""
    return [label(rows[i]) for i in pareto_indices(rows, metric)]


def attack_is_adaptive(row: Mapping[str, Any], attack: Mapping[str, Any]) -> bool:
    """Whether one attack row of `row` knew the defence: its own `adaptive` flag when it has
    one (an attack that calibrates on references runs twice under one name, plainly and
    adaptively, so the name alone cannot tell); without a flag, its name in the row's
    `adaptive_attacks`; every attack on the undefended model (nothing to adapt to)."""
    if row.get("kind") == "none":
        return True
    flag = attack.get("adaptive")
    if isinstance(flag, bool):
        return flag
    names = row.get("adaptive_attacks")
    return isinstance(names, (list, tuple)) and attack.get("attack") in names


def _has_result(attack: Mapping[str, Any]) -> bool:
    """An attack that ran and measured a TPR at 0.1% FPR (not skipped, not NaN)."""
    return "skipped" not in attack and number(attack.get("tpr_at_01pct_fpr")) is not None


def adaptively_attacked(row: Mapping[str, Any]) -> bool:
    """Whether an attack that knew the defence ran on the row *and gave a result*
    (`attack_is_adaptive`; a skipped or NaN attack proves nothing, so it does not count). The
    undefended model (kind "none") has nothing to adapt to: any result counts. A row without
    an `attacks` list counts when its strongest attack (`best`) is marked adaptive."""
    attacks = mappings(row.get("attacks"))
    if attacks:
        return any(_has_result(a) and attack_is_adaptive(row, a) for a in attacks)
    best = row.get("best")
    if not isinstance(best, Mapping) or not _has_result(best):
        return False
    return row.get("kind") == "none" or best.get("adaptive") is True


def check_gate_threshold(threshold: Any) -> float | None:
    """`threshold` as a float in [0, 1], None for None; a one-line FrontierError otherwise."""
    if threshold is None:
        return None
    x = number(threshold)
    if x is None or not 0.0 <= x <= 1.0:
        _raise(f"--max-tpr-at-0.1 must be a rate in [0, 1], got {threshold!r}")
    return x


def gate_decision(row: Mapping[str, Any], threshold: float | None) -> tuple[bool | None, str]:
    """(passes, why) of one row: None without a threshold; False when no attack result, when
    no adaptive attack was run, or when the strongest attack's TPR at 0.1% FPR is above the
    threshold; True otherwise."""
    limit = check_gate_threshold(threshold)
    if limit is None:
        return None, "no threshold"
    tpr = best_tpr(row)
    if tpr is None:
        return False, "no attack result"
    if tpr > limit:
        return False, f"TPR@0.1%FPR {percent(tpr)} > {percent(limit)}"
    if not adaptively_attacked(row):
        return False, "no adaptive attack run"
    return True, f"TPR@0.1%FPR {percent(tpr)} ≤ {percent(limit)}"


def gate(rows: Sequence[Mapping[str, Any]], threshold: float | None) -> list[bool | None]:
    """The release gate, one entry per row: True iff the strongest attack's TPR at 0.1% FPR is
    ≤ `threshold` and at least one adaptive attack was run on it (see `gate_decision`); all
    None when `threshold` is None. Bad threshold: one-line FrontierError."""
    check_gate_threshold(threshold)
    return [gate_decision(row, threshold)[0] for row in rows]


def annotate(rows: Sequence[Mapping[str, Any]], threshold: float | None = None) -> dict[str, Any]:
    """The payload's frontier fields for `rows`: ``{"rows": copies with "pareto", "passes" and
    "note" set, "pareto": [labels], "passing": [labels]}``. A row left off the frontier gets the
    reason appended to its note."""
    check_gate_threshold(threshold)
    front = set(pareto_indices(rows))
    out = []
    for i, row in enumerate(rows):
        copy = dict(row)
        copy["pareto"] = i in front
        copy["passes"] = gate_decision(row, threshold)[0]
        why = exclusion(row)
        if why is not None:
            old = row.get("note")
            copy["note"] = f"{old}; {why}" if old else why
        out.append(copy)
    return {
        "rows": out,
        "pareto": [label(r) for r in out if r["pareto"]],
        "passing": [label(r) for r in out if r["passes"] is True],
    }


def point_kind(row: Mapping[str, Any]) -> str:
    """The marker family of a row: "dp" for DP-SGD (name "dp" or a certified ε), else its kind
    ("none", "output", "training"); unknown kinds draw as "training"."""
    epsilon = number(row.get("epsilon"))
    if row.get("name") == "dp" or (epsilon is not None and math.isfinite(epsilon)):
        return "dp"
    kind = str(row.get("kind", ""))
    return kind if kind in KIND_STYLE else "training"


_OFFSETS = [
    (dx * r, dy * r)
    for r in (7.0, 16.0, 28.0)
    for dx, dy in ((1, 0.6), (1, -1), (-1, 0.6), (-1, -1), (0, 1.3), (0, -1.6), (1.4, 0), (-1.4, 0))
]
"""Candidate label offsets in points, nearest first; the first that overlaps nothing wins."""


def _groups(points: list[tuple[float, float]], radius: float) -> list[list[int]]:
    """Indices of points closer than `radius` (display units) to each other, chained."""
    parent = list(range(len(points)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, (xi, yi) in enumerate(points):
        for j in range(i):
            xj, yj = points[j]
            if math.hypot(xi - xj, yi - yj) < radius:
                parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(points)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


def _place_labels(fig: Figure, ax: Any, pts: list[tuple[float, float, str]]) -> None:
    """Greedy label placement on a drawn figure whose layout is fixed. Points whose markers
    touch share one label ("a, b, c"). For each label (top accuracy first), the nearest
    candidate offset whose text box stays inside the axes and overlaps no placed label or other
    marker; the least-overlapping one when none is free. Labels placed away from their point
    get a thin leader line."""
    if not pts:
        return
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    scale = fig.dpi / 72.0
    pixels = [tuple(ax.transData.transform((x, y))) for x, y, _ in pts]
    r = 5.0 * scale
    markers = [(px - r, py - r, px + r, py + r) for px, py in pixels]
    placed: list[tuple[float, float, float, float]] = []

    def overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
        w = min(a[2], b[2]) - max(a[0], b[0])
        h = min(a[3], b[3]) - max(a[1], b[1])
        return w * h if w > 0 and h > 0 else 0.0

    groups = _groups(pixels, 1.6 * r)  # type: ignore[arg-type]
    groups = [sorted(g, key=lambda i: pts[i][2]) for g in groups]
    groups.sort(key=lambda g: (-max(pts[i][1] for i in g), min(pts[i][0] for i in g)))
    for group in groups:
        names = [pts[i][2] for i in group]
        text = "\n".join(", ".join(names[k : k + 3]) for k in range(0, len(names), 3))
        x = sum(pts[i][0] for i in group) / len(group)
        y = sum(pts[i][1] for i in group) / len(group)
        if ax.get_xscale() == "log":
            x = math.exp(sum(math.log(pts[i][0]) for i in group) / len(group))
        best = None
        for dx, dy in _OFFSETS:
            ha = "left" if dx > 0 else "right" if dx < 0 else "center"
            va = "bottom" if dy > 0 else "top" if dy < 0 else "center"
            ann = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                ha=ha,
                va=va,
                fontsize=FONT_PT - 1,
            )
            box = ann.get_window_extent(renderer)
            b = (box.x0, box.y0, box.x1, box.y1)
            outside = (
                max(0.0, frame.x0 - b[0])
                + max(0.0, b[2] - frame.x1)
                + max(0.0, frame.y0 - b[1])
                + max(0.0, b[3] - frame.y1)
            ) * box.height
            cost = outside + sum(overlap(b, p) for p in placed)
            cost += sum(overlap(b, m) for j, m in enumerate(markers) if j not in group)
            ann.remove()
            if best is None or cost < best[0] - 1e-9:
                best = (cost, dx, dy, ha, va, b)
            if cost == 0.0:
                break
        assert best is not None
        _, dx, dy, ha, va, b = best
        far = math.hypot(dx, dy) > 10.0
        ax.annotate(
            text,
            (x, y),
            xytext=(dx, dy),
            textcoords="offset points",
            ha=ha,
            va=va,
            fontsize=FONT_PT - 1,
            arrowprops={"arrowstyle": "-", "color": "0.45", "linewidth": 0.7, "shrinkB": 4}
            if far
            else None,
        ).set_in_layout(False)
        placed.append(b)


def _frontier_line(ax: Any, pts: list[tuple[float, float]], **style: Any) -> None:
    """The Pareto front as a staircase through its points, lowest leakage first."""
    if len(pts) < 2:
        return
    pts = sorted(pts)
    xs, ys = [pts[0][0]], [pts[0][1]]
    for x, y in pts[1:]:
        xs += [x, x]
        ys += [ys[-1], y]
    ax.plot(xs, ys, **style)


def defense_frontier_plot(
    rows: Sequence[Mapping[str, Any]], threshold: float | None = None
) -> Figure:
    """The figure of `defense_frontier_figure`, labels placed (for tests that measure it)."""
    return _frontier(rows, threshold)


def defense_frontier_figure(
    rows: Sequence[Mapping[str, Any]], threshold: float | None = None
) -> bytes:
    """PNG of the privacy–utility frontier of defended models: test accuracy (y) against the
    strongest attack's TPR at 0.1% FPR (left, log x; Carlini et al. 2022, Sec. 4) and against
    the largest attack AUC (right), one labelled point per defence and parameter.

    Markers by kind (undefended ★, output ●, training ■, DP-SGD ◆). The Pareto set
    (`pareto_indices` on TPR at 0.1% FPR) is ringed in red in both panels and joined by a
    staircase on the left; the right panel joins its own AUC Pareto front with a dashed line. A
    TPR of 0 is drawn at the axis floor (tick "0"); chance (0.1%) and the gate `threshold` are
    vertical lines, and chance (AUC 0.5) on the right. Rows without a point are listed under
    the axes. Bad threshold: one-line FrontierError; no rows: FrontierError.
    """
    return _to_png(_frontier(rows, threshold))


def _frontier(rows: Sequence[Mapping[str, Any]], threshold: float | None) -> Figure:
    limit = check_gate_threshold(threshold)
    if not rows:
        _raise("defense_frontier_figure needs at least one defence row")
    front = set(pareto_indices(rows))
    auc_front = set(pareto_indices(rows, "auc"))
    tprs = [v for r in rows if (v := privacy_value(r)) is not None and v > 0]
    smallest = min([*tprs, CHANCE_TPR] + ([limit] if limit else []))
    floor = 10.0 ** math.floor(math.log10(smallest) - 0.5)

    fig = Figure(figsize=(10.4, 4.9), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    seen: set[str] = set()
    labels: dict[int, list[tuple[float, float, str]]] = {}
    for ax, metric, frontier in ((left, "tpr_at_01pct_fpr", front), (right, "auc", auc_front)):
        labelled: list[tuple[float, float, str]] = []
        line: list[tuple[float, float]] = []
        for i, row in enumerate(rows):
            p = point(row, metric)
            if p is None:
                continue
            acc, leak = p
            x = max(leak, floor) if metric == "tpr_at_01pct_fpr" else leak
            kind = point_kind(row)
            marker, color, text = KIND_STYLE[kind]
            show = ax is left and kind not in seen
            seen.add(kind)
            adaptive = adaptively_attacked(row)
            ax.scatter(
                [x],
                [acc],
                marker=marker,
                s=110 if marker == "*" else 55,
                facecolors=color if adaptive else "white",
                edgecolors="white" if adaptive else color,
                linewidths=0.6 if adaptive else 1.6,
                zorder=6 if kind == "none" else 4,
                label=text if show else None,
            )
            if not adaptive and ax is left and "hollow" not in seen:
                seen.add("hollow")
                ax.scatter(
                    [], [], marker="o", s=55, facecolors="white", edgecolors="0.3",
                    linewidths=1.6, label="hollow: no adaptive attack",
                )  # fmt: skip
            if i in front:
                ax.scatter(
                    [x], [acc], s=200, facecolors="none", edgecolors="#d62728", linewidths=1.6,
                    zorder=5, label="Pareto set" if ax is left and "pareto" not in seen else None,
                    gid="pareto-ring",
                )  # fmt: skip
                seen.add("pareto")
            if i in frontier:
                line.append((x, acc))
            labelled.append((x, acc, label(row)))
        if metric == "tpr_at_01pct_fpr":
            _frontier_line(ax, line, color="#d62728", linewidth=1.4, zorder=3, label="Pareto front")
        else:
            _frontier_line(
                ax, line, color="#d62728", linewidth=1.0, linestyle="--", zorder=3,
                label="Pareto front by AUC",
            )  # fmt: skip
        labels[id(ax)] = labelled

    left.axvline(CHANCE_TPR, color="0.5", linestyle="--", linewidth=1, label="chance (0.1%)")
    if limit is not None:
        left.axvline(
            max(limit, floor), color="#b06000", linestyle=":", linewidth=1.6,
            label=f"release gate ≤ {percent(limit)}",
        )  # fmt: skip
    left.set_xscale("log")
    left.set_xlim(floor / 1.6, 1.6)
    ticks = [t for t in (1e-4, 1e-3, 1e-2, 1e-1, 1.0) if t > floor * 1.5]
    left.set_xticks([floor, *ticks], ["0", *(percent(t) for t in ticks)])
    left.minorticks_off()
    left.set_xlabel("strongest attack: TPR at 0.1% FPR (log; members found)", fontsize=FONT_PT)
    left.set_ylabel("test accuracy", fontsize=FONT_PT)
    left.set_title("Accuracy against TPR at 0.1% FPR (better: up, left)", fontsize=FONT_PT)

    right.axvline(0.5, color="0.5", linestyle="--", linewidth=1)
    aucs = [v for r in rows if (v := privacy_value(r, "auc")) is not None]
    lo = min([0.5, *aucs])
    hi = max([0.5, *aucs])
    pad = max(0.02, 0.08 * (hi - lo))
    right.set_xlim(lo - pad, hi + pad)
    right.set_xlabel("largest attack AUC (0.5 = chance)", fontsize=FONT_PT)
    right.set_title("Accuracy against AUC (better: up, left)", fontsize=FONT_PT)

    accs = [a for r in rows if (a := number(r.get("test_accuracy"))) is not None]
    accs = [a for a in accs if math.isfinite(a)]
    if accs:
        span = max(accs) - min(accs)
        margin = max(0.02, 0.12 * span)
        left.set_ylim(max(0.0, min(accs) - margin), min(1.02, max(accs) + margin))
    for ax in (left, right):
        ax.tick_params(labelsize=FONT_PT - 1)
        ax.grid(True, alpha=0.3)
    missing = [label(r) for r in rows if point(r) is None]
    if missing:
        fig.supxlabel(
            "not drawn (no accuracy or attack result): " + ", ".join(missing),
            fontsize=FONT_PT - 1,
        )
    handles, names = left.get_legend_handles_labels()
    right_handles, right_names = right.get_legend_handles_labels()
    fig.legend(
        handles + right_handles,
        names + right_names,
        loc="outside upper center",
        ncol=min(5, len(names) + len(right_names)),
        fontsize=FONT_PT - 1,
        frameon=False,
    )
    FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    fig.set_layout_engine("none")  # freeze the layout: labels are placed against these axes
    for ax in (left, right):
        _place_labels(fig, ax, labels[id(ax)])
    return fig


__all__ = [
    "CHANCE_TPR",
    "KIND_STYLE",
    "METRICS",
    "FrontierError",
    "adaptively_attacked",
    "annotate",
    "attack_is_adaptive",
    "best_attack",
    "best_auc",
    "best_tpr",
    "check_gate_threshold",
    "defense_frontier_figure",
    "defense_frontier_plot",
    "exclusion",
    "gate",
    "gate_decision",
    "label",
    "pareto_indices",
    "pareto_set",
    "point",
    "point_kind",
    "privacy_value",
]
