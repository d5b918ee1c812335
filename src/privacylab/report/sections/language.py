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
from privacylab.report.language import KINDS, epsilon_label, redact, run_labels
from privacylab.report.sections import register_section

__all__ = [
    "EXPOSURE_COLUMNS",
    "EXTRACTED_COLUMNS",
    "MEMBERSHIP_COLUMNS",
    "RECORD_COLUMNS",
    "SUMMARY_COLUMNS",
    "LanguageSection",
    "facts_line",
    "summary_table",
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


SUMMARY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("model", "model", "size and privacy of the trained model"),
    ("parameters", "parameters", "trainable parameters"),
    ("epsilon", "ε", "DP-SGD's ε (∞: trained without differential privacy)"),
    ("members", "perplexity (members)", "per-token perplexity on training documents"),
    ("heldout", "perplexity (held-out)", "per-token perplexity on held-out documents"),
    ("memorised", "memorised samples", "most true memorised samples in a top 100 (any strategy "
     "and metric)"),
    ("records", "records extracted", "planted records found in true memorised samples"),
    ("begins", "extraction from k", "fewest copies of a record that was extracted"),
    ("exposure", "exposure", "mean exposure (bits) of the canaries inserted most often, of "
     "log2|R| possible (×: insertions)"),
    ("auc", "best MIA AUC", "best membership attack's AUC"),
    ("tpr", "best TPR@1% FPR", "best membership attack's TPR at 1% FPR"),
)  # fmt: skip
"""(key, header, tooltip) of the summary table: one row per model folder."""

SUMMARY_GUIDE = (
    "One row per model: how much each measurement found. A model that memorised its training "
    "data shows extracted records, exposure near log2|R| for repeated canaries and a "
    "membership AUC above 0.5; differential privacy should bring every one back to chance."
)


