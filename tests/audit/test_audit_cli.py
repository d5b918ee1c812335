"""`privacylab audit`: the JSON contract, durable trials, one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from privacylab.cli import app

runner = CliRunner()


def _audit(*args: str) -> dict:
    result = runner.invoke(app, ["audit", *args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_json_contract_and_resumed_trials(tmp_path: Path) -> None:
    store = str(tmp_path / "store.sqlite")
    common = ["--method", "dirac", "--epsilon", "2", "--executor", "serial", "--store", store]
    first = _audit(*common, "--trials", "20")
    for key in ("epsilon_theory", "epsilon_lower_bound", "confidence", "method", "trials"):
        assert key in first
    assert first["method"] == "dirac" and first["confidence"] == 0.95
    assert first["epsilon_lower_bound"] <= first["epsilon_theory"]
    again = _audit(*common, "--trials", "20")
    assert again["epsilon_lower_bound"] == first["epsilon_lower_bound"]
    assert again["wall_seconds"] < first["wall_seconds"]


def test_one_run_whitebox_from_the_cli(tmp_path: Path) -> None:
    out = _audit("--method", "one-run-whitebox", "--epsilon", "8", "--store",
                 str(tmp_path / "s.sqlite"))  # fmt: skip
    assert out["trials"] == 1 and 0 < out["epsilon_lower_bound"] <= out["epsilon_theory"]


def test_poisoning_distance_from_the_cli(tmp_path: Path) -> None:
    out = _audit("--method", "clipbkd", "--k", "2", "--epsilon", "8", "--trials", "20",
                 "--executor", "serial", "--store", str(tmp_path / "s.sqlite"))  # fmt: skip
    assert out["params"]["k"] == 2 and out["params"]["init"] == "fixed"
    assert out["trials"] == 20 and out["epsilon_lower_bound"] <= out["epsilon_theory"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "tarot"], "unknown audit method 'tarot'"),
        (["--epsilon", "-1"], "epsilon"),
        (["--delta", "2"], "delta"),
        (["--confidence", "1.5"], "confidence must be in (0, 1)"),
        (["--executor", "slurm"], "slurm"),
        (["--method", "dirac", "--k", "2"], "applies to the poisoning audits"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["audit", *args, "--store", str(tmp_path / "s.sqlite")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_sigkilled_audit_resumes_with_no_trial_lost_or_counted_twice(tmp_path: Path) -> None:
    """Kill `privacylab audit` (and its pool workers) with SIGKILL mid-run, run it again: the
    store holds each trial exactly once and the result equals an uninterrupted audit's."""
    from privacylab.audit.runner import NAMESPACE
    from privacylab.execution import ResultStore

    trials = 300
    args = ["--method", "clipbkd", "--epsilon", "4", "--trials", str(trials), "--workers", "2"]
    killed = tmp_path / "killed.sqlite"
    command = [sys.executable, "-m", "privacylab", "audit", *args, "--json"]
    with ResultStore(killed) as watcher:
        proc = subprocess.Popen(
            [*command, "--store", str(killed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: killpg takes the workers too
        )
        try:
            deadline = time.monotonic() + 120
            while watcher.count(NAMESPACE) < 20:
                assert proc.poll() is None, proc.communicate()[1].decode()
                assert time.monotonic() < deadline, "the audit never stored 20 trials"
                time.sleep(0.01)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        at_kill = watcher.items(NAMESPACE)
    assert 20 <= len(at_kill) < trials, "the kill came too late to test resuming"

    resumed = _audit(*args, "--store", str(killed))
    clean = _audit(*args, "--store", str(tmp_path / "clean.sqlite"))
    with ResultStore(killed) as store:
        rows = store.items(NAMESPACE)
    assert len(rows) == store_count(killed) == trials
    assert all(rows[key] == value for key, value in at_kill.items())  # kept, not redone
    for key in ("epsilon_lower_bound", "counts", "trials"):
        assert resumed[key] == clean[key]


def store_count(path: Path) -> int:
    """Rows in the audit namespace, counted by SQL (a duplicate key would count twice)."""
    import sqlite3

    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COUNT(*) FROM results").fetchone()[0])
