"""`privacylab attack inversion`: MI-Face on a softmax regression saved by `privacylab train`
(8x8 digits), the issue's JSON keys, the report with pictures (`--out`), each class stored as
it finishes (a run stopped after one class resumes there, with the evaluator it saved), and
one-line refusals (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import privacylab.invert as invert
from _cli import command
from privacylab.training import TrainConfig, train_job

invoke, run_json, fails = command("attack", "inversion")
FAST = '{"alpha": 40, "beta": 40}'


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("runs") / "logreg"
    config = TrainConfig(epochs=8, batch_size=64, lr=0.1, weight_decay=1e-3, seed=0)
    train_job("digits", "logreg", config, folder)
    return folder


@pytest.fixture(autouse=True)
def quick_evaluator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluator trained for 8 epochs, not 30: still > 0.8 on the target's rows."""
    monkeypatch.setitem(invert.EVALUATOR_TRAINING, "epochs", 8)


def test_json_report_and_store(model: Path, tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "report"
    args = ["--target", str(model), "--method", "miface-whitebox", "--options", FAST]
    first = run_json(*args, "--class", "0,3,7", "--cache", str(cache), "--out", str(out))
    assert set(first) >= {"method", "evaluator_accuracy", "classes", "queries", "access"}
    assert first["method"] == "miface-whitebox" and first["access"] == "white-box"
    assert [c["label"] for c in first["classes"]] == [0, 3, 7]
    row = first["classes"][0]
    assert set(row) >= {"label", "confidence", "predicted", "correct", "distance_to_mean"}
    assert all(c["confidence"] > 0.3 for c in first["classes"])  # from about 0.1 at the start
    assert first["evaluator_accuracy"] == pytest.approx(
        sum(c["correct"] for c in first["classes"]) / 3
    )
    assert first["evaluator"]["architecture"] == "mlp"  # not the target's logreg
    assert first["evaluator"]["accuracy_on_target_train_rows"] > 0.8
    assert first["queries"] == sum(c["iterations"] for c in first["classes"])
    page = (out / "index.html").read_text()
    assert 'id="model-inversion"' in page and "model_inversion.png" in page
    for name in ("model_inversion.png", "inversion_0.png", "inversion_7.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    saved = json.loads((out / "results.json").read_text())
    assert [c["label"] for c in saved["model_inversion"]["classes"]] == [0, 3, 7]
    # a second run is served from the store, with the same numbers
    second = run_json(*args, "--class", "0,3,7", "--cache", str(cache))
    assert all(c.pop("from_store") for c in second["classes"])
    assert [c.pop("from_store") for c in first["classes"]] == [False] * 3
    assert second["classes"] == first["classes"]


def test_scores_access_counts_queries(model: Path, tmp_path: Path) -> None:
    out = run_json(
        "--target", str(model), "--class", "2", "--cache", str(tmp_path),
        "--options", '{"alpha": 10, "directions": 4}',
    )  # fmt: skip
    assert out["method"] == "miface" and out["access"] == "scores"
    assert out["queries"] == out["classes"][0]["iterations"] * (1 + 2 * 4)


def test_a_stopped_run_resumes_at_the_next_class(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = invert.run_model_inversion
    calls: list[tuple[int, ...]] = []

    def dies_on_class_5(attack, target, task, truth):  # type: ignore[no-untyped-def]
        calls.append(task.chosen())
        if task.chosen() == (5,):
            raise KeyboardInterrupt
        return real(attack, target, task, truth)

    monkeypatch.setattr(invert, "run_model_inversion", dies_on_class_5)
    options = json.loads(FAST)
    with pytest.raises(KeyboardInterrupt):  # killed while class 5 runs; class 4 is stored
        invert.run_inversion(model, "miface-whitebox", (4, 5), options=options, cache=tmp_path)
    monkeypatch.setattr(invert, "run_model_inversion", real)

    def trains_again(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the evaluator saved by the stopped run is trained again")

    monkeypatch.setattr(invert, "train_evaluator", trains_again)
    out = run_json(
        "--target", str(model), "--method", "miface-whitebox", "--options", FAST,
        "--class", "4,5", "--cache", str(tmp_path),
    )  # fmt: skip
    assert calls == [(4,), (5,)]  # the killed run got as far as class 5
    assert [c["from_store"] for c in out["classes"]] == [True, False]  # only 5 recomputed
    assert out["evaluator"]["architecture"] == "mlp"  # its facts, stored with its weights


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--method", "nope"], "unknown reconstruction method"),
        (["--method", "dlg"], "gradients attack"),
        (["--class", "10"], "out of range"),
        (["--class", "x"], "--class"),
        (["--options", "{bad"], "--options is not JSON"),
        (["--options", '{"alpha": 0}'], "alpha"),
        (["--options", '{"nope": 1}'], "bad options"),
    ],
)
def test_bad_input_is_one_line(model: Path, tmp_path: Path, args: list[str], words: str) -> None:
    assert words in fails("--target", str(model), "--cache", str(tmp_path), *args)


def test_missing_folder_is_one_line(tmp_path: Path) -> None:
    assert "not a model folder" in fails("--target", str(tmp_path / "nothing"))
