"""The DP-Forward part of a report folder: merging one training or attack run into
`results.json`, the rows of its table, the comparison with Du et al.'s claims and its figures.

`add_dpforward_run(folder, payload)` is what `privacylab dpforward train --out` and
`privacylab attack embedding --out` call. `payload` is either ``{"facts": facts}`` (a trained
model folder, `privacylab.dpforward.train_dpforward`) or one attack run
(`privacylab.embedding.run_embedding_attack`: ``{"method", "target": facts, ...}``). Runs are
kept per model folder under ``payload["dpforward"]["models"]``: a model's "inversion-nn",
"inversion-opt" and "attribute" runs fill one row; a run replaces that model's earlier run of
the same method; a model retrained with other settings (method, position, ε, ...) drops the
runs made on the old one. A non-private or DP-SGD model read at another cut than its own
(``FOLDER@POSITION``) is a row of its own, labelled with the cut; its accuracy and step time
count once in the figures and claims. Every other key of `results.json` is kept, files are written
atomically (`privacylab.report.html.write_report`) and concurrent calls on one folder are
serialised by a lock file. The review texts of the victims appear only as inversion examples,
at most `EXAMPLES` per run and `EXAMPLE_CHARS` characters each.

What the section compares is Du et al. 2023 ("DP-Forward: Fine-tuning and Inference on
Language Models with Differential Privacy in Forward Pass", CCS'23): their Sec. 5 accuracy
against ε per perturbed position next to DP-SGD and non-private fine-tuning (Tables 2-4),
and their Sec. 6 embedding inversion (token recall) and sensitive-attribute inference
(Tables 6-7), plus sequence-level membership inference.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from privacylab.errors import PrivacylabError
from privacylab.report._format import mappings, number
from privacylab.report._merge import locked, read_results, same_folder
from privacylab.report.html import write_report
from privacylab.report.jsonable import json_ready
from privacylab.report.language import epsilon_label
from privacylab.report.plots import FONT_PT, LEGEND_FONT_PT, _to_png, line_style

__all__ = [
    "ACCURACY_IMAGE",
    "ATTACKS_IMAGE",
    "ATTACK_METHODS",
    "ATTRIBUTE_MARGIN",
    "COST_RATIO",
    "EXAMPLES",
    "EXAMPLE_CHARS",
    "INVERSION_STOPPED",
    "METHOD_NAMES",
    "MIA_MITIGATED",
    "PLOTTED",
    "DPForwardReportError",
    "Finding",
    "accuracy_plot",
    "add_dpforward_run",
    "attacks_plot",
    "distinct_models",
    "dpforward_images",
    "event_summary",
    "findings",
    "marked_tokens",
    "model_label",
    "model_rows",
    "verdict",
]

ATTACK_METHODS = ("inversion-nn", "inversion-opt", "attribute")
"""The attack runs a model row merges, one of each at most."""

ACCURACY_IMAGE = "dpforward-accuracy.png"
ATTACKS_IMAGE = "dpforward-attacks.png"

EXAMPLES = 5
"""Inversion examples kept per run."""

EXAMPLE_CHARS = 240
"""Characters kept of each example's truth and recovered text (the rest becomes "…")."""

INVERSION_STOPPED = 0.2
"""Token recall below which embedding inversion counts as stopped (the issue's threshold; Du
et al. 2023, Sec. 6.2, report DP-Forward bringing inversion down by up to 88 pp)."""

ATTRIBUTE_MARGIN = 0.05
"""Attribute accuracy at most this far above chance (the majority share) counts as stopped."""

MIA_MITIGATED = 0.55
"""Membership AUC at or below which membership inference counts as mitigated."""

COST_RATIO = 3.0
"""How many times slower a DP-SGD step than a DP-Forward step the seed reports (Sec. 7)."""

METHOD_NAMES = {"dp-forward": "DP-Forward", "dp-sgd": "DP-SGD", "non-private": "non-private"}


class DPForwardReportError(PrivacylabError, ValueError):
    """A DP-Forward payload that cannot be merged into a report (one line)."""


def _event_name(kind: str) -> str:
    return "".join(part.capitalize() for part in kind.split("_"))


