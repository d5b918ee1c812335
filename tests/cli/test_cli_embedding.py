"""`privacylab attack embedding` (Du et al. 2023, DP-Forward, Sec. 6) on one tiny non-private
folder trained once for the module: the `--json` object has exactly the keys of schemas.md §5,
a re-run reads the stored run back, `--out` adds the run to the report's #dp-forward section,
and bad input is one `error:` line with exit code 2."""

from __future__ import annotations

import json

import pytest

from _cli import command
from privacylab.dpforward import DPForwardConfig, train_dpforward
from privacylab.embedding import RESULT_KEYS

invoke, run_json, fails = command("attack", "embedding")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("embedding-cli") / "model"
    config = DPForwardConfig(
        method="non-private",
        epsilon=None,
        encoder="tiny",
        position="input",
        documents=48,
        epochs=1,
        batch_size=16,
        max_len=20,
    )
    train_dpforward(config, path)
    return path


def test_json_run_has_the_schema_keys_and_is_read_back(folder, tmp_path):
    store = str(tmp_path / "runs.sqlite")
    args = ("--target", str(folder), "--method", "inversion-nn", "--victims", "3")
    result = run_json(*args, "--store", store)
    assert tuple(result) == RESULT_KEYS
    assert result["method"] == "inversion-nn" and result["position"] == "input"
    assert result["target"]["method"] == "non-private"
    assert 0.0 <= result["inversion_recall"] <= 1.0
    assert set(result["mia"]) == {"confidence", "entropy"}
    assert 0.0 <= result["inversion_baseline_recall"] <= 1.0
    assert run_json(*args, "--store", store) == result
    shown = invoke(*args, "--store", store)
    assert shown.exit_code == 0, shown.stderr
    assert "guessing recall" in shown.stdout
    assert f"{result['inversion_baseline_recall']:.4g}" in shown.stdout


def test_out_adds_the_run_to_the_dp_forward_report(folder, tmp_path):
    out = tmp_path / "report"
    result = invoke(
        "--target", str(folder), "--method", "attribute", "--victims", "4", "--out", str(out)
    )
    assert result.exit_code == 0, result.stderr
    assert "attribute acc." in result.stdout and "index.html" in result.stdout
    assert (out / "index.html").is_file() and (folder / "embedding.sqlite").is_file()
    models = json.loads((out / "results.json").read_text())["dpforward"]["models"]
    assert [m["folder"] for m in models] == [str(folder)]
    assert set(models[0]["runs"]) == {"attribute"}


def test_bad_input_is_one_line_and_exit_2(folder, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    target = ("--target", str(folder))
    cases = {
        "not a model folder": ("--target", str(tmp_path / "missing"), "--method", "attribute"),
        "not a DP-Forward model folder": ("--target", str(empty), "--method", "attribute"),
        "unknown --method": (*target, "--method", "inversion"),
        "--victims must": (*target, "--method", "attribute", "--victims", "0"),
        "--seed must": (*target, "--method", "attribute", "--seed", "-1"),
        "--method": target,
        "unknown device": (*target, "--method", "attribute", "--device", "nonsense"),
        "out of range": (*target, "--method", "attribute", "--position", "layer:9"),
        "unknown position": (*target, "--method", "attribute", "--position", "middle"),
    }
    for message, args in cases.items():
        assert message in fails(*args)
    assert list(empty.iterdir()) == []
