"""The DP-Forward section: local DP in the forward pass of a pretrained encoder against
DP-SGD and non-private fine-tuning, and what an attacker gets from the released embeddings.

Its page anchor is `#dp-forward`. Renders ``payload["dpforward"]`` (what
`privacylab.report.dpforward.add_dpforward_run` merges, one entry per model folder): a one-line
verdict (does DP-Forward stop embedding inversion and attribute inference where DP-SGD does
not?), one table row per model (method, position, ε with δ, privacy event and accountant,
accuracy, inversion recall of the nearest-neighbour and optimisation attacks each beside the
recall of guessing common words, attribute accuracy beside chance, membership AUC; a
non-private or DP-SGD model read at several cuts has a row per cut, its position shown),
Du et al. 2023's claims beside what these runs measured, the accuracy-vs-ε figure per
position, the attack bar chart, and the inversion examples with the recovered tokens that
occur in the true text marked.
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
    mappings,
    num_cell,
    number,
    section_block,
    sortable_table,
    text_cell,
)
from privacylab.report.dpforward import (
    ATTRIBUTE_MARGIN,
    INVERSION_STOPPED,
    METHOD_NAMES,
    event_summary,
    findings,
    marked_tokens,
    model_rows,
    verdict,
)
from privacylab.report.sections import register_section

__all__ = ["FINDING_COLUMNS", "MODEL_COLUMNS", "DPForwardSection", "examples_html", "model_table"]

MODEL_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("model", "model folder", "the fine-tuned model's folder (hover: its full path)"),
    ("method", "method", "DP-Forward (noise in the forward pass), DP-SGD or non-private"),
    (
        "position",
        "position",
        "where DP-Forward normalises and perturbs the embedding matrix; for a non-private or "
        "DP-SGD model read at several cuts, the cut whose clear embeddings this row attacked",
    ),
    ("epsilon", "ε", "sequence-level ε over all training epochs (∞: no privacy)"),
    ("delta", "δ", "the δ of that ε"),
    ("event", "event", "the privacy event the accountant bounded (σ/Δ: noise per sensitivity)"),
    ("accountant", "accountant", "who computed ε from the event"),
    (
        "accuracy",
        "accuracy",
        "test accuracy of the deployed pipeline (noisy inference for DP-Forward)",
    ),
    (
        "inversion_nn",
        "inversion NN (guess)",
        "token recall of nearest-neighbour inversion; in brackets the same recovered tokens "
        "scored against another victim's: what guessing common words alone scores",
    ),
    (
        "inversion_opt",
        "inversion opt (guess)",
        "token recall of optimisation-based inversion; in brackets the same recovered tokens "
        "scored against another victim's: what guessing common words alone scores",
    ),
    (
        "attribute",
        "attribute (chance)",
        "accuracy of attribute inference from the embeddings, the majority share in brackets",
    ),
    ("mia_auc", "MIA AUC", "best membership attack's AUC on the classifier (hover: each attack)"),
    ("seconds_per_step", "s / step", "seconds per fine-tuning step when it was trained"),
)
"""(key, header, tooltip) of the model table."""

FINDING_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("claim", "Du et al. 2023 (CCS'23)", "the seed paper's finding"),
    ("ours", "these runs", "what the models in this report measured"),
    ("holds", "holds?", "holds, partly, does not hold, or not measured"),
)
"""(key, header, tooltip) of the claims table."""

GUIDE = (
    "DP-Forward (Du et al. 2023) clips each sequence's embedding matrix to Frobenius norm C at "
    "the chosen position and adds analytic matrix Gaussian noise before it leaves the user, "
    "in training and at inference, so the released embedding is sequence-level local DP "
    "(replace-one sensitivity 2C). DP-SGD noises only the training gradients: the embeddings "
    "it releases at inference are clear. The attacker sees the released embeddings: "
    "inversion recovers the sequence's tokens (recall = share of the true tokens found; in "
    "brackets the recall of the same tokens against another victim's, what guessing common "
    "words alone scores, so only recall above it is learnt from the embedding), "
    "attribute inference guesses the review's category with a classifier trained on "
    f"auxiliary data. Inversion counts as stopped below recall {INVERSION_STOPPED:g}, "
    f"attribute inference within {ATTRIBUTE_MARGIN:g} of chance."
)

_STATE_CLASS = {"holds": "ok", "partly": "warn", "does not hold": "bad", "not measured": ""}


def _first_number(data: Mapping[str, Any], *keys: str) -> float | None:
    return next((x for k in keys if (x := number(data.get(k))) is not None), None)


def _epsilon_cell(row: Mapping[str, Any]) -> str:
    epsilon = row.get("epsilon")
    if epsilon is None:
        return num_cell(float("inf"), "∞")
    text = f"{epsilon:.3g}"
    tips = []
    if row.get("label_epsilon") is not None:
        text += f" + labels {row['label_epsilon']:.3g}"
        if row.get("total_epsilon") is not None:
            tips.append(f"sequence and label composed: ε = {row['total_epsilon']:.3g}")
    if row.get("inference_epsilon") is not None:
        tips.append(f"one inference query: ε = {row['inference_epsilon']:.3g}")
    shuffled = row.get("shuffled")
    if isinstance(shuffled, Mapping):
        amplified = _first_number(shuffled, "composed_epsilon", "epsilon")
        if amplified is not None:
            tips.append(f"with a trusted shuffler (Feldman et al. 2021): ε = {amplified:.3g}")
    return num_cell(epsilon, text, title="; ".join(tips))


def _mia_title(row: Mapping[str, Any]) -> str:
    return "; ".join(
        f"{name}: AUC {fmt(m.get('auc'))}, TPR@1% FPR {fmt(m.get('tpr_at_1_fpr'))}"
        for name, m in (row.get("mia") or {}).items()
    )


def _recall_cell(recall: Any, guess: Any) -> str:
    if recall is None or guess is None:
        return num_cell(recall)
    return num_cell(recall, f"{fmt(recall)} ({fmt(guess)})")


def model_table(rows: list[dict[str, Any]]) -> str:
    """The model table: one sortable row per model folder (`model_rows`), "—" where a model
    has no run of that kind."""
    body = []
    for row in rows:
        method = str(row.get("method") or MISSING)
        attribute = row.get("attribute_accuracy")
        chance = row.get("attribute_chance")
        cells = [
            text_cell(Path(row["folder"]).name or row["folder"], title=row["folder"]),
            text_cell(METHOD_NAMES.get(method, method)),
            text_cell(row.get("position") if method == "dp-forward" else row.get("read_at")),
            _epsilon_cell(row),
            num_cell(
                row.get("delta"), MISSING if row.get("delta") is None else f"{row['delta']:.0e}"
            ),
            text_cell(event_summary(row.get("event")) if row.get("event") else None),
            text_cell(row.get("accountant")),
            num_cell(row.get("accuracy")),
            _recall_cell(row.get("inversion_nn"), row.get("inversion_nn_baseline")),
            _recall_cell(row.get("inversion_opt"), row.get("inversion_opt_baseline")),
            num_cell(
                attribute, MISSING if attribute is None else f"{fmt(attribute)} ({fmt(chance)})"
            ),
            num_cell(row.get("mia_auc"), title=_mia_title(row)),
            num_cell(row.get("seconds_per_step")),
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return sortable_table(
        "dpforward-models",
        MODEL_COLUMNS,
        body,
        text={"model", "method", "position", "event", "accountant"},
        empty="no model",
    )


def _findings_table(rows: list[dict[str, Any]]) -> str:
    body = []
    for found in findings(rows):
        klass = _STATE_CLASS.get(found.holds, "")
        body.append(
            "<tr>"
            + text_cell(found.claim)
            + text_cell(found.ours)
            + text_cell(found.holds, klass=klass)
            + "</tr>"
        )
    return sortable_table(
        "dpforward-claims", FINDING_COLUMNS, body, text={"claim", "ours", "holds"}
    )


def _marked(example: Mapping[str, Any]) -> str:
    truth, recovered = str(example.get("truth") or ""), str(example.get("recovered") or "")
    return " ".join(
        f'<mark title="in the true text">{e(token)}</mark>' if hit else e(token)
        for token, hit in marked_tokens(truth, recovered)
    )


def examples_html(rows: list[dict[str, Any]]) -> str:
    """Per model and inversion attack, its examples in a <details> block (the first open): the
    true text and what was recovered, the recovered tokens that occur in the true text in
    <mark>; every text HTML-escaped."""
    parts = []
    for row in rows:
        for method, examples in row["examples"].items():
            if not examples:
                continue
            key = "inversion_nn" if method == "inversion-nn" else "inversion_opt"
            recall, guess = row.get(key), row.get(f"{key}_baseline")
            guessed = "" if guess is None else f", guessing {fmt(guess)}"
            lines = [
                "<tr>"
                f'<td class="text">{e(ex.get("truth") or "")}</td>'
                f'<td class="text">{_marked(ex)}</td>'
                "</tr>"
                for ex in examples
            ]
            parts.append(
                f"<details{' open' if not parts else ''}>"
                f"<summary>{e(row['label'])}: {e(method)} (recall {fmt(recall)}"
                f"{e(guessed)})</summary>\n"
                '<table class="dpforward-examples">\n<thead><tr>'
                '<th class="text" scope="col">true text</th>'
                '<th class="text" scope="col">recovered (marked: in the true text)</th>'
                "</tr></thead>\n<tbody>\n" + "\n".join(lines) + "\n</tbody>\n</table></details>"
            )
    return "\n".join(parts)


@register_section
class DPForwardSection:
    """DP-Forward vs DP-SGD vs non-private: accuracy, ε and inference-time attacks."""

    key = "dp-forward"
    title = "DP-Forward: privacy in the forward pass"
    order = 48
    css = """
