"""The backdoor part of a report folder: merging one attack run, one defence run or a
benchmark's tables into `results.json`, drawing the pictures, and the section's verdict line.

`add_backdoor_run(folder, payload)` is what `privacylab attack backdoor --out`, `privacylab
defend backdoor` and the benchmarks call. `payload` is one of

- ``{"attack": entry}``: a `BackdoorResult.to_dict()` plus "folder" (the attack's out folder,
  its key), optional "label", "epsilon", "delta", and "images" of arrays in [0, 1] ((H, W) or
  (C, H, W) nested lists): "trigger" (for the trojan its generated trigger, for the
  contrastive backdoor its patch), "clean_example", "triggered_example", "inverted" (the
  trojan's reverse-engineered training images, at most `MAX_INVERTED` drawn) and optionally
  "inverted_labels". A re-run of the same folder replaces the entry.
- ``{"defense": entry}``: the `privacylab defend backdoor --json` object plus "folder"; keyed by
  (folder, method). A Neural Cleanse run's ``details["triggers"]`` (the reversed mask of
  every class) and ``details["norms"]`` become pictures: the masks in a row with the flagged
  class outlined, the flagged class's reversed trigger (its mask times
  ``details["flagged_pattern"]``), and the anomaly index per class (Wang et al. 2019, "Neural
  Cleanse", Sec. IV-C: |x - median| / (1.4826 MAD) of the masks' L1 norms) against the
  threshold 2.
- ``{"tables": {name: [row, ...]}}``: a benchmark's table, replaced by name. "contrastive"
  rows (keys "poisons", "asr", "z_score", and series keys such as "position", "patch_size",
  "dataset_size", "method") draw ASR and z-score against the number of poisoned pairs
  (Carlini & Terzis 2022, Sec. 5.1-5.2); "badnets" rows (keys "poison_rate", "asr",
  "epsilon" (None for non-private), optional "asr_bound") draw ASR against the poison rate
  with and without DP-SGD; "trojan" rows are shown with the seed's columns (Liu et al. 2018,
  Table 3: Orig, Orig Dec, Orig+Tri, Ext+Tri); any other table as it comes.

The arrays are drawn into PNG files in the folder when merged and replaced by the files' names
in `results.json` (the attack folder's own result.json and defenses/*.json keep the arrays), so
the report stays small. Every other key of `results.json` is kept, files are written atomically
(`privacylab.report.html.write_report`) and concurrent calls on one folder are serialised by a
lock file. A bad payload raises `BackdoorReportError` (one line) before anything is written.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from privacylab.errors import PrivacylabError
from privacylab.report._format import check_image, fmt, mappings, number, percent, safe_name
from privacylab.report._merge import check_tables, locked, read_results, same_folder
from privacylab.report.html import write_report
from privacylab.report.jsonable import json_ready
from privacylab.report.model_inversion import image_png, to_display
from privacylab.report.plots import FONT_PT, LEGEND_FONT_PT, _to_png, line_style
from privacylab.stats.backdoor import anomaly_index

__all__ = [
    "ACCURACY_POINTS",
    "ATTACK_IMAGES",
    "BACKDOORED_ASR",
    "BLOCK",
    "DISPLAY_PIXELS",
    "MAX_INVERTED",
    "NC_METHOD",
    "NC_THRESHOLD",
    "PUBLISHED",
    "PUBLISHED_SOURCE",
    "REMOVED_ASR",
    "TABLE_FIGURES",
    "BackdoorReportError",
    "add_backdoor_run",
    "anomaly_plot",
    "attack_label",
    "badnets_dp_plot",
    "contrastive_plot",
    "contrastive_series",
    "inverted_grid_plot",
    "nc_anomaly",
    "nc_masks",
    "nc_masks_plot",
    "published_outcome",
    "slug",
    "verdict",
]

BLOCK = "backdoor"
"""The key of `results.json` this module merges into."""

ATTACK_IMAGES = ("trigger", "clean_example", "triggered_example")
"""Single images of an attack entry, each drawn enlarged (nearest neighbour) as its own PNG."""

MAX_INVERTED = 10
"""Reverse-engineered training images of a trojan drawn (the first ones)."""

DISPLAY_PIXELS = 112
"""Target side of an enlarged image in pixels (a whole-number nearest-neighbour scale)."""

MAX_SIDE = 512
"""Largest image side accepted in a payload."""

NC_METHOD = "neural-cleanse"
NC_THRESHOLD = 2.0
"""Neural Cleanse's anomaly index threshold (Wang et al. 2019, Sec. IV-C)."""

