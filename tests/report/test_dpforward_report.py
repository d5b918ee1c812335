"""The DP-Forward report (`privacylab.report.dpforward`, section `#dp-forward`) on synthetic
payloads shaped like `train_dpforward`'s facts and `run_embedding_attack`'s runs: runs merge
into one row per model folder, numbers and events are formatted, the figures draw exactly the
rows' numbers, texts are escaped, the seed paper's claims are judged by hand-checked cases,
bad payloads are refused in one line before anything is written, and re-adding is idempotent."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_render_chromium import _render, chromium  # noqa: F401  (fixture)

from privacylab.errors import PrivacylabError
from privacylab.report.dpforward import (
    ACCURACY_IMAGE,
    ATTACKS_IMAGE,
    EXAMPLE_CHARS,
    EXAMPLES,
    DPForwardReportError,
    accuracy_plot,
    add_dpforward_run,
    attacks_plot,
    event_summary,
    findings,
    marked_tokens,
    model_label,
    model_rows,
    verdict,
)
from privacylab.report.html import render_html

PNG = b"\x89PNG\r\n\x1a\n"
MGM = {"type": "matrix_gaussian", "noise_multiplier": 0.912, "rows": 48, "columns": 384}
SGD_EVENT = {
    "type": "self_composed",
    "count": 90,
    "event": {
        "type": "poisson_sampled",
        "sample_rate": 0.0333,
        "event": {"type": "gaussian", "noise_multiplier": 1.07},
    },
}
INJECTION = 'great <script>alert("x")</script> kettle'


def facts(
    folder: str,
    method: str = "dp-forward",
    epsilon: float | None = 8.0,
    position: str = "output",
    accuracy: float = 0.8,
) -> dict[str, Any]:
    private = epsilon is not None
    return {
        "method": method,
        "position": position,
        "encoder": "minilm",
        "layers": None,
        "epsilon": epsilon,
        "delta": 1e-5 if private else None,
        "event": (MGM if method == "dp-forward" else SGD_EVENT) if private else None,
        "accountant": "pld" if private else None,
        "privacy": None,
        "label_epsilon": None,
        "accuracy": accuracy,
        "train_accuracy": min(1.0, accuracy + 0.05),
        "members": 960,
        "non_members": 720,
        "epochs": 3,
        "seconds": 120.0,
        "seconds_per_step": 0.5,
        "folder": folder,
    }


def attack(
    target: dict[str, Any], method: str, value: float, chance: float = 0.25, mia: float = 0.52
) -> dict[str, Any]:
    run = {
        "method": method,
        "target": target,
        "accuracy": target["accuracy"],
        "epsilon": target["epsilon"],
        "delta": target["delta"],
        "event": target["event"],
        "accountant": target["accountant"],
        "position": target["position"],
        "inversion_recall": None,
        "attribute_accuracy": None,
        "attribute_chance": None,
        "mia_auc": mia,
        "mia": {"confidence": {"auc": mia, "tpr_at_1_fpr": 0.01, "advantage": 0.04}},
        "examples": [],
        "queries": 200,
        "seconds": 2.5,
    }
    if method == "attribute":
        run.update(attribute_accuracy=value, attribute_chance=chance)
    else:
        run.update(
            inversion_recall=value,
            examples=[
                {"truth": INJECTION, "recovered": "great <img src=x onerror=alert(1)> ##ly kettle"},
                {"truth": "the blender broke", "recovered": "the toaster broke"},
            ],
        )
    return run


PLAIN = facts("/models/plain", "non-private", None, accuracy=0.912)
SGD = facts("/models/sgd8", "dp-sgd", 8.0, accuracy=0.781)
FORWARD = facts("/models/fwd-out-8", accuracy=0.853)
FORWARD_IN = facts("/models/fwd-in-8", position="input", accuracy=0.702)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder: a non-private, a DP-SGD and two DP-Forward models, attacked."""
    folder = tmp_path_factory.mktemp("dpforward") / "report"
    add_dpforward_run(folder, {"facts": PLAIN})
    add_dpforward_run(folder, attack(SGD, "inversion-nn", 0.91, mia=0.51))
    add_dpforward_run(folder, attack(SGD, "attribute", 0.62, mia=0.53))
    add_dpforward_run(folder, {"facts": FORWARD})
    add_dpforward_run(folder, attack(FORWARD, "inversion-nn", 0.04))
    add_dpforward_run(folder, attack(FORWARD, "inversion-opt", 0.11))
    add_dpforward_run(folder, attack(FORWARD, "attribute", 0.27))
    add_dpforward_run(folder, {"facts": FORWARD_IN})
    return folder


