"""The gradient-inversion section: what an honest-but-curious federated server recovered of a
client's training examples from the update it sent (Zhu et al. 2019, "Deep Leakage from
Gradients"; Zhao et al. 2020, iDLG; Geiping et al. 2020, "Inverting Gradients"), with and
without update defences.

Its page anchor is `#gradient-inversion`. Renders ``payload["reconstruction"]`` (what
`privacylab attack gradients` writes): one row per run (`runs`: `ReconstructionResult.to_dict()`
plus the setting's facts and its pixels) and the pictures (`images`: `pairs`, one per run;
`grid`, the grid over defences and strengths; `objective`, the attack objective over
iterations). The table gives each run's PSNR, SSIM and MSE in [0, 1] pixel space, the label
accuracy and the dummy-initialisation baseline PSNR (what an attacker who learned nothing gets),
so that "the defence stopped it" reads as "PSNR near the baseline". A run that carries the
accuracy of a federated model trained with the same defence (`federated_accuracy`) shows it
beside, as Zhu et al. 2019 (Fig. 8) put the two side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privacylab.report._format import (
    MISSING,
    e,
    figure,
    fmt,
    fmt_int,
    mappings,
    num_cell,
    number,
    section_block,
    sortable_table,
    text_cell,
)
from privacylab.report.reconstruction import labels_given, run_labels
from privacylab.report.sections import register_section

RUN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("label", "run", "what differs between the runs"),
    ("method", "method", "the gradient-inversion attack"),
    ("defense", "defence", "the update defence every client applied"),
    (
        "batch_size",
        "rows",
        "rows behind the attacked update (all clients' under secure aggregation)",
    ),
    ("local_steps", "local steps", "1: FedSGD (one gradient); more: FedAvg local epochs"),
    ("clients", "clients", "clients under secure aggregation (1: the update of one client)"),
    ("psnr", "PSNR (dB)", "mean peak signal-to-noise ratio of the matched reconstructions"),
    ("ssim", "SSIM", "mean structural similarity (Wang et al. 2004)"),
    ("mse", "MSE", "mean squared pixel error in [0, 1] pixel space"),
    (
        "label_accuracy",
        "label acc.",
        "share of the batch's labels recovered (as multisets); 'given': the attack was given them",
    ),
    ("baseline_psnr", "baseline PSNR", "PSNR of the attack's dummy initialisation"),
    ("federated_accuracy", "FL accuracy", "test accuracy of a federated model with this defence"),
    ("queries", "queries", "forward passes through the model (counted by the target)"),
    ("seconds", "seconds", "wall-clock time of the attack"),
)
"""(key, header, tooltip) of the table of every run."""

_TEXT = {"label", "method", "defense"}

SUCCESS_PSNR = 30.0
"""PSNR above which a reconstruction is called a success in the summary line (Zhu et al.
2019's recognisable reconstructions of MNIST digits lie well above it)."""

READING_GUIDE = (
    "Each run is one attack on one update a federated server observed. The reconstructions "
    "are paired with the client's true images by the assignment of least total MSE (a batch "
    "comes back in any order) and scored in [0, 1] pixel space. The baseline PSNR is that "
    "of the attack's random starting point: a run whose PSNR stays near it learned nothing "
    "from the update. Labels 'known' means the server was given the labels and the attack "
    "declares that it uses them."
)


def _cell(key: str, value: Any, row: Mapping[str, Any]) -> str:
    if key == "label_accuracy" and labels_given(row):
        return num_cell(value, "given")
    if key in _TEXT:
        return text_cell(value)
    if key in {"batch_size", "local_steps", "clients", "queries"}:
        return num_cell(value, fmt_int(value))
    if key in {"psnr", "baseline_psnr"}:
        return num_cell(value, fmt(value, 1))
    if key == "mse":
        x = number(value)
        return num_cell(value, MISSING if x is None else f"{x:.3g}")
    if key == "seconds":
        return num_cell(value, fmt(value, 2))
    return num_cell(value, fmt(value))


def _table(rows: list[Mapping[str, Any]], labels: list[str]) -> str:
    hidden = set()
    if not any(number(r.get("federated_accuracy")) is not None for r in rows):
        hidden.add("federated_accuracy")
    if all(label == str(r.get("defense")) for r, label in zip(rows, labels, strict=True)):
        hidden.add("label")
    columns = [c for c in RUN_COLUMNS if c[0] not in hidden]
    body = []
    for row, label in zip(rows, labels, strict=True):
        values = {**row, "label": label}
        body.append("<tr>" + "".join(_cell(c[0], values.get(c[0]), row) for c in columns) + "</tr>")
    return sortable_table("gradient-runs", columns, body, text=_TEXT)


def _facts(rows: list[Mapping[str, Any]]) -> str:
    first = rows[0]
    shape = first.get("input_shape")
    parts = [
        f"dataset: {first.get('dataset')}" if first.get("dataset") else None,
        f"model: {first.get('model')}" if first.get("model") else None,
        f"saved model: {first.get('target')}" if first.get("target") else None,
        f"input {'x'.join(str(s) for s in shape)}" if isinstance(shape, list) else None,
        f"{fmt_int(first.get('parameters'))} parameters" if first.get("parameters") else None,
        f"examples (training rows): {', '.join(str(i) for i in first.get('examples') or [])}"
        if len({str(r.get("examples")) for r in rows}) == 1 and first.get("examples")
        else None,
        f"seed {first.get('seed')}" if first.get("seed") is not None else None,
    ]
    return " · ".join(p for p in parts if p)


def _summary(rows: list[Mapping[str, Any]], labels: list[str]) -> str:
    """The baseline stated once, and which runs got above `SUCCESS_PSNR`."""
    baselines = [number(r.get("baseline_psnr")) for r in rows]
    baselines = [b for b in baselines if b is not None]
    said = []
    if baselines:
        low, high = min(baselines), max(baselines)
        span = f"{low:.1f} dB" if high - low < 0.05 else f"{low:.1f}–{high:.1f} dB"
        said.append(
            f"Dummy-initialisation baseline: PSNR {span} (what an attacker who learned nothing "
            "from the update gets)."
        )
    good = [
        lab
        for r, lab in zip(rows, labels, strict=True)
        if (number(r.get("psnr")) or 0) > SUCCESS_PSNR
    ]
    if good:
        said.append(
            f"Reconstructions above {SUCCESS_PSNR:g} dB: {', '.join(good)} "
            f"({len(good)} of {len(rows)} runs)."
        )
    else:
        said.append(f"No run got above {SUCCESS_PSNR:g} dB.")
    return f'<p class="note">{e(" ".join(said))}</p>'


def _privacy(rows: list[Mapping[str, Any]]) -> str:
    """One line per distinct DP-SGD defence: its ε with δ and the accountant, σ and clip."""
    lines = []
    seen = set()
    for row in rows:
        facts = row.get("defense_facts")
        if not isinstance(facts, Mapping) or number(facts.get("epsilon")) is None:
            continue
        spec = str(facts.get("spec") or row.get("defense"))
        if spec in seen:
            continue
        seen.add(spec)
        delta = number(facts.get("delta"))
        sigma = number(facts.get("sigma"))
        lines.append(
            f"{spec}: ε = {fmt(facts.get('epsilon'), 3)}"
            + (f" at δ = {delta:.1e}" if delta is not None else "")
            + f" ({facts.get('accountant') or MISSING} accountant)"
            + (f", noise multiplier σ = {sigma:.3g}" if sigma is not None else "")
            + f", clip {fmt(facts.get('clip'), 3)}, {fmt_int(facts.get('steps'))} local step(s)"
            + (f"; sampling: {facts.get('sampling')}" if facts.get("sampling") else "")
        )
    if not lines:
        return ""
    items = "".join(f"<li>{e(line)}</li>" for line in lines)
    return f'<p class="small">DP-SGD inside the clients:</p><ul class="small">{items}</ul>'


@register_section
class GradientInversionSection:
    """Gradient inversion: pictures of truth beside reconstruction, the grid over defences,
    the objective curves and the table of every run."""

    key = "gradient-inversion"
    title = "Gradient inversion (federated updates)"
    order = 35
    css = """
figure.gradient-wide img { max-width: 100%; }
"""

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload has a reconstruction block with at least one run."""
        return bool(mappings(section_block(payload, "reconstruction").get("runs")))

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """Facts, guide, baseline, the grid, every run's pairs, the objective, the table."""
        block = section_block(payload, "reconstruction")
        rows = list(mappings(block.get("runs")))
        labels = run_labels(rows)
        images = block.get("images")
        images = images if isinstance(images, Mapping) else {}
        pairs = images.get("pairs")
        pairs = pairs if isinstance(pairs, list) else []
        parts = [
            f'<section id="{self.key}">',
            f"<h2>{e(self.title)}</h2>",
            f'<p class="meta">{e(_facts(rows))}</p>' if rows else "",
            f'<p class="small">{e(READING_GUIDE)}</p>',
            _summary(rows, labels),
            _privacy(rows),
        ]
        grid = figure(
            folder,
            images.get("grid"),
            "Grid of reconstructions: one row per run, one column per example",
            "Ground truth and each run's reconstructions, PSNR under each: " + "; ".join(labels),
            "gradient-wide",
        )
        if grid:
            parts += ["<h3>Defences and strengths</h3>", grid]
        shown = [(p, lab, r) for p, lab, r in zip(pairs, labels, rows, strict=False) if p]
        if shown:
            pictures = []
            for name, label, row in shown:
                pictures.append(
                    figure(
                        folder,
                        name,
                        f"True images and reconstructions of run {label}",
                        f"{label}: {row.get('method')} on a batch of "
                        f"{fmt_int(row.get('batch_size'))}, PSNR {fmt(row.get('psnr'), 1)} "
                        "dB (baseline "
                        f"{fmt(row.get('baseline_psnr'), 1)} dB)",
                        "gradient-wide",
                    )
                )
            heading = "Ground truth beside each reconstruction (PSNR and SSIM per image)"
            if grid:  # the grid already shows every run: the pairs fold away
                parts.append(f"<details><summary>{e(heading)}</summary>")
                parts += [*pictures, "</details>"]
            else:
                parts += [f"<h3>{e(heading)}</h3>", *pictures]
        objective = figure(
            folder,
            images.get("objective"),
            "Attack objective over iterations, one curve per run",
            "The attack's objective (its gradient distance) over iterations",
        )
        if objective:
            parts += ["<h3>Objective over iterations</h3>", objective]
        parts += [f"<h3>Every run ({len(rows)})</h3>", _table(rows, labels), "</section>"]
        return "\n".join(p for p in parts if p)
