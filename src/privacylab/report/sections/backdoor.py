"""The backdoor section: BadNets (Gu et al. 2017), the trojaning attack (Liu et al. NDSS'18),
poisoning and backdooring contrastive models (Carlini & Terzis ICLR'22), and the defences
that look for them (Neural Cleanse, STRIP, activation clustering, spectral signatures,
fine-pruning).

Its page anchor is `#backdoor`. Renders ``payload["backdoor"]`` (what
`privacylab.report.backdoor.add_backdoor_run` merges): a one-line verdict, then pictures
before numbers — per attack its trigger enlarged, a clean test image beside its triggered
copy and, for the trojan, its reverse-engineered training images; per Neural Cleanse run
the reversed mask of every class with the flagged one outlined and the anomaly index per
class against the threshold 2 — then the attacks and defences tables, the benchmark curves
(ASR and z-score against the number of poisoned pairs; ASR against the poison rate with and
without DP-SGD), the trojan table with the seed's columns, our defences table beside
BackdoorBench's published CIFAR-10 numbers, and any other benchmark table.
"""

from __future__ import annotations

import json
import math
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
    percent,
    section_block,
    sortable_table,
    text_cell,
)
from privacylab.report.backdoor import (
    NC_METHOD,
    NC_THRESHOLD,
    PUBLISHED,
    PUBLISHED_SOURCE,
    attack_label,
    published_outcome,
    verdict,
)
from privacylab.report.sections import register_section

__all__ = [
    "ATTACK_COLUMNS",
    "DEFENSE_COLUMNS",
    "TROJAN_COLUMNS",
    "BackdoorSection",
    "attacks_table",
    "defenses_table",
    "generic_table",
    "published_table",
    "trojan_run_rows",
    "trojan_table",
]

ATTACK_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run", "run", "the attack's folder (hover: its full path)"),
    ("method", "method", "badnets, trojan, clip-poison or clip-backdoor"),
    ("trigger", "trigger", "the trigger's spec (shape:size@position[:transparency])"),
    ("poisons", "poisons (rate)", "poisoned rows injected and their share of X ∪ P"),
    (
        "clean_accuracy",
        "clean acc. (clean model)",
        "the attacked model on clean test rows; in brackets the clean model's",
    ),
    (
        "asr",
        "ASR (clean model)",
        "triggered non-target test inputs classified as the target; in brackets the same "
        "trigger on the clean model",
    ),
    ("z_score", "z-score", "Carlini & Terzis's backdoor z-score (contrastive backdoors)"),
    ("epsilon", "ε", "DP-SGD's ε of the victim's training (∞: non-private)"),
    ("seconds", "seconds", "wall-clock time of the attack"),
)
"""(key, header, tooltip) of the attacks table."""

DEFENSE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run", "model", "the attacked model's folder"),
    ("method", "defence", "the defence run on it"),
    ("detected", "detected", "whether the defence judged the model backdoored"),
    ("flagged", "flagged class", "the class named as the backdoor's target (✓: the true target)"),
    ("anomaly_index", "anomaly index", "Neural Cleanse's MAD anomaly index (flag above 2)"),
    ("asr", "ASR before → after", "attack success rate before and after the mitigation"),
    ("accuracy", "accuracy before → after", "clean test accuracy before and after"),
    ("seconds", "seconds", "wall-clock time of the defence"),
)
"""(key, header, tooltip) of the defences table."""

TROJAN_COLUMNS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("Orig", ("orig", "ori", "original"), "clean test accuracy of the trojaned model"),
    ("Orig Dec", ("origdec", "oridec", "dec"), "accuracy lost against the original model"),
    ("Orig+Tri", ("origtri", "oritri", "origplustri"), "test inputs with the trigger → target"),
    ("Ext+Tri", ("exttri", "extplustri"), "external inputs with the trigger → target"),
)
"""The seed's trojan table columns (Liu et al. 2018, Table 3) and the row keys read for each
(lower-cased, letters only: "orig_tri", "Orig+Tri" and "orig+tri" are one key)."""

