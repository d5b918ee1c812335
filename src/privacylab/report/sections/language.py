"""The language-model section: what a small GPT trained on a corpus with planted personal
records and canaries gives away, by three measurements of memorisation.

Its page anchor is `#language-models`. Renders ``payload["language"]`` (what
`privacylab.report.language.add_language_run` merges, one run per target folder and kind):

- extraction runs (`privacylab attack lm-extraction`; Carlini et al. 2021, "Extracting
  Training Data from Large Language Models"): the strategy × metric table of true memorised
  samples among the top 100 (their Table 2, the best metric of each strategy in bold), the
  records extracted against how many documents held them (k of k-eidetic memorisation, their
  Def. 2 and Fig. 3's question: from how many copies on does extraction begin), and the
  extracted samples with their personal data redacted (`privacylab.report.language.redact`);
- exposure runs (`privacylab attack exposure`; Carlini et al. 2019, "The Secret Sharer",
  Sec. 4-5): the exposure-vs-insertions figure (`images.exposure`) and each run's canaries;
- membership runs (`privacylab attack lm-membership`): per run the log-log ROC figure
  (`images.membership[i]`) and the attacks by AUC, TPR at 1% and 0.1% FPR and advantage.

Each run opens with a line of its target's facts (size, parameters, private/ε, per-token
perplexity on members and held-out documents). Any part may be absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    sort_key,
    sortable_table,
    text_cell,
)
from privacylab.report.language import KINDS, redact, run_label
from privacylab.report.sections import register_section

__all__ = [
    "EXPOSURE_COLUMNS",
    "EXTRACTED_COLUMNS",
    "MEMBERSHIP_COLUMNS",
    "RECORD_COLUMNS",
    "LanguageSection",
    "facts_line",
]

MEMBERSHIP_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("name", "attack", "the membership score (loss, zlib, reference ratio, Min-K%, ...)"),
    ("auc", "AUC", "area under the ROC curve, members vs held-out documents"),
    ("tpr_at_1pct_fpr", "TPR@1% FPR", "members found when 1% of held-out documents are accused"),
    ("tpr_at_01pct_fpr", "TPR@0.1% FPR", "members found at 0.1% false positives"),
    ("advantage", "advantage", "max over thresholds of TPR − FPR (Yeom et al. 2018)"),
    ("queries", "queries", "queries this attack sent to the target"),
)
"""(key, header, tooltip) of a membership run's table."""

EXPOSURE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("prefix", "canary format", "the known prefix; the secret after it is what is ranked"),
    ("repeats", "insertions", "member documents that held the canary (0: a control)"),
    ("exposure", "exposure", "log2|R| − log2 rank of the true secret (bits)"),
    ("space_bits", "log2|R|", "the largest exposure possible: bits of the candidate space"),
    ("rank", "rank", "rank of the true secret among the candidates by the model's perplexity"),
    ("method", "method", "enumerate every candidate, or extrapolate from a sample"),
    ("extrapolated_exposure", "extrapolated", "the estimate from a fitted skew-normal"),
    ("user", "user", "a canary the user supplied"),
)
"""(key, header, tooltip) of an exposure run's table."""

RECORD_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("copies", "copies (k)", "member documents holding each of these records"),
    ("records", "records", "records planted that many times"),
    ("extracted", "extracted", "of them, found in a true memorised sample"),
    ("share", "share", "extracted / records"),
)
"""(key, header, tooltip) of an extraction run's records table."""

EXTRACTED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("text", "sample (redacted)", "the generated text, every word and number masked"),
    ("pii", "personal data found (redacted)", "planted records, canaries or fields in it"),
    ("k", "k", "training documents holding the memorised string (k-eidetic)"),
    ("strategy", "strategy", "how the sample was generated"),
    ("metric", "metric", "the membership metric that ranked it into the top"),
    ("rank", "rank", "its place under that metric"),
)
"""(key, header, tooltip) of an extraction run's extracted-samples table."""

SHOWN_SAMPLES = 40
"""Extracted samples listed per run (the most often repeated first)."""

SAMPLE_CHARS = 120
"""Characters of each sample shown."""

