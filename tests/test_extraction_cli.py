"""`privacylab attack extraction`: the JSON contract of issue 13, one-line refusals (exit 2)
before any query, the store serving a second run, and the report written with --out.

The plumbing is checked with stand-in attack and watch classes registered for the test (the
same ones as tests/test_extract.py); the registered attacks and defences (knockoff, prada,
budget, relu-exact) are run where they are installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from _cli import command
from privacylab.attacks.extraction import EXTRACTION_ATTACKS, extraction_names, register_extraction
from privacylab.defenses import DEFENSES, defense_names, register_defense
from privacylab.models import ModelSpec, build_model, save_model
from privacylab.training import TrainConfig, train_job
from test_extract import _FakeCopy, _FakeExact, _FakeWatch

invoke, run_json, fails = command("attack", "extraction")
CONFIG = TrainConfig(epochs=4, batch_size=64, lr=0.1, optimizer="momentum", seed=0)
ISSUE_KEYS = {"method", "queries", "accuracy", "fidelity", "victim_accuracy"}


@pytest.fixture(autouse=True)
def fakes() -> Iterator[None]:
    register_extraction("fake-copy")(_FakeCopy)
    register_extraction("fake-exact")(_FakeExact)
    register_defense(_FakeWatch)
    yield
    EXTRACTION_ATTACKS.unregister("fake-copy")
    EXTRACTION_ATTACKS.unregister("fake-exact")
    DEFENSES.unregister("fake-watch")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    train_job("digits", "mlp", CONFIG, base / "mlp", model_options={"widths": [16]})
    tanh = TrainConfig(epochs=1, batch_size=64, lr=0.1, seed=0)
    train_job(
        "digits", "mlp", tanh, base / "tanh", model_options={"widths": [8], "activation": "tanh"}
    )
    # an untrained CNN saved by privacylab: refusals happen before any query, so no training
    spec = ModelSpec("cnn", (1, 28, 28), 10, {})
    meta = {"data": {"name": "mnist5k"}, "training": CONFIG.to_dict()}
    save_model(build_model("cnn", (1, 28, 28), 10, seed=0), base / "cnn", spec, meta)
    return {"mlp": base / "mlp", "tanh": base / "tanh", "cnn": base / "cnn"}


def test_one_method_prints_the_issue_flat_object(models: dict[str, Path], tmp_path: Path) -> None:
    out = run_json(
        "--target", str(models["mlp"]), "--method", "fake-copy", "--queries", "80",
        "--cache", str(tmp_path),
    )  # fmt: skip
    assert set(out) >= ISSUE_KEYS
    assert out["method"] == "fake-copy" and out["queries"] == 80
    assert out["target"] == str(models["mlp"])
    assert 0 <= out["fidelity"] <= 1 and 0 <= out["accuracy"] <= 1
    assert out["victim_accuracy"] > 0.5
    assert out["output"] == "scores" and out["precision"] == "float32"
    assert [p["queries"] for p in out["curve"]] == [5, 10, 20, 40, 80]
    assert "detected" not in out


def test_several_methods_and_defences_print_attacks(
    models: dict[str, Path], tmp_path: Path
) -> None:
    out = run_json(
        "--target", str(models["mlp"]), "--method", "fake-copy,fake-copy", "--queries", "60",
        "--defense", "none,fake-watch:20", "--output", "labels", "--cache", str(tmp_path),
    )  # fmt: skip
    rows = out["attacks"]
    assert [r["defense"] for r in rows] == ["none", "fake-watch:20"]
    assert all(set(r) >= ISSUE_KEYS for r in rows)
    assert all(r["output"] == "labels" for r in rows)
    assert rows[1]["detected"] is True and rows[1]["queries_until_detection"] == 30
    assert rows[0]["fidelity"] == rows[1]["fidelity"]  # a watch does not change answers


def test_second_run_is_served_from_the_store(models: dict[str, Path], tmp_path: Path) -> None:
    args = ["--target", str(models["mlp"]), "--method", "fake-copy", "--queries", "40"]
    first = run_json(*args, "--cache", str(tmp_path))
    second = run_json(*args, "--cache", str(tmp_path))
    assert first.pop("from_store") is False and second.pop("from_store") is True
    assert first == second
    # the default store lives next to the model
    default = run_json(*args)
    assert default["from_store"] is False
    assert (models["mlp"] / "extraction-cache" / "store.sqlite").is_file()


def test_out_writes_the_report(models: dict[str, Path], tmp_path: Path) -> None:
    result = invoke(
        "--target", str(models["mlp"]), "--method", "fake-copy", "--queries", "40",
        "--defense", "none,fake-watch:10", "--cache", str(tmp_path / "c"),
        "--out", str(tmp_path / "report"),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "fake-copy" in result.stdout and "report:" in result.stdout
    page = (tmp_path / "report" / "index.html").read_text()
    assert 'id="model-extraction"' in page and "extraction_curves.png" in page
    assert "Detection by query watches" in page
    png = (tmp_path / "report" / "extraction_curves.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    saved = json.loads((tmp_path / "report" / "results.json").read_text())
    assert len(saved["extraction"]["attacks"]) == 2


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--method", "nope"], "unknown extraction method 'nope'; choose"),
        (["--method", ","], "--method needs at least one method"),
        (["--queries", "0"], "query budget) must be a whole number in [1, 1,000,000,000], got 0"),
        (["--queries", "99999999999999999999"], "got 99999999999999999999"),
        (["--defense", "nope"], "unknown defense 'nope'"),
        (["--defense", "l2:1e-3"], "training-time defence"),
        (["--defense", "fake-watch:0"], "n must be >= 1"),
        (["--output", "probs"], "unknown --output 'probs'"),
        (["--method", "fake-exact", "--output", "scores"], "needs logits access"),
        (["--method", "fake-exact", "--defense", "rounding:2"], "behind rounding:2 serves scores"),
        (["--output", "labels", "--defense", "label-only"], "a target served at label access"),
        (["--device", "tpu"], "unknown device"),
        (["--options", "{nope"], "--options is not JSON"),
        (["--options", "[1]"], "--options must be a JSON object"),
        (["--options", '{"fake-copy": 1}'], "attack options must map a method"),
        (["--options", '{"fake-exact": {}}'], "options given for fake-exact, which is not run"),
        (["--options", '{"fake-copy": {"nope": 1}}'], "fake-copy: bad options:"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    models: dict[str, Path], tmp_path: Path, args: list[str], words: str
) -> None:
    base = ["--target", str(models["mlp"]), "--method", "fake-copy", "--cache", str(tmp_path)]
    line = fails(*base, *args)
    assert words in line
    assert not (tmp_path / "store.sqlite").exists() or "needs logits" in line or "serves" in line


def test_options_reach_the_attack(models: dict[str, Path], tmp_path: Path) -> None:
    args = ["--target", str(models["mlp"]), "--method", "fake-copy", "--queries", "80"]
    plain = run_json(*args, "--cache", str(tmp_path))
    weak = run_json(*args, "--options", '{"fake-copy": {"c": 1e-4}}', "--cache", str(tmp_path))
    assert weak["from_store"] is False  # other options, another stored result
    assert weak["fidelity"] < plain["fidelity"]


def test_unknown_method_lists_the_registry(models: dict[str, Path]) -> None:
    line = fails("--target", str(models["mlp"]), "--method", "nope")
    assert ", ".join(extraction_names()) in line


def test_bad_targets_are_one_line(models: dict[str, Path], tmp_path: Path) -> None:
    assert "not a model folder" in fails("--target", str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    assert "no saved model" in fails("--target", str(tmp_path / "empty"))


@pytest.mark.parametrize("method", ["fake-exact", "relu-exact"])
@pytest.mark.parametrize(("victim", "layer"), [("tanh", "'2' (Tanh)"), ("cnn", "'0' (Conv2d)")])
def test_exact_extraction_of_a_non_relu_network_names_the_layer(
    models: dict[str, Path], tmp_path: Path, method: str, victim: str, layer: str
) -> None:
    if method not in extraction_names():
        pytest.skip(f"{method} is not installed")
    line = fails(
        "--target", str(models[victim]), "--method", method, "--output", "logits",
        "--cache", str(tmp_path),
    )  # fmt: skip
    assert f"{method} cannot extract {victim}: layer {layer}" in line
    assert not (tmp_path / "store.sqlite").exists()  # refused before any query


def test_registered_learning_attack_through_prada(models: dict[str, Path], tmp_path: Path) -> None:
    if "knockoff" not in extraction_names() or "prada" not in defense_names():
        pytest.skip("knockoff or prada not installed")
    out = run_json(
        "--target", str(models["mlp"]), "--method", "knockoff", "--queries", "60",
        "--defense", "prada", "--cache", str(tmp_path),
    )  # fmt: skip
    assert set(out) >= ISSUE_KEYS
    assert {"detected", "queries_until_detection"} <= set(out)
    assert out["queries"] <= 60


def test_registered_budget_of_zero_is_refused(models: dict[str, Path], tmp_path: Path) -> None:
    if "budget" not in defense_names():
        pytest.skip("budget not installed")
    line = fails("--target", str(models["mlp"]), "--method", "fake-copy", "--defense", "budget:0")
    assert "budget" in line