def results(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))


def section(folder: Path) -> str:
    page = (folder / "index.html").read_text(encoding="utf-8")
    start = page.index('<section id="dp-forward">')
    return page[start : page.index("</section>", start)]


def table_rows(html: str, css: str) -> list[list[str]]:
    table = html[html.index(f'class="sortable {css}"') :]
    body = table[table.index("<tbody>") : table.index("</tbody>")]
    return [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body)
    ]


def test_runs_merge_into_one_row_per_model(report: Path) -> None:
    block = results(report)["dpforward"]
    assert [m["folder"] for m in block["models"]] == [
        "/models/plain", "/models/sgd8", "/models/fwd-out-8", "/models/fwd-in-8"
    ]  # fmt: skip
    assert list(block["models"][2]["runs"]) == ["inversion-nn", "inversion-opt", "attribute"]
    assert all("target" not in run for run in block["models"][2]["runs"].values())
    rows = {r["folder"]: r for r in model_rows(block)}
    forward = rows["/models/fwd-out-8"]
    assert (forward["inversion_nn"], forward["inversion_opt"]) == (0.04, 0.11)
    assert forward["inversion"] == 0.11
    assert (forward["attribute_accuracy"], forward["attribute_chance"]) == (0.27, 0.25)
    assert rows["/models/sgd8"]["mia_auc"] == 0.53  # the larger of its two runs
    assert rows["/models/sgd8"]["inversion_opt"] is None
    assert rows["/models/plain"]["epsilon"] is None and rows["/models/plain"]["mia_auc"] is None
    assert len(table_rows(section(report), "dpforward-models")) == 4


def test_table_formats_numbers_events_and_missing_cells(report: Path) -> None:
    rows = {r[0]: r for r in table_rows(section(report), "dpforward-models")}
    assert list(rows) == ["plain", "sgd8", "fwd-out-8", "fwd-in-8"]
    forward = rows["fwd-out-8"]
    assert forward[1:] == [
        "DP-Forward", "output", "8", "1e-05", "MatrixGaussian(σ/Δ=0.91, 48×384)", "pld",
        "0.853", "0.040", "0.110", "0.270 (0.250)", "0.520", "0.500",
    ]  # fmt: skip
    sgd = rows["sgd8"]
    assert sgd[2] == "—" and sgd[5] == "90 × PoissonSampled(q=0.033, Gaussian(σ/Δ=1.1))"
    assert sgd[8:] == ["0.910", "—", "0.620 (0.250)", "0.530", "0.500"]
    plain = rows["plain"]
    assert plain[3:7] == ["∞", "—", "—", "—"] and plain[7] == "0.912"
    assert rows["fwd-in-8"][8:] == ["—", "—", "—", "—", "0.500"]
    assert 'data-sort="Infinity">∞</td>' in section(report)
    assert 'title="confidence: AUC 0.530, TPR@1% FPR 0.010">0.530</td>' in section(report)


