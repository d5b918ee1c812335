"""The defences part of the report: Pareto set, release gate, frontier picture and section."""

from __future__ import annotations

import json
import math
import re
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text
from test_plots_html import make_payload

from privacylab.errors import PrivacylabError
from privacylab.report.defenses import (
    FrontierError,
    adaptively_attacked,
    annotate,
    attack_is_adaptive,
    best_tpr,
    defense_frontier_figure,
    defense_frontier_plot,
    gate,
    gate_decision,
    pareto_indices,
    pareto_set,
    point_kind,
)
from privacylab.report.html import render_html, write_report
from privacylab.report.sections import sections
from privacylab.report.sections.defenses import (
    DefensesSection,
    attack_detail_table,
    defense_table,
    gate_statement,
)

PNG = b"\x89PNG\r\n\x1a\n"


def row(
    label: str,
    acc: float | None,
    tpr: float | None,
    auc: float | None = 0.6,
    *,
    kind: str = "output",
    adaptive: bool = True,
    name: str | None = None,
    epsilon: float | None = None,
    best: bool = True,
) -> dict[str, Any]:
    """One row of `privacylab defend --json`: a non-adaptive `loss` attack and, when `adaptive`,
    an adaptive attack that is the strongest."""
    strong = "label-only" if kind == "output" else "lira-defended"
    attacks = [
        {"attack": strong, "adaptive": adaptive, "access": "label", "auc": auc,
         "tpr_at_01pct_fpr": tpr, "tpr_at_1pct_fpr": None if tpr is None else 3 * tpr,
         "balanced_accuracy": 0.55, "advantage": 0.1, "epsilon_lower_bound": 0.4,
         "examples": 400, "queries": 4000, "seconds": 1.5},
        {"attack": "loss", "adaptive": False, "access": "scores",
         "auc": None if auc is None else auc - 0.02, "tpr_at_01pct_fpr": 0.0,
         "tpr_at_1pct_fpr": 0.004, "balanced_accuracy": 0.52, "advantage": 0.04,
         "epsilon_lower_bound": 0.1, "examples": 2000, "queries": 2000, "seconds": 0.1},
    ]  # fmt: skip
    out: dict[str, Any] = {
        "defense": label,
        "spec": label,
        "name": name or label.split(":")[0],
        "kind": kind,
        "changes": {"output": ["outputs"], "training": ["training"]}.get(kind, []),
        "params": {},
        "paper": "a paper",
        "serves": "label" if kind == "output" else "scores",
        "test_accuracy": acc,
        "train_accuracy": None if acc is None else min(1.0, acc + 0.25),
        "epsilon": epsilon,
        "attacks": attacks,
        "adaptive_attacks": [strong] if adaptive else [],
        "best_auc": {"attack": strong, "adaptive": adaptive, "auc": auc},
        "note": None,
    }
    if best:
        out["best"] = {
            "attack": strong,
            "adaptive": adaptive,
            "tpr_at_01pct_fpr": tpr,
            "auc": auc,
            "balanced_accuracy": 0.55,
            "epsilon_lower_bound": 0.4,
        }
    return out


def twelve() -> list[dict[str, Any]]:
    """Twelve defences shaped like seed 004's findings: output defences leave the scores
    attack where it was, label-only and training-time ones lower it at a cost."""
    return [
        row("none", 0.72, 0.08, 0.82, kind="none", adaptive=False),
        row("topk:1", 0.72, 0.079, 0.81),
        row("topk:3", 0.72, 0.08, 0.82),
        row("rounding:1", 0.72, 0.075, 0.80),
        row("label-only", 0.72, 0.004, 0.66),
        row("memguard", 0.72, 0.002, 0.66, adaptive=False),
        row("l2:1e-3", 0.70, 0.03, 0.72, kind="training"),
        row("advreg:3", 0.63, 0.005, 0.62, kind="training"),
        row("dmp", 0.69, 0.003, 0.58, kind="training"),
        row("selena", 0.71, 0.004, 0.59, kind="training"),
        row("dp:8", 0.55, 0.0, 0.53, kind="training", name="dp", epsilon=8.0),
        row("early-stop", 0.68, 0.006, 0.63, kind="training"),
    ]


