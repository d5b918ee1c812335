"""The defences section: the privacy–utility frontier of every defended model, the release gate,
one sortable row per defence and, per defence, every attack with the adaptive ones marked.

Renders ``payload["defenses"]`` (the `privacylab defend --json` object). The Pareto set and the
gate are recomputed from the rows with `privacylab.report.defenses` (the same functions the
defend job calls), so the page cannot disagree with its own numbers.
"""

from __future__ import annotations

import re
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
    percent,
    section_block,
    sortable_table,
    text_cell,
)
from privacylab.report.defenses import (
    adaptively_attacked,
    attack_is_adaptive,
    best_attack,
    best_auc,
    best_tpr,
    exclusion,
    gate_decision,
    label,
    pareto_indices,
)
from privacylab.report.sections import register_section
from privacylab.report.verdict import strength_key

DEFENSE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("defense", "defence", "the defence and its parameters, as given to --defenses"),
    ("kind", "kind", "what it changes: outputs (post-processing) or training"),
    ("serves", "serves", "what the defended deployment answers a query with"),
    ("test_accuracy", "test acc.", "accuracy on held-out data (utility)"),
    ("train_accuracy", "train acc.", "accuracy on the training members"),
    ("best_attack", "strongest attack", "largest TPR at 0.1% FPR; (adaptive) = knew the defence"),
    ("tpr_at_01pct_fpr", "TPR@0.1%FPR", "members found while wrongly accusing 0.1% (privacy)"),
    ("auc", "AUC", "largest AUC of any attack (0.5 = chance)"),
    ("epsilon_lower_bound", "ε lower bound", "the strongest attack's empirical ε lower bound"),
    ("epsilon", "certified ε", "the accountant's ε (DP-SGD only)"),
    ("pareto", "Pareto", "no other defence is at least as accurate and at most as attackable"),
    ("gate", "gate", "the release gate at the chosen threshold"),
)
"""(key, header, tooltip) of each column of the defence table."""

ATTACK_COLUMNS: tuple[tuple[str, str], ...] = (
    ("attack", "attack"),
    ("adaptive", "adaptive"),
    ("access", "access"),
    ("tpr_at_01pct_fpr", "TPR@0.1%FPR"),
    ("tpr_at_1pct_fpr", "TPR@1%FPR"),
    ("auc", "AUC"),
    ("balanced_accuracy", "bal. acc."),
    ("epsilon_lower_bound", "ε lower bound"),
    ("examples", "examples"),
    ("queries", "queries"),
    ("seconds", "seconds"),
)
"""(key, header) of each column of a defence's attack table."""

_TEXT = {
    "defense",
    "kind",
    "serves",
    "best_attack",
    "pareto",
    "gate",
    "attack",
    "adaptive",
    "access",
}

READING_GUIDE = (
    "Each point is one defence at one setting, trained and deployed on the same data as the "
    "undefended model and attacked by the whole membership suite plus the attacks that know "
    "the defence (label-only attacks against output defences; reference models trained with "
    "the defence against training-time ones). Up is more useful (test accuracy); left is more "
    "private (the strongest attack's TPR at 0.1% FPR, log scale; 0.1% is chance, a TPR of 0 "
    "sits at the axis floor). The Pareto set, ringed and joined, holds the defences no other "
    "defence beats on both at once: choose among them. Points at the undefended model's "
    "height and leakage cost nothing and protect nothing; a point far down protects by "
    "not learning. A hollow marker was attacked only by attacks that did not know the "
    "defence, which proves nothing about it."
)