def event_summary(event: Any) -> str:
    """A privacy event dict (`privacylab.accounting.events.event_to_dict`) in one short line:
    "MatrixGaussian(σ/Δ=0.91, 48×384)", "3 × PoissonSampled(q=0.033, Gaussian(σ/Δ=1.1))",
    "Composed(…, …)"; "—" for None, the text itself for anything not an event dict."""
    if event is None:
        return "—"
    if not isinstance(event, Mapping):
        return str(event)
    kind = str(event.get("type", "event"))
    if kind == "self_composed":
        return f"{number(event.get('count')) or 0:g} × {event_summary(event.get('event'))}"
    if kind == "poisson_sampled":
        rate = number(event.get("sample_rate"))
        inner = event_summary(event.get("event"))
        return f"PoissonSampled(q={rate:.2g}, {inner})" if rate is not None else inner
    if kind == "composed":
        parts = event.get("events")
        parts = parts if isinstance(parts, list) else []
        return "Composed(" + ", ".join(event_summary(p) for p in parts) + ")"
    details = []
    sigma = number(event.get("noise_multiplier"))
    if sigma is not None:
        details.append(f"σ/Δ={sigma:.2g}")
    rows, columns = number(event.get("rows")), number(event.get("columns"))
    if rows is not None and columns is not None:
        details.append(f"{int(rows)}×{int(columns)}")
    epsilon = number(event.get("epsilon"))
    if kind == "randomized_response" and epsilon is not None:
        details.append(f"ε={epsilon:.2g}, k={int(number(event.get('k')) or 2)}")
    scale = number(event.get("scale"))
    if scale is not None:
        details.append(f"b/Δ={scale:.2g}")
    return f"{_event_name(kind)}({', '.join(details)})" if details else _event_name(kind)


def model_label(row: Mapping[str, Any]) -> str:
    """A model row's short label: "DP-Forward, output, ε=8", "DP-SGD, ε=3", "non-private";
    a non-private or DP-SGD model read at several cuts (`read_at`) names the cut of its row:
    "non-private, read at layer:2"."""
    method = str(row.get("method") or "model")
    parts = [METHOD_NAMES.get(method, method)]
    if method == "dp-forward" and row.get("position"):
        parts.append(str(row["position"]) + (" (f frozen)" if row.get("frozen") else ""))
    elif row.get("read_at"):
        parts.append(f"read at {row['read_at']}")
    epsilon = number(row.get("epsilon"))
    if epsilon is not None and math.isfinite(epsilon):
        parts.append(f"ε={epsilon_label(epsilon)}")
    return ", ".join(parts)


def _labels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    plain = [model_label(r) for r in rows]
    out = []
    for row, label in zip(rows, plain, strict=True):
        if plain.count(label) > 1:
            label = f"{label} ({Path(str(row.get('folder'))).name or row.get('folder')})"
        out.append(label)
    return out


def _cut_of(row: Mapping[str, Any]) -> tuple[str, str | None]:
    """(the model's folder, the cut) of a row that reads a non-private or DP-SGD model at
    another cut than its own (`privacylab.embedding.run_embedding_attack(position=...)` names it
    ``FOLDER@POSITION``); (folder, None) for any other row."""
    folder, position = str(row.get("folder")), row.get("position")
    suffix = f"@{position}"
    if row.get("method") != "dp-forward" and position and folder.endswith(suffix):
        return folder[: -len(suffix)], str(position)
    return folder, None