def defenses_payload(rows: list[dict[str, Any]], threshold: float | None) -> dict[str, Any]:
    marked = annotate(rows, threshold)
    return {
        "dataset": "purchase-like",
        "model": "mlp",
        "access": "scores",
        "metric": "tpr_at_01pct_fpr",
        "max_tpr_at_01pct_fpr": threshold,
        "rows": marked["rows"],
        "pareto": marked["pareto"],
        "passing": marked["passing"],
        "images": {"frontier": "defense_frontier.png"},
    }


def test_pareto_set_dominance_ties_and_missing_values() -> None:
    rows = [
        row("a", 0.90, 0.05),
        row("b", 0.80, 0.01),
        row("c", 0.80, 0.05),  # dominated by a (more accurate, same TPR) and by b
        row("d", 0.70, 0.0),
        row("a-twin", 0.90, 0.05),  # same point as a: neither dominates the other
        row("nan-acc", float("nan"), 0.0),
        row("no-tpr", 0.99, None),
        row("b-worse", 0.80, 0.0100001),  # dominated by b only through a strict TPR
        row("e", 0.70, 0.0),  # tie with d
        row("f", 0.69, 0.0),  # same TPR as d, less accurate
    ]
    assert pareto_indices(rows) == [0, 1, 3, 4, 8]
    assert pareto_set(rows) == ["a", "b", "d", "a-twin", "e"]
    # the set does not depend on row order
    assert sorted(pareto_set(rows[::-1])) == sorted(pareto_set(rows))
    # a perfect row dominates everything
    assert pareto_set([*rows, row("perfect", 1.0, 0.0)]) == ["perfect"]
    # NaN or missing values are left out, with the reason in the row's note
    marked = annotate(rows, None)
    notes = {r["defense"]: r["note"] for r in marked["rows"]}
    assert "no test accuracy" in notes["nan-acc"] and "TPR" in notes["no-tpr"]
    assert notes["a"] is None
    assert marked["pareto"] == ["a", "b", "d", "a-twin", "e"]
    assert [r["pareto"] for r in marked["rows"]] == [i in {0, 1, 3, 4, 8} for i in range(10)]
    # by AUC, a different axis
    by_auc = [row("x", 0.9, 0.1, 0.7), row("y", 0.8, 0.0, 0.75), row("z", 0.8, 0.0, 0.6)]
    assert pareto_set(by_auc) == ["x", "y", "z"]
    assert pareto_set(by_auc, "auc") == ["x", "z"]
    with pytest.raises(FrontierError, match="metric"):
        pareto_set(by_auc, "advantage")
    assert pareto_set([]) == []


def test_best_attack_falls_back_to_the_strongest_attack() -> None:
    bare = row("bare", 0.8, 0.03, best=False)
    bare.pop("best_auc")
    assert best_tpr(bare) == 0.03
    assert pareto_set([bare, row("other", 0.8, 0.04)]) == ["bare"]


