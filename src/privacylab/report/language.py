"""The language-model part of a report folder: merging one attack run into `results.json`,
the figures of the "Language models: memorisation" section, and the redaction of extracted
personal data before it is shown.

`add_language_run(folder, kind, run)` is what `privacylab attack lm-extraction`, `exposure` and
`lm-membership` call: the run joins ``payload["language"][kind]`` (replacing an earlier run on
the same target folder), the figures that the run changes are redrawn from the merged payload,
and `privacylab.report.html.write_report` writes `results.json`, the PNGs and `index.html`.
Every other key of an existing `results.json` is kept.

Figures (matplotlib `Figure` objects through the Agg canvas, never pyplot):

- the share of planted records extracted against their copies count, one line per extraction
  run (Carlini et al. 2021, Sec. 7: memorisation grows with duplication);
- exposure against insertion count, one line per run (Carlini et al. 2019, "The Secret Sharer",
  Sec. 5, Fig. 3/4): the largest possible exposure log2|R| dashed, the expected exposure of a
  random canary, E[-log2(rank/|R|)] -> 1/ln 2 for uniform ranks, dotted;
- per membership run, the ROC curves of its attacks on log-log axes (Carlini et al. 2022,
  "Membership Inference Attacks From First Principles", Sec. 4), the diagonal dashed.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter

from privacylab.errors import PrivacylabError
from privacylab.report._format import mappings, number, safe_name, target_epsilon
from privacylab.report._merge import locked, read_results, same_folder
from privacylab.report.html import write_report
from privacylab.report.jsonable import json_ready
from privacylab.report.plots import FONT_PT, LEGEND_FONT_PT, _to_png, line_style

__all__ = [
    "EXPOSURE_IMAGE",
    "EXTRACTION_IMAGE",
    "KINDS",
    "RANDOM_EXPOSURE",
    "LanguageReportError",
    "add_language_run",
    "epsilon_label",
    "exposure_figure",
    "exposure_plot",
    "language_images",
    "language_roc_figure",
    "language_roc_plot",
    "records_figure",
    "records_plot",
    "redact",
    "roc_image_name",
    "run_label",
    "run_labels",
]

KINDS = ("extraction", "exposure", "membership")
"""The kinds of language-model runs, each a list under ``payload["language"]``."""

EXPOSURE_IMAGE = "language-exposure.png"
EXTRACTION_IMAGE = "language-records.png"

RANDOM_EXPOSURE = 1.0 / math.log(2.0)
"""Expected exposure of a canary the model never saw: with rank uniform on 1..|R|,
E[log2|R| - log2 rank] -> 1/ln 2 ≈ 1.44 bits as |R| grows (Carlini et al. 2019, Sec. 4)."""


class LanguageReportError(PrivacylabError, ValueError):
    """A language-model run that cannot be merged into a report (one line)."""


def roc_image_name(index: int) -> str:
    """File name of the ROC figure of the `index`-th membership run."""
    return f"language-roc-{index}.png"


_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_NUMBER = re.compile(r"\+?\(?\d(?:[\d()]|[ .\-/](?=[\d(]))*\d\)?|\d")
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")


def _mask_word(word: str) -> str:
    return word[:1] + "*" * (len(word) - 1)


def _mask_number(text: str) -> str:
    digits = [i for i, ch in enumerate(text) if ch.isdigit()]
    n = len(digits)
    keep = set(digits[n - min(2, n // 2) :]) if n // 2 else set()
    if n >= 6:
        keep.add(digits[0])
    return "".join("*" if ch.isdigit() and i not in keep else ch for i, ch in enumerate(text))


def _mask_email(address: str) -> str:
    local, _, domain = address.partition("@")
    labels = domain.split(".")
    tld = labels[-1] if labels[-1].isascii() and labels[-1].isalpha() else _mask_plain(labels[-1])
    masked = [_mask_plain(label) for label in labels[:-1]] + [tld]
    return _mask_plain(local) + "@" + ".".join(masked)


def _mask_plain(text: str) -> str:
    out = _NUMBER.sub(lambda m: _mask_number(m.group(0)), text)
    return _WORD.sub(lambda m: _mask_word(m.group(0)), out)


def redact(text: str) -> str:
    """`text` with personal data masked, for showing extracted PII on a report page.

    Each word keeps its first character ("John" -> "J***"); each number (a run of digits,
    possibly grouped by spaces, dots, dashes, slashes or parentheses, like a phone number)
    keeps its last two digits, and its first digit too when it has at least six, but never
    more than half its digits ("(555) 123-1234" -> "(5**) ***-**34", "1987" -> "**87",
    "42" -> "*2"); an e-mail address keeps its top-level domain when that is plain letters
    ("john@example.org" -> "j***@e******.org"). Every other character is kept and the length
    is unchanged, so the shape of what was extracted stays visible while the secret does not.
    """
    pieces = []
    last = 0
    for match in _EMAIL.finditer(text):
        pieces.append(_mask_plain(text[last : match.start()]))
        pieces.append(_mask_email(match.group(0)))
        last = match.end()
    pieces.append(_mask_plain(text[last:]))
    return "".join(pieces)


def epsilon_label(epsilon: float) -> str:
    """ε to two significant digits, no exponent ("8" for 7.9934, "0.5", "16", "100")."""
    return f"{float(f'{epsilon:.2g}'):g}"


def run_label(target: Any) -> str:
    """A run's short label from its target facts: "tiny, non-private" or "small, DP ε=8"."""
    facts = target if isinstance(target, Mapping) else {}
    size = str(facts.get("size") or facts.get("folder") or "model")
    epsilon = target_epsilon(facts)
    if epsilon is not None:
        return f"{size}, DP ε={epsilon_label(epsilon)}"
    return f"{size}, DP" if facts.get("private") else f"{size}, non-private"