ACCURACY_POINTS = 1.0
"""A clean-accuracy gap of at most this many points is "within"; a larger one is named as
below or above the clean model (the issue's bar: within 1 point)."""

BACKDOORED_ASR = 0.5
"""ASR at or above which the verdict calls a model backdoored."""

TABLE_FIGURES = {"contrastive": "backdoor-contrastive.png", "badnets": "backdoor-badnets-dp.png"}
"""File of the figure drawn from each table that has one."""

PUBLISHED_SOURCE = (
    "Wu et al. 2022, BackdoorBench (NeurIPS Datasets and Benchmarks), leaderboard data "
    "static/data/results.csv of github.com/backdoorbench/backdoorbench.github.io, commit "
    "a4ef038, rows 11520-11559: BadNets on CIFAR-10 with PreAct-ResNet18 (the constants "
    "benchmarks/backdoor_defenses.py quotes)"
)
PUBLISHED: tuple[dict[str, Any], ...] = (
    {"poison_rate": 0.10, "defense": "none", "accuracy": 0.9132, "asr": 0.9503},
    {"poison_rate": 0.10, "defense": "neural-cleanse", "accuracy": 0.8905, "asr": 0.0127},
    {"poison_rate": 0.10, "defense": "activation-clustering", "accuracy": 0.8880, "asr": 0.8623},
    {"poison_rate": 0.10, "defense": "spectral", "accuracy": 0.8998, "asr": 0.9241},
    {"poison_rate": 0.10, "defense": "fine-pruning", "accuracy": 0.9131, "asr": 0.5713},
    {"poison_rate": 0.01, "defense": "none", "accuracy": 0.9314, "asr": 0.7473},
    {"poison_rate": 0.01, "defense": "neural-cleanse", "accuracy": 0.9164, "asr": 0.0088},
    {"poison_rate": 0.01, "defense": "activation-clustering", "accuracy": 0.8888, "asr": 0.2718},
    {"poison_rate": 0.01, "defense": "spectral", "accuracy": 0.9262, "asr": 0.7420},
    {"poison_rate": 0.01, "defense": "fine-pruning", "accuracy": 0.9298, "asr": 0.2018},
)
"""BackdoorBench's published test accuracy and ASR after each defence ("none": the attacked
model), quoted beside our defences table: constants from `PUBLISHED_SOURCE`, not measured
here."""

REMOVED_ASR = 0.10
"""A defence whose ASR after is at most this "removes" the backdoor in the published table's
reading; one that keeps at least half the ASR it started with "fails"; else it "reduces" it."""


def published_outcome(before: float, after: float) -> str:
    """How the published table reads one defence: "removes" (ASR after <= `REMOVED_ASR`),
    "fails" (at least half of the attacked model's ASR kept) or "reduces"."""
    if after <= REMOVED_ASR:
        return "removes"
    return "fails" if after >= 0.5 * before else "reduces"


_UNIT = ("clean_accuracy", "baseline_accuracy", "asr", "baseline_asr", "poison_rate")


class BackdoorReportError(PrivacylabError, ValueError):
    """A backdoor payload that cannot be merged into a report (one line)."""


def slug(folder: Any) -> str:
    """A file-name-safe tag of a run folder: its last part (letters, digits, "-", "_", at most
    32) and 8 hex digits of the full text's SHA-256, so two folders never share files."""
    text = str(folder)
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(text).name or "run").strip("-")[:32] or "run"
    return f"{base}-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:8]}"


def attack_label(entry: Mapping[str, Any]) -> str:
    """An attack entry's display label: its "label", else "METHOD, TRIGGER, N poisons (R)"
    ("trojan, square:7@corner" when nothing was poisoned), with "DP-SGD ε=E" when private."""
    if entry.get("label"):
        return str(entry["label"])
    parts = [str(entry.get("method") or "attack")]
    trigger = entry.get("trigger")
    spec = trigger.get("spec") if isinstance(trigger, Mapping) else trigger
    if spec:
        parts.append(str(spec))
    poisons = number(entry.get("poisons"))
    if poisons:
        parts.append(f"{int(poisons)} poisons ({percent(entry.get('poison_rate'))})")
    epsilon = number(entry.get("epsilon"))
    if epsilon is not None and math.isfinite(epsilon):
        parts.append(f"DP-SGD ε={epsilon:.3g}")
    return ", ".join(parts)