points = st.lists(
    st.tuples(
        st.sampled_from([0.5, 0.6, 0.7, 0.8, float("nan")]),
        st.sampled_from([0.0, 0.001, 0.01, 0.1, None]),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(points)
def test_pareto_set_is_exactly_the_undominated_points(pts: list[tuple[float, Any]]) -> None:
    rows = [row(f"r{i}", acc, tpr) for i, (acc, tpr) in enumerate(pts)]
    valid = [i for i, (a, t) in enumerate(pts) if not math.isnan(a) and t is not None]

    def dominates(j: int, i: int) -> bool:
        (aj, tj), (ai, ti) = pts[j], pts[i]
        return aj >= ai and tj <= ti and (aj > ai or tj < ti)

    front = pareto_indices(rows)
    assert front == sorted(front) and set(front) <= set(valid)
    for i in valid:
        beaten = any(dominates(j, i) for j in valid)
        assert (i in front) is not beaten
        if beaten:  # every dominated point is dominated by a member of the set
            assert any(dominates(j, i) for j in front)
    if valid:
        assert front  # a finite non-empty set always has an undominated point


def test_gate_needs_low_tpr_and_an_adaptive_attack() -> None:
    rows = [
        row("leaky", 0.9, 0.05),
        row("edge", 0.8, 0.01),  # exactly at the threshold passes
        row("untested", 0.8, 0.0, adaptive=False),  # looks perfect, but no adaptive attack
        row("none", 0.9, 0.0, kind="none", adaptive=False),  # undefended: adaptive by definition
        row("no-result", 0.8, None),
        row("nan", 0.8, float("nan")),
    ]
    assert gate(rows, 0.01) == [False, True, False, True, False, False]
    assert gate(rows, None) == [None] * 6
    assert gate(rows, 1.0)[0] is True
    assert gate(rows, 0.0) == [False, False, False, True, False, False]
    assert "no adaptive attack" in gate_decision(rows[2], 0.01)[1]
    assert "> 1.0%" in gate_decision(rows[0], 0.01)[1]
    # adaptive through a marked attack alone, without the adaptive_attacks list
    flagged = row("flagged", 0.8, 0.0)
    flagged["adaptive_attacks"] = []
    assert gate([flagged], 0.01) == [True]
    flagged["attacks"][0]["adaptive"] = False
    assert gate([flagged], 0.01) == [False]
    marked = annotate(rows, 0.01)
    assert marked["passing"] == ["edge", "none"]
    assert [r["passes"] for r in marked["rows"]] == gate(rows, 0.01)
    for bad in (-0.1, 1.5, float("nan"), "x", True):
        with pytest.raises(FrontierError, match=r"max-tpr-at-0\.1") as info:
            gate(rows, bad)  # type: ignore[arg-type]
        assert isinstance(info.value, PrivacylabError) and "\n" not in str(info.value)


def test_gate_counts_only_adaptive_attacks_that_gave_a_result() -> None:
    """As `privacylab defend` writes them: an attack calibrated on references runs twice under
    one name (plain, then adaptive) and `adaptive_attacks` lists names, skipped runs included.
    A plain run that scored and an adaptive run that was skipped (or measured NaN) is a defence
    attacked non-adaptively only: the gate fails it, the table does not mark the plain run."""
    plain = {"attack": "lira-online", "adaptive": False, "references": "plain",
             "tpr_at_01pct_fpr": 0.0, "tpr_at_1pct_fpr": 0.01, "auc": 0.52}  # fmt: skip
    skipped = {"attack": "lira-online", "adaptive": True, "references": "defended",
               "skipped": "lira-online: no reference models"}  # fmt: skip
    gap_skipped = {"attack": "gap", "adaptive": True, "references": "defended",
                   "skipped": "needs label access"}  # fmt: skip
    only_plain = {
        **row("memguard", 0.8, 0.0),
        "attacks": [plain, skipped, gap_skipped],
        "adaptive_attacks": ["gap", "lira-online"],
        "best": {
            "attack": "lira-online",
            "adaptive": False,
            "tpr_at_01pct_fpr": 0.0,
            "auc": 0.52,
        },
    }
    assert not adaptively_attacked(only_plain)
    assert gate([only_plain], 0.01) == [False]
    assert "no adaptive attack" in gate_decision(only_plain, 0.01)[1]
    nan = {**skipped, "tpr_at_01pct_fpr": float("nan"), "auc": 0.5}
    nan.pop("skipped")
    assert gate([{**only_plain, "attacks": [plain, nan]}], 0.01) == [False]
    scored = {**plain, "adaptive": True, "references": "defended"}
    assert gate([{**only_plain, "attacks": [plain, scored]}], 0.01) == [True]
    # the plain run is not marked adaptive because its name is in `adaptive_attacks`
    assert not attack_is_adaptive(only_plain, plain)
    assert attack_is_adaptive(only_plain, {"attack": "gap"})  # no flag: the name decides
    assert attack_is_adaptive(row("none", 0.9, 0.1, kind="none"), plain)
    table = attack_detail_table(only_plain)
    assert table.count("✓ adaptive") == 2  # the two skipped runs, not the plain one
    summary = defense_table([only_plain], 0.01)
    assert ">lira-online</td>" in summary and ">fail</td>" in summary
    # a row with `best` only: its flag, and a result, decide
    bare = {"kind": "output", "best": {"attack": "gap", "adaptive": True, "tpr_at_01pct_fpr": 0.0}}
    assert adaptively_attacked(bare)
    assert not adaptively_attacked({**bare, "best": {**bare["best"], "adaptive": False}})
    assert not adaptively_attacked({**bare, "best": {**bare["best"], "tpr_at_01pct_fpr": None}})
    assert not adaptively_attacked({"kind": "none", "attacks": [gap_skipped]})


@pytest.fixture(scope="module")
def frontier_png() -> bytes:
    return defense_frontier_figure(twelve(), 0.005)


def test_point_kinds() -> None:
    assert point_kind(row("dp:8", 0.5, 0.0, kind="training", name="dp")) == "dp"
    assert point_kind({**row("x", 0.5, 0.0, kind="training"), "epsilon": 2.0}) == "dp"
    assert point_kind({**row("x", 0.5, 0.0, kind="training"), "epsilon": math.inf}) == "training"
    assert point_kind(row("none", 0.5, 0.0, kind="none")) == "none"
    assert point_kind(row("topk:1", 0.5, 0.0)) == "output"


def test_frontier_figure_is_a_png_for_one_and_twelve_rows(frontier_png: bytes) -> None:
    assert defense_frontier_figure([row("none", 0.72, 0.08, kind="none")]).startswith(PNG)
    assert frontier_png.startswith(PNG)
    rows = twelve()
    # rows without a point are listed, not drawn; all-zero TPRs sit on the floor
    odd = [*rows, row("broken", None, None), row("zero", 0.5, 0.0, None)]
    assert defense_frontier_figure(odd, 0.0).startswith(PNG)
    with pytest.raises(FrontierError):
        defense_frontier_figure([])
    with pytest.raises(FrontierError):
        defense_frontier_figure(rows, 2.0)


def test_frontier_labels_name_every_point_and_do_not_overlap() -> None:
    rows = twelve()
    fig = defense_frontier_plot(rows, 0.005)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    left, right = fig.axes[:2]
    for ax in (left, right):
        texts = [t for t in ax.texts if t.get_text()]
        names = sorted(n.strip() for t in texts for n in re.split(r"[,\n]", t.get_text()))
        assert names == sorted(r["defense"] for r in rows)
        boxes = [Text.get_window_extent(t, renderer) for t in texts]  # without leader lines
        for a, b in combinations(boxes, 2):
            assert not a.overlaps(b), (a, b)
        frame = ax.get_window_extent(renderer)
        assert all(frame.x0 - 1 <= b.x0 and b.x1 <= frame.x1 + 1 for b in boxes)
        assert all(t.get_fontsize() >= 9 for t in texts)
    # the Pareto set (TPR) is ringed: one ring per member, in the left panel
    front = pareto_indices(rows)
    for ax in (left, right):
        rings = [c for c in ax.collections if c.get_gid() == "pareto-ring"]
        assert len(rings) == len(front) == 2
    assert left.get_xscale() == "log"


def test_section_escapes_and_states_the_gate(tmp_path: Path) -> None:
    rows = twelve()
    rows[1] = row("<script>alert(1)</script>", 0.72, 0.079, 0.81)
    payload = {"defenses": defenses_payload(rows, 0.005)}
    section = DefensesSection()
    assert section.applies(payload)
    assert not section.applies({"targets": []})
    assert not section.applies({"defenses": None})
    html = section.render(tmp_path, payload)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.startswith('<section id="defenses">') and html.endswith("</section>")
    assert html.count("<section") == html.count("</section>") == 1
    # gate: passing and failing defences, with reasons
    gate_text = re.search(r'<div class="note gate"[^>]*>(.*?)</div>', html, re.S).group(1)  # type: ignore[union-attr]
    assert "With TPR@0.1%FPR ≤ 0.5%: pass: label-only, advreg:3, dmp, selena, dp:8;" in gate_text
    assert "memguard (no adaptive attack run)" in gate_text and "fail: none (" in gate_text
    # the warning names the defence attacked only non-adaptively, not the undefended model
    warn = re.search(r'<div class="note warn">(.*?)</div>', html, re.S).group(1)  # type: ignore[union-attr]
    assert warn.split("</strong>")[1].split(".")[0].strip() == "memguard"
    # one table row per defence, the Pareto set marked, the gate column
    table = re.search(r'<table class="sortable defenses">(.*?)</table>', html, re.S).group(1)  # type: ignore[union-attr]
    body_rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("<tbody>")[1], re.S)
    assert len(body_rows) == len(rows)
    assert table.count('class="pareto"') + table.count('class="pareto ') == len(
        pareto_indices(rows)
    )
    assert len(re.findall(r">pass</td>", table)) == 5 and len(re.findall(r">fail</td>", table))
    assert "lira-defended (adaptive)" in table and "8.000" in table  # certified ε of dp:8
    # one expandable detail per defence, every attack, the adaptive one marked
    assert html.count("<details") == len(rows)
    assert html.count("✓ adaptive") == sum(1 for r in rows if r["adaptive_attacks"]) == 10
    assert html.count("✓ nothing to adapt to") == 2  # the undefended model's two attacks
    assert 'src="defense_frontier.png"' not in html  # the file is absent here
    assert "defense_frontier.png is missing" in html
    # without a threshold
    html = section.render(tmp_path, {"defenses": defenses_payload(rows, None)})
    assert "No release threshold given: pass --max-tpr-at-0.1" in html
    assert ">pass</td>" not in html and ">fail</td>" not in html
    bad = {"defenses": {**defenses_payload(rows, None), "max_tpr_at_01pct_fpr": "lots"}}
    assert "was ignored" in section.render(tmp_path, bad)
    # an empty block still renders
    assert "no defences" in section.render(tmp_path, {"defenses": {}})


def test_gate_statement_forms() -> None:
    rows = [row("a", 0.9, 0.0), row("b", 0.9, 0.5)]
    assert gate_statement(rows, 0.01).endswith("pass: a; fail: b (TPR@0.1%FPR 50% > 1.0%).")
    assert gate_statement(rows[:1], 0.0).endswith("pass: a; fail: none.")
    assert gate_statement(rows[1:], 0.0).endswith("pass: none; fail: b (TPR@0.1%FPR 50% > 0%).")
    assert gate_statement(rows, None).startswith("No release threshold given")


def test_write_report_round_trip_with_defences(tmp_path: Path, frontier_png: bytes) -> None:
    rows = twelve()
    images = {"defense_frontier.png": frontier_png}
    payload = {**make_payload(), "defenses": defenses_payload(rows, 0.005)}
    page = write_report(tmp_path, payload, images)
    text = page.read_text(encoding="utf-8")
    keys = [s.key for s in sections()]
    assert keys.index("membership") < keys.index("defenses") < keys.index("audit")
    assert text.index('id="membership"') < text.index('id="defenses"')
    assert '<a href="#defenses">Defences</a>' in text
    assert re.search(
        r'<a href="defense_frontier.png"[^>]*><img src="defense_frontier.png" alt="[^"]+"', text
    )
    assert (tmp_path / "defense_frontier.png").read_bytes().startswith(PNG)
    assert text.count("<script>") == 1  # the one sorting script, shared
    assert "table.defenses td.gate-pass" in text  # the section's CSS is on the page
    loaded = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    block = loaded["defenses"]
    assert block["passing"] == ["label-only", "advreg:3", "dmp", "selena", "dp:8"]
    assert block["pareto"] == pareto_set(rows)
    assert [r["defense"] for r in block["rows"]] == [r["defense"] for r in rows]
    assert block["rows"][10]["epsilon"] == 8.0 and block["rows"][0]["best"]["auc"] == 0.82
    # a page without defences has no such section
    assert 'id="defenses"' not in render_html(tmp_path, make_payload())
