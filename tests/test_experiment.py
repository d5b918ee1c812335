"""`privacylab run` and `privacylab attack membership`: the whole train → attack → report loop on
small data, the DP sanity check on ε lower bounds, resuming, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from privacylab.attacks.membership import AttackError
from privacylab.cli import app
from privacylab.execution import ResultStore
from privacylab.experiment import DEFAULT_ATTACKS, RunConfig, resolve_attacks, run_experiment

runner = CliRunner()

SMALL = {
    "dataset": "digits",
    "model_options": {"widths": [64]},
    "members": 150,
    "population": 300,
    "references": 4,
    "epochs": 20,
    "batch_size": 32,
    "dp_batch_size": 64,
    "subsample": 15,
    "workers": 1,
    "audits": ("dirac",),
    "audit_trials": 20,
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("report")
    payload = run_experiment(RunConfig(epsilons=(1.0,), **SMALL), out)
    return out, payload


def test_run_writes_the_report_with_every_attack_on_every_target(
    report: tuple[Path, dict],
) -> None:
    out, payload = report
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(payload))
    html = (out / "index.html").read_text()
    assert [t["name"] for t in payload["targets"]] == ["non-private", "dp-eps1"]
    for target in payload["targets"]:
        assert [a["attack"] for a in target["attacks"]] == list(DEFAULT_ATTACKS)
        assert (out / target["images"]["roc"]).read_bytes().startswith(b"\x89PNG")
        assert target["images"]["roc"] in html
        for attack in target["attacks"]:
            assert attack["queries"] > 0 or attack["access"] == "white-box"
            assert 0.0 <= attack["auc"] <= 1.0
    private = payload["targets"][1]
    assert private["epsilon"] == pytest.approx(1.0, abs=0.01)
    assert private["accountant"] == "pld" and private["delta"] == 1e-5


def test_no_attack_claims_more_than_the_certified_epsilon(report: tuple[Path, dict]) -> None:
    for target in report[1]["targets"]:
        if target["epsilon"] is None:
            continue
        for attack in target["attacks"]:
            assert attack["epsilon_lower_bound"] <= target["epsilon"], attack["attack"]


def test_boundary_attacks_run_on_the_subsample(report: tuple[Path, dict]) -> None:
    attacks = {a["attack"]: a for a in report[1]["targets"][0]["attacks"]}
    assert attacks["boundary"]["examples"] == 30
    assert attacks["loss"]["examples"] == 300


def test_a_second_run_trains_nothing(report: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = report
    models = sorted((out / "cache").rglob("model.safetensors"))
    assert len(models) == 2 + 2 * 4
    stamps = [m.stat().st_mtime_ns for m in models]
    stages: list[str] = []
    run_experiment(
        RunConfig(epsilons=(1.0,), **{**SMALL, "attacks": ("loss",)}),
        tmp_path / "again",
        cache=out / "cache",
        progress=lambda stage, done, total: stages.append(stage),
    )
    assert [m.stat().st_mtime_ns for m in models] == stamps
    assert "train targets" in stages


def test_attack_names_and_aliases() -> None:
    assert resolve_attacks(["lira", "rmia", "lira-online"]) == ["lira-online", "rmia"]
    with pytest.raises(AttackError, match="unknown membership attack 'lyra'"):
        resolve_attacks(["lyra"])


def test_cli_run_json_and_attack_membership_on_a_saved_model(tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["run", "--dataset", "digits", "--widths", "32", "--epsilons", "4", "--members",
            "100", "--references", "2", "--epochs", "5", "--workers", "1",
            "--attacks", "loss,lira-offline,gap", "--audits", "one-run-whitebox", "--out",
            str(out), "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert payload == json.loads((out / "results.json").read_text())
    assert [t["name"] for t in payload["targets"]] == ["non-private", "dp-eps4"]
    # the default defence section: output defences on the non-private target, no training
    rows = payload["defenses"]["rows"]
    assert [r["defense"] for r in rows] == ["none", "topk:1", "rounding:1", "label-only"]
    assert {r["test_accuracy"] for r in rows} == {payload["targets"][0]["test_accuracy"]}
    assert (out / "defense_frontier.png").is_file()
    with ResultStore(out / "cache" / "store.sqlite") as store:
        assert "defended-targets" not in store.namespaces()

    model = tmp_path / "model"
    trained = runner.invoke(
        app,
        ["train", "--dataset", "digits", "--widths", "32", "--epochs", "5", "--out", str(model)],
    )
    assert trained.exit_code == 0, trained.stderr
    result = runner.invoke(
        app,
        ["attack", "membership", "--target", str(model), "--attack", "lira,loss",
         "--references", "2", "--workers", "1", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    attacked = json.loads(result.stdout.strip().splitlines()[-1])
    assert [a["attack"] for a in attacked["attacks"]] == ["lira-online", "loss"]
    assert attacked["epsilon"] is None and attacked["references"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--attacks", "lyra"], "unknown membership attack 'lyra'"),
        (["run", "--epsilons", "-1"], "epsilon must be a finite number > 0"),
        (["run", "--epsilons", "x"], "--epsilons must be comma-separated numbers"),
        (["run", "--references", "0"], "references must be a whole number >= 1"),
        (["run", "--dataset", "nope"], "nope"),
        (["run", "--device", "tpu9"], "unknown device 'tpu9'"),
        (["attack", "membership", "--target", "/nonexistent"], "nonexistent"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, [*args, "--out", str(tmp_path)] if args[0] == "run" else args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_a_killed_run_resumes_without_retraining(tmp_path: Path) -> None:
    """SIGKILL `privacylab run` once some models are stored; the re-run keeps them (same
    files, untouched) and trains only the rest."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    out = tmp_path / "report"
    store = out / "cache" / "store.sqlite"
    args = [sys.executable, "-m", "privacylab", "run", "--dataset", "digits", "--widths", "32",
            "--epsilons", "4", "--members", "150", "--references", "6", "--epochs", "15",
            "--workers", "1", "--attacks", "loss", "--audits", "none", "--defenses", "off",
            "--out", str(out)]  # fmt: skip

    def stored() -> int:
        try:
            with sqlite3.connect(store) as db:
                return int(db.execute("SELECT COUNT(*) FROM results").fetchone()[0])
        except sqlite3.Error:
            return 0

    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while stored() < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    before = stored()
    assert 3 <= before < 2 + 2 * 6, before
    with sqlite3.connect(store) as db:
        folders = [json.loads(v)["folder"] for (v,) in db.execute("SELECT value FROM results")]
    finished = {
        Path(folder) / "model.safetensors": (Path(folder) / "model.safetensors").stat().st_mtime_ns
        for folder in folders
    }
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert stored() == 2 + 2 * 6
    for path, stamp in finished.items():
        assert path.stat().st_mtime_ns == stamp, path
    assert json.loads((out / "results.json").read_text())["targets"][1]["name"] == "dp-eps4"