def _points(a: float, b: float) -> str:
    return fmt(abs(a - b) * 100.0, 1)


def verdict(block: Mapping[str, Any]) -> str:
    """The section's one-line verdict: of the attack with the highest ASR, "Backdoored: ASR x%
    at y% poison; clean accuracy within z points of the clean model" (z = |clean accuracy -
    baseline accuracy| in percentage points, "z points below" or "above" beyond
    `ACCURACY_POINTS`; "after retraining" for an attack with no
    poisons; "not backdoored" below `BACKDOORED_ASR`), the backdoor z-score when measured,
    then what Neural Cleanse said: "Neural Cleanse flagged class c (the target)", "... (not
    the target t)" or "found no backdoor"."""
    parts = []
    attacks = [a for a in mappings(block.get("attacks")) if number(a.get("asr")) is not None]
    if attacks:
        top = max(attacks, key=lambda a: number(a.get("asr")) or 0.0)
        asr = number(top.get("asr")) or 0.0
        poisons = number(top.get("poisons"))
        where = (
            f"at {percent(top.get('poison_rate'))} poison ({int(poisons)} rows)"
            if poisons
            else "after retraining"
        )
        head = "Backdoored" if asr >= BACKDOORED_ASR else "Not backdoored"
        line = f"{head}: ASR {percent(asr)} {where}"
        if len(attacks) > 1:
            line += f" (strongest of {len(attacks)} attacks: {attack_label(top)})"
        clean, base = number(top.get("clean_accuracy")), number(top.get("baseline_accuracy"))
        if clean is not None and base is not None:
            if abs(clean - base) <= ACCURACY_POINTS / 100.0:
                line += f"; clean accuracy within {_points(clean, base)} points of"
            else:
                side = "below" if clean < base else "above"
                line += f"; clean accuracy {_points(clean, base)} points {side}"
            line += f" the clean model ({percent(clean)} vs {percent(base)})"
        elif clean is not None:
            line += f"; clean accuracy {percent(clean)}"
        z = number(top.get("z_score"))
        if z is not None:
            line += f"; backdoor z-score {fmt(z, 2)}"
        parts.append(line)
    runs = [r for r in mappings(block.get("defenses")) if r.get("method") == NC_METHOD]
    if attacks and runs:
        same = [r for r in runs if str(r.get("folder")) == str(top.get("folder"))]
        runs = same or runs
    for run in runs[:1]:
        flagged, target = run.get("flagged_class"), run.get("target_class")
        if flagged is None or not run.get("detected"):
            parts.append("Neural Cleanse found no backdoor")
        elif target is None:
            parts.append(f"Neural Cleanse flagged class {flagged}")
        elif flagged == target:
            parts.append(f"Neural Cleanse flagged class {flagged} (the target)")
        else:
            parts.append(f"Neural Cleanse flagged class {flagged} (not the target {target})")
    return "; ".join(parts) + "." if parts else "No backdoor run yet."


def _scale(arr: np.ndarray) -> int:
    side = max(arr.shape[-2:])
    return max(1, round(DISPLAY_PIXELS / side))