_LABEL_KEYS = ("row", "label", "setting", "variant", "name")

GUIDE = (
    "A backdoor makes a model answer the attacker's target class whenever a trigger is "
    "present while behaving normally otherwise. ASR counts triggered test inputs of other "
    "classes classified as the target; the clean model's ASR with the same trigger shows what "
    "the patch does without a backdoor. Neural Cleanse reverse-engineers, per class, the "
    "smallest mask that sends every input there: a backdoor's target needs a much smaller mask "
    f"than the others, and a class whose anomaly index exceeds {NC_THRESHOLD:g} below the "
    "median is flagged."
)


def _short(folder: Any) -> str:
    return Path(str(folder)).name or str(folder)


def _percent_pair(value: Any, base: Any) -> str:
    if number(value) is None:
        return MISSING
    return percent(value) + ("" if number(base) is None else f" ({percent(base)})")


def _epsilon_cell(entry: Mapping[str, Any]) -> str:
    epsilon = number(entry.get("epsilon"))
    if epsilon is None or math.isinf(epsilon):
        return num_cell(float("inf"), "∞")
    delta = number(entry.get("delta"))
    text = f"{epsilon:.3g}" + ("" if delta is None else f" (δ={delta:.0e})")
    bound = number(entry.get("asr_bound"))
    title = (
        ""
        if bound is None
        else f"group-privacy bound on the ASR for its {fmt_int(entry.get('poisons'))} poisons: "
        f"{percent(min(1.0, bound))} (Jagielski et al. 2020, Lemma 1)"
    )
    return num_cell(epsilon, text, title=title)


def _trigger_spec(entry: Mapping[str, Any]) -> str | None:
    trigger = entry.get("trigger")
    spec = trigger.get("spec") if isinstance(trigger, Mapping) else trigger
    if spec is None:
        return None
    learned = isinstance(trigger, Mapping) and trigger.get("learned")
    return str(spec) + (" (learned)" if learned else "")


