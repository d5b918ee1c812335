"""`privacylab attack memorization` (issue 18): the JSON object it prints (the issue's keys and
the job's), a re-run reusing the saved models, the plain summary, a DP-SGD run (ε reported
and spent within it), a tabular secret decoded float-exact, and every refusal as one `error:`
line with exit code 2 before any training (nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from _cli import command
from privacylab.data import load_dataset
from privacylab.models import load_model

attack, attack_json, attack_fails = command("attack", "memorization")

TINY = ["--dataset", "digits", "--train-size", "500", "--test-size", "300", "--epochs", "3"]
RECIPE = ["--recipe", '{"model": "mlp", "model_options": {"widths": [64]}, "lr": 0.01}']
GAME = [*TINY, *RECIPE, "--method", "sign", "--bits", "4096"]

ISSUE_KEYS = {"method", "clean_accuracy", "honest_accuracy", "recovered", "bit_accuracy", "psnr",
              "queries"}  # fmt: skip
JOB_KEYS = {"folder", "epsilon", "delta", "items", "pixel_bits", "checks"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("cli") / "run"
    return out, attack_json(*GAME, "--out", str(out))


def test_json_keys(run) -> None:
    out, payload = run
    assert set(payload) >= ISSUE_KEYS | JOB_KEYS
    assert payload["method"] == "sign" and payload["folder"] == str(out.resolve())
    assert payload["items"] == 4096 // 256 and payload["pixel_bits"] == 4
    assert payload["bits_encoded"] == 4096 and payload["queries"] == 0
    assert payload["epsilon"] is None and payload["delta"] is None
    assert json.loads((out / "result.json").read_text()) == payload
    html = (out / "index.html").read_text()
    pictures = list(out.glob("memorization-*-pairs.png"))
    assert '<section id="memorization">' in html and len(pictures) == 1
    assert f'<img src="{pictures[0].name}"' in html


def test_rerun_reuses_the_models(run) -> None:
    out, payload = run
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/model.safetensors")}
    assert len(stamps) == 2
    result = attack(*GAME, "--out", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == payload
    assert "reused" in result.stderr
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


def test_summary_without_json(run) -> None:
    out, _ = run
    result = attack(*GAME, "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "sign on digits" in result.stdout and "bit accuracy" in result.stdout
    assert "items recovered" in result.stdout


def test_dp_sgd_run_reports_its_epsilon(tmp_path) -> None:
    out = tmp_path / "dp"
    payload = attack_json(*GAME, "--epsilon", "8", "--out", str(out))
    assert payload["epsilon"] == 8.0 and payload["delta"] == 1e-5
    assert 0 < payload["privacy"]["epsilon"] <= 8.0 + 1e-9
    config = json.loads((out / "config.json").read_text())
    assert config["epsilon"] == 8.0 and config["recipe"]["epsilon"] == 8.0


def test_tabular_rows_decode_float_exact(tmp_path) -> None:
    out = tmp_path / "rows"
    payload = attack_json(
        "--dataset", "breast_cancer", "--train-size", "300", "--test-size", "100",
        "--epochs", "2", *RECIPE, "--method", "lsb", "--bits", str(5 * 30 * 32),
        "--out", str(out),
    )  # fmt: skip
    assert payload["items"] == 5 and payload["pixel_bits"] == 32
    assert payload["exact_match"] == 1.0 and payload["psnr"] is None
    splits = json.loads((out / "splits.json").read_text())
    train = np.asarray(splits["train"])
    rows = train[np.random.default_rng(0).permutation(300)[:5]]
    assert payload["secret_rows"] == rows.tolist()
    x = load_dataset("breast_cancer").features[torch.as_tensor(rows)].numpy()
    truth = np.unpackbits(x.astype(">f4").view(np.uint8))
    model, _, _ = load_model(out / "model")
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    low = (weights.view(np.uint32) & 0xFFFF).astype(">u2").view(np.uint8)
    assert np.array_equal(np.unpackbits(low)[: truth.size], truth)


def _refused(tmp_path: Path, *args: str) -> str:
    out = tmp_path / "never"
    line = attack_fails(*args, "--out", str(out))
    assert not out.exists()
    return line


def test_refusals(tmp_path) -> None:
    assert "unknown memorization method 'zip'; choose one of" in _refused(
        tmp_path, *TINY, "--method", "zip"
    )
    assert "nope" in _refused(tmp_path, "--dataset", "nope")
    line = _refused(tmp_path, *TINY, *RECIPE, "--method", "sign", "--bits", "100000")
    assert "sign: the secret needs 99840 bits but this model can hold at most 4810 bits" in line
    assert "100 bits hold no whole item of 256 bits" in _refused(
        tmp_path, *TINY, "--method", "sign", "--bits", "100"
    )
    assert (
        _refused(tmp_path, *TINY, "--method", "lsb", "--epsilon", "1")
        == "error: lsb writes the weights after training; DP-SGD cannot apply to it"
    )
    assert "--recipe must be a JSON object" in _refused(tmp_path, *TINY, "--recipe", "{")
    assert "--option must be KEY=VALUE" in _refused(tmp_path, *TINY, "--option", "bits")
    assert "lsb: bits" in _refused(tmp_path, *TINY, "--option", "bits=40")
    assert "unknown device" in _refused(tmp_path, *TINY, "--device", "tpu")
    if not torch.cuda.is_available():
        assert "no CUDA device is available" in _refused(tmp_path, *TINY, "--device", "cuda")