def run_labels(targets: Sequence[Any]) -> list[str]:
    """`run_label` of each target, with the model folder's name added where two labels would
    otherwise be the same."""
    plain = [run_label(t) for t in targets]
    labels = []
    for target, label in zip(targets, plain, strict=True):
        folder = target.get("folder") if isinstance(target, Mapping) else None
        if plain.count(label) > 1 and folder:
            label = f"{label} ({Path(str(folder)).name or folder})"
        labels.append(label)
    return labels


def _exposure_points(run: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    rows = [
        (number(c.get("repeats")), number(c.get("exposure")))
        for c in mappings(run.get("canaries"))
        if not c.get("user")
    ]
    rows = [(r, x) for r, x in rows if r is not None and x is not None and math.isfinite(x)]
    if not rows:
        return np.zeros(0), np.zeros(0)
    data = np.asarray(rows, dtype=float)
    return data[:, 0], data[:, 1]


def exposure_plot(runs: Sequence[Mapping[str, Any]]) -> Figure:
    """Exposure of the planted canaries against how often each was inserted: per run its
    canaries as points and their mean per insertion count as a line (labelled by
    `run_label`), the largest exposure log2|R| of each candidate space dashed and the random
    level 1/ln 2 dotted (Carlini et al. 2019, Sec. 5). The x axis is symmetric-log so that
    controls (0 insertions) and heavy repetition fit on one axis."""
    fig = Figure(figsize=(7.6, 4.8), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    largest = 1.0
    counts: set[float] = set()
    labels = run_labels([run.get("target") for run in runs])
    for i, run in enumerate(runs):
        repeats, exposure = _exposure_points(run)
        if len(repeats) == 0:
            continue
        color, style = line_style(i)
        xs = np.unique(repeats)
        means = np.asarray([exposure[repeats == x].mean() for x in xs])
        counts.update(float(x) for x in repeats)
        ax.scatter(repeats, exposure, s=14, color=color, alpha=0.45, linewidths=0)
        ax.plot(xs, means, color=color, linestyle=style, marker="o", markersize=4, linewidth=1.8,
                label=labels[i])  # fmt: skip
        largest = max(largest, float(xs.max()))
    spaces = sorted(
        {
            round(float(b), 6)
            for run in runs
            for c in mappings(run.get("canaries"))
            if (b := number(c.get("space_bits"))) is not None and math.isfinite(b) and b > 0
        }
    )
    for j, bits in enumerate(spaces):
        ax.axhline(bits, color="#555555", linestyle="--", linewidth=1,
                   label=f"max exposure log2|R| = {bits:.3g}" if j < 3 else None)  # fmt: skip
    ax.axhline(RANDOM_EXPOSURE, color="#7f7f7f", linestyle=":", linewidth=1.2,
               label=f"random canary, 1/ln 2 ≈ {RANDOM_EXPOSURE:.2f}")  # fmt: skip
    ax.set_xscale("symlog", linthresh=1.0)
    if 0 < len(counts) <= 12:
        ax.set_xticks(sorted(counts))
    ax.set_xlim(-0.3, largest * 1.3 + 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("insertion count (member documents holding the canary)", fontsize=FONT_PT)
    ax.set_ylabel("exposure (bits)", fontsize=FONT_PT)
    ax.set_title("Exposure vs insertion count", fontsize=FONT_PT + 1)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(
        fontsize=LEGEND_FONT_PT,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2,
        frameon=False,
    )
    return fig


def exposure_figure(runs: Sequence[Mapping[str, Any]]) -> bytes:
    """`exposure_plot` as PNG bytes."""
    return _to_png(exposure_plot(runs))


def _record_points(run: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    records = run.get("records")
    rows = []
    for copies, counts in records.items() if isinstance(records, Mapping) else []:
        if not isinstance(counts, Mapping):
            continue
        k, total, found = (number(copies), number(counts.get("records")),
                           number(counts.get("extracted")))  # fmt: skip
        if k is not None and total and found is not None:
            rows.append((k, found / total))
    if not rows:
        return np.zeros(0), np.zeros(0)
    data = np.asarray(sorted(rows), dtype=float)
    return data[:, 0], data[:, 1]


def records_plot(runs: Sequence[Mapping[str, Any]]) -> Figure:
    """Share of the planted records extracted against how many training documents held each
    (the k of k-eidetic memorisation, Carlini et al. 2021, Def. 2 and Sec. 7), one line per
    extraction run (`run_labels`); the x axis is log2, as the copies counts double."""
    fig = Figure(figsize=(7.6, 4.4), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    labels = run_labels([run.get("target") for run in runs])
    counts: set[float] = set()
    for i, run in enumerate(runs):
        copies, share = _record_points(run)
        if len(copies) == 0:
            continue
        color, style = line_style(i)
        ax.plot(copies, share, color=color, linestyle=style, marker="o", markersize=4,
                linewidth=1.8, label=labels[i])  # fmt: skip
        counts.update(float(c) for c in copies)
    ax.set_xscale("log", base=2)
    if counts:
        ax.set_xticks(sorted(counts))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("copies of the record in the training documents (k)", fontsize=FONT_PT)
    ax.set_ylabel("share of records extracted", fontsize=FONT_PT)
    ax.set_title("Extraction vs duplication", fontsize=FONT_PT + 1)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=LEGEND_FONT_PT, loc="upper left", frameon=False)
    return fig


def records_figure(runs: Sequence[Mapping[str, Any]]) -> bytes:
    """`records_plot` as PNG bytes."""
    return _to_png(records_plot(runs))


def _roc_points(attack: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    roc = attack.get("roc")
    if not isinstance(roc, Mapping):
        return None
    fpr = [number(x) for x in roc.get("fpr") or []]
    tpr = [number(x) for x in roc.get("tpr") or []]
    if len(fpr) < 2 or len(fpr) != len(tpr) or any(x is None for x in fpr + tpr):
        return None
    return np.asarray(fpr, dtype=float), np.asarray(tpr, dtype=float)


def language_roc_plot(run: Mapping[str, Any]) -> Figure:
    """One membership run: each attack's ROC curve (the run's `roc` points) on log-log axes
    from min(1e-3, 1/held-out) to 1, strongest by AUC first, the diagonal TPR = FPR dashed
    (Carlini et al. 2022, Sec. 4; for language models Duan et al. 2024, "Do Membership
    Inference Attacks Work on Large Language Models?")."""
    attacks = [(a, p) for a in mappings(run.get("attacks")) if (p := _roc_points(a)) is not None]
    attacks.sort(key=lambda ap: -(number(ap[0].get("auc")) or 0.0))
    documents = run.get("documents")
    heldout = number(documents.get("heldout")) if isinstance(documents, Mapping) else None
    low = min(1e-3, 1.0 / heldout) if heldout and heldout > 0 else 1e-3
    fig = Figure(figsize=(6.4, 5.0), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([low, 1.0], [low, 1.0], linestyle="--", color="0.55", linewidth=1, label="chance")
    for i, (attack, (fpr, tpr)) in enumerate(attacks):
        color, style = line_style(i)
        ax.plot(
            np.clip(fpr, low, 1.0),
            np.clip(tpr, low, 1.0),
            color=color,
            linestyle=style,
            linewidth=2.2 if i == 0 else 1.4,
            drawstyle="steps-post",
            label=f"{attack.get('name') or attack.get('attack')}: AUC "
            f"{number(attack.get('auc')) or 0.0:.3f}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, 1.0)
    ax.set_ylim(low, 1.0)
    ax.set_xlabel("false positive rate (held-out documents accused)", fontsize=FONT_PT)
    ax.set_ylabel("true positive rate (training documents found)", fontsize=FONT_PT)
    ax.set_title(f"Membership ROC: {run_label(run.get('target'))}", fontsize=FONT_PT + 1)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=LEGEND_FONT_PT, loc="lower right", frameon=False)
    return fig


def language_roc_figure(run: Mapping[str, Any]) -> bytes:
    """`language_roc_plot` as PNG bytes."""
    return _to_png(language_roc_plot(run))


def language_images(
    block: Mapping[str, Any], current: Collection[str] = ()
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The figures of a ``payload["language"]`` block: (names to store under its "images":
    {"extraction": name|None, "exposure": name|None, "membership": [name|None, ...]},
    {file name: PNG bytes}).
    Figures named in `current` are already up to date on disk and are not drawn again."""
    files: dict[str, bytes] = {}
    names: dict[str, Any] = {"extraction": None, "exposure": None, "membership": []}
    extraction = mappings(block.get("extraction"))
    if any(len(_record_points(run)[0]) for run in extraction):
        names["extraction"] = EXTRACTION_IMAGE
        if EXTRACTION_IMAGE not in current:
            files[EXTRACTION_IMAGE] = records_figure(extraction)
    exposure = mappings(block.get("exposure"))
    if any(len(_exposure_points(run)[0]) for run in exposure):
        names["exposure"] = EXPOSURE_IMAGE
        if EXPOSURE_IMAGE not in current:
            files[EXPOSURE_IMAGE] = exposure_figure(exposure)
    for i, run in enumerate(mappings(block.get("membership"))):
        name = roc_image_name(i)
        if any(_roc_points(a) is not None for a in mappings(run.get("attacks"))):
            names["membership"].append(name)
            if name not in current:
                files[name] = language_roc_figure(run)
        else:
            names["membership"].append(None)
    return names, files


def _current_images(base: Path, block: Mapping[str, Any], changed: str) -> set[str]:
    """Figure files on disk that the merge leaves as they are: named in the block's images
    before it, present, and not the figure of the kind and run that changed."""
    images = block.get("images")
    images = images if isinstance(images, Mapping) else {}
    named = [images.get("extraction"), images.get("exposure")]
    if isinstance(images.get("membership"), list):
        named += images["membership"]
    return {
        n
        for n in named
        if isinstance(n, str) and safe_name(n) and n != changed and (base / n).is_file()
    }


def _run_folder(run: Any) -> str:
    if not isinstance(run, Mapping):
        raise LanguageReportError(f"a language run must be a mapping, got {type(run).__name__}")
    target = run.get("target")
    folder = target.get("folder") if isinstance(target, Mapping) else None
    if folder is None or str(folder) == "":
        raise LanguageReportError("a language run needs run['target']['folder'] (target_facts)")
    return str(folder)


def add_language_run(folder: str | os.PathLike[str], kind: str, run: Mapping[str, Any]) -> Path:
    """Merge one language-model attack `run` of `kind` ("extraction", "exposure" or
    "membership") into the report in `folder` and rewrite it; return the page (index.html).

    Reads `folder/results.json` when present and keeps every other key of it; the run
    replaces the run of ``payload["language"][kind]`` on the same ``run["target"]["folder"]``
    (the same text or the same resolved directory), or is appended. The figures the run
    changes are redrawn (the others stay as they are on disk), their names stored under
    ``payload["language"]["images"]``, and `write_report` writes the folder. The run is made
    plain JSON first (`json_ready`), so what is on the page is what `results.json` holds.
    Concurrent calls on one folder are serialised by a lock file (`.language.lock`).
    """
    if kind not in KINDS:
        raise LanguageReportError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    key = _run_folder(run)
    clean = json_ready(run)
    base = Path(folder)
    base.mkdir(parents=True, exist_ok=True)
    with locked(base, "language"):
        payload = read_results(base / "results.json", LanguageReportError)
        block = payload.get("language")
        block = dict(block) if isinstance(block, Mapping) else {}
        runs = list(mappings(block.get(kind)))
        for index, old in enumerate(runs):
            target = old.get("target")
            if isinstance(target, Mapping) and same_folder(target.get("folder"), key):
                runs[index] = clean
                break
        else:
            index = len(runs)
            runs.append(clean)
        block[kind] = runs
        for other in KINDS:
            block[other] = list(mappings(block.get(other)))
        changed = {
            "extraction": EXTRACTION_IMAGE,
            "exposure": EXPOSURE_IMAGE,
            "membership": roc_image_name(index),
        }[kind]
        current = _current_images(base, block, changed)
        names, files = language_images(block, current)
        block["images"] = names
        payload["language"] = block
        payload.setdefault("title", "privacylab report: language models")
        return write_report(base, payload, files)