TRAINED = json.loads(
    '{"method": "dp-forward", "position": "output", "encoder": "tiny", "layers": 2, "epsilon": '
    '7.999999999990342, "delta": 1e-05, "event": {"type": "self_composed", "event": {"type": '
    '"matrix_gaussian", "noise_multiplier": 0.6002290721995519, "rows": 1, "columns": 32}, '
    '"count": 1}, "accountant": "pld", "privacy": {"notion": "SeqLDP", "adjacency": '
    '"replace-one sequence", "sensitivity": 2.0, "clip": 1.0, "epsilon": 7.999999999990342, '
    '"delta": 1e-05, "accountant": "pld", "event": {"type": "self_composed", "event": {"type": '
    '"matrix_gaussian", "noise_multiplier": 0.6002290721995519, "rows": 1, "columns": 32}, '
    '"count": 1}, "releases": 1, "inference_epsilon": 7.999999999990342, "label_epsilon": 1.0, '
    '"label_event": null, "total_epsilon": 8.61, "shuffled": {"epsilon": 0.31, '
    '"composed_epsilon": 0.93}}, "label_epsilon": 1.0, "accuracy": 0.625, "train_accuracy": '
    '0.46875, "members": 32, "non_members": 24, "epochs": 1, "seconds": 0.644, '
    '"seconds_per_step": 0.1133, "folder": "/tmp/tmptxb7h5a3/m"}'
)
"""Facts as `train_dpforward` returned them for a tiny encoder (label ε, total and shuffled
ε filled in by hand)."""


def test_trained_facts_show_event_label_inference_and_shuffled_epsilon(tmp_path: Path) -> None:
    add_dpforward_run(tmp_path, {"facts": TRAINED})
    html = section(tmp_path)
    (row,) = table_rows(html, "dpforward-models")
    assert row == [
        "m", "DP-Forward", "output", "8 + labels 1", "1e-05", "1 × MatrixGaussian(σ/Δ=0.6, 1×32)",
        "pld", "0.625", "—", "—", "—", "—", "0.113",
    ]  # fmt: skip
    assert (
        'title="sequence and label composed: ε = 8.61; one inference query: ε = 8; '
        'with a trusted shuffler (Feldman et al. 2021): ε = 0.93">8 + labels 1</td>'
    ) in html
    assert ATTACKS_IMAGE not in html and f'<img src="{ACCURACY_IMAGE}"' in html
    assert "Not measured yet" in html


def test_event_summary_reads_every_event_kind() -> None:
    composed = {
        "type": "composed",
        "events": [MGM, {"type": "randomized_response", "epsilon": 1.0, "k": 2}],
    }
    assert event_summary(composed) == (
        "Composed(MatrixGaussian(σ/Δ=0.91, 48×384), RandomizedResponse(ε=1, k=2))"
    )
    assert event_summary({"type": "laplace", "scale": 2.0}) == "Laplace(b/Δ=2)"
    assert event_summary(None) == "—"
    assert event_summary("gaussian σ=1") == "gaussian σ=1"


def test_section_figures_and_nav(report: Path) -> None:
    page = (report / "index.html").read_text(encoding="utf-8")
    assert '<a href="#dp-forward">DP-Forward: privacy in the forward pass</a>' in page
    html = section(report)
    for name in (ACCURACY_IMAGE, ATTACKS_IMAGE):
        assert (report / name).read_bytes().startswith(PNG)
        assert f'<img src="{name}"' in html
    images = results(report)["dpforward"]["images"]
    assert (images["accuracy"], images["attacks"]) == (ACCURACY_IMAGE, ATTACKS_IMAGE)
    assert set(images["drawn"]) == {ACCURACY_IMAGE, ATTACKS_IMAGE}
    assert results(report)["title"] == "privacylab report: DP-Forward"
    assert 'id="dp-forward"' not in render_html(report, {"dpforward": {"models": []}})


def test_accuracy_plot_draws_the_rows() -> None:
    rows = model_rows(
        {
            "models": [
                {"folder": f["folder"], "facts": f, "runs": {}}
                for f in (
                    PLAIN,
                    SGD,
                    FORWARD,
                    FORWARD_IN,
                    facts("/f2", accuracy=0.7, epsilon=2.0),
                    facts("/l", position="layer:3", accuracy=0.75),
                )
            ]
        }
    )
    ax = accuracy_plot(rows).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines)[:4] == [
        "DP-Forward, input", "DP-Forward, layer:3", "DP-Forward, output", "DP-SGD"
    ]  # fmt: skip
    output = lines["DP-Forward, output"]
    assert list(output.get_xdata()) == [2.0, 8.0] and list(output.get_ydata()) == [0.7, 0.853]
    assert list(lines["DP-SGD"].get_ydata()) == [0.781]
    plain = lines["non-private (0.912)"]
    assert list(plain.get_ydata()) == [0.912, 0.912]
    assert ax.get_xscale() == "log"