GUIDES = {
    "extraction": (
        "The attacker samples text from the model (top-n, temperature decay, or prompts from "
        "public text), ranks the samples by how much more likely the target finds them than a "
        "reference would (perplexity, ratios to smaller models, to zlib, to lower-cased text, "
        "the lowest sliding window), and keeps the top 100 of each ranking; a sample counts "
        "when it reproduces a training document or planted record. k is how many training "
        "documents held the string: a record extracted at small k is memorised, not learned."
    ),
    "exposure": (
        "A canary is a random secret after a fixed prefix, planted in some training documents. "
        "Its exposure is log2 of the candidate space minus log2 of the rank of the true secret "
        "when all candidates are ordered by the model's perplexity: a model that never saw it "
        "ranks it at random (about 1/ln 2 ≈ 1.44 bits on average), one that memorised it puts "
        "it first (the dashed maximum). Differential privacy should keep every line near the "
        "dotted level however often the canary was inserted."
    ),
    "membership": (
        "Each attack scores training documents against held-out documents of the same corpus "
        "from the model's log-probabilities alone (or against a reference model's). The ROC "
        "is on log-log axes: what matters is how many members are found while almost no "
        "held-out document is accused."
    ),
}

TITLES = {
    "extraction": "Training-data extraction",
    "exposure": "Canary exposure",
    "membership": "Membership inference on documents",
}


def _perplexity(facts: Mapping[str, Any]) -> str | None:
    value = facts.get("perplexity")
    if isinstance(value, Mapping):
        members, heldout = value.get("members"), value.get("heldout")
        if number(members) is None and number(heldout) is None:
            return None
        return f"perplexity members {fmt(members, 2)} / held-out {fmt(heldout, 2)}"
    return f"perplexity {fmt(value, 2)}" if number(value) is not None else None


def facts_line(target: Any) -> str:
    """One line of a target's facts: size, parameters, private/ε (and δ), per-token
    perplexity on members and held-out documents, the model folder."""
    facts = target if isinstance(target, Mapping) else {}
    epsilon = number(facts.get("epsilon"))
    if facts.get("private") or epsilon is not None:
        privacy = "DP-SGD" if epsilon is None else f"DP-SGD, ε = {epsilon:.3g}"
        delta = number(facts.get("delta"))
        privacy += f", δ = {delta:.1e}" if delta is not None else ""
    else:
        privacy = "non-private"
    parameters = number(facts.get("parameters"))
    parts = [
        f"model: {facts.get('size')}" if facts.get("size") else None,
        f"{int(parameters):,} parameters" if parameters is not None else None,
        privacy,
        _perplexity(facts),
        f"folder: {facts.get('folder')}" if facts.get("folder") else None,
    ]
    return " · ".join(p for p in parts if p)


def _run_head(run: Mapping[str, Any], extra: Sequence[str | None] = ()) -> str:
    more = " · ".join(x for x in extra if x)
    return (
        f"<h4>{e(run_label(run.get('target')))}</h4>\n"
        f'<p class="meta">{e(facts_line(run.get("target")))}</p>'
        + (f'\n<p class="small">{e(more)}</p>' if more else "")
    )


def _count(label: str, value: Any) -> str | None:
    return f"{label}: {fmt_int(value)}" if number(value) is not None else None


def _bold_cell(value: Any, bold: bool, title: str = "") -> str:
    attr = f' title="{e(title)}"' if title else ""
    shown = e(fmt_int(value))
    return (
        f'<td data-sort="{e(sort_key(value))}"{attr}>'
        f"{f'<strong>{shown}</strong>' if bold else shown}</td>"
    )


def _strategy_table(run: Mapping[str, Any]) -> str:
    table = run.get("table")
    table = table if isinstance(table, Mapping) else {}
    precision = run.get("precision_at_100")
    precision = precision if isinstance(precision, Mapping) else {}
    strategies = [str(s) for s in run.get("strategies") or table.keys()]
    metrics = [str(m) for m in run.get("metrics") or []]
    if not metrics:
        metrics = sorted(
            {str(m) for row in table.values() if isinstance(row, Mapping) for m in row}
        )
    top = fmt_int(run.get("top", 100))
    columns = [("strategy", "strategy", "how the samples were generated")] + [
        (m, m, f"true memorised samples among the top {top} by {m}") for m in metrics
    ]
    rows = []
    for strategy in strategies:
        counts = table.get(strategy)
        counts = counts if isinstance(counts, Mapping) else {}
        shares = precision.get(strategy)
        shares = shares if isinstance(shares, Mapping) else {}
        values = [number(counts.get(m)) for m in metrics]
        best = max((v for v in values if v is not None), default=None)
        cells = [text_cell(strategy)]
        for metric, value in zip(metrics, values, strict=True):
            share = number(shares.get(metric))
            tip = f"precision@{top}: {fmt(share, 2)}" if share is not None else ""
            cells.append(_bold_cell(value, value is not None and value == best and best > 0, tip))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return sortable_table(
        "language-extraction", columns, rows, text={"strategy"}, empty="no strategy"
    )


