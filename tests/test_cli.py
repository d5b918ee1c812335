"""The `privacylab` command line: output contracts, agreement with the API, one-line errors."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from privacylab import __version__
from privacylab.accounting import dp_sgd, make_accountant, steps_from_epochs
from privacylab.cli import app

runner = CliRunner()

EPSILON_KEYS = {
    "epsilon",
    "delta",
    "accountant",
    "order",
    "noise_multiplier",
    "sample_rate",
    "steps",
    "note",
}
BASE = ["--noise-multiplier", "1.1", "--sample-rate", "0.01", "--delta", "1e-5"]


def invoke(*args: str):
    """Run the app in-process; stdout and stderr are kept apart."""
    return runner.invoke(app, list(args))


def run_json(*args: str) -> dict:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0])


def api_epsilon(accountant: str, sigma: float, q: float, steps: int, delta: float) -> float:
    return make_accountant(accountant).compose(dp_sgd(sigma, q, steps)).epsilon(delta)


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"privacylab {__version__}"


def test_no_placeholder_commands() -> None:
    for name in ("report",):
        assert invoke(name, "--help").exit_code == 2
    for name in ("train", "run", "attack", "audit"):
        assert invoke(name, "--help").exit_code == 0


@pytest.mark.parametrize("accountant", ["rdp", "rdp-classic", "pld", "gdp"])
def test_epsilon_json_matches_api(accountant: str) -> None:
    payload = run_json("account", "epsilon", *BASE, "--steps", "1000", "--accountant", accountant)
    assert set(payload) == EPSILON_KEYS
    assert payload["accountant"] == accountant
    assert payload["delta"] == 1e-5
    assert payload["noise_multiplier"] == 1.1
    assert payload["sample_rate"] == 0.01
    assert payload["steps"] == 1000
    expected = api_epsilon(accountant, 1.1, 0.01, 1000, 1e-5)
    assert payload["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert 0 < payload["epsilon"] < 10
    if accountant.startswith("rdp"):
        assert isinstance(payload["order"], float) and payload["order"] > 1
    if accountant == "gdp":
        assert payload["note"], "GDP must state that it may under-state ε"


def test_epsilon_default_accountant_is_pld() -> None:
    payload = run_json("account", "epsilon", *BASE, "--steps", "100")
    assert payload["accountant"] == "pld"


def test_epsilon_human_output() -> None:
    result = invoke("account", "epsilon", *BASE, "--steps", "1000", "--accountant", "gdp")
    assert result.exit_code == 0
    assert "ε =" in result.stdout and "gdp" in result.stdout
    assert "note:" in result.stdout


def test_epochs_equals_steps() -> None:
    q = 256 / 60000
    steps = steps_from_epochs(60, q)
    assert steps == math.ceil(60 / q)
    common = ["account", "epsilon", "--noise-multiplier", "1.1", "--sample-rate", str(q)]
    by_epochs = run_json(*common, "--delta", "1e-5", "--epochs", "60", "--accountant", "rdp")
    by_steps = run_json(*common, "--delta", "1e-5", "--steps", str(steps), "--accountant", "rdp")
    assert by_epochs == by_steps
    assert by_epochs["epsilon"] == pytest.approx(2.597, abs=2e-3)  # TF Privacy MNIST, tight


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_noise_round_trip(accountant: str) -> None:
    target, delta, q, steps = 2.0, 1e-5, 0.01, 2000
    payload = run_json(
        "account", "noise", "--epsilon", str(target), "--delta", str(delta),
        "--sample-rate", str(q), "--steps", str(steps), "--accountant", accountant,
    )  # fmt: skip
    assert {"noise_multiplier", "epsilon", "delta", "accountant", "sample_rate", "steps"} <= set(
        payload
    )
    assert payload["epsilon"] == target and payload["steps"] == steps
    sigma = payload["noise_multiplier"]
    achieved = run_json(
        "account", "epsilon", "--noise-multiplier", repr(sigma), "--sample-rate", str(q),
        "--steps", str(steps), "--delta", str(delta), "--accountant", accountant,
    )["epsilon"]  # fmt: skip
    assert achieved <= target * (1 + 1e-9)
    assert achieved == pytest.approx(target, rel=1e-2)


def test_noise_with_epochs() -> None:
    by_epochs = run_json(
        "account", "noise", "--epsilon", "3", "--delta", "1e-5", "--sample-rate", "0.01",
        "--epochs", "5", "--accountant", "rdp",
    )  # fmt: skip
    assert by_epochs["steps"] == 500


def test_steps_is_the_largest_that_fits() -> None:
    sigma, q, target, delta = 1.0, 0.01, 1.5, 1e-5
    payload = run_json(
        "account", "steps", "--noise-multiplier", str(sigma), "--sample-rate", str(q),
        "--epsilon", str(target), "--delta", str(delta), "--accountant", "rdp",
    )  # fmt: skip
    steps = payload["steps"]
    assert steps >= 1
    assert payload["epochs"] == pytest.approx(steps * q)
    assert api_epsilon("rdp", sigma, q, steps, delta) <= target
    assert api_epsilon("rdp", sigma, q, steps + 1, delta) > target


def test_curve_json_and_plot(tmp_path) -> None:
    figure = tmp_path / "fig2.png"
    payload = run_json(
        "account", "curve", "--noise-multiplier", "4", "--sample-rate", "0.01",
        "--delta", "1e-5", "--epochs", "60", "--points", "3", "--plot", str(figure),
    )  # fmt: skip
    assert payload["plot"] == str(figure)
    assert payload["epochs"] == pytest.approx([20, 40, 60])
    assert set(payload["curves"]) == {"rdp", "pld", "gdp", "advanced"}
    for values in payload["curves"].values():
        assert len(values) == 3
        assert all(a < b for a, b in itertools.pairwise(values))
    curves = payload["curves"]
    for i in range(3):
        assert curves["pld"][i] <= curves["rdp"][i] * (1 + 1e-6)
        assert curves["rdp"][i] < curves["advanced"][i]
    rdp_at_60 = api_epsilon("rdp", 4, 0.01, 6000, 1e-5)
    assert curves["rdp"][-1] == pytest.approx(rdp_at_60, rel=1e-9)
    data = figure.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_curve_table_without_json() -> None:
    result = invoke(
        "account", "curve", "--noise-multiplier", "4", "--sample-rate", "0.01",
        "--delta", "1e-5", "--epochs", "2", "--points", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "advanced" in result.stdout and "pld" in result.stdout


EPS = ["account", "epsilon"]
# fmt: off
BAD_INPUTS = {
    "sigma zero": [*EPS, "--noise-multiplier", "0", "--sample-rate", "0.01", "--delta", "1e-5",
                   "--steps", "10"],
    "sigma negative": [*EPS, "--noise-multiplier", "-1", "--sample-rate", "0.01", "--delta",
                       "1e-5", "--steps", "10"],
    "sigma nan": [*EPS, "--noise-multiplier", "nan", "--sample-rate", "0.01", "--delta", "1e-5",
                  "--steps", "10"],
    "sigma inf": [*EPS, "--noise-multiplier", "inf", "--sample-rate", "0.01", "--delta", "1e-5",
                  "--steps", "10"],
    "sigma text": [*EPS, "--noise-multiplier", "abc", "--sample-rate", "0.01", "--delta", "1e-5",
                   "--steps", "10"],
    "q above 1": [*EPS, "--noise-multiplier", "1", "--sample-rate", "1.5", "--delta", "1e-5",
                  "--steps", "10"],
    "q zero": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0", "--delta", "1e-5",
               "--steps", "10"],
    "q nan": [*EPS, "--noise-multiplier", "1", "--sample-rate", "nan", "--delta", "1e-5",
              "--steps", "10"],
    "delta zero": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta", "0",
                   "--steps", "10"],
    "delta one": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta", "1",
                  "--steps", "10"],
    "delta inf": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta", "inf",
                  "--steps", "10"],
    "delta nan": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta", "nan",
                  "--steps", "10"],
    "steps zero": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta", "1e-5",
                   "--steps", "0"],
    "steps negative": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta",
                       "1e-5", "--steps", "-3"],
    "steps fractional": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta",
                         "1e-5", "--steps", "2.5"],
    "epochs inf": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta", "1e-5",
                   "--epochs", "inf"],
    "epochs nan": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta", "1e-5",
                   "--epochs", "nan"],
    "epochs negative": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta",
                        "1e-5", "--epochs", "-1"],
    "steps and epochs": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta",
                         "1e-5", "--steps", "10", "--epochs", "1"],
    "neither steps nor epochs": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01",
                                 "--delta", "1e-5"],
    "missing delta": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10"],
    "unknown accountant": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta",
                           "1e-5", "--steps", "10", "--accountant", "moments"],
    "unknown option": [*EPS, "--noise-multiplier", "1", "--sample-rate", "0.01", "--delta",
                       "1e-5", "--steps", "10", "--sigma", "2"],
    "noise epsilon zero": ["account", "noise", "--epsilon", "0", "--delta", "1e-5",
                           "--sample-rate", "0.01", "--steps", "10"],
    "noise epsilon inf": ["account", "noise", "--epsilon", "inf", "--delta", "1e-5",
                          "--sample-rate", "0.01", "--steps", "10"],
    "noise no steps": ["account", "noise", "--epsilon", "1", "--delta", "1e-5",
                       "--sample-rate", "0.01"],
    "noise bad accountant": ["account", "noise", "--epsilon", "1", "--delta", "1e-5",
                             "--sample-rate", "0.01", "--steps", "10", "--accountant", "x"],
    "steps epsilon nan": ["account", "steps", "--noise-multiplier", "1", "--sample-rate", "0.01",
                          "--epsilon", "nan", "--delta", "1e-5"],
    "steps q above 1": ["account", "steps", "--noise-multiplier", "1", "--sample-rate", "2",
                        "--epsilon", "1", "--delta", "1e-5"],
    "curve sigma negative": ["account", "curve", "--noise-multiplier", "-4", "--sample-rate",
                             "0.01", "--delta", "1e-5", "--epochs", "10"],
    "curve points zero": ["account", "curve", "--noise-multiplier", "4", "--sample-rate", "0.01",
                          "--delta", "1e-5", "--epochs", "10", "--points", "0"],
    "curve epochs inf": ["account", "curve", "--noise-multiplier", "4", "--sample-rate", "0.01",
                         "--delta", "1e-5", "--epochs", "inf"],
    "curve unwritable plot": ["account", "curve", "--noise-multiplier", "4", "--sample-rate",
                              "0.01", "--delta", "1e-5", "--epochs", "1", "--points", "1",
                              "--plot", "/nonexistent-dir/fig.png"],
    "unknown command": ["account", "train"],
}
# fmt: on


@pytest.mark.parametrize("args", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_gives_one_line_and_exit_2(args: list[str]) -> None:
    for extra in ([], ["--json"]):
        result = invoke(*args, *extra)
        assert result.exit_code == 2, (result.stdout, result.stderr)
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: ")
        assert "Traceback" not in result.stderr


def test_subprocess_entry_point() -> None:
    """`python -m privacylab` uses the same app; real streams, real exit codes."""
    ok = subprocess.run(
        [sys.executable, "-m", "privacylab", "--version"], capture_output=True, text=True
    )
    assert ok.returncode == 0 and ok.stdout.strip() == f"privacylab {__version__}"
    bad = subprocess.run(
        [sys.executable, "-m", "privacylab", "account", "epsilon", "--noise-multiplier", "1",
         "--sample-rate", "1.5", "--delta", "1e-5", "--steps", "10", "--json"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.strip() == "error: sample rate must be in (0, 1], got 1.5"
