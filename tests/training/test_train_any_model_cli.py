"""`privacylab train --model file.py:factory --dataset data.npz --dp`: DP-SGD for a model and data
privacylab never saw. What DP-SGD cannot train exactly is one `error:` line with exit 2 (a stock
GRU or BatchNorm — with the fix to apply —, a layer called off the batch axis, empty data,
non-integer labels, a model that fails on the data); `--fix` applies the validator's fixes, prints
them, and the saved model reloads with the fixed architecture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from privacylab.cli import app
from privacylab.models import load_model

runner = CliRunner()

NETS = """
import torch
from torch import nn


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(1, 4, batch_first=True)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.rnn(x.reshape(x.shape[0], -1, 1))[0][:, -1])


class Positions(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(10, 4)
        self.positions = nn.Embedding(6, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, t):
        x = self.tokens(t.long()) + self.positions(torch.arange(t.shape[-1]))
        return self.head(torch.tanh(x).mean(-2))


def gru():
    return Recurrent()


def positions():
    return Positions()


def batch_norm():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)
    )


def wide():
    return nn.Sequential(nn.Flatten(), nn.Linear(7, 3))
"""


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    (tmp_path / "nets.py").write_text(NETS)
    rng = np.random.default_rng(0)

    def save(name: str, x_train, y_train, x_test, y_test) -> None:
        np.savez(tmp_path / name, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)

    tokens = rng.integers(0, 10, (60, 6)).astype(np.float32)
    save("tokens.npz", tokens[:40], rng.integers(0, 3, 40), tokens[40:], rng.integers(0, 3, 20))
    images = rng.normal(size=(60, 1, 6, 6)).astype(np.float32)
    save("images.npz", images[:40], rng.integers(0, 3, 40), images[40:], rng.integers(0, 3, 20))
    save(
        "empty.npz",
        np.zeros((0, 1, 6, 6), np.float32),
        np.zeros(0, np.int64),
        images[:5],
        np.zeros(5, np.int64),
    )
    save("floats.npz", images[:40], rng.normal(size=40), images[40:], rng.normal(size=20))
    return tmp_path


def _train(files: Path, model: str, data: str, *extra: str):
    return runner.invoke(
        app,
        [
            "train", "--model", str(files / f"nets.py:{model}"), "--dataset",
            str(files / data), "--dp", "--epsilon", "4", "--epochs", "1",
            "--out", str(files / f"out-{model}-{data}"), *extra,
        ],
    )  # fmt: skip


def _error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("model", "data", "expected"),
    [
        ("gru", "tokens.npz", "'rnn' (GRU)"),
        ("batch_norm", "images.npz", "'1' (BatchNorm2d)"),
    ],
)
def test_a_fixable_layer_is_refused_in_one_line_that_names_the_fix(files, model, data, expected):
    line = _error_line(_train(files, model, data))
    assert expected in line and "--fix" in line


@pytest.mark.parametrize(
    ("model", "data", "expected"),
    [
        (
            "positions",
            "tokens.npz",
            "'positions' (Embedding) is called on a tensor whose dimension",
        ),
        ("wide", "empty.npz", "training"),
        ("wide", "floats.npz", "labels must be whole numbers"),
        ("wide", "images.npz", "the model fails on examples of shape"),
    ],
    ids=["not-batch-first", "empty-data", "float-labels", "model-does-not-fit-data"],
)
def test_bad_model_or_data_is_one_line_exit_2(files, model, data, expected):
    assert expected in _error_line(_train(files, model, data))


def test_fix_needs_dp(files):
    result = runner.invoke(
        app,
        ["train", "--model", str(files / "nets.py:gru"), "--dataset", str(files / "tokens.npz"),
         "--fix", "--out", str(files / "out")],
    )  # fmt: skip
    assert "--fix prepares a model for DP-SGD" in _error_line(result)


@pytest.mark.parametrize(
    ("model", "data", "replaced"),
    [("gru", "tokens.npz", "DPGRU"), ("batch_norm", "images.npz", "GroupNorm")],
)
def test_fix_trains_and_the_saved_model_reloads_fixed(files, model, data, replaced):
    result = _train(files, model, data, "--fix", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0 < summary["epsilon"] <= 4
    assert "fix: replace by" in result.stderr and replaced in result.stderr
    net, spec, _ = load_model(files / f"out-{model}-{data}")
    assert spec.transforms == ("dp-fix",)
    assert replaced in {type(m).__name__ for m in net.modules()}
    x = torch.from_numpy(np.load(files / data)["x_test"])
    assert torch.isfinite(net(x)).all()


def test_auto_trains_the_model_ghost_refuses(files):
    result = _train(files, "positions", "tokens.npz", "--clipping", "auto", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["epsilon"] <= 4