def distinct_models(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One row per trained model: a model read at several cuts keeps its first row (its
    accuracy, ε and step time are the same at every cut)."""
    seen: set[str] = set()
    out = []
    for row in rows:
        model = _cut_of(row)[0]
        if model not in seen:
            seen.add(model)
            out.append(row)
    return out


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _best(values: Sequence[Any]) -> float | None:
    found = [x for v in values if (x := number(v)) is not None]
    return max(found) if found else None


def _pick(facts: Mapping[str, Any], runs: Mapping[str, Mapping[str, Any]], key: str) -> Any:
    return _first(facts.get(key), *(r.get(key) for r in runs.values()))


def _mia_of(runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The per-attack membership metrics of the run with the largest membership AUC."""
    scored = [r for r in runs.values() if number(r.get("mia_auc")) is not None]
    if not scored:
        return {}
    mia = max(scored, key=lambda r: number(r.get("mia_auc")) or 0.0).get("mia")
    if not isinstance(mia, Mapping):
        return {}
    return {str(k): v for k, v in mia.items() if isinstance(v, Mapping)}


def model_rows(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per model folder of a ``payload["dpforward"]`` block, in the order the models
    were first added: the facts (method, position, ε, δ, event, accountant, label ε, accuracy)
    and what each attack found (inversion recall of "inversion-nn" and "inversion-opt",
    attribute accuracy and its chance level, the largest membership AUC of its runs and that
    run's per-attack metrics `mia`), plus `label` (`model_label`, made unique by the folder
    name) and `examples` ({method: [{"truth", "recovered"}, ...]}). `inversion_nn_baseline`
    and `inversion_opt_baseline` are each inversion's recall against another victim's tokens
    (what guessing common words scores, `privacylab.attacks.embedding.run_inversion`).
    `read_at` is the cut of a non-private or DP-SGD model read at several cuts (its rows
    ``FOLDER@POSITION`` and FOLDER at its own cut), else None."""
    rows = []
    for model in mappings(block.get("models")):
        facts = model.get("facts")
        facts = facts if isinstance(facts, Mapping) else {}
        stored = model.get("runs")
        stored = stored if isinstance(stored, Mapping) else {}
        runs = {m: r for m in ATTACK_METHODS if isinstance(r := stored.get(m), Mapping)}
        empty: Mapping[str, Any] = {}
        nn, opt, attribute = (runs.get(m, empty) for m in ATTACK_METHODS)
        privacy = facts.get("privacy")
        privacy = privacy if isinstance(privacy, Mapping) else {}
        shuffled = privacy.get("shuffled")
        pick = functools.partial(_pick, facts, runs)

        rows.append(
            {
                "folder": str(model.get("folder")),
                "method": facts.get("method"),
                "position": pick("position"),
                "frozen": bool(facts.get("frozen")),
                "epsilon": number(pick("epsilon")),
                "delta": number(pick("delta")),
                "event": pick("event"),
                "accountant": pick("accountant"),
                "label_epsilon": number(facts.get("label_epsilon")),
                "total_epsilon": number(privacy.get("total_epsilon")),
                "inference_epsilon": number(privacy.get("inference_epsilon")),
                "shuffled": shuffled if isinstance(shuffled, Mapping) else None,
                "encoder": facts.get("encoder"),
                "accuracy": number(pick("accuracy")),
                "train_accuracy": number(facts.get("train_accuracy")),
                "seconds_per_step": number(facts.get("seconds_per_step")),
                "inversion_nn": number(nn.get("inversion_recall")),
                "inversion_opt": number(opt.get("inversion_recall")),
                "inversion_nn_baseline": number(nn.get("inversion_baseline_recall")),
                "inversion_opt_baseline": number(opt.get("inversion_baseline_recall")),
                "attribute_accuracy": number(attribute.get("attribute_accuracy")),
                "attribute_chance": number(attribute.get("attribute_chance")),
                "mia_auc": _best([r.get("mia_auc") for r in runs.values()]),
                "mia": _mia_of(runs),
                "examples": {
                    m: list(mappings(runs[m].get("examples")))
                    for m in ATTACK_METHODS[:2]
                    if m in runs
                },
            }
        )
    reread = {model for model, cut in map(_cut_of, rows) if cut}
    for row in rows:
        shared = row.get("method") != "dp-forward" and _cut_of(row)[0] in reread
        row["read_at"] = str(row["position"]) if shared and row.get("position") else None
    for row, label in zip(rows, _labels(rows), strict=True):
        row["label"] = label
        row["inversion"] = _best([row["inversion_nn"], row["inversion_opt"]])
    return rows


_WORD = re.compile(r"\w+|[^\w\s]")


def _in_truth(token: str, words: set[str]) -> bool:
    bare = token.lower().removeprefix("##")
    parts = re.findall(r"\w+", bare)
    if parts:
        return all(part in words for part in parts)
    return bool(bare) and all(ch in words for ch in bare)


def marked_tokens(truth: str, recovered: str) -> list[tuple[str, bool]]:
    """The recovered text split on whitespace, each token with whether it occurs in the truth:
    lower-cased and without a WordPiece continuation's "##", a token is in the truth when each
    of its words is one of the truth's words (punctuation around or inside it ignored), and a
    token of punctuation alone when each of its marks occurs in the truth (the set-membership
    that token recall, |set(recovered) ∩ set(truth)| / |set(truth)|, counts; Song &
    Raghunathan 2020, "Information Leakage in Embedding Models", Sec. 4)."""
    words = {w for w in _WORD.findall(str(truth).lower())}
    return [(token, _in_truth(token, words)) for token in str(recovered).split()]


@dataclass(frozen=True)
class Finding:
    """One of Du et al.'s claims, what our runs measured, and whether it holds: "holds",
    "partly", "does not hold" or "not measured"."""

    claim: str
    ours: str
    holds: str


def _range(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if lo == hi else f"{lo:.2f}–{hi:.2f}"


def _of(rows: Sequence[Mapping[str, Any]], method: str, key: str) -> list[tuple[Any, float]]:
    return [(r, r[key]) for r in rows if r.get("method") == method and r.get(key) is not None]


def _three(all_ok: bool, some_ok: bool) -> str:
    return "holds" if all_ok else "partly" if some_ok else "does not hold"


def _accuracy_finding(rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    rows = distinct_models(rows)
    forward = [r for r, _ in _of(rows, "dp-forward", "accuracy") if r.get("epsilon") is not None]
    sgd = [r for r, _ in _of(rows, "dp-sgd", "accuracy") if r.get("epsilon") is not None]
    gaps = []
    for base in sgd:
        level = epsilon_label(base["epsilon"])
        same = [r for r in forward if epsilon_label(r["epsilon"]) == level]
        if same:
            top = max(same, key=lambda r: r["accuracy"])
            gaps.append((level, top, base, 100.0 * (top["accuracy"] - base["accuracy"])))
    claim = "DP-Forward is more accurate than DP-SGD at moderate ε (up to +7.7 pp)"
    if not gaps:
        out = [Finding(claim, "needs DP-Forward and DP-SGD models at the same ε", "not measured")]
    else:
        ours = "; ".join(
            f"ε={lvl}: {top['accuracy']:.3f} ({top.get('position')}) vs {base['accuracy']:.3f} "
            f"({gap:+.1f} pp)"
            for lvl, top, base, gap in gaps
        )
        wins = [g for g in gaps if g[3] > 0]
        out = [Finding(claim, ours, _three(len(wins) == len(gaps), bool(wins)))]
    claim = "the output position is the most accurate place to add the noise"
    levels: dict[str, list[Mapping[str, Any]]] = {}
    for row in forward:
        levels.setdefault(epsilon_label(row["epsilon"]), []).append(row)
    compared = {k: v for k, v in levels.items() if len({r.get("position") for r in v}) > 1}
    if not compared:
        out.append(
            Finding(claim, "needs DP-Forward models at two positions and one ε", "not measured")
        )
    else:
        best = {k: max(v, key=lambda r: r["accuracy"]) for k, v in compared.items()}
        ours = "; ".join(
            f"ε={k}: best {r.get('position')} ({r['accuracy']:.3f})" for k, r in best.items()
        )
        output = [k for k, r in best.items() if r.get("position") == "output"]
        out.append(Finding(claim, ours, _three(len(output) == len(best), bool(output))))
    return out


def _attack_finding(rows: Sequence[Mapping[str, Any]], what: str) -> Finding:
    if what == "inversion":
        claim = (
            f"embedding inversion: token recall under DP-Forward below {INVERSION_STOPPED:g} "
            "where DP-SGD leaves it high"
        )
        measure = lambda r: r["inversion"]  # noqa: E731
        stopped = lambda r: r["inversion"] < INVERSION_STOPPED  # noqa: E731
        key, unit = "inversion", "recall"
    else:
        claim = "attribute inference: towards chance under DP-Forward, barely reduced by DP-SGD"
        measure = lambda r: r["attribute_accuracy"] - (r["attribute_chance"] or 0.0)  # noqa: E731
        stopped = lambda r: measure(r) <= ATTRIBUTE_MARGIN  # noqa: E731
        key, unit = "attribute_accuracy", "accuracy above chance"
    forward = [r for r, _ in _of(rows, "dp-forward", key)]
    sgd = [r for r, _ in _of(rows, "dp-sgd", key)]
    plain = [r for r, _ in _of(rows, "non-private", key)]
    if not forward or not sgd:
        return Finding(claim, "needs DP-Forward and DP-SGD models attacked", "not measured")
    parts = [
        f"{name} {unit} {_range([measure(r) for r in group])}"
        f" ({sum(stopped(r) for r in group)}/{len(group)} stopped)"
        for name, group in (("DP-Forward", forward), ("DP-SGD", sgd), ("non-private", plain))
        if group
    ]
    guesses = [
        x
        for r in rows
        for k in ("inversion_nn_baseline", "inversion_opt_baseline")
        if what == "inversion" and (x := r.get(k)) is not None
    ]
    if guesses:
        parts.append(f"guessing common words (another victim's tokens) {_range(guesses)}")
    forward_ok = [stopped(r) for r in forward]
    sgd_leaks = not any(stopped(r) for r in sgd)
    return Finding(
        claim,
        "; ".join(parts),
        _three(all(forward_ok) and sgd_leaks, any(forward_ok) and sgd_leaks),
    )


def _mia_finding(rows: Sequence[Mapping[str, Any]]) -> Finding:
    claim = f"membership inference mitigated by both (AUC ≤ {MIA_MITIGATED:g})"
    groups = [
        (name, [v for _, v in _of(rows, method, "mia_auc")])
        for method, name in METHOD_NAMES.items()
    ]
    forward, sgd = groups[0][1], groups[1][1]
    if not forward or not sgd:
        return Finding(claim, "needs DP-Forward and DP-SGD membership AUCs", "not measured")
    ours = "; ".join(f"{name} AUC {_range(values)}" for name, values in groups if values)
    both = [v <= MIA_MITIGATED for v in forward + sgd]
    return Finding(claim, ours, _three(all(both), any(both)))


def _cost_finding(rows: Sequence[Mapping[str, Any]]) -> Finding:
    claim = "a DP-Forward step costs about 3× less time than a DP-SGD step"
    rows = distinct_models(rows)
    forward = [v for _, v in _of(rows, "dp-forward", "seconds_per_step")]
    sgd = [v for _, v in _of(rows, "dp-sgd", "seconds_per_step")]
    if not forward or not sgd or min(forward) <= 0:
        return Finding(claim, "needs DP-Forward and DP-SGD step times", "not measured")
    mean_forward, mean_sgd = sum(forward) / len(forward), sum(sgd) / len(sgd)
    ratio = mean_sgd / mean_forward
    ours = (
        f"DP-SGD {mean_sgd:.3g} s vs DP-Forward {mean_forward:.3g} s per step "
        f"({ratio:.1f}×, as trained, not a controlled benchmark)"
    )
    return Finding(claim, ours, _three(ratio >= COST_RATIO, ratio > 1.0))


def findings(rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Du et al. 2023's findings (abstract; Sec. 5-7) checked against `model_rows`: accuracy
    over DP-SGD at equal ε, the output position best, inversion recall below
    `INVERSION_STOPPED` under DP-Forward but not DP-SGD, attribute accuracy within
    `ATTRIBUTE_MARGIN` of chance under DP-Forward but not DP-SGD, membership AUC at most
    `MIA_MITIGATED` under both, and a DP-SGD step at least `COST_RATIO` times as slow as a
    DP-Forward step (mean seconds per step of the models' own training)."""
    return [
        *_accuracy_finding(rows),
        _attack_finding(rows, "inversion"),
        _attack_finding(rows, "attribute"),
        _mia_finding(rows),
        _cost_finding(rows),
    ]


def verdict(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line answering: does DP-Forward stop embedding inversion and attribute inference
    where DP-SGD does not? Per attack "yes", "partly", "no" or "not measured", with the numbers
    of `findings`; "Not measured yet" when neither attack ran on both kinds of model."""
    found = [_attack_finding(rows, "inversion"), _attack_finding(rows, "attribute")]
    measured = [f for f in found if f.holds != "not measured"]
    if not measured:
        return (
            "Not measured yet: attack DP-Forward and DP-SGD models with inversion-nn, "
            "inversion-opt and attribute to see whether DP-Forward stops what DP-SGD does not."
        )
    answers = {"holds": "yes", "partly": "partly", "does not hold": "no"}
    names = ("Inversion", "Attribute inference")
    detail = " ".join(
        f"{n}: {answers[f.holds]} — {f.ours}." if f.holds in answers else f"{n}: not measured."
        for n, f in zip(names, found, strict=True)
    )
    return (
        "Does DP-Forward stop embedding inversion and attribute inference where DP-SGD does "
        f"not? {detail}"
    )


def _position_order(position: str) -> tuple[int, int, str]:
    """Input first, then encoder layers by index, then output (the pipeline's order)."""
    if position == "input":
        return (0, 0, position)
    if position == "output":
        return (2, 0, position)
    layer = position.removeprefix("layer:")
    return (1, int(layer) if layer.isdigit() else 0, position)


def accuracy_plot(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Test accuracy of the deployed pipeline against ε (log axis): one line per DP-Forward
    position, DP-SGD as points, each non-private model as a horizontal dashed line (Du et al.
    2023, Sec. 5, Tables 2-4 drawn as curves)."""
    fig = Figure(figsize=(7.2, 4.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)

    def usable(r: Mapping[str, Any]) -> bool:
        return r.get("accuracy") is not None and (r.get("epsilon") or 0.0) > 0

    rows = distinct_models(rows)
    forward = [r for r in rows if r.get("method") == "dp-forward" and usable(r)]
    series = sorted(
        {(str(r.get("position")), bool(r.get("frozen"))) for r in forward},
        key=lambda s: (_position_order(s[0]), s[1]),
    )
    xs: list[float] = []
    for i, (position, frozen) in enumerate(series):
        points = sorted(
            (r["epsilon"], r["accuracy"])
            for r in forward
            if str(r.get("position")) == position and bool(r.get("frozen")) == frozen
        )
        color, style = line_style(i)
        ax.plot(
            *zip(*points, strict=True),
            color=color,
            linestyle=style,
            marker="o",
            markersize=5,
            linewidth=1.8,
            label=f"DP-Forward, {position}" + (" (f frozen)" if frozen else ""),
        )
        xs += [p[0] for p in points]
    sgd = sorted(
        (r["epsilon"], r["accuracy"]) for r in rows if r.get("method") == "dp-sgd" and usable(r)
    )
    if sgd:
        ax.plot(
            *zip(*sgd, strict=True),
            color="#000000",
            linestyle="none",
            marker="s",
            markersize=7,
            label="DP-SGD",
        )
        xs += [p[0] for p in sgd]
    plain = [r for r in rows if r.get("method") == "non-private" and r.get("accuracy") is not None]
    for j, row in enumerate(plain):
        ax.axhline(
            row["accuracy"],
            color="#7f7f7f",
            linestyle="--",
            linewidth=1.3,
            label=f"non-private ({row['accuracy']:.3f})" if j < 3 else None,
        )
    ax.set_xscale("log")
    if xs:
        ax.set_xlim(min(xs) / 1.6, max(xs) * 1.6)
        ax.set_xticks(sorted(set(xs)), [epsilon_label(x) for x in sorted(set(xs))])
    else:
        ax.set_xlim(0.5, 20.0)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("ε (sequence-level, all epochs; smaller is more private)", fontsize=FONT_PT)
    ax.set_ylabel("test accuracy (deployed pipeline)", fontsize=FONT_PT)
    ax.set_title("Accuracy vs ε per noise position", fontsize=FONT_PT + 1)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=LEGEND_FONT_PT, loc="lower right", frameon=False)
    return fig


_TICKS = (
    ("#8c564b", "inversion by guessing (another victim's tokens)"),
    ("#000000", "attribute chance (majority share)"),
)
"""(colour, legend) of the level each attack bar is read against: inversion, attribute."""


def attacks_plot(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Per model, bars of inversion token recall (nearest neighbour, optimisation), each with
    the recall of guessing (recovered tokens against another victim's) as a brown tick, and
    attribute accuracy with its chance level as a black tick; the dashed line is
    `INVERSION_STOPPED` (Du et al. 2023, Sec. 6, Tables 6-7 as bars)."""
    shown = [
        r
        for r in rows
        if any(
            r.get(k) is not None for k in ("inversion_nn", "inversion_opt", "attribute_accuracy")
        )
    ]
    fig = Figure(figsize=(min(14.0, max(7.0, 1.5 * len(shown) + 2.5)), 4.8), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    width = 0.26
    bars = (
        ("inversion_nn", "inversion recall (nearest neighbour)"),
        ("inversion_opt", "inversion recall (optimisation)"),
        ("attribute_accuracy", "attribute accuracy"),
    )
    centres = np.arange(len(shown), dtype=float)
    floor = {
        "inversion_nn": "inversion_nn_baseline",
        "inversion_opt": "inversion_opt_baseline",
        "attribute_accuracy": "attribute_chance",
    }
    for k, (key, name) in enumerate(bars):
        values = [r.get(key) for r in shown]
        where = [c + (k - 1) * width for c, v in zip(centres, values, strict=True) if v is not None]
        heights = [v for v in values if v is not None]
        tops = [max(v, r.get(floor[key]) or 0.0)
                for r, v in zip(shown, values, strict=True) if v is not None]  # fmt: skip
        if not heights:
            continue
        ax.bar(where, heights, width=width * 0.95, color=line_style(k)[0], label=name)
        for x, height, top in zip(where, heights, tops, strict=True):
            ax.text(x, top + 0.015, f"{height:.2f}", ha="center", va="bottom",
                    fontsize=FONT_PT - 2)  # fmt: skip
    labelled: set[str] = set()
    for k, (key, _) in enumerate(bars):
        ticks = [
            (c + (k - 1) * width, r[floor[key]])
            for c, r in zip(centres, shown, strict=True)
            if r.get(key) is not None and r.get(floor[key]) is not None
        ]
        tick = _TICKS[key == "attribute_accuracy"]
        for x, level in ticks:
            ax.plot(
                [x - width / 2, x + width / 2],
                [level, level],
                color=tick[0],
                linewidth=2.2,
                zorder=3,
                label=None if tick[1] in labelled else tick[1],
            )
            labelled.add(tick[1])
    ax.axhline(
        INVERSION_STOPPED,
        color="#555555",
        linestyle="--",
        linewidth=1,
        label=f"inversion stopped below {INVERSION_STOPPED:g}",
    )
    ax.set_xticks(centres, [r["label"] for r in shown], rotation=20, ha="right")
    ax.set_ylim(0.0, 1.02)
    ax.set_ylabel("recall / accuracy", fontsize=FONT_PT)
    ax.set_title("Inference-time attacks on the released embeddings", fontsize=FONT_PT + 1)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(
        fontsize=LEGEND_FONT_PT,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.3),
        ncol=2,
        frameon=False,
    )
    return fig


PLOTTED = {
    ACCURACY_IMAGE: ("label", "method", "position", "epsilon", "accuracy"),
    ATTACKS_IMAGE: ("label", "inversion_nn", "inversion_opt", "attribute_accuracy",
                    "attribute_chance", "inversion_nn_baseline", "inversion_opt_baseline"),
}  # fmt: skip
"""What each figure draws of `model_rows`: a figure whose values did not change is not redrawn."""


def _digest(rows: Sequence[Mapping[str, Any]], name: str) -> str:
    values = [[row.get(k) for k in PLOTTED[name]] for row in rows]
    return hashlib.sha256(json.dumps(values, default=str).encode("utf-8")).hexdigest()[:20]


def dpforward_images(
    block: Mapping[str, Any], current: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The figures of a ``payload["dpforward"]`` block: ({"accuracy": name|None,
    "attacks": name|None, "drawn": {name: digest of what it shows}}, {file name: PNG bytes}).
    A figure is drawn when some row has what it shows, unless `current` (file name -> digest
    of figures already on disk) says that file already shows exactly these values."""
    rows = model_rows(block)
    current = current or {}
    names: dict[str, Any] = {"accuracy": None, "attacks": None, "drawn": {}}
    files: dict[str, bytes] = {}
    wanted = {
        ACCURACY_IMAGE: ("accuracy", any(r["accuracy"] is not None for r in rows), accuracy_plot),
        ATTACKS_IMAGE: (
            "attacks",
            any(r[k] is not None for r in rows for k in PLOTTED[ATTACKS_IMAGE][1:4]),
            attacks_plot,
        ),
    }
    for name, (key, shown, plot) in wanted.items():
        if not shown:
            continue
        names[key] = name
        names["drawn"][name] = digest = _digest(rows, name)
        if current.get(name) != digest:
            files[name] = _to_png(plot(rows))
    return names, files


IDENTITY = (
    "method",
    "position",
    "encoder",
    "layers",
    "epsilon",
    "delta",
    "label_epsilon",
    "epochs",
)
"""Facts that name what model a folder holds: when they change, its old attack runs go."""

_UNIT = (
    "accuracy",
    "train_accuracy",
    "inversion_recall",
    "inversion_baseline_recall",
    "attribute_accuracy",
    "attribute_chance",
    "mia_auc",
)


def _check_numbers(where: str, data: Mapping[str, Any]) -> None:
    for key in _UNIT:
        value = data.get(key)
        if value is None:
            continue
        x = number(value)
        if x is None or not 0.0 <= x <= 1.0:
            raise DPForwardReportError(
                f"{where}[{key!r}] must be a number in [0, 1], got {value!r}"
            )
    for key in ("epsilon", "delta", "label_epsilon"):
        value = data.get(key)
        if value is not None and ((x := number(value)) is None or x <= 0):
            raise DPForwardReportError(f"{where}[{key!r}] must be a positive number, got {value!r}")


def _facts_of(payload: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(facts, attack run without its facts or None) of a valid payload."""
    if "facts" in payload and "method" not in payload:
        facts, run = payload.get("facts"), None
        where = "payload['facts']"
    elif "folder" in payload and "target" not in payload:
        facts, run = payload, None
        where = "facts"
    elif "method" in payload:
        method = payload.get("method")
        if method not in ATTACK_METHODS:
            raise DPForwardReportError(
                f"attack method must be one of {', '.join(ATTACK_METHODS)}, got {method!r}"
            )
        facts = payload.get("target")
        run = {k: v for k, v in payload.items() if k != "target"}
        where = "payload['target']"
    else:
        raise DPForwardReportError(
            "a DP-Forward payload is {'facts': ...} (training) or an attack run with "
            "'method' and 'target'"
        )
    if not isinstance(facts, Mapping):
        raise DPForwardReportError(f"{where} must be a mapping of model facts")
    folder = facts.get("folder")
    if folder is None or str(folder) == "":
        raise DPForwardReportError(f"{where} needs the model 'folder'")
    _check_numbers(where, facts)
    if run is not None:
        _check_numbers("payload", run)
        examples = run.get("examples")
        if examples is not None and (
            not isinstance(examples, list) or len(mappings(examples)) != len(examples)
        ):
            raise DPForwardReportError("payload['examples'] must be a list of mappings")
    return json_ready(facts), None if run is None else json_ready(run)


def _truncate(text: Any) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 1] + "…"


def _trim_examples(run: dict[str, Any]) -> dict[str, Any]:
    if isinstance(run.get("examples"), list):
        run["examples"] = [
            {**ex, "truth": _truncate(ex.get("truth")), "recovered": _truncate(ex.get("recovered"))}
            for ex in run["examples"][:EXAMPLES]
        ]
    return run


def _identity(facts: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(facts.get(k) for k in IDENTITY)


def add_dpforward_run(out_dir: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Merge one DP-Forward `payload` (``{"facts": facts}`` from training, the facts alone, or
    one `privacylab attack embedding` run) into the report in `out_dir`; return its index.html.

    The model is found by its folder (the same text or the same resolved directory) among
    ``results["dpforward"]["models"]`` or appended; its facts are replaced by the payload's;
    an attack run replaces the model's run of the same method, and when the facts name a
    different model (`IDENTITY`) than before, the model's older runs are dropped. Examples are
    cut to `EXAMPLES` of `EXAMPLE_CHARS` characters. A figure is redrawn only when the values
    it shows (`PLOTTED`) changed or its file is gone; re-adding the same payload leaves the
    report as it was. A bad payload raises `DPForwardReportError` (one line) before anything
    is written.
    """
    if not isinstance(payload, Mapping):
        raise DPForwardReportError(
            f"a DP-Forward payload must be a mapping, got {type(payload).__name__}"
        )
    facts, run = _facts_of(payload)
    key = str(facts["folder"])
    base = Path(out_dir)
    base.mkdir(parents=True, exist_ok=True)
    with locked(base, "dpforward"):
        results = read_results(base / "results.json", DPForwardReportError)
        block = results.get("dpforward")
        block = dict(block) if isinstance(block, Mapping) else {}
        models = [dict(m) for m in mappings(block.get("models"))]
        model = next((m for m in models if same_folder(m.get("folder"), key)), None)
        if model is None:
            model = {"folder": key, "facts": facts, "runs": {}}
            models.append(model)
        old = model.get("facts")
        runs = model.get("runs")
        runs = dict(runs) if isinstance(runs, Mapping) else {}
        if not isinstance(old, Mapping) or _identity(old) != _identity(facts):
            runs = {}
        if run is not None:
            runs[str(run["method"])] = _trim_examples(run)
        model.update(facts=facts, runs={m: runs[m] for m in ATTACK_METHODS if m in runs})
        block["models"] = models
        before = block.get("images")
        drawn = before.get("drawn") if isinstance(before, Mapping) else None
        current = {
            str(name): str(digest)
            for name, digest in (drawn.items() if isinstance(drawn, Mapping) else [])
            if name in PLOTTED and (base / name).is_file()
        }
        names, files = dpforward_images(block, current)
        block["images"] = names
        results["dpforward"] = block
        results.setdefault("title", "privacylab report: DP-Forward")
        return write_report(base, results, files)