def test_attacks_plot_bars_are_the_measured_values(report: Path) -> None:
    rows = model_rows(results(report)["dpforward"])
    ax = attacks_plot(rows).axes[0]
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == sorted([0.91, 0.62, 0.04, 0.11, 0.27])
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "DP-SGD, ε=8", "DP-Forward, output, ε=8"
    ]  # fmt: skip
    assert [t.get_text() for t in ax.texts] == ["0.91", "0.04", "0.11", "0.62", "0.27"]
    chance = [line for line in ax.get_lines() if line.get_label().startswith("attribute chance")]
    assert list(chance[0].get_ydata()) == [0.25, 0.25]


def test_attacks_plot_legend_names_only_what_was_measured() -> None:
    rows = rows_of(("dp-sgd", 8.0, "output", 0.9, None), ("dp-forward", 8.0, "output", 0.0, None))
    ax = attacks_plot(rows).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["inversion stopped below 0.2", "inversion recall (nearest neighbour)"]
    assert [t.get_text() for t in ax.texts] == ["0.90", "0.00"]


def test_texts_are_escaped(report: Path) -> None:
    html = section(report)
    assert "<script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "&lt;img" in html
    assert '<mark title="in the true text">great</mark>' in html
    assert '<mark title="in the true text">kettle</mark>' in html
    assert "<mark" not in html.split("toaster")[1][:5] and "the toaster" not in html
    folder = report.parent / "evil"
    add_dpforward_run(folder, {"facts": facts('/m/"><b>x', "non-private", None)})
    assert '"><b>x' not in section(folder) and "&quot;&gt;&lt;b&gt;x" in section(folder)


def test_marked_tokens_cases() -> None:
    marks = marked_tokens("The kettle, sadly, broke!", "the kett ##le broke , toaster !")
    assert marks == [
        ("the", True), ("kett", False), ("##le", False), ("broke", True), (",", True),
        ("toaster", False), ("!", True),
    ]  # fmt: skip
    assert marked_tokens("ab", "") == []
    assert marked_tokens("I don't know.", "don't know, dont ...") == [
        ("don't", True), ("know,", True), ("dont", False), ("...", True)
    ]  # fmt: skip


@given(
    truth=st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=1, max_size=8),
    other=st.lists(st.text("mnopq", min_size=1, max_size=4), max_size=5),
)
@settings(max_examples=60, deadline=None)
def test_marked_tokens_mark_exactly_the_true_words(truth: list[str], other: list[str]) -> None:
    recovered = " ".join(truth + other)
    marks = marked_tokens(" ".join(truth).upper(), recovered)
    assert [t for t, _ in marks] == recovered.split()
    assert [hit for _, hit in marks] == [True] * len(truth) + [False] * len(other)


def test_examples_are_kept_short_and_few(tmp_path: Path) -> None:
    run = attack(FORWARD, "inversion-nn", 0.1)
    run["examples"] = [{"truth": "w" * 1000, "recovered": "v" * 999}] * (EXAMPLES + 3)
    add_dpforward_run(tmp_path, run)
    kept = results(tmp_path)["dpforward"]["models"][0]["runs"]["inversion-nn"]["examples"]
    assert len(kept) == EXAMPLES
    assert all(len(ex["truth"]) == EXAMPLE_CHARS and ex["truth"].endswith("…") for ex in kept)
    assert "w" * EXAMPLE_CHARS not in (tmp_path / "index.html").read_text(encoding="utf-8")


