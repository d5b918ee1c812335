"""The one trainer: learns, accounts privacy correctly, stops on a budget, resumes after a kill."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from privacylab.accounting import PldAccountant, dp_sgd
from privacylab.cli import app
from privacylab.data import load_dataset, split_train_test
from privacylab.models import build_model, load_model
from privacylab.training.config import PrivacyConfig, TrainConfig, TrainingError
from privacylab.training.job import train_job
from privacylab.training.trainer import train


@pytest.fixture(scope="module")
def digits():
    return split_train_test(load_dataset("digits"))


def _logreg(train_part):
    return build_model("logreg", train_part.input_shape, train_part.num_classes, seed=0)


def test_non_private_training_learns(digits) -> None:
    tr, te = digits
    result = train(_logreg(tr), tr, TrainConfig(epochs=10, batch_size=64, lr=0.1), te)
    assert result.privacy is None
    assert result.eval_accuracy is not None and result.eval_accuracy > 0.9
    assert [r.epoch for r in result.history] == list(range(1, 11))


def test_private_training_spends_the_target_epsilon(digits) -> None:
    tr, te = digits
    privacy = PrivacyConfig(epsilon=2.0, delta=1e-5, max_grad_norm=1.0)
    cfg = TrainConfig(epochs=8, batch_size=128, lr=0.5, privacy=privacy)
    result = train(_logreg(tr), tr, cfg, te)
    spent = result.privacy
    assert spent is not None
    q = 128 / len(tr)
    assert spent.sample_rate == pytest.approx(q)
    assert spent.steps == 8 * round(1 / q)
    independent = PldAccountant().compose(dp_sgd(spent.noise_multiplier, q, spent.steps))
    assert spent.epsilon == pytest.approx(independent.epsilon(1e-5))
    assert 1.98 <= spent.epsilon <= 2.0
    epsilons = [r.epsilon for r in result.history]
    assert epsilons == sorted(epsilons)
    assert result.eval_accuracy is not None and result.eval_accuracy > 0.75


def test_budget_stops_training(digits) -> None:
    tr, te = digits
    privacy = PrivacyConfig(epsilon=1.0, noise_multiplier=2.0, max_grad_norm=1.0)
    cfg = TrainConfig(epochs=20, batch_size=128, lr=0.5, privacy=privacy)
    result = train(_logreg(tr), tr, cfg, te)
    assert result.stopped == "privacy budget spent"
    assert result.privacy is not None and result.privacy.epsilon <= 1.0
    assert len(result.history) < 20


def test_shuffled_batches_are_flagged(digits) -> None:
    tr, te = digits
    privacy = PrivacyConfig(noise_multiplier=1.0, sampling="shuffle")
    result = train(_logreg(tr), tr, TrainConfig(epochs=1, batch_size=128, privacy=privacy), te)
    assert result.privacy is not None and "Poisson" in (result.privacy.note or "")


def test_same_seed_same_model(digits) -> None:
    tr, te = digits
    cfg = TrainConfig(epochs=2, batch_size=64, privacy=PrivacyConfig(noise_multiplier=1.0))
    a = train(_logreg(tr), tr, cfg, te).model
    b = train(_logreg(tr), tr, cfg, te).model
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_killed_run_resumes_to_the_same_model(digits, tmp_path) -> None:
    tr, te = digits
    cfg = TrainConfig(epochs=4, batch_size=64, lr=0.2, privacy=PrivacyConfig(noise_multiplier=1.0))
    whole = train(_logreg(tr), tr, cfg, te).model

    def kill_after_two(record) -> None:
        if record.epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_logreg(tr), tr, cfg, te, checkpoint_dir=tmp_path, progress=kill_after_two)
    resumed = train(_logreg(tr), tr, cfg, te, checkpoint_dir=tmp_path)
    assert [r.epoch for r in resumed.history] == [1, 2, 3, 4]
    for pa, pb in zip(whole.parameters(), resumed.model.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6)
    other = TrainConfig(epochs=5, batch_size=64, privacy=PrivacyConfig(noise_multiplier=1.0))
    with pytest.raises(TrainingError, match="different training configuration"):
        train(_logreg(tr), tr, other, te, checkpoint_dir=tmp_path)


def test_frozen_front_end_is_applied_once(digits) -> None:
    tr, te = digits
    model = build_model("scatnet", tr.input_shape, tr.num_classes, seed=0, scales=1)
    cfg = TrainConfig(epochs=5, batch_size=64, lr=0.5, privacy=PrivacyConfig(noise_multiplier=0.5))
    result = train(model, tr, cfg, te)
    assert result.eval_accuracy is not None and result.eval_accuracy > 0.8


def test_batch_norm_is_refused_under_dp(digits) -> None:
    tr, te = digits
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.Linear(32, 10))
    cfg = TrainConfig(epochs=1, privacy=PrivacyConfig(noise_multiplier=1.0))
    with pytest.raises(ValueError, match="GroupNorm"):
        train(model, tr, cfg, te)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (TrainConfig(lr=-0.1), "learning rate"),
        (TrainConfig(epochs=0), "epochs"),
        (TrainConfig(optimizer="rmsprop"), "optimizer"),
        (TrainConfig(privacy=PrivacyConfig(epsilon=1.0, delta=1.0)), "delta"),
        (TrainConfig(privacy=PrivacyConfig()), "target epsilon or a noise multiplier"),
        (TrainConfig(privacy=PrivacyConfig(epsilon=1.0, clipping="magic")), "clipping"),
    ],
)
def test_bad_config_is_one_line(config: TrainConfig, message: str) -> None:
    with pytest.raises(TrainingError, match=message) as info:
        config.validate()
    assert "\n" not in str(info.value)


def test_train_job_saves_a_loadable_model(tmp_path) -> None:
    cfg = TrainConfig(epochs=2, batch_size=128, lr=0.5, privacy=PrivacyConfig(epsilon=4.0))
    summary = train_job("digits", "logreg", cfg, tmp_path / "run")
    _, spec, metadata = load_model(tmp_path / "run")
    assert spec.name == "logreg"
    assert metadata["summary"]["epsilon"] == pytest.approx(summary["epsilon"])
    assert summary["epsilon"] <= 4.0 and summary["test_accuracy"] > 0.3


def test_cli_train_json(tmp_path) -> None:
    runner = CliRunner()
    args = [
        "train",
        "--dataset",
        "digits",
        "--model",
        "logreg",
        "--epochs",
        "2",
        "--lr",
        "0.5",
        "--dp",
        "--epsilon",
        "3",
        "--batch-size",
        "128",
        "--out",
        str(tmp_path / "r"),
        "--json",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["epsilon"] <= 3.0 and payload["delta"] == 1e-5
    assert {"test_accuracy", "noise_multiplier", "sample_rate", "steps"} <= set(payload)
    assert (tmp_path / "r" / "model.safetensors").exists()


@pytest.mark.parametrize(
    "extra",
    [
        ["--lr", "-1"],
        ["--dp", "--epsilon", "1", "--delta", "1.5"],
        ["--model", "resnet999"],
        ["--dataset", "imagenet"],
        ["--epsilon", "1"],
        ["--dp", "--epsilon", "1", "--clipping", "magic"],
        ["--dp", "--epsilon", "1", "--model", "cnn", "--dataset", "mnist5k", "--norm", "batch"],
    ],
)
def test_cli_train_bad_input(tmp_path, extra: list[str]) -> None:
    runner = CliRunner()
    base = [
        "train",
        "--dataset",
        "digits",
        "--model",
        "logreg",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "bad"),
    ]
    result = runner.invoke(app, base + extra)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error:")
