"""`privacylab watermark embed|verify`: JSON keys, agreement with the API, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from privacylab.cli import app
from privacylab.defenses.watermark import binomial_p_value, load_trigger_set, verify_watermark
from privacylab.models import load_model

runner = CliRunner()

VERIFY_KEYS = {"matches", "triggers", "p_value", "owned", "threshold"}
SMALL = ["--dataset", "digits", "--epochs", "15", "--widths", "128", "--batch-size", "128"]


def run_json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0])


def one_line_error(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def embedded(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("wm") / "run"
    return out, run_json("watermark", "embed", *SMALL, "--triggers", "60", "--out", str(out))


def test_embed_json_and_files(embedded) -> None:
    out, summary = embedded
    for key in (
        "test_accuracy",
        "baseline_test_accuracy",
        "accuracy_cost",
        "triggers",
        "matches",
        "p_value",
        "owned",
        "threshold",
    ):
        assert key in summary
    assert summary["triggers"] == 60 and summary["owned"] and summary["p_value"] < 1e-6
    for name in ("model.json", "model.safetensors", "watermark.json", "watermark.safetensors"):
        assert (out / name).is_file()
    assert (out / "baseline" / "model.json").is_file()


def test_verify_json_matches_api(embedded) -> None:
    out, summary = embedded
    own = run_json("watermark", "verify", "--model", str(out), "--suspect", str(out))
    assert set(own) >= VERIFY_KEYS
    assert own["matches"] == summary["matches"] and own["triggers"] == 60
    assert own["p_value"] == pytest.approx(binomial_p_value(own["matches"], 60, 10))
    assert own["owned"] and own["threshold"] == 1e-3 and own["p_value"] < 1e-6
    model, _, _ = load_model(out)
    assert own["matches"] == verify_watermark(model, load_trigger_set(out)).matches
    other = run_json("watermark", "verify", "--model", str(out), "--suspect", str(out / "baseline"))
    assert not other["owned"] and other["p_value"] > 0.05
    strict = run_json(
        "watermark",
        "verify",
        "--model",
        str(out),
        "--suspect",
        str(out),
        "--threshold",
        "1e-300",
    )
    assert strict["threshold"] == 1e-300 and strict["owned"] == (strict["p_value"] < 1e-300)


def test_verify_text_output(embedded) -> None:
    out, _ = embedded
    result = runner.invoke(app, ["watermark", "verify", "--model", str(out), "--suspect", str(out)])
    assert result.exit_code == 0
    assert result.stdout.startswith("owned: ")


def test_bad_input_is_one_line_exit_2(embedded, tmp_path) -> None:
    out, _ = embedded
    assert "no watermark" in one_line_error(
        "watermark", "verify", "--model", str(out / "baseline"), "--suspect", str(out)
    )
    assert "no saved model" in one_line_error(
        "watermark", "verify", "--model", str(out), "--suspect", str(tmp_path)
    )
    assert "--threshold" in one_line_error(
        "watermark", "verify", "--model", str(out), "--suspect", str(out), "--threshold", "0"
    )
    assert "--kind" in one_line_error(
        "watermark", "embed", "--out", str(tmp_path / "a"), "--kind", "photos"
    )
    assert "--triggers" in one_line_error(
        "watermark", "embed", "--out", str(tmp_path / "b"), "--triggers", "0"
    )
    assert "fraction" in one_line_error(
        "watermark", "embed", "--out", str(tmp_path / "c"), "--trigger-fraction", "1.5"
    )
    assert "unknown dataset" in one_line_error(
        "watermark", "embed", "--out", str(tmp_path / "d"), "--dataset", "nope"
    )
    # a suspect of another input shape: refused before any query
    run_json("train", "--dataset", "breast_cancer", "--epochs", "1", "--out", str(tmp_path / "bc"))
    assert "shape" in one_line_error(
        "watermark", "verify", "--model", str(out), "--suspect", str(tmp_path / "bc")
    )
