"""The defend job and `privacylab defend`: the frontier rows' contract, adaptive evaluation
(references queried through / trained with the defence), durability, one-line bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from privacylab.cli import app
from privacylab.defend import (
    EVALUATIONS,
    DefendConfig,
    attack_plan,
    defense_split,
    evaluate_defenses,
    run_defend,
)
from privacylab.defenses import DefenseError, parse_defense
from privacylab.execution import ResultStore
from privacylab.target import Access

runner = CliRunner()

ROW_KEYS = {
    "defense",
    "spec",
    "name",
    "kind",
    "changes",
    "params",
    "paper",
    "serves",
    "test_accuracy",
    "train_accuracy",
    "epsilon",
    "attacks",
    "adaptive_attacks",
    "best",
    "best_auc",
    "pareto",
    "passes",
    "note",
}


def tiny(**overrides) -> DefendConfig:
    base = dict(
        dataset="digits",
        model_options={"widths": [32]},
        defenses=("none", "topk:1", "label-only", "l2:1e-2"),
        attacks=("loss", "lira-online", "gap"),
        members=300,
        population=150,
        holdout=100,
        references=2,
        epochs=4,
        workers=1,
        max_tpr=0.5,
    )
    base.update(overrides)
    return DefendConfig(**base)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    cache = tmp_path_factory.mktemp("defend-cache")
    stages: list[str] = []
    section, images = evaluate_defenses(tiny(), cache, progress=lambda s, d, t: stages.append(s))
    return cache, section, images, stages


def by_name(section: dict) -> dict[str, dict]:
    return {row["defense"]: row for row in section["rows"]}


def test_rows_keep_the_contract(evaluated) -> None:
    _, section, images, _ = evaluated
    assert [r["defense"] for r in section["rows"]] == ["none", "topk:1", "label-only", "l2:1e-2"]
    for row in section["rows"]:
        assert set(row) >= ROW_KEYS, ROW_KEYS - set(row)
        assert 0 <= row["test_accuracy"] <= 1
        assert row["best"]["tpr_at_01pct_fpr"] == max(
            a["tpr_at_01pct_fpr"] for a in row["attacks"] if "skipped" not in a
        )
    assert section["metric"] == "tpr_at_01pct_fpr"
    assert section["max_tpr_at_01pct_fpr"] == 0.5
    assert set(section["pareto"]) <= set(by_name(section))
    assert images["defense_frontier.png"].startswith(b"\x89PNG")
    json.dumps(section, allow_nan=False)


def test_output_defences_share_the_target_and_keep_its_accuracy(evaluated) -> None:
    _, section, _, _ = evaluated
    rows = by_name(section)
    # top-k and label-only keep every label: same predictions, same accuracy as undefended
    assert rows["topk:1"]["test_accuracy"] == rows["none"]["test_accuracy"]
    assert rows["label-only"]["test_accuracy"] == rows["none"]["test_accuracy"]
    assert rows["label-only"]["serves"] == "label"
    assert rows["topk:1"]["serves"] == "scores"


def test_label_only_attacks_are_unchanged_by_label_keeping_output_defences(evaluated) -> None:
    _, section, _, _ = evaluated
    rows = by_name(section)
    gap = {name: [a for a in row["attacks"] if a["attack"] == "gap"] for name, row in rows.items()}
    for name in ("topk:1", "label-only"):
        (row,) = gap[name]
        assert row["adaptive"] is True
        assert row["auc"] == gap["none"][0]["auc"]


def test_score_attacks_run_plain_and_adaptive_on_output_defences(evaluated) -> None:
    _, section, _, _ = evaluated
    topk = [a for a in by_name(section)["topk:1"]["attacks"] if a["attack"] == "lira-online"]
    assert sorted((a["references"], a["adaptive"]) for a in topk) == [
        ("defended", True),
        ("plain", False),
    ]
    # label-only serves labels: score attacks cannot run and say why, in one line
    skipped = [a for a in by_name(section)["label-only"]["attacks"] if "skipped" in a]
    assert {a["attack"] for a in skipped} == {"loss", "lira-online"}
    assert all("serves label" in a["skipped"] for a in skipped)


def test_training_defence_references_are_trained_with_it(evaluated) -> None:
    cache, section, _, _ = evaluated
    l2 = by_name(section)["l2:1e-2"]
    variants = {(a["attack"], a["references"]) for a in l2["attacks"]}
    assert ("lira-online", "plain") in variants and ("lira-online", "defended") in variants
    with ResultStore(cache / "store.sqlite") as store:
        refs = store.items("references")
        defended = store.items("defended-targets")
    assert len(refs) == 2 * 2  # undefended references and references trained with l2
    assert [r["defense"] for r in refs.values() if "defense" in r] == ["l2:lam=0.01"] * 2
    assert len(defended) == 1


def test_second_run_trains_and_attacks_nothing(evaluated, monkeypatch) -> None:
    cache, section, _, _ = evaluated
    import privacylab.defend as job

    def refuse(*args, **kwargs):
        raise AssertionError("nothing should be recomputed")

    monkeypatch.setattr(job, "train_one", refuse)
    monkeypatch.setattr(job, "train_defended", refuse)
    monkeypatch.setattr(job, "make_attack", refuse)
    again, _ = evaluate_defenses(tiny(), cache)
    assert again["rows"] == section["rows"]


def test_a_lost_evaluation_is_recomputed_alone(evaluated, monkeypatch) -> None:
    cache, section, _, _ = evaluated
    with ResultStore(cache / "store.sqlite") as store:
        assert store.count(EVALUATIONS) == 4
        store.delete_namespace(EVALUATIONS)
    import privacylab.defend as job

    def refuse(*args, **kwargs):
        raise AssertionError("models are stored; nothing is trained again")

    monkeypatch.setattr(job, "train_one", refuse)
    monkeypatch.setattr(job, "train_defended", refuse)
    again, _ = evaluate_defenses(tiny(), cache)
    assert [r["best"] for r in again["rows"]] == [r["best"] for r in section["rows"]]


def test_attack_plan() -> None:
    names = ["loss", "gap"]
    assert attack_plan(parse_defense("none"), names) == [
        ("loss", "plain", True),
        ("gap", "plain", True),
    ]
    assert attack_plan(parse_defense("topk:1"), names) == [
        ("loss", "plain", False),
        ("loss", "defended", True),
        ("gap", "defended", True),
    ]
    assert attack_plan(parse_defense("l2:1e-3"), names) == [
        ("loss", "plain", False),
        ("loss", "defended", True),
        ("gap", "defended", True),
    ]


def test_split_is_disjoint_and_shares_the_runs_targets() -> None:
    from privacylab.data import membership_split

    split = defense_split(1797, 300, 150, 100, seed=3)
    parts = [
        split.members,
        split.nonmembers,
        split.population,
        split.defender_holdout,
        split.defender_public,
        split.attacker_holdout,
        split.attacker_public,
    ]
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined) == 600 + 150 + 400
    run = membership_split(1797, target_size=300, population_size=150, seed=3)
    assert np.array_equal(split.members, run.target_members)
    assert np.array_equal(split.population, run.population)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--defenses", "topk:0"], "topk: k must be >= 1"),
        (["--defenses", "rounding:-1"], "rounding: d must be >= 0"),
        (["--defenses", "dp:0"], "dp: epsilon must be > 0"),
        (["--defenses", "nope"], "unknown defense 'nope'"),
        (["--defenses", "topk:1", "--access", "white-box"], "cannot defend a target served at"),
        (["--defenses", "none", "--max-tpr-at-0.1", "2"], "must be in [0, 1]"),
        (["--defenses", "none", "--members", "5000"], "rows"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(
        app, ["defend", "--dataset", "digits", "--out", str(tmp_path / "r"), *args]
    )
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]


def test_defence_needing_holdout_without_it_is_refused() -> None:
    with pytest.raises(DefenseError, match="needs the defender's holdout"):
        tiny(defenses=("early-stopping",), holdout=0).validate()


def test_cli_json_is_one_object(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "defend",
            "--dataset",
            "digits",
            "--widths",
            "16",
            "--defenses",
            "none,rounding:1",
            "--attacks",
            "loss,gap",
            "--members",
            "200",
            "--holdout",
            "50",
            "--references",
            "1",
            "--epochs",
            "2",
            "--workers",
            "1",
            "--max-tpr-at-0.1",
            "1",
            "--out",
            str(tmp_path / "r"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.stderr
    (line,) = result.stdout.strip().splitlines()
    payload = json.loads(line)
    rows = payload["defenses"]["rows"]
    assert [r["defense"] for r in rows] == ["none", "rounding:1"]
    assert all(r["passes"] is True for r in rows)
    assert (tmp_path / "r" / "index.html").is_file()
    assert (tmp_path / "r" / "defense_frontier.png").is_file()


def test_run_defend_writes_the_report(evaluated, tmp_path: Path) -> None:
    cache, _, _, _ = evaluated
    payload = run_defend(tiny(), tmp_path / "out", cache=cache)
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'id="defenses"' in page
    assert json.loads((tmp_path / "out" / "results.json").read_text())["defenses"]["rows"]
    assert payload["defenses"]["passing"] == [
        r["defense"] for r in payload["defenses"]["rows"] if r["passes"]
    ]


def test_a_defence_the_model_cannot_take_is_refused_before_training(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["defend", "--dataset", "digits", "--model", "logreg", "--defenses", "dropout:0.5",
         "--out", str(tmp_path / "r")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "dropout" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_subsampled_attack_cannot_be_the_strongest_at_low_fpr() -> None:
    from privacylab.defend import defense_row

    full = {"attack": "rmia", "adaptive": True, "examples": 5000, "members": 2500,
            "tpr_at_01pct_fpr": 0.02, "auc": 0.7, "balanced_accuracy": 0.6,
            "epsilon_lower_bound": 0.5}  # fmt: skip
    small = {**full, "attack": "boundary", "examples": 200, "members": 100,
             "tpr_at_01pct_fpr": 0.3, "auc": 0.8}  # fmt: skip
    row = defense_row(parse_defense("none"), Access.SCORES, 0.7, 1.0, None, [full, small])
    assert row["best"]["attack"] == "rmia"
    assert row["best_auc"]["attack"] == "boundary"
    alone = defense_row(parse_defense("none"), Access.SCORES, 0.7, 1.0, None, [small])
    assert alone["best"]["attack"] == "boundary"  # nothing better resolved: the best there is
