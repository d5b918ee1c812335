"""`privacylab train`: DP defaults chosen from ε (and overridden by any flag), `--tune N`, the
transformer on a text dataset, and one-line refusals."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from privacylab.cli import app
from privacylab.data import load_dataset, split_train_test
from privacylab.training.defaults import dp_defaults

runner = CliRunner()


def run_json(*args: str) -> tuple[dict, str]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0]), result.stderr


def sidecar(out) -> dict:
    return json.loads((out / "model.json").read_text())


def digits_train_size() -> int:
    return len(split_train_test(load_dataset("digits"))[0])


def test_dp_epsilon_alone_takes_the_rule(tmp_path) -> None:
    summary, err = run_json(
        "train", "--out", str(tmp_path), "--dataset", "digits", "--model", "logreg",
        "--dp", "--epsilon", "1",
    )  # fmt: skip
    n = digits_train_size()
    rule = dp_defaults(1.0, 1e-5, n)
    chosen = summary["defaults"]
    assert chosen["batch_size"] == rule.batch_size
    assert chosen["epochs"] == rule.epochs
    assert chosen["lr"] == rule.lr
    assert chosen["max_grad_norm"] == rule.max_grad_norm
    assert chosen["overridden"] == []
    assert "DP defaults for ε = 1" in err
    assert summary["epsilon"] <= 1.0
    assert summary["sample_rate"] == pytest.approx(rule.batch_size / n)
    assert summary["steps"] == rule.steps
    training = sidecar(tmp_path)["metadata"]["training"]
    assert (training["batch_size"], training["epochs"], training["lr"]) == (
        rule.batch_size,
        rule.epochs,
        rule.lr,
    )
    assert summary["test_accuracy"] > 0.5


def test_every_flag_overrides_the_rule(tmp_path) -> None:
    summary, err = run_json(
        "train", "--out", str(tmp_path), "--dataset", "digits", "--model", "logreg",
        "--dp", "--epsilon", "2", "--batch-size", "64", "--epochs", "2", "--lr", "0.3",
        "--max-grad-norm", "0.5", "--optimizer", "sgd",
    )  # fmt: skip
    assert summary["defaults"]["overridden"] == [
        "batch_size", "epochs", "lr", "max_grad_norm", "optimizer",
    ]  # fmt: skip
    training = sidecar(tmp_path)["metadata"]["training"]
    assert training["batch_size"] == 64
    assert training["epochs"] == 2
    assert training["lr"] == 0.3
    assert training["optimizer"] == "sgd"
    assert training["privacy"]["max_grad_norm"] == 0.5
    assert summary["max_grad_norm"] == 0.5
    assert "Given, so kept" in err


def test_a_given_clipping_norm_keeps_lr_times_c(tmp_path) -> None:
    summary, _ = run_json(
        "train", "--out", str(tmp_path), "--dataset", "digits", "--model", "logreg",
        "--dp", "--epsilon", "2", "--max-grad-norm", "0.25", "--epochs", "1",
    )  # fmt: skip
    rule = dp_defaults(2.0, 1e-5, digits_train_size())
    assert summary["defaults"]["lr"] == pytest.approx(rule.lr * rule.max_grad_norm / 0.25)


def test_non_private_defaults_are_unchanged(tmp_path) -> None:
    summary, err = run_json(
        "train", "--out", str(tmp_path), "--dataset", "digits", "--model", "logreg",
        "--epochs", "1",
    )  # fmt: skip
    assert "defaults" not in summary
    assert "DP defaults" not in err
    training = sidecar(tmp_path)["metadata"]["training"]
    assert (training["batch_size"], training["lr"], training["optimizer"]) == (
        256,
        0.1,
        "momentum",
    )


def test_noise_multiplier_without_epsilon_keeps_the_old_defaults(tmp_path) -> None:
    summary, _ = run_json(
        "train", "--out", str(tmp_path), "--dataset", "digits", "--model", "logreg",
        "--dp", "--noise-multiplier", "1.0", "--epochs", "1",
    )  # fmt: skip
    assert "defaults" not in summary
    assert sidecar(tmp_path)["metadata"]["training"]["batch_size"] == 256


def test_tune_reports_the_total_including_tuning(tmp_path) -> None:
    summary, err = run_json(
        "train", "--out", str(tmp_path), "--dataset", "digits", "--model", "logreg",
        "--dp", "--epsilon", "1", "--tune", "2", "--epochs", "2", "--seed", "1",
    )  # fmt: skip
    tuning = summary["tuning"]
    assert summary["epsilon"] == tuning["total_epsilon"] <= 1.0
    assert tuning["per_trial_epsilon"] < summary["epsilon"]
    assert tuning["trials_run"] == len(tuning["trials"]) >= 1
    assert err.count("trial ") >= tuning["trials_run"]
    assert str(round(tuning["per_trial_epsilon"], 3))[:4] in tuning["unaccounted_claim"]
    assert all(t["epochs"] == 2 for t in tuning["trials"])
    best = tuning["best"]
    assert best["noisy_validation_accuracy"] == max(
        t["noisy_validation_accuracy"] for t in tuning["trials"]
    )
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    assert (tmp_path / "model.safetensors").is_file()


@pytest.mark.parametrize("private", [False, True])
def test_transformer_trains_from_the_cli_on_text(tmp_path, private: bool) -> None:
    extra = ["--dp", "--epsilon", "8"] if private else []
    summary, _ = run_json(
        "train", "--out", str(tmp_path), "--dataset", "pydoc_topics", "--model", "transformer",
        "--epochs", "1", "--batch-size", "128", *extra,
    )  # fmt: skip
    assert summary["epochs_run"] == 1
    assert summary["private"] is private
    if private:
        assert summary["epsilon"] <= 8.0
    spec = sidecar(tmp_path)["spec"]
    assert spec["options"]["vocab_size"] == 256
    assert spec["input_shape"] == [32]


BAD = {
    "tune 0": ["--dp", "--epsilon", "1", "--tune", "0"],
    "tune 1": ["--dp", "--epsilon", "1", "--tune", "1"],
    "tune without dp": ["--tune", "4"],
    "tune without epsilon": ["--dp", "--noise-multiplier", "1", "--tune", "4"],
    "tune with sigma": ["--dp", "--epsilon", "1", "--noise-multiplier", "1", "--tune", "4"],
    "tune shuffle": ["--dp", "--epsilon", "1", "--sampling", "shuffle", "--tune", "4"],
    "tune text": ["--dp", "--epsilon", "1", "--tune", "abc"],
    "vocab on mlp": ["--vocab-size", "100"],
    "transformer on images": ["--model", "transformer"],
    "vocab too small": ["--dataset", "pydoc_topics", "--model", "transformer", "--vocab-size", "8"],
    "max len too small": ["--dataset", "pydoc_topics", "--model", "transformer", "--max-len", "4"],
    "zero clip with defaults": ["--dp", "--epsilon", "1", "--max-grad-norm", "0"],
    "epsilon zero": ["--dp", "--epsilon", "0"],
}


@pytest.mark.parametrize("args", BAD.values(), ids=BAD.keys())
def test_bad_input_is_one_line_and_exit_2(tmp_path, args: list[str]) -> None:
    base = ["train", "--out", str(tmp_path), "--dataset", "digits"]
    if "--dataset" in args:
        base = ["train", "--out", str(tmp_path)]
    result = runner.invoke(app, [*base, *args])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert not (tmp_path / "model.safetensors").exists()