def _best(values: Sequence[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return max(found) if found else None


def _summary(runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    extraction = runs.get("extraction")
    if extraction is not None:
        table = extraction.get("table")
        cells = [
            number(v)
            for strategy in (table.values() if isinstance(table, Mapping) else [])
            if isinstance(strategy, Mapping)
            for v in strategy.values()
        ]
        row["memorised"] = _best(cells)
        records = extraction.get("records")
        counts = [c for c in (records.values() if isinstance(records, Mapping) else [])
                  if isinstance(c, Mapping)]  # fmt: skip
        found = [number(c.get("extracted")) for c in counts]
        total = [number(c.get("records")) for c in counts]
        if counts and None not in found and None not in total:
            row["records"] = (sum(found), sum(total))  # type: ignore[arg-type]
        row["begins"] = number(extraction.get("extraction_begins_at"))
    exposure = runs.get("exposure")
    if exposure is not None:
        canaries = [
            (number(c.get("repeats")), number(c.get("exposure")), number(c.get("space_bits")))
            for c in mappings(exposure.get("canaries"))
            if not c.get("user")
        ]
        canaries = [c for c in canaries if c[0] is not None and c[1] is not None]
        if canaries:
            most = max(c[0] for c in canaries)
            chosen = [c for c in canaries if c[0] == most]
            row["exposure"] = sum(c[1] for c in chosen) / len(chosen)
            row["repeats"] = most
            row["space"] = _best([c[2] for c in chosen])
    membership = runs.get("membership")
    if membership is not None:
        attacks = mappings(membership.get("attacks"))
        row["auc"] = _best([number(a.get("auc")) for a in attacks])
        row["tpr"] = _best([number(a.get("tpr_at_1pct_fpr")) for a in attacks])
    return row


def summary_table(block: Mapping[str, Any]) -> str:
    """One row per model folder over every kind of run: its facts and the headline of each
    measurement (most memorised samples, records extracted, the fewest copies extracted, the
    mean exposure of the most inserted canaries, the best membership AUC and TPR at 1% FPR);
    "—" where a kind has no run."""
    order: list[str] = []
    targets: dict[str, Mapping[str, Any]] = {}
    runs: dict[str, dict[str, Mapping[str, Any]]] = {}
    for kind in KINDS:
        for run in mappings(block.get(kind)):
            target = run.get("target")
            target = target if isinstance(target, Mapping) else {}
            key = str(target.get("folder"))
            if key not in targets:
                order.append(key)
                targets[key] = target
            runs.setdefault(key, {})[kind] = run
    labels = run_labels([targets[k] for k in order])
    rows = []
    for key, label in zip(order, labels, strict=True):
        target = targets[key]
        row = _summary(runs[key])
        epsilon = number(target.get("epsilon"))
        perplexity = target.get("perplexity")
        perplexity = perplexity if isinstance(perplexity, Mapping) else {}
        records = row.get("records")
        exposure, space = row.get("exposure"), row.get("space")
        cells = [
            text_cell(label, title=str(target.get("folder") or "")),
            num_cell(target.get("parameters"), fmt_int(target.get("parameters"))),
            num_cell(
                float("inf") if epsilon is None else epsilon,
                ("DP" if target.get("private") else "∞")
                if epsilon is None
                else epsilon_label(epsilon),
            ),
            num_cell(perplexity.get("members"), fmt(perplexity.get("members"), 2)),
            num_cell(perplexity.get("heldout"), fmt(perplexity.get("heldout"), 2)),
            num_cell(row.get("memorised"), fmt_int(row.get("memorised"))),
            num_cell(
                records[0] if records else None,
                f"{int(records[0])} / {int(records[1])}" if records else MISSING,
            ),
            num_cell(row.get("begins"), fmt_int(row.get("begins"))),
            num_cell(
                exposure,
                MISSING
                if exposure is None
                else f"{exposure:.2f}"
                + (f" / {space:.1f}" if space is not None else "")
                + f" (×{int(row['repeats'])})",
            ),
            num_cell(row.get("auc")),
            num_cell(row.get("tpr")),
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return sortable_table("language-summary", SUMMARY_COLUMNS, rows, text={"model"})


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
        privacy += f" ({facts.get('accountant')} accountant)" if facts.get("accountant") else ""
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


def _run_head(run: Mapping[str, Any], label: str, extra: Sequence[str | None] = ()) -> str:
    more = " · ".join(x for x in extra if x)
    notes = run.get("notes")
    notes = [str(n) for n in notes] if isinstance(notes, list) else []
    return (
        f"<h4>{e(label)}</h4>\n"
        f'<p class="meta">{e(facts_line(run.get("target")))}</p>'
        + (f'\n<p class="small">{e(more)}</p>' if more else "")
        + "".join(f'\n<p class="small note">{e(n)}</p>' for n in notes)
    )


def _count(label: str, value: Any) -> str | None:
    return f"{label}: {fmt_int(value)}" if number(value) is not None else None


def _seconds(run: Mapping[str, Any]) -> str | None:
    return f"{fmt(run.get('seconds'), 1)} s" if number(run.get("seconds")) is not None else None


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


def _distinct(run: Mapping[str, Any]) -> str | None:
    distinct = run.get("distinct")
    if not isinstance(distinct, Mapping) or not distinct:
        return None
    return "distinct samples: " + ", ".join(f"{k} {fmt_int(v)}" for k, v in distinct.items())


def _extraction(run: Mapping[str, Any], label: str) -> str:
    references = [str(r.get("size") or r.get("folder")) for r in mappings(run.get("references"))]
    per_thousand = number(run.get("seconds_per_1000_samples"))
    head = _run_head(
        run,
        label,
        [
            _count("samples per strategy", run.get("samples")),
            _distinct(run),
            _count("verbatim match of at least (bytes)", run.get("min_match")),
            f"reference models: {', '.join(references)}" if references else None,
            _count("queries", run.get("queries")),
            _count("tokens served", run.get("tokens_served")),
            _seconds(run),
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


def _exposure(run: Mapping[str, Any], label: str) -> str:
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
        label,
        [
            f"method: {run.get('method')}" if run.get("method") else None,
            _count("queries", run.get("queries")),
            _seconds(run),
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


def _membership(folder: Path, run: Mapping[str, Any], label: str, image: Any) -> str:
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
        label,
        [
            f"{fmt_int(documents.get('members'))} member and "
            f"{fmt_int(documents.get('heldout'))} held-out documents"
            if documents
            else None,
            f"reference model: {facts_line(reference)}" if isinstance(reference, Mapping) else None,
            _count("queries", run.get("queries")),
            _seconds(run),
        ],
    )
    picture = figure(
        folder,
        image,
        "ROC curves of the membership attacks on log-log axes",
        f"Membership ROC, {label}: "
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
        parts = [
            f'<section id="{self.key}">',
            f"<h2>{e(self.title)}</h2>",
            f'<p class="small">{e(SUMMARY_GUIDE)}</p>',
            summary_table(block),
        ]
        extraction = mappings(block.get("extraction"))
        if extraction:
            parts += [
                f'<h3 id="language-extraction">{TITLES["extraction"]} ({len(extraction)})</h3>',
                f'<p class="small">{e(GUIDES["extraction"])}</p>',
            ]
            labels = run_labels([r.get("target") for r in extraction])
            parts.append(
                figure(
                    folder,
                    images.get("extraction"),
                    "Share of planted records extracted against their number of copies",
                    "Extraction vs duplication: " + ", ".join(labels),
                )
            )
            parts += [_extraction(run, lab) for run, lab in zip(extraction, labels, strict=True)]
        exposure = mappings(block.get("exposure"))
        if exposure:
            parts += [
                f'<h3 id="language-exposure">{TITLES["exposure"]} ({len(exposure)})</h3>',
                f'<p class="small">{e(GUIDES["exposure"])}</p>',
            ]
            labels = run_labels([r.get("target") for r in exposure])
            parts.append(
                figure(
                    folder,
                    images.get("exposure"),
                    "Exposure of the canaries against their insertion count, one line per model",
                    "Exposure vs insertion count: " + ", ".join(labels),
                )
            )
            parts += [_exposure(run, lab) for run, lab in zip(exposure, labels, strict=True)]
        membership = mappings(block.get("membership"))
        if membership:
            parts += [
                f'<h3 id="language-membership">{TITLES["membership"]} ({len(membership)})</h3>',
                f'<p class="small">{e(GUIDES["membership"])}</p>',
            ]
            names = images.get("membership")
            names = names if isinstance(names, list) else []
            labels = run_labels([r.get("target") for r in membership])
            for i, run in enumerate(membership):
                image = names[i] if i < len(names) else None
                parts.append(_membership(folder, run, labels[i], image))
        parts.append("</section>")
        return "\n".join(p for p in parts if p)