def attacks_table(attacks: Sequence[Mapping[str, Any]]) -> str:
    """One sortable row per attack entry (`ATTACK_COLUMNS`)."""
    body = []
    for a in attacks:
        poisons = number(a.get("poisons"))
        cells = [
            text_cell(a.get("label") or _short(a.get("folder")), title=str(a.get("folder"))),
            text_cell(a.get("method")),
            text_cell(_trigger_spec(a)),
            num_cell(
                a.get("poison_rate"),
                MISSING if poisons is None else f"{int(poisons)} ({percent(a.get('poison_rate'))})",
            ),
            num_cell(
                a.get("clean_accuracy"),
                _percent_pair(a.get("clean_accuracy"), a.get("baseline_accuracy")),
            ),
            num_cell(a.get("asr"), _percent_pair(a.get("asr"), a.get("baseline_asr"))),
            num_cell(a.get("z_score"), fmt(a.get("z_score"), 2)),
            _epsilon_cell(a),
            num_cell(a.get("seconds"), fmt(a.get("seconds"), 1)),
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return sortable_table(
        "backdoor-attacks",
        ATTACK_COLUMNS,
        body,
        text={"run", "method", "trigger"},
        empty="no attack",
    )


def _flagged_cell(run: Mapping[str, Any]) -> str:
    flagged, target = run.get("flagged_class"), run.get("target_class")
    if flagged is None:
        return text_cell(None)
    if target is None:
        return num_cell(flagged, str(flagged))
    if flagged == target:
        return num_cell(flagged, f"{flagged} ✓", title="the attack's target class")
    return num_cell(flagged, f"{flagged} ✗ (target {target})", title="not the target class")


def _before_after(run: Mapping[str, Any], key: str) -> str:
    before = run.get("before") if isinstance(run.get("before"), Mapping) else {}
    after = run.get("after") if isinstance(run.get("after"), Mapping) else {}
    b, a = number(before.get(key)), number(after.get(key))
    if b is None and a is None:
        return num_cell(None)
    return num_cell(a if a is not None else b, f"{percent(b)} → {percent(a)}")


def _yes_no(value: Any) -> str:
    return MISSING if value is None else ("yes" if value else "no")


def defenses_table(runs: Sequence[Mapping[str, Any]]) -> str:
    """One sortable row per defence run (`DEFENSE_COLUMNS`); the flagged class marked ✓ when
    it is the attack's target."""
    body = []
    for run in runs:
        cells = [
            text_cell(_short(run.get("folder")), title=str(run.get("folder"))),
            text_cell(run.get("method")),
            text_cell(_yes_no(run.get("detected"))),
            _flagged_cell(run),
            num_cell(run.get("anomaly_index"), fmt(run.get("anomaly_index"), 2)),
            _before_after(run, "asr"),
            _before_after(run, "accuracy"),
            num_cell(run.get("seconds"), fmt(run.get("seconds"), 1)),
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return sortable_table(
        "backdoor-defenses",
        DEFENSE_COLUMNS,
        body,
        text={"run", "method", "detected"},
        empty="no defence",
    )


def _plain(key: Any) -> str:
    return "".join(ch for ch in str(key).lower() if ch.isalpha())


_RATE_WORDS = ("asr", "accuracy", "rate", "success", "fpr", "frr", "far", "precision", "recall")
"""A numeric column whose key holds one of these words and whose values lie in [0, 1] is shown
as percentages."""


def _column_kind(key: str, rows: Sequence[Mapping[str, Any]]) -> str:
    if key.lower() in ("epsilon", "eps", "ε"):
        return "epsilon"
    values = [r.get(key) for r in rows]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return "text"
    if any(w in key.lower() for w in _RATE_WORDS) and all(0 <= v <= 1 for v in numbers):
        return "percent"
    return "float" if any(isinstance(v, float) for v in numbers) else "int"


def _value_cell(value: Any, kind: str = "") -> str:
    if kind == "epsilon" and (value is None or isinstance(value, (int, float))):
        x = number(value)
        if x is None or math.isinf(x):
            return num_cell(float("inf"), "∞", title="non-private")
        return num_cell(x, f"{x:.3g}")
    if isinstance(value, bool) or value is None:
        return text_cell(None if value is None else _yes_no(value))
    if isinstance(value, (int, float)) and kind == "percent":
        return num_cell(value, percent(value))
    if isinstance(value, int) and kind != "float":
        return num_cell(value, fmt_int(value))
    if isinstance(value, (int, float)):
        return num_cell(value, fmt(value, 3))
    if isinstance(value, (Mapping, list, tuple)):
        text = json.dumps(value, ensure_ascii=False, default=str)
        return text_cell(text if len(text) <= 80 else text[:79] + "…", title=text[:500])
    return text_cell(value)


def generic_table(name: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """A benchmark table as it comes: one column per key (in first-seen order), numbers
    formatted (rates as percentages, an "epsilon" column with "∞" for None), nested values
    as short JSON, every text escaped."""
    keys: list[str] = []
    for row in rows:
        keys += [str(k) for k in row if str(k) not in keys]
    columns = [(k, k.replace("_", " ")) for k in keys]
    kinds = {k: _column_kind(k, rows) for k in keys}
    text = {k for k in keys if kinds[k] == "text"}
    body = ["<tr>" + "".join(_value_cell(r.get(k), kinds[k]) for k in keys) + "</tr>" for r in rows]
    return sortable_table(f"backdoor-table-{name}", columns, body, text=text, empty="no rows")


def _flat_trojan_row(row: Mapping[str, Any]) -> tuple[dict[str, Any], Mapping[str, Any]]:
    """(the row with "phase_seconds" spread into one column per phase and without "seed",
    the seed's numbers for it: a "seed" mapping, in percent)."""
    flat = {str(k): v for k, v in row.items() if k not in ("phase_seconds", "seed")}
    phases = row.get("phase_seconds")
    if isinstance(phases, Mapping):
        flat.update({name: phases.get(key) for key, name in _PHASES})
    seed = row.get("seed")
    return flat, seed if isinstance(seed, Mapping) else {}


def trojan_table(rows: Sequence[Mapping[str, Any]], css: str = "backdoor-trojan") -> str:
    """The trojan table with the seed's columns (Orig, Orig Dec, Orig+Tri, Ext+Tri; Liu et
    al. 2018, Sec. VI tables) as percentages after the row's label, each followed in brackets
    by the seed's face-recognition number where the row carries it (a "seed" mapping in
    percent, as benchmarks/trojan_table.py gives it), then every other key ("phase_seconds"
    as one column per phase)."""
    split = [_flat_trojan_row(r) for r in rows]
    flats = [f for f, _ in split]
    plain_keys = {_plain(k) for _, keys, _ in TROJAN_COLUMNS for k in keys}
    extra: list[str] = []
    for row in flats:
        extra += [
            k
            for k in row
            if _plain(k) not in plain_keys and k not in _LABEL_KEYS and k not in extra
        ]
    kinds = {k: _column_kind(k, flats) for k in extra}
    seeded = any(seed for _, seed in split)
    columns = [("row", "row", "what the row varies")]
    columns += [
        (name, name, tip + ("; in brackets the seed's face-recognition number" if seeded else ""))
        for name, _, tip in TROJAN_COLUMNS
    ]
    columns += [(k, k.replace("_", " "), "") for k in extra]
    body = []
    for row, seed in split:
        by_plain = {_plain(k): v for k, v in row.items()}
        seed_plain = {_plain(k): v for k, v in seed.items()}
        label = next((row[k] for k in _LABEL_KEYS if row.get(k) is not None), None)
        cells = [text_cell(label)]
        for _, keys, _ in TROJAN_COLUMNS:
            value = next((by_plain[k] for k in keys if k in by_plain), None)
            published = number(next((seed_plain[k] for k in keys if k in seed_plain), None))
            text = percent(value) + ("" if published is None else f" ({published:g}%)")
            cells.append(num_cell(value, text))
        cells += [_value_cell(row.get(k), kinds[k]) for k in extra]
        body.append("<tr>" + "".join(cells) + "</tr>")
    text = {"row"} | {k for k in extra if kinds[k] == "text"}
    return sortable_table(css, columns, body, text=text, empty="no rows")


PUBLISHED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("defense", "defence", "the defence BackdoorBench ran"),
    ("poison_rate", "poison rate", "BadNets' poison rate"),
    ("accuracy", "accuracy before → after", "published clean test accuracy"),
    ("asr", "ASR before → after", "published attack success rate without and with the defence"),
    ("outcome", "reading", "removes: ASR ≤ 10% after; fails: at least half the ASR kept"),
)


def published_table() -> str:
    """BackdoorBench's published CIFAR-10 numbers (`PUBLISHED`), each defence beside the
    attacked model of its poison rate, labelled as published and not measured here."""
    attacked = {r["poison_rate"]: r for r in PUBLISHED if r["defense"] == "none"}
    body = []
    for row in PUBLISHED:
        base = attacked.get(row["poison_rate"])
        if row["defense"] == "none" or base is None:
            continue
        body.append(
            "<tr>"
            + text_cell(row["defense"])
            + num_cell(row["poison_rate"], percent(row["poison_rate"]))
            + num_cell(row["accuracy"], f"{percent(base['accuracy'])} → {percent(row['accuracy'])}")
            + num_cell(row["asr"], f"{percent(base['asr'])} → {percent(row['asr'])}")
            + text_cell(published_outcome(base["asr"], row["asr"]))
            + "</tr>"
        )
    return (
        f'<p class="small published">Published, CIFAR-10, PreAct-ResNet18 — not measured here. '
        f"Source: {e(PUBLISHED_SOURCE)}.</p>\n"
        + sortable_table("backdoor-published", PUBLISHED_COLUMNS, body, text={"defense", "outcome"})
    )


_PHASES = (("trigger_generation", "trigger s"), ("data_generation", "data s"),
           ("retraining", "retrain s"))  # fmt: skip
_TROJAN_FACTS = ("selection", "neurons", "mask", "mask_area", "transparency", "denoise")


def trojan_run_rows(attacks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The trojan attack runs as rows of the seed's table: the run's label, Orig, Orig Dec,
    Orig+Tri, Ext+Tri from its details (`run_trojan`), what it varied (selection, neurons,
    mask shape and area, transparency, denoise; arrays left out) and the seconds of each
    phase."""
    rows = []
    for a in attacks:
        details = a.get("details") if isinstance(a.get("details"), Mapping) else {}
        if a.get("method") != "trojan" or not any(
            k in details for k in ("orig", "orig_dec", "orig_tri", "ext_tri")
        ):
            continue
        row: dict[str, Any] = {"row": attack_label(a)}
        row.update({k: details.get(k) for k in ("orig", "orig_dec", "orig_tri", "ext_tri")})
        row.update(
            {
                k: details[k]
                for k in _TROJAN_FACTS
                if k in details and (k == "neurons" or not isinstance(details[k], (list, Mapping)))
            }
        )
        if isinstance(details.get("phase_seconds"), Mapping):
            row["phase_seconds"] = details["phase_seconds"]
        rows.append(row)
    return rows


def _images(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    images = entry.get("images")
    return images if isinstance(images, Mapping) else {}


def _attack_pictures(folder: Path, entry: Mapping[str, Any]) -> str:
    images = _images(entry)
    method = str(entry.get("method") or "")
    label = attack_label(entry)
    spec = _trigger_spec(entry) or ""
    if method == "trojan":
        what = "generated trigger"
    elif method.startswith("clip-"):
        what = "patch"
    else:
        what = "trigger"
    target = entry.get("target_class")
    parts = [
        figure(
            folder,
            images.get("trigger"),
            f"the {what} of {label}",
            f"{what} {spec}".strip(),
            "backdoor-image",
        ),
        figure(
            folder,
            images.get("clean_example"),
            "a clean test image",
            "clean test image",
            "backdoor-image",
        ),
        figure(
            folder,
            images.get("triggered_example"),
            "the same image with the trigger",
            "with the trigger" + ("" if target is None else f" (target class {target})"),
            "backdoor-image",
        ),
    ]
    count = images.get("inverted_count")
    parts.append(
        figure(
            folder,
            images.get("inverted"),
            "training images reverse-engineered from the model",
            "reverse-engineered training images"
            + ("" if number(count) is None else f" (first {fmt_int(count)})"),
        )
    )
    shown = [p for p in parts if p]
    if not shown:
        return ""
    return (
        f'<h3 class="backdoor-run">{e(label)}</h3>\n'
        f'<div class="backdoor-pictures">{"".join(shown)}</div>'
    )


def _nc_pictures(folder: Path, run: Mapping[str, Any]) -> str:
    images = _images(run)
    flagged, target = run.get("flagged_class"), run.get("target_class")
    said = "no class flagged" if flagged is None else f"class {flagged} flagged"
    if flagged is not None and target is not None:
        said += " (the target)" if flagged == target else f" (the target is {target})"
    parts = [
        figure(
            folder,
            images.get("masks"),
            "reversed trigger mask of every class, the flagged one outlined",
            f"Reversed masks per class: {said}",
        ),
        figure(
            folder,
            images.get("flagged_trigger"),
            f"the reversed trigger of class {flagged}",
            f"reversed trigger of class {flagged} (mask × pattern)",
            "backdoor-image",
        ),
        figure(
            folder,
            images.get("anomaly"),
            f"anomaly index per class with the threshold {NC_THRESHOLD:g}",
            f"Anomaly index per class (threshold {NC_THRESHOLD:g}, dashed)",
        ),
    ]
    shown = [p for p in parts if p]
    if not shown:
        return ""
    return (
        f'<h3 class="backdoor-run">Neural Cleanse on {e(_short(run.get("folder")))}</h3>\n'
        f'<div class="backdoor-pictures">{"".join(shown)}</div>'
    )


@register_section
class BackdoorSection:
    """Backdoors and trojans: pictures of triggers and reversed triggers, then the tables."""

    key = "backdoor"
    title = "Backdoors and trojans"
    order = 55
    css = """
.backdoor-pictures { display: flex; flex-wrap: wrap; align-items: flex-start; }
figure.backdoor-image img { image-rendering: pixelated; border: 1px solid #777; }
p.published { font-style: italic; }
table.backdoor-published { background: #fafafa; }
"""

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload holds a backdoor attack, defence or table."""
        block = section_block(payload, "backdoor")
        tables = block.get("tables")
        return bool(
            mappings(block.get("attacks"))
            or mappings(block.get("defenses"))
            or (isinstance(tables, Mapping) and any(tables.values()))
        )

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """Verdict, pictures per attack and per Neural Cleanse run, tables and curves."""
        block = section_block(payload, "backdoor")
        attacks = mappings(block.get("attacks"))
        defenses = mappings(block.get("defenses"))
        tables = block.get("tables") if isinstance(block.get("tables"), Mapping) else {}
        images = _images(block)
        parts = [
            f'<section id="{self.key}">',
            f"<h2>{e(self.title)}</h2>",
            f'<p class="verdict">{e(verdict(block))}</p>',
            f'<p class="small">{e(GUIDE)}</p>',
        ]
        parts += [_attack_pictures(folder, a) for a in attacks]
        parts += [_nc_pictures(folder, d) for d in defenses if d.get("method") == NC_METHOD]
        if attacks:
            parts += ['<h3 id="backdoor-attacks">Attacks</h3>', attacks_table(attacks)]
        trojans = trojan_run_rows(attacks)
        if trojans:
            parts += [
                '<h3 id="backdoor-trojan-runs">Trojan runs (the seed\'s columns)</h3>',
                trojan_table(trojans, "backdoor-trojan-runs"),
            ]
        if defenses:
            parts += ['<h3 id="backdoor-defenses">Defences</h3>', defenses_table(defenses)]
        curves = [
            figure(
                folder,
                images.get("contrastive"),
                "attack success rate and backdoor z-score against the number of poisoned pairs",
                "Contrastive backdoor: ASR and z-score against the number of poisoned pairs",
            ),
            figure(
                folder,
                images.get("badnets"),
                "BadNets attack success rate against the poison rate, with and without DP-SGD",
                "BadNets: ASR against the poison rate, with and without DP-SGD",
            ),
        ]
        if any(curves):
            parts += ['<h3 id="backdoor-curves">Curves</h3>', *curves]
        for name, rows in tables.items():
            rows = mappings(rows)
            if not rows:
                continue
            title = {
                "trojan": "Trojaning attack (the seed's table: Orig, Orig Dec, Orig+Tri, Ext+Tri)",
                "defenses": "Defences benchmark, ours beside BackdoorBench's published numbers",
                "contrastive": "Contrastive poisoning and backdoor benchmark",
                "badnets": "BadNets with and without DP-SGD",
            }.get(name, f"Table: {name}")
            parts.append(f'<h3 id="backdoor-table-{e(name)}">{e(title)}</h3>')
            if name == "trojan":
                parts.append(trojan_table(rows))
            else:
                parts.append(generic_table(name, rows))
            if name == "defenses":
                parts.append(published_table())
        parts.append("</section>")
        return "\n".join(p for p in parts if p)