def inverted_grid_plot(images: Sequence[np.ndarray], labels: Sequence[Any] = ()) -> Figure:
    """The trojan's reverse-engineered training images (Liu et al. 2018, Sec. 4.3, model
    inversion with the TV denoiser) in one row of at most `MAX_INVERTED`, nearest neighbour,
    each titled with its label when given."""
    shown = list(images)[:MAX_INVERTED]
    n = max(1, len(shown))
    fig = Figure(figsize=(1.15 * n, 1.45), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, n, squeeze=False)[0])
    for i, ax in enumerate(axes):
        ax.set_xticks([])
        ax.set_yticks([])
        if i < len(shown):
            ax.imshow(to_display(shown[i]), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            if i < len(labels) and labels[i] is not None:
                ax.set_title(f"label {labels[i]}", fontsize=FONT_PT - 1)
    return fig


def nc_masks(details: Mapping[str, Any]) -> list[tuple[int, np.ndarray]]:
    """(class, reversed mask) pairs from a Neural Cleanse run's ``details["triggers"]``: a list
    indexed by class (or by position in ``details["classes"]``), a mapping class -> mask,
    either of them under "masks", or per-class mappings holding a "mask"; each mask (H, W) (a
    (1, H, W) or (C, H, W) mask is averaged over channels). [] when there are none;
    `BackdoorReportError` on a malformed mask."""
    triggers = details.get("triggers")
    if isinstance(triggers, Mapping) and "masks" in triggers:
        triggers = triggers["masks"]
    if isinstance(triggers, Mapping):
        items = []
        for key, value in triggers.items():
            try:
                items.append((int(key), value))
            except (TypeError, ValueError):
                continue
        items.sort(key=lambda kv: kv[0])
    elif isinstance(triggers, (list, tuple)):
        classes = details.get("classes")
        if isinstance(classes, (list, tuple)) and len(classes) == len(triggers):
            items = list(zip(classes, triggers, strict=True))
        else:
            items = list(enumerate(triggers))
    else:
        return []
    out = []
    for k, value in items:
        if isinstance(value, Mapping):
            value = value.get("mask")
        if value is None:
            continue
        arr = check_image(value, f"details['triggers'][{k}]", BackdoorReportError, MAX_SIDE)
        out.append((k, arr.mean(axis=0) if arr.ndim == 3 else arr))
    return out


def _norm_rows(norms: Any) -> np.ndarray | None:
    if isinstance(norms, Mapping):
        try:
            keys = sorted(norms, key=int)
        except (TypeError, ValueError):
            return None
        norms = [norms[k] for k in keys]
    try:
        arr = np.asarray(norms, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] < 2 or not np.isfinite(arr).all():
        return None
    return arr


def nc_anomaly(details: Mapping[str, Any]) -> dict[str, Any] | None:
    """Per class, from the masks' L1 norms in ``details["norms"]`` (one list per class, or one
    per seed: (seeds, classes)): the anomaly index of each seed's norms
    (`stats.backdoor.anomaly_index`), its mean over seeds ("index"), min and max ("low",
    "high"; from ``details["per_seed"][i]["norms"]`` when "norms" is one list, as Neural
    Cleanse's median over restarts gives it), and whether the class lies below the median norm
    ("below": the only side Neural Cleanse flags); None when there are no usable norms."""
    rows = _norm_rows(details.get("norms"))
    if rows is None:
        return None
    indices = np.stack([anomaly_index(r) for r in rows])
    below = (rows < np.median(rows, axis=1, keepdims=True)).mean(axis=0) > 0.5
    index, low, high = indices.mean(axis=0), indices.min(axis=0), indices.max(axis=0)
    seeds = [_norm_rows(r.get("norms")) for r in mappings(details.get("per_seed"))]
    if len(rows) == 1 and seeds and all(r is not None and r.shape == rows.shape for r in seeds):
        per_seed = np.stack([anomaly_index(r[0]) for r in seeds if r is not None])
        low, high = per_seed.min(axis=0), per_seed.max(axis=0)
    return {"index": index, "low": low, "high": high, "below": below, "norms": rows.mean(axis=0)}


def nc_masks_plot(
    masks: Sequence[tuple[int, np.ndarray]],
    flagged: Any = None,
    target: Any = None,
    norms: Sequence[float] | None = None,
) -> Figure:
    """Neural Cleanse's reversed mask of each class in a row (Wang et al. 2019, Sec. IV-B,
    Eq. 2-3; shown on one [0, 1] scale so sizes compare), the flagged class outlined in red,
    the true target class named in its title, each titled with its mask's L1 norm."""
    n = max(1, len(masks))
    fig = Figure(figsize=(max(3.0, 1.05 * n), 1.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, n, squeeze=False)[0])
    for i, ax in enumerate(axes):
        ax.set_xticks([])
        ax.set_yticks([])
        if i >= len(masks):
            continue
        k, mask = masks[i]
        ax.imshow(np.clip(mask, 0, 1), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        norm = (
            float(norms[i]) if norms is not None and i < len(norms) else float(np.abs(mask).sum())
        )
        title = f"class {k}" + (" (target)" if target is not None and k == target else "")
        ax.set_title(f"{title}\n|m|₁={norm:.3g}", fontsize=FONT_PT - 2)
        if flagged is not None and k == flagged:
            for spine in ax.spines.values():
                spine.set_edgecolor("#d62728")
                spine.set_linewidth(3.0)
            ax.set_xlabel("flagged", color="#d62728", fontsize=FONT_PT - 1)
    return fig


def anomaly_plot(
    anomaly: Mapping[str, Any],
    classes: Sequence[int],
    flagged: Any = None,
    threshold: float = NC_THRESHOLD,
) -> Figure:
    """Neural Cleanse's anomaly index per class as bars (mean over seeds, or the index of the
    median norms; whiskers from the seeds' min to max, reaching the bar when it lies outside),
    red where the class lies below the median norm with an index above `threshold`, grey
    above the median (not flaggable), with the threshold as a dashed line; an infinite index
    (MAD 0) is drawn at the top of the axes and labelled "∞"."""
    index = np.asarray(anomaly["index"], dtype=np.float64)
    low = np.asarray(anomaly["low"], dtype=np.float64)
    high = np.asarray(anomaly["high"], dtype=np.float64)
    below = np.asarray(anomaly["below"], dtype=bool)
    finite = index[np.isfinite(index)]
    top = max(threshold * 1.6, float(finite.max()) * 1.15 if finite.size else 0.0, 1.0)
    shown = np.where(np.isfinite(index), index, top)
    colours = [
        "#d62728" if b and v > threshold else ("#1f77b4" if b else "#b0b0b0")
        for b, v in zip(below, index, strict=True)
    ]
    fig = Figure(figsize=(max(3.6, 0.45 * len(index) + 1.4), 2.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(index))
    ax.bar(x, shown, color=colours, edgecolor="#333333", linewidth=0.6)
    spread = np.isfinite(low) & np.isfinite(high) & (high > low)
    if spread.any():
        ax.errorbar(
            x[spread],
            shown[spread],
            yerr=[
                np.maximum(shown[spread] - low[spread], 0.0),
                np.maximum(high[spread] - shown[spread], 0.0),
            ],
            fmt="none",
            ecolor="#333333",
            capsize=2,
            linewidth=0.8,
        )
    for i in np.flatnonzero(~np.isfinite(index)):
        ax.text(i, top, "∞", ha="center", va="bottom", fontsize=FONT_PT)
    ax.axhline(
        threshold, color="#555555", linestyle="--", linewidth=1.0, label=f"threshold {threshold:g}"
    )
    labels = [f"{c}*" if flagged is not None and c == flagged else str(c) for c in classes]
    ax.set_xticks(x, labels)
    ax.set_ylim(0, top * 1.1)
    ax.set_xlabel("class (* flagged; grey: norm above the median)", fontsize=FONT_PT)
    ax.set_ylabel("anomaly index", fontsize=FONT_PT)
    ax.tick_params(labelsize=FONT_PT)
    ax.legend(fontsize=LEGEND_FONT_PT, frameon=False, loc="upper right")
    return fig


_SERIES_KEYS = ("method", "position", "placement", "patch_size", "size", "dataset_size", "trigger")


def _first(row: Mapping[str, Any], *keys: str) -> float | None:
    return next((x for k in keys if (x := number(row.get(k))) is not None), None)


def contrastive_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """The contrastive table's curves: rows grouped by the series keys that vary between rows
    ("method", "position", "patch_size", "dataset_size", ...), each series's rows with the same
    number of poisons averaged (seeds): {label: {"poisons", "asr", "z_score"}} (NaN where a
    point lacks the value), sorted by poisons."""
    varying = [k for k in _SERIES_KEYS if len({str(r.get(k)) for r in rows if k in r}) > 1]
    groups: dict[str, dict[float, list[tuple[float | None, float | None]]]] = {}
    for row in rows:
        n = _first(row, "poisons", "n_poisons", "num_poisons", "poisoned_pairs", "pairs")
        if n is None:
            continue
        label = ", ".join(f"{k}={row.get(k)}" for k in varying if k in row) or "all"
        asr = _first(row, "asr", "success", "attack_success_rate")
        z = _first(row, "z_score", "z")
        groups.setdefault(label, {}).setdefault(n, []).append((asr, z))
    out = {}
    for label, points in groups.items():
        ns = sorted(points)

        def mean(values: list[float | None]) -> float:
            found = [v for v in values if v is not None]
            return float(np.mean(found)) if found else float("nan")

        out[label] = {
            "poisons": ns,
            "asr": [mean([a for a, _ in points[n]]) for n in ns],
            "z_score": [mean([z for _, z in points[n]]) for n in ns],
        }
    return out


def contrastive_plot(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Two panels against the number of poisoned pairs (Carlini & Terzis 2022, Fig. 3-4, on
    our scale): the backdoor's attack success rate, and the backdoor z-score (Sec. 5.1), one
    line per series (`contrastive_series`), x on a symmetric log scale (0 poisons included)."""
    series = contrastive_series(rows)
    fig = Figure(figsize=(9.0, 3.4), layout="constrained")
    axes = fig.subplots(1, 2)
    for i, (label, s) in enumerate(series.items()):
        colour, style = line_style(i)
        for ax, key in zip(axes, ("asr", "z_score"), strict=True):
            y = np.asarray(s[key], dtype=np.float64)
            if np.isfinite(y).any():
                ax.plot(s["poisons"], y, marker="o", color=colour, linestyle=style, label=label)
    ticks = sorted({n for s in series.values() for n in s["poisons"]})
    for ax, name in zip(axes, ("attack success rate", "backdoor z-score"), strict=True):
        ax.set_xscale("symlog", linthresh=1.0)
        if ticks:
            ax.set_xticks(ticks, [f"{n:g}" for n in ticks])
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("poisoned pairs", fontsize=FONT_PT)
        ax.set_ylabel(name, fontsize=FONT_PT)
        ax.tick_params(labelsize=FONT_PT)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    if series:
        axes[0].legend(fontsize=LEGEND_FONT_PT, frameon=False, loc="best")
    return fig


def _epsilon_name(value: Any) -> str:
    x = number(value)
    return "non-private" if x is None or math.isinf(x) else f"DP-SGD ε={x:.3g}"


def badnets_dp_plot(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """BadNets' ASR against the poison rate, one line per ε ("non-private" for None), with the
    group-privacy bound min(1, e^{kε} p0 + δ_k) (Jagielski et al. 2020, Lemma 1) dashed in the
    same colour where the rows give it ("asr_bound")."""
    groups: dict[str, list[tuple[float, float | None, float | None]]] = {}
    for row in rows:
        rate = _first(row, "poison_rate", "rate")
        if rate is None:
            continue
        name = _epsilon_name(row.get("epsilon"))
        groups.setdefault(name, []).append(
            (rate, _first(row, "asr"), _first(row, "asr_bound", "bound"))
        )
    fig = Figure(figsize=(5.6, 3.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    order = sorted(groups, key=lambda n: (n != "non-private", n))
    for i, name in enumerate(order):
        points = sorted(groups[name])
        colour, _ = line_style(i)
        rates = [100.0 * p[0] for p in points if p[1] is not None]
        asr = [p[1] for p in points if p[1] is not None]
        if asr:
            ax.plot(rates, asr, marker="o", color=colour, label=name)
        bound = [(100.0 * p[0], p[2]) for p in points if p[2] is not None]
        if bound:
            ax.plot(
                [b[0] for b in bound],
                [min(1.0, b[1]) for b in bound],
                linestyle="--",
                color=colour,
                linewidth=1.0,
                label=f"{name}: group-privacy bound",
            )
    rates_all = [p[0] for g in groups.values() for p in g]
    if rates_all and min(rates_all) > 0:
        ax.set_xscale("log")
    if rates_all:
        ticks = sorted({100.0 * r for r in rates_all})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("poison rate (%)", fontsize=FONT_PT)
    ax.set_ylabel("attack success rate", fontsize=FONT_PT)
    ax.set_title("BadNets with and without DP-SGD", fontsize=FONT_PT + 1)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, alpha=0.3)
    if groups:
        ax.legend(
            fontsize=LEGEND_FONT_PT,
            frameon=False,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.2),
            ncol=2,
        )
    return fig


def _check_entry(entry: Any, kind: str) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise BackdoorReportError(f"payload[{kind!r}] must be a mapping")
    folder = entry.get("folder")
    if folder is None or str(folder) == "":
        raise BackdoorReportError(f"payload[{kind!r}] needs the run's 'folder'")
    method = entry.get("method")
    if not isinstance(method, str) or not method:
        raise BackdoorReportError(f"payload[{kind!r}] needs a 'method' name")
    for key in _UNIT:
        value = entry.get(key)
        if isinstance(value, float) and math.isnan(value):
            continue
        if value is not None and ((x := number(value)) is None or not 0.0 <= x <= 1.0):
            raise BackdoorReportError(
                f"payload[{kind!r}][{key!r}] must be in [0, 1], got {value!r}"
            )
    images = entry.get("images")
    if images is not None and not isinstance(images, Mapping):
        raise BackdoorReportError(f"payload[{kind!r}]['images'] must be a mapping")
    return dict(entry)


def _learned_trigger(entry: Mapping[str, Any]) -> np.ndarray | None:
    trigger = entry.get("trigger")
    if not isinstance(trigger, Mapping) or trigger.get("pattern") is None:
        return None
    pattern = check_image(
        trigger["pattern"], "payload['attack']['trigger']['pattern']", BackdoorReportError, MAX_SIDE
    )
    if trigger.get("mask") is None:
        return pattern
    mask = check_image(
        trigger["mask"], "payload['attack']['trigger']['mask']", BackdoorReportError, MAX_SIDE
    )
    try:
        return np.clip(pattern * mask, 0.0, 1.0)
    except ValueError:
        return pattern


def _attack_files(entry: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The entry with its arrays replaced by PNG names, and the PNGs."""
    raw = entry.get("images")
    raw = raw if isinstance(raw, Mapping) else {}
    tag = slug(entry["folder"])
    names: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    arrays = {}
    for key in ATTACK_IMAGES:
        value = raw.get(key)
        if isinstance(value, str) and safe_name(value):
            names[key] = value
        elif value is not None:
            arrays[key] = check_image(
                value, f"payload['attack']['images'][{key!r}]", BackdoorReportError, MAX_SIDE
            )
    if "trigger" not in arrays and "trigger" not in names:
        learned = _learned_trigger(entry)
        if learned is not None:
            arrays["trigger"] = learned
    for key, arr in arrays.items():
        name = f"backdoor-{tag}-{key.replace('_', '-')}.png"
        files[name] = image_png(arr, scale=_scale(arr))
        names[key] = name
    inverted = raw.get("inverted")
    if isinstance(inverted, str) and safe_name(inverted):
        names["inverted"] = inverted
        names["inverted_count"] = raw.get("inverted_count")
    elif inverted is not None:
        if not isinstance(inverted, (list, tuple)):
            raise BackdoorReportError(
                "payload['attack']['images']['inverted'] must be a list of images"
            )
        images = [
            check_image(
                x, f"payload['attack']['images']['inverted'][{i}]", BackdoorReportError, MAX_SIDE
            )
            for i, x in enumerate(inverted[:MAX_INVERTED])
        ]
        if images:
            labels = raw.get("inverted_labels")
            labels = list(labels) if isinstance(labels, (list, tuple)) else []
            name = f"backdoor-{tag}-inverted.png"
            files[name] = _to_png(inverted_grid_plot(images, labels))
            names["inverted"] = name
            names["inverted_count"] = len(images)
    out = dict(entry)
    out["images"] = names
    trigger = out.get("trigger")
    if isinstance(trigger, Mapping) and ("pattern" in trigger or "mask" in trigger):
        out["trigger"] = {
            **{k: v for k, v in trigger.items() if k not in ("pattern", "mask")},
            "learned": True,
        }
    return out, files


def _defense_files(entry: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    details = entry.get("details")
    details = dict(details) if isinstance(details, Mapping) else {}
    given = entry.get("images")
    names: dict[str, Any] = {
        k: v
        for k, v in (given.items() if isinstance(given, Mapping) else [])
        if isinstance(v, str) and safe_name(v)
    }
    files: dict[str, bytes] = {}
    if entry.get("method") == NC_METHOD:
        tag = f"backdoor-{slug(entry['folder'])}-{entry['method']}"
        masks = nc_masks(details)
        anomaly = nc_anomaly(details)
        flagged, target = entry.get("flagged_class"), entry.get("target_class")
        if masks:
            norms = None
            if anomaly is not None and len(anomaly["norms"]) == len(masks):
                norms = list(anomaly["norms"])
            files[f"{tag}-masks.png"] = _to_png(nc_masks_plot(masks, flagged, target, norms))
            names["masks"] = f"{tag}-masks.png"
        if anomaly is not None:
            classes = (
                [k for k, _ in masks]
                if len(masks) == len(anomaly["index"])
                else list(range(len(anomaly["index"])))
            )
            files[f"{tag}-anomaly.png"] = _to_png(anomaly_plot(anomaly, classes, flagged))
            names["anomaly"] = f"{tag}-anomaly.png"
            details["anomaly_indices"] = [
                None if not math.isfinite(v) else float(v) for v in anomaly["index"]
            ]
        pattern = details.get("flagged_pattern")
        where = [i for i, (k, _) in enumerate(masks) if k == flagged]
        if isinstance(pattern, list) and where:
            picture = check_image(
                pattern, "details['flagged_pattern']", BackdoorReportError, MAX_SIDE
            )
            mask = masks[where[0]][1]
            if picture.shape[-2:] == mask.shape:
                drawn = np.clip(picture * mask, 0.0, 1.0)
                files[f"{tag}-flagged.png"] = image_png(drawn, scale=_scale(drawn))
                names["flagged_trigger"] = f"{tag}-flagged.png"
            details["flagged_pattern"] = "drawn"
        if "triggers" in details:
            details["triggers"] = "drawn" if masks else None
    out = dict(entry)
    out["details"] = details
    out["images"] = names
    return out, files


def add_backdoor_run(out_dir: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Merge one backdoor `payload` (``{"attack": entry}``, ``{"defense": entry}`` or
    ``{"tables": {name: rows}}``, see the module docstring) into the report in `out_dir`;
    return its index.html.

    Attacks are keyed by their folder (the same text or the same resolved directory) and a
    re-run replaces the entry in place; defences by (folder, method); tables by name. The
    entry's pictures are drawn as PNG files beside the page; every other key of results.json
    and every other entry is kept. Folder locked, files written atomically; a bad payload
    raises `BackdoorReportError` before anything is written."""
    if not isinstance(payload, Mapping):
        raise BackdoorReportError(
            f"a backdoor payload must be a mapping, got {type(payload).__name__}"
        )
    kinds = [k for k in ("attack", "defense", "tables") if k in payload]
    if len(kinds) != 1 or len(payload) != 1:
        raise BackdoorReportError(
            "a backdoor payload is exactly one of {'attack': ...}, {'defense': ...} or "
            "{'tables': ...}"
        )
    kind = kinds[0]
    files: dict[str, bytes] = {}
    if kind == "tables":
        tables = check_tables(payload["tables"], BackdoorReportError)
        for name, rows in tables.items():
            if name in TABLE_FIGURES and rows:
                plot = contrastive_plot if name == "contrastive" else badnets_dp_plot
                files[TABLE_FIGURES[name]] = _to_png(plot(rows))
    else:
        entry = json_ready(_check_entry(payload[kind], kind))
        entry["folder"] = str(entry["folder"])
        entry, files = _attack_files(entry) if kind == "attack" else _defense_files(entry)
    base = Path(out_dir)
    base.mkdir(parents=True, exist_ok=True)
    with locked(base, BLOCK):
        results = read_results(base / "results.json", BackdoorReportError)
        block = results.get(BLOCK)
        block = dict(block) if isinstance(block, Mapping) else {}
        if kind == "tables":
            stored = block.get("tables")
            merged = dict(stored) if isinstance(stored, Mapping) else {}
            merged.update(tables)
            block["tables"] = merged
            images = block.get("images")
            images = dict(images) if isinstance(images, Mapping) else {}
            images.update({k: v for k, v in TABLE_FIGURES.items() if v in files})
            block["images"] = images
        else:
            key = "attacks" if kind == "attack" else "defenses"
            entries = [dict(m) for m in mappings(block.get(key))]
            at = next(
                (
                    i
                    for i, m in enumerate(entries)
                    if same_folder(m.get("folder"), entry["folder"])
                    and (kind == "attack" or m.get("method") == entry["method"])
                ),
                None,
            )
            if at is None:
                entries.append(entry)
            else:
                entries[at] = entry
            block[key] = entries
        results[BLOCK] = block
        results.setdefault("title", "privacylab report: backdoors")
        return write_report(base, results, files)
