"""`privacylab account model PATH` re-accounts a saved model from the event it recorded."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from privacylab.cli import app


def test_account_model_reaccounts_the_recorded_event(tmp_path):
    runner = CliRunner()
    out = tmp_path / "m"
    trained = runner.invoke(
        app,
        ["train", "--dataset", "digits", "--model", "logreg", "--epochs", "2", "--dp",
         "--epsilon", "2", "--out", str(out), "--json"],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    at_train = json.loads(trained.stdout)["epsilon"]
    answers = {}
    for accountant in ("pld", "rdp"):
        result = runner.invoke(
            app, ["account", "model", str(out), "--accountant", accountant, "--json"]
        )
        assert result.exit_code == 0, result.output
        answers[accountant] = json.loads(result.stdout)
    assert answers["pld"]["epsilon"] == at_train
    assert answers["rdp"]["epsilon"] >= answers["pld"]["epsilon"]
    assert answers["pld"]["delta"] == 1e-5
    looser = runner.invoke(app, ["account", "model", str(out), "--delta", "1e-7", "--json"])
    assert json.loads(looser.stdout)["epsilon"] > at_train
    missing = runner.invoke(app, ["account", "model", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and missing.stderr.startswith("error: ")