def _record_table(run: Mapping[str, Any]) -> str:
    records = run.get("records")
    records = records if isinstance(records, Mapping) else {}
    rows = []
    for copies, counts in sorted(records.items(), key=lambda kv: number(kv[0]) or 0.0):
        if not isinstance(counts, Mapping):
            continue
        total, found = number(counts.get("records")), number(counts.get("extracted"))
        share = found / total if total and found is not None else None
        rows.append(
            "<tr>"
            + num_cell(number(copies), fmt_int(copies))
            + num_cell(total, fmt_int(total))
            + num_cell(found, fmt_int(found))
            + num_cell(share, MISSING if share is None else f"{100 * share:.0f}%")
            + "</tr>"
        )
    return sortable_table("language-records", RECORD_COLUMNS, rows, empty="no planted records")


def _begins(run: Mapping[str, Any]) -> str:
    begins = number(run.get("extraction_begins_at"))
    if begins is None:
        return "No planted record was extracted."
    copies = int(begins)
    return f"Extraction begins at {copies} {'copy' if copies == 1 else 'copies'}."


def _pii_text(pii: Any) -> str:
    items = []
    for item in mappings(pii):
        copies = number(item.get("copies"))
        times = f" (×{int(copies)})" if copies is not None else ""
        items.append(f"{item.get('kind', '?')}: {redact(str(item.get('text', '')))}{times}")
    return "; ".join(items)


def _extracted_table(run: Mapping[str, Any]) -> str:
    samples = list(mappings(run.get("extracted")))
    samples.sort(key=lambda s: (-(number(s.get("k")) or 0.0), number(s.get("rank")) or 0.0))
    rows = []
    for sample in samples[:SHOWN_SAMPLES]:
        text = " ".join(str(sample.get("text", "")).split())
        if len(text) > SAMPLE_CHARS:
            text = text[:SAMPLE_CHARS] + "…"
        rows.append(
            "<tr>"
            + text_cell(redact(text))
            + text_cell(_pii_text(sample.get("pii")))
            + num_cell(sample.get("k"), fmt_int(sample.get("k")))
            + text_cell(sample.get("strategy"))
            + text_cell(sample.get("metric"))
            + num_cell(sample.get("rank"), fmt_int(sample.get("rank")))
            + "</tr>"
        )
    shown = (
        f'<p class="small">The {SHOWN_SAMPLES} most repeated of {len(samples)} extracted '
        "samples.</p>"
        if len(samples) > SHOWN_SAMPLES
        else ""
    )
    table = sortable_table(
        "language-extracted",
        EXTRACTED_COLUMNS,
        rows,
        text={"text", "pii", "strategy", "metric"},
        empty="nothing extracted",
    )
    return shown + table


def _extraction(run: Mapping[str, Any]) -> str:
    references = [str(r.get("size") or r.get("folder")) for r in mappings(run.get("references"))]
    per_thousand = number(run.get("seconds_per_1000_samples"))
    head = _run_head(
        run,
        [
            _count("samples per strategy", run.get("samples")),
            f"reference models: {', '.join(references)}" if references else None,
            _count("queries", run.get("queries")),
            _count("tokens served", run.get("tokens_served")),
            f"{fmt(run.get('seconds'), 1)} s" if number(run.get("seconds")) is not None else None,
            f"{fmt(per_thousand, 2)} s per 1000 samples" if per_thousand is not None else None,
        ],
    )
    top = fmt_int(run.get("top", 100))
    return "\n".join(
        [
            head,
            f'<p class="small">True memorised samples among the top {top} of each '
            "strategy (rows) by each metric (columns), best metric per strategy in bold "
            "(Carlini et al. 2021, Table 2).</p>",
            _strategy_table(run),
            f"<p>{e(_begins(run))}</p>",
            _record_table(run),
            _extracted_table(run),
        ]
    )


def _exposure_cell(key: str, canary: Mapping[str, Any]) -> str:
    value = canary.get(key)
    if key in ("prefix", "method"):
        return text_cell(value)
    if key == "user":
        return text_cell("yes" if value else "no")
    if key in ("repeats", "rank"):
        return num_cell(value, fmt_int(value))
    return num_cell(value, fmt(value, 2))