.verdict { font-weight: 600; }
table.dpforward-models td:not(.text) { white-space: nowrap; }
td.ok { color: #0a6b2b; font-weight: 600; }
td.warn { color: #8a5a00; font-weight: 600; }
td.bad { color: #a40000; font-weight: 600; }
table.dpforward-examples td.text { font-family: ui-monospace, monospace; font-size: 0.85rem;
  max-width: 34rem; }
table.dpforward-examples mark { background: #c8f0c8; }
"""

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload holds any DP-Forward model."""
        return bool(mappings(section_block(payload, "dpforward").get("models")))

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """Verdict, model table, claims, figures and inversion examples."""
        block = section_block(payload, "dpforward")
        images = block.get("images")
        images = images if isinstance(images, Mapping) else {}
        rows = model_rows(block)
        examples = examples_html(rows)
        parts = [
            f'<section id="{self.key}">',
            f"<h2>{e(self.title)}</h2>",
            f'<p class="verdict">{e(verdict(rows))}</p>',
            f'<p class="small">{e(GUIDE)}</p>',
            model_table(rows),
            '<h3 id="dp-forward-claims">The seed paper\'s findings on these models</h3>',
            _findings_table(rows),
            figure(
                folder,
                images.get("accuracy"),
                "Test accuracy against ε, one line per DP-Forward position, DP-SGD as squares, "
                "non-private dashed",
                "Accuracy vs ε: DP-Forward per position, DP-SGD and non-private",
            ),
            figure(
                folder,
                images.get("attacks"),
                "Inversion token recall and attribute accuracy per model, chance as black ticks",
                "Inference-time attacks on the released embeddings, per model",
            ),
        ]
        if examples:
            parts += ['<h3 id="dp-forward-examples">Inversion examples</h3>', examples]
        parts.append("</section>")
        return "\n".join(p for p in parts if p)
