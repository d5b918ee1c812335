"""The model-inversion section: what MI-Face (Fredrikson, Jha & Ristenpart 2015, Alg. 1)
recovers of each class from the model, shown as pictures beside the class means, and how
often an independent classifier recognises the inversions.

Its page anchor is `#model-inversion`. Renders ``payload["model_inversion"]`` (what
`privacylab attack inversion` writes): `method`, `access`, `evaluator_accuracy`, `queries`,
the `target` and `evaluator` facts, one row per class (`classes`: label, confidence,
predicted, correct, distance_to_mean, psnr_to_mean, ssim_to_mean, iterations, stopped,
queries, seconds) and the images (`images.grid` and one per class).
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
    percent,
    section_block,
    sortable_table,
    text_cell,
)
from privacylab.report.sections import register_section

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("label", "class", "the class inverted"),
    ("image", "inversion", "the MI-Face inversion"),
    ("confidence", "target conf.", "the target's confidence in the class at the inversion"),
    ("predicted", "evaluator says", "the independent evaluator's label for the inversion"),
    ("distance_to_mean", "MSE to mean", "mean squared error to the class mean, [0, 1] pixels"),
    ("ssim_to_mean", "SSIM to mean", "structural similarity to the class mean"),
    ("iterations", "iterations", "iterations of Alg. 1 run (cost evaluations)"),
    ("stopped", "stopped by", "alpha: iteration cap; beta: no improvement; gamma: cost reached"),
    ("queries", "queries", "queries sent to the target for this class"),
    ("seconds", "seconds", "wall-clock time for this class"),
)
"""(key, header, tooltip) of the per-class table."""

READING_GUIDE = (
    "MI-Face starts from a blank image and follows the gradient of the target's confidence in "
    "one class (from scores access the gradient is estimated from queries), denoising after "
    "each step. What comes out is what the model has learnt the class looks like, not any one "
    "training example. Each inversion is shown above the mean of the class over data the "
    "target never trained on; an independent classifier trained on that data labels the "
    "inversions (the paper asked people to recognise them)."
)


def _cell(folder: Path, images: Mapping[str, Any], key: str, row: Mapping[str, Any]) -> str:
    value = row.get(key)
    if key == "image":
        name = images.get(str(row.get("label")))
        if isinstance(name, str) and (folder / name).is_file():
            alt = f"inversion of class {row.get('label')}"
            return f'<td><img class="inversion" src="{e(name)}" alt="{e(alt)}"></td>'
        return f"<td>{MISSING}</td>"
    if key == "predicted":
        mark = "" if value is None else (" ✓" if row.get("correct") else " ✗")
        return num_cell(value, (MISSING if value is None else str(value)) + mark)
    if key == "stopped":
        return text_cell(value)
    if key in ("label", "iterations", "queries"):
        return num_cell(value, fmt_int(value))
    if key == "seconds":
        return num_cell(value, fmt(value, 2))
    return num_cell(value)


@register_section
class ModelInversionSection:
    """Model inversion: the picture grid, the evaluator's accuracy, the per-class table."""

    key = "model-inversion"
    title = "Model inversion"
    order = 40
    css = """
img.inversion { width: 56px; image-rendering: pixelated; }
table.model-inversion td.text { text-align: left; }
"""

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload has a model-inversion block with at least one class."""
        return bool(mappings(section_block(payload, "model_inversion").get("classes")))

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """Facts, the grid figure, the headline accuracy and the per-class table."""
        block = section_block(payload, "model_inversion")
        rows = mappings(block.get("classes"))
        images = block.get("images")
        images = images if isinstance(images, Mapping) else {}
        target = block.get("target") if isinstance(block.get("target"), Mapping) else {}
        evaluator = block.get("evaluator") if isinstance(block.get("evaluator"), Mapping) else {}
        facts = " · ".join(
            p
            for p in (
                f"target: {target.get('name')}" if target.get("name") else "",
                f"dataset: {target.get('dataset')}" if target.get("dataset") else "",
                f"model: {target.get('model')}" if target.get("model") else "",
                f"method: {block.get('method')} ({block.get('access')} access)",
                f"queries: {fmt_int(block.get('queries'))}",
            )
            if p
        )
        headline = (
            f"The evaluator ({e(evaluator.get('architecture', '?'))}, trained on "
            f"{e(fmt_int(evaluator.get('rows')))} rows the target never saw; "
            f"{e(percent(evaluator.get('accuracy_on_target_train_rows')))} on the target's "
            f"training rows) labels <strong>{e(percent(block.get('evaluator_accuracy')))}"
            f"</strong> of the {len(rows)} inversions as their class."
        )
        picture = figure(
            folder,
            images.get("grid"),
            "MI-Face inversion of each class above the class mean",
            "Top: MI-Face inversion per class (target confidence, evaluator's label); "
            "bottom: the class mean over the evaluator's data.",
        )
        body = [
            "<tr>" + "".join(_cell(folder, images, key, row) for key, _, _ in COLUMNS) + "</tr>"
            for row in rows
        ]
        parts = [
            f'<section id="{self.key}">',
            f"<h2>{e(self.title)}</h2>",
            f'<p class="meta">{e(facts)}</p>',
            f"<p>{headline}</p>",
            f'<p class="small">{e(READING_GUIDE)}</p>',
            picture,
            sortable_table("model-inversion", COLUMNS, body, text=("image", "stopped")),
            "</section>",
        ]
        return "\n".join(p for p in parts if p)
