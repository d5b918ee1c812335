"""The memorization part of a report folder (issue 18): merging one run of `privacylab attack
memorization` or a benchmark's table into `results.json`, drawing original and decoded images
side by side, and the section's verdict line.

Song, Ristenpart & Shmatikov, "Machine Learning Models that Remember Too Much" (CCS 2017)
show each encoding by the training images beside what was decoded from the released model
(their Figs. 2-4); `pairs_plot` draws that: the originals on the top row, the decodings under
them, and — for LSB — what the same decoder reads from the re-quantised model.

`add_memorization_run(folder, payload)` takes one of

- ``{"attack": entry}``: a `MemorizationResult.to_dict()` plus "folder" (the run's out folder,
  its key: a re-run replaces the entry), optional "label", "epsilon", "delta", "checks",
  "requantized", and "images" of arrays in [0, 1] ((H, W) or (C, H, W) nested lists):
  "original", "decoded" and optionally "requantized", lists of the same length (the first
  `MAX_IMAGES` are drawn);
- ``{"tables": {name: [row, ...]}}``: a benchmark's table (e.g. H6's Song et al. table beside
  ours), replaced by name and shown as it comes.

The arrays are drawn into one PNG per run in the folder and replaced by its name in
`results.json`; every other key of `results.json` is kept, files are written atomically and
concurrent calls on one folder are serialised by a lock file. A bad payload raises
`MemorizationReportError` (one line) before anything is written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from privacylab.errors import PrivacylabError
from privacylab.report._format import check_image, fmt, mappings, number, percent
from privacylab.report._merge import check_tables, locked, read_results, same_folder
from privacylab.report.backdoor import slug
from privacylab.report.html import write_report
from privacylab.report.jsonable import json_ready
from privacylab.report.model_inversion import to_display
from privacylab.report.plots import FONT_PT, _to_png

__all__ = [
    "BLOCK",
    "IMAGE_ROWS",
    "MAX_IMAGES",
    "MemorizationReportError",
    "add_memorization_run",
    "checks_flagged",
    "pairs_plot",
    "run_label",
    "verdict",
]

BLOCK = "memorization"
"""The key of `results.json` this module merges into."""

MAX_IMAGES = 8
"""Items drawn per run (the first ones)."""

MAX_SIDE = 512

IMAGE_ROWS = (
    ("original", "original"),
    ("decoded", "decoded"),
    ("requantized", "re-quantised"),
)
"""(images key, row label) of the picture, top to bottom."""

CELL_IN = 1.0

_UNIT = ("clean_accuracy", "honest_accuracy", "bit_accuracy", "exact_match")


class MemorizationReportError(PrivacylabError, ValueError):
    """A memorization payload that cannot be merged into a report (one line)."""


def run_label(entry: Mapping[str, Any]) -> str:
    """An entry's display label: its "label", else "METHOD, N items" with "DP-SGD ε=E" when
    private."""
    if entry.get("label"):
        return str(entry["label"])
    parts = [str(entry.get("method") or "attack")]
    items = number(entry.get("items"))
    if items is not None:
        parts.append(f"{int(items)} items")
    epsilon = number(entry.get("epsilon"))
    parts.append("non-private" if epsilon is None else f"DP-SGD ε={epsilon:.3g}")
    return ", ".join(parts)


def checks_flagged(entry: Mapping[str, Any], honest: bool = False) -> list[str]:
    """Names of the weight checks that flagged the released model (`honest`: the honest one)."""
    checks = entry.get("checks")
    if not isinstance(checks, Mapping):
        return []
    key = "honest_flagged" if honest else "flagged"
    return [str(n) for n, c in checks.items() if isinstance(c, Mapping) and c.get(key)]


def _share(entry: Mapping[str, Any]) -> float:
    items = number(entry.get("items")) or 0.0
    return (number(entry.get("recovered")) or 0.0) / items if items else 0.0


def verdict(block: Mapping[str, Any]) -> str:
    """The section's one-line verdict, of the run that recovered the largest share of its
    items: "Memorized: N of M training items recovered from the released model by METHOD (bit
    accuracy b%, PSNR p dB, q label queries); clean accuracy x points below the honest model's
    (a% vs h%); flagged by CHECKS" ("Not memorized" when no item was recovered; "no weight
    check flagged it" when none did)."""
    runs = [r for r in mappings(block.get("runs")) if number(r.get("items"))]
    if not runs:
        return "No memorization run yet."
    top = max(runs, key=_share)
    recovered = int(number(top.get("recovered")) or 0)
    head = "Memorized" if recovered else "Not memorized"
    facts = [f"bit accuracy {percent(top.get('bit_accuracy'))}"]
    if number(top.get("psnr")) is not None:
        facts.append(f"PSNR {fmt(top.get('psnr'), 1)} dB")
    queries = number(top.get("queries"))
    if queries:
        facts.append(f"{int(queries)} label queries")
    line = (
        f"{head}: {recovered} of {int(number(top.get('items')) or 0)} training items recovered "
        f"from the released model by {run_label(top)} ({', '.join(facts)})"
    )
    clean, honest = number(top.get("clean_accuracy")), number(top.get("honest_accuracy"))
    if clean is not None and honest is not None:
        gap = abs(clean - honest) * 100
        side = "below" if clean < honest else "above"
        where = "the same as" if gap < 0.05 else f"{gap:.1f} points {side}"
        line += (
            f"; clean accuracy {where} the honest model's ({percent(clean)} vs {percent(honest)})"
        )
    if isinstance(top.get("checks"), Mapping) and top["checks"]:
        flagged = checks_flagged(top)
        line += "; flagged by " + ", ".join(flagged) if flagged else "; no weight check flagged it"
    return line + "."


