"""The membership-inference section: a verdict per target, the privacy–utility plot, what the
ε lower bound means, and per target a sortable table, a log-log ROC, the most exposed
examples and the informative score histograms."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privacylab.report._format import (
    MISSING,
    e,
    epsilon_text,
    figure,
    fmt,
    fmt_int,
    mappings,
    num_cell,
    number,
    percent,
    sortable_table,
    target_epsilon,
    text_cell,
)
from privacylab.report.sections import register_section
from privacylab.report.verdict import (
    DEFAULT_VERDICT_THRESHOLD,
    VERDICT_FPR,
    strength_key,
    target_verdict,
)

TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("attack", "attack", "the attack's name"),
    ("access", "access", "what the attack may query"),
    ("tpr_at_01pct_fpr", "TPR@0.1%FPR", "members found while wrongly accusing 0.1% (sorted)"),
    ("tpr_at_1pct_fpr", "TPR@1%FPR", "members found while wrongly accusing 1%"),
    ("auc", "AUC", "area under the ROC curve (0.5 = chance)"),
    ("balanced_accuracy", "bal. acc.", "balanced accuracy"),
    ("epsilon_lower_bound", "ε lower bound", "see 'What the ε lower bound means'"),
    ("examples", "examples", "candidates scored (label-only attacks: a balanced subsample)"),
    ("queries", "queries", "queries sent to the target"),
    ("seconds", "seconds", "wall time of the attack"),
)
"""(key, header, tooltip) of each column of a target's attack table."""

_TEXT = {"attack", "access"}

EPSILON_NOTE = (
    "An attack's ε lower bound is the smallest ε that any (ε, δ)-differentially-private "
    "training would need in order to allow the attack's true and false positive rates at one "
    "threshold, with 95% Clopper–Pearson confidence (Kairouz et al. 2015; Jagielski et al. "
    "2020; Nasr et al. 2021). It speaks about the guarantee, not about the risk to "
    "individuals: it comes from a single operating point — the attack's own threshold, or, for "
    "an attack without one, the best threshold on a held-out half of the examples — usually at "
    "a moderate false positive rate. A threshold-free attack such as gap (“member if "
    "classified correctly”) can prove a large ε from, say, 100% of members against 3% of "
    "non-members classified correctly, while it cannot single out any member at 1% FPR. That "
    "is why the verdict and every ordering here use TPR at low FPR and never the ε lower bound. "
    "For a DP target, a bound above the claimed ε (a red row) must not happen: it points to a "
    "bug in training or accounting."
)


def _slug(name: str) -> str:
    return "target-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "x")


def _threshold(payload: Mapping[str, Any]) -> float:
    value = number(payload.get("verdict_threshold"))
    return DEFAULT_VERDICT_THRESHOLD if value is None else value


def _verdict_box(target: Mapping[str, Any], threshold: float) -> str:
    name = str(target.get("name", MISSING))
    verdict = target_verdict(target, threshold)
    facts = f"ε = {epsilon_text(target)} · test accuracy {fmt(target.get('test_accuracy'))}"
    confidence = percent(verdict["confidence"])
    rule = (
        f"Fails when some attack finds more than {percent(threshold)} of members at "
        f"{percent(VERDICT_FPR)} FPR (chance: {percent(VERDICT_FPR)}) with {confidence} "
        "confidence over all attacks."
    )
    link = f'<a href="#{e(_slug(name))}">details</a>'
    if verdict["leaks"] is None:
        return (
            f'<div class="verdict unknown"><p class="head"><strong>{e(name)}</strong> '
            f'<span class="badge">NO RESULT</span></p><p>No attack result to decide on.</p>'
            f'<p class="small">{e(facts)} · {link}</p></div>'
        )
    attack = str(verdict["attack"])
    found = percent(verdict["tpr_at_01pct_fpr"])
    low = percent(verdict["tpr_lower_bound"])
    at_one = percent(verdict["tpr_at_1pct_fpr"])
    members = verdict["members"]
    scored = f"{fmt_int(members)} members scored" if members is not None else "members scored"
    fpr = percent(VERDICT_FPR)
    if verdict["leaks"]:
        klass, badge = "leak", "FAIL — leaks membership"
        say = (
            f"An attacker can identify <b>{e(found)}</b> of members while wrongly accusing only "
            f"{e(fpr)} of non-members (attack: {e(attack)}; at least {e(low)} with "
            f"{e(confidence)} confidence)."
        )
    else:
        klass, badge = "pass", "PASS — below threshold"
        say = (
            f"No attack identifies significantly more than {e(percent(threshold))} of members "
            f"at {e(fpr)} FPR. The most convincing, {e(attack)}, finds <b>{e(found)}</b> "
            f"(lower confidence bound {e(low)})."
        )
    more = (
        f"Accepting 1% false accusations, {e(attack)} finds {e(at_one)} of members "
        f"(AUC {e(fmt(verdict['auc']))}; {e(scored)})."
    )
    return (
        f'<div class="verdict {klass}"><p class="head"><strong>{e(name)}</strong> '
        f'<span class="badge">{e(badge)}</span></p><p>{say}</p><p>{more}</p>'
        f'<p class="small">{e(facts)}. {e(rule)} {link}</p></div>'
    )