def _exposure(run: Mapping[str, Any]) -> str:
    canaries = sorted(
        mappings(run.get("canaries")),
        key=lambda c: (bool(c.get("user")), number(c.get("repeats")) or 0.0),
    )
    rows = [
        "<tr>" + "".join(_exposure_cell(k, c) for k, _, _ in EXPOSURE_COLUMNS) + "</tr>"
        for c in canaries
    ]
    head = _run_head(
        run,
        [
            f"method: {run.get('method')}" if run.get("method") else None,
            _count("queries", run.get("queries")),
            f"{fmt(run.get('seconds'), 1)} s" if number(run.get("seconds")) is not None else None,
        ],
    )
    table = sortable_table(
        "language-exposure",
        EXPOSURE_COLUMNS,
        rows,
        text={"prefix", "method", "user"},
        empty="no canary",
    )
    return head + "\n" + table


def _membership(folder: Path, run: Mapping[str, Any], image: Any) -> str:
    attacks = list(mappings(run.get("attacks")))
    order = [str(n) for n in run.get("order") or []]
    rank = {name: i for i, name in enumerate(order)}
    attacks.sort(
        key=lambda a: (
            rank.get(str(a.get("name")), len(order)),
            -(number(a.get("auc")) or 0.0),
        )
    )
    rows = []
    for attack in attacks:
        cells = [text_cell(attack.get("name") or attack.get("attack"))]
        for key, _, _ in MEMBERSHIP_COLUMNS[1:]:
            value = attack.get(key)
            cells.append(num_cell(value, fmt_int(value)) if key == "queries" else num_cell(value))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    documents = run.get("documents")
    documents = documents if isinstance(documents, Mapping) else {}
    reference = run.get("reference")
    head = _run_head(
        run,
        [
            f"{fmt_int(documents.get('members'))} member and "
            f"{fmt_int(documents.get('heldout'))} held-out documents"
            if documents
            else None,
            f"reference model: {facts_line(reference)}" if isinstance(reference, Mapping) else None,
            _count("queries", run.get("queries")),
            f"{fmt(run.get('seconds'), 1)} s" if number(run.get("seconds")) is not None else None,
        ],
    )
    picture = figure(
        folder,
        image,
        "ROC curves of the membership attacks on log-log axes",
        f"Membership ROC, {run_label(run.get('target'))}: "
        + ", ".join(str(a.get("name") or a.get("attack")) for a in attacks),
    )
    table = sortable_table(
        "language-membership", MEMBERSHIP_COLUMNS, rows, text={"name"}, empty="no attack"
    )
    return "\n".join(p for p in (head, picture, table) if p)


@register_section
class LanguageSection:
    """Language models: extraction, exposure and membership runs, each on its target."""

    key = "language-models"
    title = "Language models: memorisation"
    order = 47
    css = """
table.language-extracted td.text { font-family: ui-monospace, monospace; font-size: 0.85rem; }
"""

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload holds any language-model run."""
        block = section_block(payload, "language")
        return any(mappings(block.get(kind)) for kind in KINDS)

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """A subsection per kind with runs: guide, figures, a head and tables per run."""
        block = section_block(payload, "language")
        images = block.get("images")
        images = images if isinstance(images, Mapping) else {}
        parts = [f'<section id="{self.key}">', f"<h2>{e(self.title)}</h2>"]
        extraction = mappings(block.get("extraction"))
        if extraction:
            parts += [
                f'<h3 id="language-extraction">{TITLES["extraction"]} ({len(extraction)})</h3>',
                f'<p class="small">{e(GUIDES["extraction"])}</p>',
            ]
            parts += [_extraction(run) for run in extraction]
        exposure = mappings(block.get("exposure"))
        if exposure:
            parts += [
                f'<h3 id="language-exposure">{TITLES["exposure"]} ({len(exposure)})</h3>',
                f'<p class="small">{e(GUIDES["exposure"])}</p>',
                figure(
                    folder,
                    images.get("exposure"),
                    "Exposure of the canaries against their insertion count, one line per model",
                    "Exposure vs insertion count: "
                    + ", ".join(run_label(r.get("target")) for r in exposure),
                ),
            ]
            parts += [_exposure(run) for run in exposure]
        membership = mappings(block.get("membership"))
        if membership:
            parts += [
                f'<h3 id="language-membership">{TITLES["membership"]} ({len(membership)})</h3>',
                f'<p class="small">{e(GUIDES["membership"])}</p>',
            ]
            names = images.get("membership")
            names = names if isinstance(names, list) else []
            for i, run in enumerate(membership):
                parts.append(_membership(folder, run, names[i] if i < len(names) else None))
        parts.append("</section>")
        return "\n".join(p for p in parts if p)