BAD = [
    ("not a mapping", "must be a mapping"),
    ({}, "is {'facts'"),
    ({"facts": "x"}, "mapping of model facts"),
    ({"facts": {"method": "dp-forward"}}, "needs the model 'folder'"),
    ({"method": "inversion", "target": FORWARD}, "attack method must be one of"),
    ({"method": "attribute", "target": None}, "mapping of model facts"),
    ({**attack(FORWARD, "attribute", 0.3), "attribute_accuracy": 1.5}, "in [0, 1]"),
    ({**attack(FORWARD, "inversion-nn", 0.3), "inversion_recall": "high"}, "in [0, 1]"),
    ({**attack(FORWARD, "inversion-nn", 0.3), "mia_auc": float("nan")}, "in [0, 1]"),
    ({"facts": {**FORWARD, "epsilon": -1.0}}, "positive number"),
    ({"facts": {**FORWARD, "accuracy": True}}, "in [0, 1]"),
    ({**attack(FORWARD, "inversion-nn", 0.3), "examples": "truth"}, "list of mappings"),
    ({**attack(FORWARD, "inversion-nn", 0.3), "examples": [1]}, "list of mappings"),
]


@pytest.mark.parametrize(("payload", "message"), BAD)
def test_bad_payload_is_one_line_and_writes_nothing(
    tmp_path: Path, payload: Any, message: str
) -> None:
    with pytest.raises(DPForwardReportError) as caught:
        add_dpforward_run(tmp_path / "out", payload)
    assert isinstance(caught.value, PrivacylabError) and isinstance(caught.value, ValueError)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_unreadable_results_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DPForwardReportError, match="cannot read") as caught:
        add_dpforward_run(tmp_path, {"facts": PLAIN})
    assert "\n" not in str(caught.value)