def _cell(key: str, attack: Mapping[str, Any]) -> str:
    value = attack.get(key)
    if key in _TEXT:
        return text_cell(value)
    if key == "queries" and number(value) == 0 and attack.get("access") == "white-box":
        tip = "white-box: reads the model's weights and gradients, which are not counted queries"
        return num_cell(value, "0 (weights)", title=tip)
    if key in {"queries", "examples"}:
        return num_cell(value, fmt_int(value))
    if key == "seconds":
        return num_cell(value, fmt(value, 2))
    return num_cell(value)


def attack_table(target: Mapping[str, Any], threshold: float = DEFAULT_VERDICT_THRESHOLD) -> str:
    """A target's attacks as a sortable table, strongest first (TPR at 0.1% FPR, then TPR at
    1% FPR, then AUC); the verdict's attack is starred, rows whose ε lower bound exceeds the
    target's claimed ε are red. Reads fine without scripts: rows are pre-sorted."""
    attacks = sorted(mappings(target.get("attacks")), key=strength_key, reverse=True)
    starred = target_verdict(target, threshold)["attack"]
    epsilon = target_epsilon(target)
    body = []
    for attack in attacks:
        cells = "".join(_cell(key, attack) for key, _, _ in TABLE_COLUMNS)
        bound = number(attack.get("epsilon_lower_bound"))
        classes = []
        title = ""
        if starred is not None and attack.get("attack") == starred:
            classes.append("strongest")
            title = "the verdict's attack: largest lower confidence bound on TPR at 0.1% FPR"
            starred = None
        if epsilon is not None and bound is not None and bound > epsilon:
            classes.append("violation")
            title = "ε lower bound exceeds the claimed ε"
        attrs = f' class="{" ".join(classes)}"' if classes else ""
        attrs += f' title="{e(title)}"' if title else ""
        body.append(f"<tr{attrs}>{cells}</tr>")
    return sortable_table("", TABLE_COLUMNS, body, text=_TEXT, empty="no results")


def _score(value: Any) -> str:
    x = number(value)
    return MISSING if x is None else f"{x:.4g}"


def _exposed_html(target: Mapping[str, Any], threshold: float) -> str:
    risk = target.get("risk")
    if not isinstance(risk, Mapping):
        return ""
    rows = mappings(risk.get("most_exposed"))
    if not rows:
        return ""
    has_index = any(r.get("index") is not None for r in rows)
    lines = (
        ("rank", [str(i) for i in range(1, len(rows) + 1)]),
        (
            "dataset row" if has_index else "candidate #",
            [fmt_int(r.get("index") if has_index else r.get("candidate")) for r in rows],
        ),
        ("label", [fmt_int(r.get("label")) for r in rows]),
        ("risk", [fmt(r.get("risk"), 4) for r in rows]),
        ("score", [_score(r.get("score")) for r in rows]),
    )
    body = "".join(
        f'<tr><th scope="row" class="text">{e(head)}</th>'
        + "".join(f"<td>{e(v)}</td>" for v in values)
        + "</tr>"
        for head, values in lines
    )
    where = "its row in the dataset" if has_index else "its position among the candidates"
    note = (
        f"The {len(rows)} training members the attack {risk.get('attack', MISSING)} finds most "
        f"exposed ({where}); risk is the percentile rank of the member's score among all "
        "candidates (1 = the most confident “member” guess). results.json holds the risk of "
        "every candidate under targets[].risk."
    )
    if target_verdict(target, threshold)["leaks"] is False:
        note += (
            " This target passes: these are the attack's most confident guesses, not evidence "
            "that these examples leak."
        )
    return (
        f'<h4>Most exposed examples</h4>\n<p class="small">{e(note)}</p>\n'
        f'<table class="exposed"><tbody>{body}</tbody></table>'
    )


def _histograms_html(folder: Path, target: Mapping[str, Any]) -> str:
    name = str(target.get("name", MISSING))
    images = target.get("images")
    images = images if isinstance(images, Mapping) else {}
    histograms = images.get("histograms")
    histograms = histograms if isinstance(histograms, Mapping) else {}
    figures = [
        figure(
            folder,
            file,
            f"Histogram of {attack} scores for members and non-members of target {name}",
            f"{attack} on {name}",
            "small",
        )
        for attack, file in histograms.items()
    ]
    figures = [f for f in figures if f]
    skipped = [
        str(a.get("attack"))
        for a in mappings(target.get("attacks"))
        if a.get("attack") not in histograms
    ]
    if not figures and not skipped:
        return ""
    summary = f"Score histograms ({len(figures)}, log-scale counts)"
    note = (
        f"Left out as uninformative (few distinct scores or one spike): {', '.join(skipped)}."
        if skipped and histograms
        else ""
    )
    return (
        f"<details><summary>{e(summary)}</summary>\n"
        + (f'<p class="small">{e(note)}</p>\n' if note else "")
        + "\n".join(figures)
        + "\n</details>"
    )