def _image_rows(raw: Mapping[str, Any]) -> dict[str, list[np.ndarray]]:
    rows: dict[str, list[np.ndarray]] = {}
    counts: dict[str, int] = {}
    for key, _ in IMAGE_ROWS:
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, (list, tuple)):
            raise MemorizationReportError(
                f"payload['attack']['images'][{key!r}] must be a list of images"
            )
        counts[key] = len(value)
        rows[key] = [
            check_image(
                x, f"payload['attack']['images'][{key!r}][{i}]", MemorizationReportError, MAX_SIDE
            )
            for i, x in enumerate(value[:MAX_IMAGES])
        ]
    if rows and ("original" not in rows or "decoded" not in rows):
        raise MemorizationReportError(
            "payload['attack']['images'] needs both 'original' and 'decoded'"
        )
    if len(set(counts.values())) > 1:
        raise MemorizationReportError(
            "payload['attack']['images'] rows must hold as many images each"
        )
    return rows


def _mse(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.shape != b.shape:
        return None
    return float(np.mean((a - b) ** 2))


def pairs_plot(rows: Mapping[str, Sequence[np.ndarray]], title: str = "") -> Figure:
    """The secret's training images (top row) above their decodings from the released model
    (and, when given, from the re-quantised model), nearest neighbour, pixels in [0, 1]
    (never rescaled per image); each decoding's PSNR under it (Song et al. 2017, Figs. 2-4)."""
    shown = [(key, label) for key, label in IMAGE_ROWS if rows.get(key)]
    n = max(1, min(MAX_IMAGES, max(len(rows[k]) for k, _ in shown) if shown else 1))
    fig = Figure(
        figsize=(max(2.6, CELL_IN * n + 0.9), CELL_IN * max(1, len(shown)) + 0.9),
        layout="constrained",
    )
    axes = np.asarray(fig.subplots(max(1, len(shown)), n, squeeze=False))
    originals = rows.get("original") or []
    for r, (key, label) in enumerate(shown):
        for i in range(n):
            ax = axes[r, i]
            ax.set_xticks([])
            ax.set_yticks([])
            if i >= len(rows[key]):
                ax.set_axis_off()
                continue
            picture = to_display(np.clip(rows[key][i], 0.0, 1.0))
            ax.imshow(picture, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            if key != "original" and i < len(originals):
                error = _mse(rows[key][i], originals[i])
                if error is not None:
                    psnr = math.inf if error == 0 else 10 * math.log10(1.0 / error)
                    text = "exact" if math.isinf(psnr) else f"{psnr:.1f} dB"
                    ax.set_xlabel(text, fontsize=FONT_PT - 2)
        axes[r, 0].set_ylabel(label, fontsize=FONT_PT - 1)
    if title:
        fig.suptitle(title, fontsize=FONT_PT)
    return fig


def _check_entry(entry: Any) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise MemorizationReportError("payload['attack'] must be a mapping")
    folder = entry.get("folder")
    if folder is None or str(folder) == "":
        raise MemorizationReportError("payload['attack'] needs the run's 'folder'")
    method = entry.get("method")
    if not isinstance(method, str) or not method:
        raise MemorizationReportError("payload['attack'] needs a 'method' name")
    for key in _UNIT:
        value = entry.get(key)
        if value is not None and ((x := number(value)) is None or not 0.0 <= x <= 1.0):
            raise MemorizationReportError(
                f"payload['attack'][{key!r}] must be in [0, 1], got {value!r}"
            )
    images = entry.get("images")
    if images is not None and not isinstance(images, Mapping):
        raise MemorizationReportError("payload['attack']['images'] must be a mapping")
    return dict(entry)


def _attack_files(entry: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    raw = entry.get("images")
    raw = raw if isinstance(raw, Mapping) else {}
    files: dict[str, bytes] = {}
    names: dict[str, Any] = {}
    given = raw.get("pairs")
    if isinstance(given, str):
        names["pairs"] = given
        names["count"] = raw.get("count")
    rows = _image_rows(raw)
    if rows:
        name = f"memorization-{slug(entry['folder'])}-pairs.png"
        files[name] = _to_png(pairs_plot(rows))
        names["pairs"] = name
        names["count"] = len(rows["original"])
        names["rows"] = [k for k, _ in IMAGE_ROWS if k in rows]
    out = dict(entry)
    out["images"] = names
    return out, files


def add_memorization_run(out_dir: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Merge one memorization `payload` (``{"attack": entry}`` or ``{"tables": {name:
    rows}}``, see the module docstring) into the report in `out_dir`; return its index.html.
    Runs are keyed by their folder (a re-run replaces the entry in place), tables by name;
    every other key of results.json is kept. Folder locked, files written atomically; a bad
    payload raises `MemorizationReportError` before anything is written."""
    if not isinstance(payload, Mapping):
        raise MemorizationReportError(
            f"a memorization payload must be a mapping, got {type(payload).__name__}"
        )
    kinds = [k for k in ("attack", "tables") if k in payload]
    if len(kinds) != 1 or len(payload) != 1:
        raise MemorizationReportError(
            "a memorization payload is exactly one of {'attack': ...} or {'tables': ...}"
        )
    files: dict[str, bytes] = {}
    tables: dict[str, list[dict[str, Any]]] = {}
    entry: dict[str, Any] = {}
    if kinds[0] == "tables":
        tables = check_tables(payload["tables"], MemorizationReportError)
    else:
        entry = _check_entry(payload["attack"])
        entry, files = _attack_files(entry)
        entry = json_ready(entry)
        entry["folder"] = str(entry["folder"])
    base = Path(out_dir)
    base.mkdir(parents=True, exist_ok=True)
    with locked(base, BLOCK):
        results = read_results(base / "results.json", MemorizationReportError)
        block = results.get(BLOCK)
        block = dict(block) if isinstance(block, Mapping) else {}
        if tables:
            stored = block.get("tables")
            merged = dict(stored) if isinstance(stored, Mapping) else {}
            merged.update(tables)
            block["tables"] = merged
        else:
            runs = [dict(m) for m in mappings(block.get("runs"))]
            at = next(
                (i for i, m in enumerate(runs) if same_folder(m.get("folder"), entry["folder"])),
                None,
            )
            if at is None:
                runs.append(entry)
            else:
                runs[at] = entry
            block["runs"] = runs
        results[BLOCK] = block
        results.setdefault("title", "privacylab report: memorization")
        return write_report(base, results, files)