def test_readding_is_idempotent_and_keeps_other_keys(report: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(report, folder)
    data = results(folder)
    data["language"] = {"exposure": []}
    data["notes"] = ["kept"]
    (folder / "results.json").write_text(json.dumps(data), encoding="utf-8")
    add_dpforward_run(folder, attack(FORWARD, "inversion-opt", 0.11))
    first = {n: (folder / n).read_bytes() for n in ("results.json", "index.html")}
    add_dpforward_run(folder, attack(FORWARD, "inversion-opt", 0.11))
    assert {n: (folder / n).read_bytes() for n in first} == first
    again = results(folder)
    assert again["notes"] == ["kept"] and again["language"] == {"exposure": []}
    assert results(folder)["dpforward"]["models"] == results(report)["dpforward"]["models"]


def test_a_figure_is_redrawn_only_when_its_values_change(tmp_path: Path) -> None:
    add_dpforward_run(tmp_path, attack(FORWARD, "inversion-nn", 0.04))
    accuracy = tmp_path / ACCURACY_IMAGE
    attacks = tmp_path / ATTACKS_IMAGE
    stamps = {p: p.stat().st_mtime_ns for p in (accuracy, attacks)}
    add_dpforward_run(tmp_path, attack(FORWARD, "inversion-nn", 0.3))  # recall changed
    assert accuracy.stat().st_mtime_ns == stamps[accuracy]
    assert attacks.stat().st_mtime_ns != stamps[attacks]
    attacks.unlink()
    add_dpforward_run(tmp_path, {"facts": {**FORWARD, "accuracy": 0.5}})  # accuracy changed
    assert accuracy.stat().st_mtime_ns != stamps[accuracy]
    assert attacks.read_bytes().startswith(PNG)  # a missing file is drawn again


def test_same_model_by_relative_path_and_retraining_drops_stale_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    first = facts(str(tmp_path / "m"))
    add_dpforward_run("out", attack(first, "inversion-nn", 0.05))
    add_dpforward_run("out", facts("m", accuracy=0.9))  # the facts alone, unwrapped
    models = results(tmp_path / "out")["dpforward"]["models"]
    assert len(models) == 1 and list(models[0]["runs"]) == ["inversion-nn"]
    assert models[0]["facts"]["accuracy"] == 0.9
    add_dpforward_run("out", {"facts": facts("m", epsilon=2.0)})
    models = results(tmp_path / "out")["dpforward"]["models"]
    assert len(models) == 1 and models[0]["runs"] == {}
    assert models[0]["facts"]["epsilon"] == 2.0


def rows_of(*specs: tuple[str, float | None, str, float | None, float | None]) -> list[dict]:
    """Model rows from (method, ε, position, inversion recall, attribute accuracy)."""
    models = []
    for i, (method, epsilon, position, recall, attribute) in enumerate(specs):
        runs: dict[str, Any] = {}
        if recall is not None:
            runs["inversion-nn"] = {"inversion_recall": recall, "mia_auc": 0.5 + recall / 10}
        if attribute is not None:
            runs["attribute"] = {"attribute_accuracy": attribute, "attribute_chance": 0.25}
        target = facts(f"/r{i}", method, epsilon, position, accuracy=0.6 + 0.01 * i)
        target["seconds_per_step"] = 1.6 if method == "dp-sgd" else 0.5
        models.append({"folder": f"/r{i}", "facts": target, "runs": runs})
    return model_rows({"models": models})


def test_findings_and_verdict_against_hand_checked_cases() -> None:
    rows = rows_of(
        ("dp-sgd", 8.0, "output", 0.9, 0.6),
        ("dp-forward", 8.0, "input", 0.1, 0.28),
        ("dp-forward", 8.0, "output", 0.05, 0.26),
    )
    accuracy, position, inversion, attribute, membership, cost = findings(rows)
    assert accuracy.holds == "holds" and "+2.0 pp" in accuracy.ours  # 0.62 vs 0.60 at ε=8
    assert position.holds == "holds"  # output (0.62) beats input (0.61)
    assert inversion.holds == "holds" and attribute.holds == "holds"
    assert "DP-Forward recall 0.05–0.10 (2/2 stopped)" in inversion.ours
    assert membership.holds == "partly"  # DP-SGD AUC 0.59 > 0.55
    assert cost.holds == "holds" and "(3.2×" in cost.ours  # 1.6 s / 0.5 s
    line = verdict(rows)
    assert "Inversion: yes" in line and "Attribute inference: yes" in line
    assert "\n" not in line

    leaky = rows_of(("dp-sgd", 8.0, "output", 0.9, 0.6), ("dp-forward", 8.0, "input", 0.3, 0.5))
    assert "Inversion: no" in verdict(leaky) and "Attribute inference: no" in verdict(leaky)
    mixed = rows_of(
        ("dp-sgd", 8.0, "output", 0.9, None),
        ("dp-forward", 2.0, "output", 0.1, None),
        ("dp-forward", 64.0, "output", 0.4, None),
    )
    assert "Inversion: partly" in verdict(mixed)
    assert "Attribute inference: not measured" in verdict(mixed)
    assert findings(mixed)[0].holds == "not measured"  # no DP-Forward model at ε=8
    mixed[0]["seconds_per_step"] = 0.8
    assert findings(mixed)[-1].holds == "partly"  # 0.8 s / 0.5 s = 1.6×, faster but not 3×
    mixed[0]["seconds_per_step"] = 0.4
    assert findings(mixed)[-1].holds == "does not hold"
    assert verdict(rows_of(("non-private", None, "output", 0.9, 0.6))).startswith("Not measured")


def test_dpforward_page_renders_in_chromium(
    chromium: str,  # noqa: F811
    report: Path,
    tmp_path: Path,
) -> None:
    probe, console = _render(chromium, report / "index.html", tmp_path / "profile")
    assert probe["errors"] == [] and console == []
    assert len(probe["images"]) == 2
    for image in probe["images"]:
        assert image["loaded"] and image["width"] > 0 and image["alt"], image


def test_baseline_read_at_other_cuts_and_guessing_recall(tmp_path: Path) -> None:
    """`run_embedding_attack(position=...)` reads one non-private model at another cut as
    FOLDER@POSITION: each cut is its own row labelled with that cut, the model's accuracy is
    drawn and compared once, and every inversion recall shows the guessing recall beside it."""

    def guessed(target: dict[str, Any], method: str, recall: float, guess: float) -> dict:
        return {**attack(target, method, recall), "inversion_baseline_recall": guess}

    sgd = facts("/models/sgd8", "dp-sgd", 8.0, accuracy=0.781)
    at_input = {**PLAIN, "position": "input", "folder": "/models/plain@input"}
    sgd_input = {**sgd, "position": "input", "folder": "/models/sgd8@input"}
    add_dpforward_run(tmp_path, {"facts": PLAIN})
    add_dpforward_run(tmp_path, guessed(PLAIN, "inversion-nn", 0.42, 0.21))
    add_dpforward_run(tmp_path, guessed(at_input, "inversion-nn", 0.97, 0.23))
    add_dpforward_run(tmp_path, {"facts": sgd})
    add_dpforward_run(tmp_path, guessed(sgd_input, "inversion-opt", 0.88, 0.2))
    add_dpforward_run(tmp_path, guessed(FORWARD, "inversion-nn", 0.19, 0.18))
    block = results(tmp_path)["dpforward"]
    rows = model_rows(block)
    assert [r["label"] for r in rows] == [
        "non-private, read at output", "non-private, read at input",
        "DP-SGD, read at output, ε=8", "DP-SGD, read at input, ε=8", "DP-Forward, output, ε=8",
    ]  # fmt: skip
    assert rows[1]["inversion_nn_baseline"] == 0.23 and rows[3]["inversion_opt_baseline"] == 0.2
    html = section(tmp_path)
    table = {r[0]: r for r in table_rows(html, "dpforward-models")}
    assert table["plain@input"][2] == "input" and table["plain"][2] == "output"
    assert table["plain@input"][8] == "0.970 (0.230)"
    assert table["sgd8@input"][8:10] == ["—", "0.880 (0.200)"]
    assert table["fwd-out-8"][2] == "output" and table["fwd-out-8"][8] == "0.190 (0.180)"
    assert "non-private, read at input: inversion-nn (recall 0.970, guessing 0.230)" in html
    assert "inversion NN (guess)" in html
    inversion = findings(rows)[2]
    assert "guessing common words (another victim's tokens) 0.18–0.23" in inversion.ours
    assert "guessing common words" in verdict(rows)

    accuracy, _ = findings(rows)[:2]
    assert accuracy.ours.count("ε=8") == 1  # the DP-SGD model compared once, not per cut
    ax = accuracy_plot(rows).axes[0]
    assert [line.get_label() for line in ax.get_lines()].count("non-private (0.912)") == 1
    ax = attacks_plot(rows).axes[0]
    ticks = [
        line.get_ydata()[0]
        for line in ax.get_lines()
        if line.get_color() == "#8c564b" and len(line.get_xdata()) == 2
    ]
    assert sorted(ticks) == [0.18, 0.2, 0.21, 0.23]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend.count("inversion by guessing (another victim's tokens)") == 1

    bad = guessed(FORWARD, "inversion-nn", 0.2, 1.5)
    with pytest.raises(DPForwardReportError, match="inversion_baseline_recall"):
        add_dpforward_run(tmp_path / "bad", bad)


def test_frozen_models_are_their_own_series_and_label() -> None:
    """A DP-Forward model with f(.) frozen (one release per sequence) is not the per-epoch one at
    the same cut: its own line in the accuracy plot and "(f frozen)" in its label."""
    frozen = {**facts("/fz", accuracy=0.49), "frozen": True}
    rows = model_rows(
        {"models": [{"folder": f["folder"], "facts": f, "runs": {}} for f in (FORWARD, frozen)]}
    )
    labels = sorted(model_label(r) for r in rows)
    assert labels == ["DP-Forward, output (f frozen), ε=8", "DP-Forward, output, ε=8"]
    lines = {line.get_label(): line for line in accuracy_plot(rows).axes[0].get_lines()}
    assert list(lines["DP-Forward, output (f frozen)"].get_ydata()) == [0.49]
    assert list(lines["DP-Forward, output"].get_ydata()) == [0.853]