def _target_html(folder: Path, target: Mapping[str, Any], threshold: float) -> str:
    name = str(target.get("name", MISSING))
    parts = [f'<section id="{e(_slug(name))}">\n<h3>{e(name)}</h3>']
    accountant = target.get("accountant")
    members = target.get("members")
    meta = [
        f"ε = {epsilon_text(target)}",
        f"accountant: {accountant}" if accountant else None,
        f"train accuracy {fmt(target.get('train_accuracy'))}",
        f"test accuracy {fmt(target.get('test_accuracy'))}",
        f"{fmt_int(members)} members / {fmt_int(target.get('nonmembers'))} non-members"
        if members is not None
        else None,
        f"{fmt_int(target.get('references'))} reference models"
        if target.get("references") is not None
        else None,
    ]
    parts.append(f'<p class="meta">{e(" · ".join(m for m in meta if m))}</p>')
    parts.append(attack_table(target, threshold))
    images = target.get("images")
    images = images if isinstance(images, Mapping) else {}
    roc = figure(
        folder,
        images.get("roc"),
        f"Log-log ROC curves of every membership attack on target {name}",
        f"ROC curves of {name}, log-log; legend ordered by TPR at 0.1% FPR (click for full size)",
        "roc",
    )
    if roc:
        parts.append(roc)
    parts.append(_exposed_html(target, threshold))
    parts.append(_histograms_html(folder, target))
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


@register_section
class MembershipSection:
    """Membership inference against every target of the run."""

    key = "membership"
    title = "Membership inference"
    order = 10

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload has targets."""
        return bool(mappings(payload.get("targets")))

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """Verdicts first, then the privacy–utility plot, the ε note and each target."""
        targets = mappings(payload.get("targets"))
        threshold = _threshold(payload)
        boxes = "\n".join(_verdict_box(t, threshold) for t in targets)
        violations = sum(
            1
            for t in targets
            for a in mappings(t.get("attacks"))
            if target_epsilon(t) is not None
            and number(a.get("epsilon_lower_bound")) is not None
            and number(a.get("epsilon_lower_bound")) > target_epsilon(t)  # type: ignore[operator]
        )
        note = EPSILON_NOTE
        if violations:
            note += f" {violations} attack(s) exceed the claimed ε."
        images = payload.get("images")
        images = images if isinstance(images, Mapping) else {}
        utility = figure(
            folder,
            images.get("privacy_utility"),
            "Test accuracy and the strongest attack's TPR at 0.1% FPR against ε",
            "Privacy–utility: what each ε costs in accuracy and buys in protection",
            "utility",
        )
        parts = [
            f'<section id="{self.key}">',
            f"<h2>{e(self.title)}</h2>",
            '<h3 class="sr">Verdict</h3>',
            f'<div class="verdicts">\n{boxes}\n</div>',
            utility,
            f'<div class="note{" warn" if violations else ""}" id="epsilon-lower-bound">'
            f"<strong>What the ε lower bound means.</strong> {e(note)}</div>",
            *(_target_html(folder, t, threshold) for t in targets),
            "</section>",
        ]
        return "\n".join(p for p in parts if p)

    css = """
.verdicts { display: flex; flex-wrap: wrap; gap: 0.8rem; margin: 0.8rem 0 1.2rem; }
.verdict { flex: 1 1 20rem; border: 2px solid #888; border-radius: 6px; padding: 0.5rem 0.9rem;
           background: #f6f6f6; }
.verdict p { margin: 0.35rem 0; }
.verdict .head { font-size: 1.1rem; }
.verdict .badge { display: inline-block; margin-left: 0.4rem; padding: 0.05rem 0.5rem;
                  border-radius: 4px; color: #fff; background: #666; font-size: 0.9rem; }
.verdict.leak { border-color: #b00020; background: #fdecee; }
.verdict.leak .badge { background: #b00020; }
.verdict.pass { border-color: #1b7f3b; background: #eaf6ee; }
.verdict.pass .badge { background: #1b7f3b; }
tr.strongest td { font-weight: 600; }
tr.strongest td:first-child::before { content: "★ "; color: #b06000; }
table.sortable th { cursor: pointer; }
table.sortable th[aria-sort="descending"]::after { content: " ▼"; }
table.sortable th[aria-sort="ascending"]::after { content: " ▲"; }
figure.roc img { width: auto; max-width: 100%; }
figure.utility img { width: auto; max-width: 100%; }
figure.small img { width: auto; max-width: 27rem; }
.sr { position: absolute; left: -9999px; }
"""