def _threshold(block: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """The gate threshold and, when the payload's value is unusable, why it was ignored."""
    raw = block.get("max_tpr_at_01pct_fpr")
    if raw is None:
        return None, None
    x = number(raw)
    if x is None or not 0.0 <= x <= 1.0:
        return None, f"the threshold {raw!r} is not a rate in [0, 1] and was ignored"
    return x, None


def _slug(index: int, name: str) -> str:
    return f"defense-{index}-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "x")


def _defense_row(row: Mapping[str, Any], on_front: bool, threshold: float | None) -> str:
    best = best_attack(row) or {}
    attack = best.get("attack")
    adaptive = row.get("kind") != "none" and bool(best) and attack_is_adaptive(row, best)
    passes, why = gate_decision(row, threshold)
    top_auc = row.get("best_auc")
    auc_by = top_auc.get("attack") if isinstance(top_auc, Mapping) else None
    cells = [
        text_cell(label(row)),
        text_cell(row.get("kind")),
        text_cell(row.get("serves")),
        num_cell(row.get("test_accuracy")),
        num_cell(row.get("train_accuracy")),
        text_cell(
            f"{attack}{' (adaptive)' if adaptive else ''}" if attack is not None else MISSING
        ),
        num_cell(best_tpr(row)),
        num_cell(best_auc(row), title=f"by {auc_by}" if auc_by else ""),
        num_cell(best.get("epsilon_lower_bound")),
        num_cell(row.get("epsilon")),
        text_cell("★ yes" if on_front else "no", sort="1" if on_front else "0"),
    ]
    if passes is None:
        cells.append(text_cell(MISSING, sort="0", title="no threshold given"))
    else:
        cells.append(
            text_cell(
                "pass" if passes else "fail",
                sort="2" if passes else "1",
                klass="gate-pass" if passes else "gate-fail",
                title=why,
            )
        )
    classes = ["pareto"] if on_front else []
    if not adaptively_attacked(row):
        classes.append("not-adaptive")
    attrs = f' class="{" ".join(classes)}"' if classes else ""
    return f"<tr{attrs}>{''.join(cells)}</tr>"


def defense_table(rows: list[Mapping[str, Any]], threshold: float | None) -> str:
    """One sortable row per defence, in the payload's order (the user's --defenses order)."""
    front = set(pareto_indices(rows))
    body = [_defense_row(row, i in front, threshold) for i, row in enumerate(rows)]
    return sortable_table("defenses", DEFENSE_COLUMNS, body, text=_TEXT, empty="no defences")


def attack_detail_table(row: Mapping[str, Any]) -> str:
    """Every attack on one defence, strongest first (TPR at 0.1% FPR, TPR at 1% FPR, AUC), the
    adaptive ones marked; a sortable table."""
    attacks = sorted(mappings(row.get("attacks")), key=strength_key, reverse=True)
    body = []
    for attack in attacks:
        adaptive = attack_is_adaptive(row, attack)
        cells = []
        for key, _ in ATTACK_COLUMNS:
            value = attack.get(key)
            if key == "adaptive":
                text = "✓ adaptive" if adaptive else "no"
                if row.get("kind") == "none":
                    text = "✓ nothing to adapt to"
                cells.append(text_cell(text, sort="1" if adaptive else "0"))
            elif key in _TEXT:
                cells.append(text_cell(MISSING if value is None else str(value)))
            elif key in {"examples", "queries"}:
                cells.append(num_cell(value, fmt_int(value)))
            elif key == "seconds":
                cells.append(num_cell(value, fmt(value, 2)))
            else:
                cells.append(num_cell(value))
        klass = ' class="adaptive"' if adaptive else ""
        body.append(f"<tr{klass}>{''.join(cells)}</tr>")
    return sortable_table("attacks", ATTACK_COLUMNS, body, text=_TEXT, empty="no attack results")


def _params_text(params: Any) -> str:
    if not isinstance(params, Mapping) or not params:
        return ""
    return ", ".join(f"{k}={v}" for k, v in params.items())


def _detail_html(index: int, row: Mapping[str, Any]) -> str:
    name = label(row)
    attacks = mappings(row.get("attacks"))
    adaptive = sum(1 for a in attacks if attack_is_adaptive(row, a))
    best = best_attack(row) or {}
    summary = (
        f"{name} — {len(attacks)} attack{'s' if len(attacks) != 1 else ''}, {adaptive} adaptive"
        + (
            f"; strongest {best.get('attack')} at TPR@0.1%FPR {percent(best_tpr(row))}"
            if best.get("attack") is not None
            else ""
        )
    )
    changes = row.get("changes")
    facts = [
        f"spec {row.get('spec')}" if row.get("spec") else None,
        f"parameters {_params_text(row.get('params'))}"
        if _params_text(row.get("params"))
        else None,
        f"changes {', '.join(map(str, changes))}"
        if isinstance(changes, (list, tuple)) and changes
        else None,
        f"serves {row.get('serves')}" if row.get("serves") else None,
        f"certified ε {fmt(row.get('epsilon'))}"
        if number(row.get("epsilon")) is not None
        else None,
        f"paper: {row.get('paper')}" if row.get("paper") else None,
    ]
    notes = [str(row.get("note"))] if row.get("note") else []
    excluded = exclusion(row)
    if excluded and not any(excluded in n for n in notes):
        notes.append(excluded)
    parts = [
        f'<details id="{e(_slug(index, name))}"><summary>{e(summary)}</summary>',
        f'<p class="meta">{e(" · ".join(f for f in facts if f))}</p>',
        *(f'<p class="small">{e(n)}</p>' for n in notes),
        attack_detail_table(row),
        "</details>",
    ]
    return "\n".join(p for p in parts if p)


def gate_statement(rows: list[Mapping[str, Any]], threshold: float | None) -> str:
    """The release gate in one sentence: which defended models pass at `threshold`, and why
    each other one fails; or how to ask for a gate when there is no threshold."""
    if threshold is None:
        return (
            "No release threshold given: pass --max-tpr-at-0.1 to state which defended models "
            "may be released."
        )
    passed, failed = [], []
    for row in rows:
        ok, why = gate_decision(row, threshold)
        (passed if ok else failed).append(label(row) if ok else f"{label(row)} ({why})")
    return (
        f"A defended model passes when its strongest attack finds at most {percent(threshold)} "
        "of members at 0.1% FPR and at least one attack that knew the defence was run on it. "
        f"With TPR@0.1%FPR ≤ {percent(threshold)}: pass: {', '.join(passed) or 'none'}; "
        f"fail: {', '.join(failed) or 'none'}."
    )


@register_section
class DefensesSection:
    """Defences against membership inference: frontier, gate, table and per-defence attacks."""

    key = "defenses"
    title = "Defences"
    order = 20

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload has a defences block."""
        return isinstance(payload.get("defenses"), Mapping)

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """Reading guide, frontier picture, gate, warnings, the table, then each defence."""
        block = section_block(payload, "defenses")
        rows = mappings(block.get("rows"))
        threshold, bad = _threshold(block)
        meta = [
            f"dataset: {block.get('dataset')}" if block.get("dataset") else None,
            f"model: {block.get('model')}" if block.get("model") else None,
            f"undefended access: {block.get('access')}" if block.get("access") else None,
            f"{len(rows)} defence setting{'s' if len(rows) != 1 else ''}",
        ]
        images = block.get("images")
        images = images if isinstance(images, Mapping) else {}
        picture = figure(
            folder,
            images.get("frontier"),
            "Test accuracy against the strongest attack's TPR at 0.1% FPR and against the "
            "largest AUC, one labelled point per defence, Pareto set ringed",
            "Privacy–utility frontier of the defences: up is more accurate, left leaks less "
            "(click for full size)",
            "frontier",
        )
        gate_text = gate_statement(rows, threshold)
        if bad:
            gate_text = f"{bad[0].upper()}{bad[1:]}. {gate_text}"
        lonely = [label(r) for r in rows if r.get("kind") != "none" and not adaptively_attacked(r)]
        warnings = ""
        if lonely:
            warnings = (
                '<div class="note warn"><strong>Not attacked adaptively:</strong> '
                f"{e(', '.join(lonely))}. Every attack on "
                f"{'it' if len(lonely) == 1 else 'them'} ignored the defence, so the numbers "
                "say nothing about an attacker who knows it; the gate fails "
                f"{'it' if len(lonely) == 1 else 'them'}.</div>"
            )
        excluded = [f"{label(r)}: {why}" for r in rows if (why := exclusion(r))]
        parts = [
            f'<section id="{self.key}">',
            f"<h2>{e(self.title)}</h2>",
            f'<p class="meta">{e(" · ".join(m for m in meta if m))}</p>',
            f"<p>{e(READING_GUIDE)}</p>",
            picture,
            f'<div class="note gate" id="release-gate"><strong>Release gate.</strong> '
            f"{e(gate_text)}</div>",
            warnings,
            f'<p class="small">{e("; ".join(excluded))}.</p>' if excluded else "",
            defense_table(rows, threshold),
            "<h3>Every attack on each defence</h3>" if rows else "",
            *(_detail_html(i, r) for i, r in enumerate(rows)),
            "</section>",
        ]
        return "\n".join(p for p in parts if p)

    css = """
#defenses table.sortable th { cursor: pointer; }
#defenses table.sortable th[aria-sort="descending"]::after { content: " ▼"; }
#defenses table.sortable th[aria-sort="ascending"]::after { content: " ▲"; }
table.defenses tr.pareto td { font-weight: 600; }
table.defenses tr.not-adaptive td:first-child::after { content: " ⚠"; color: #b06000; }
table.defenses td.gate-pass { color: #1b7f3b; font-weight: 700; }
table.defenses td.gate-fail { color: #a40000; font-weight: 700; }
table.attacks tr.adaptive td:nth-child(2) { color: #1b5e9b; font-weight: 600; }
.note.gate { border-left-color: #b06000; }
figure.frontier img { width: auto; max-width: 100%; }
"""
