"""`privacylab attack property` and its job (`privacylab.infer_property`): the JSON contract,
the report written with --out (section `#property-inference` with its figure), every trained
model stored as it finishes (a killed run resumes and retrains only what is missing), and bad
input refused in one line with exit code 2 before anything is trained."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import privacylab.infer_property as job
from _cli import command
from privacylab.execution import ResultStore, TaskError
from privacylab.infer_property import NAMESPACE, PropertyConfig, property_models, run_property

_, run_json, fails = command("attack", "property")
TINY = ("--shadows", "3", "--targets", "2", "--epochs", "4", "--train-size", "60")
ISSUE_KEYS = {"method", "property", "accuracy", "auc", "chance", "queries", "seconds"}


def test_json_and_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    payload = run_json(
        "--property",
        "class-share:1:0.1:0.6",
        "--method",
        "property-whitebox,property-blackbox",
        *TINY,
        "--queries",
        "16",
        "--out",
        str(out),
    )
    assert payload["property"] == "class-share:1:0.1:0.6"
    assert payload["models_trained"] == 8 and payload["models_from_store"] == 0
    rows = {r["method"]: r for r in payload["attacks"]}
    assert set(rows) == {"property-whitebox", "property-blackbox"}
    for row in rows.values():
        assert set(row) >= ISSUE_KEYS
        assert row["chance"] == 0.5 and 0 <= row["accuracy"] <= 1
    assert rows["property-blackbox"]["queries"] == 2 * 16
    assert rows["property-whitebox"]["queries"] == 0
    page = (out / "index.html").read_text()
    assert 'id="property-inference"' in page and "property_scores.png" in page
    assert (out / "property_scores.png").read_bytes().startswith(b"\x89PNG")
    saved = json.loads((out / "results.json").read_text())
    assert saved["property_inference"]["attacks"][0]["method"] == "property-whitebox"
    assert list((out / "property-cache" / "models").iterdir())

    flat = run_json(
        "--property",
        "class-share:1:0.1:0.6",
        "--method",
        "property-blackbox",
        *TINY,
        "--queries",
        "16",
        "--cache",
        str(out / "property-cache"),
    )
    assert flat["method"] == "property-blackbox"  # one method: a flat object
    assert flat["models_from_store"] == 8 and flat["models_trained"] == 0
    assert flat["scores"] == rows["property-blackbox"]["scores"]


def test_a_killed_run_resumes_with_the_stored_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = PropertyConfig(
        property="row-parity", shadows=2, targets=2, epochs=3, train_size=50, queries=8
    )
    real = job.train_one
    calls: list[str] = []

    def dies_after_three(unit: dict[str, Any]) -> dict[str, Any]:
        if len(calls) == 3:
            raise RuntimeError("killed")
        calls.append(unit["folder"])
        return real(unit)

    monkeypatch.setattr(job, "train_one", dies_after_three)
    with pytest.raises(TaskError):
        property_models(config, tmp_path)
    with ResultStore(tmp_path / "store.sqlite") as store:
        assert store.count(NAMESPACE) == 3
    first = list(calls)

    calls.clear()
    monkeypatch.setattr(
        job, "train_one", lambda unit: (calls.append(unit["folder"]), real(unit))[1]
    )
    models = property_models(config, tmp_path)
    assert models.from_store == 3
    assert len(calls) == 3 and not set(calls) & set(first)  # only the missing ones
    assert (Path(first[0]) / "model.safetensors").is_file()
    assert (Path(first[0]) / "model.json").is_file()

    calls.clear()
    again = property_models(config, tmp_path)
    assert calls == [] and again.from_store == 6
    for a, b in zip(models.targets, again.targets, strict=True):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert p.detach().equal(q.detach())


def test_run_property_is_reproducible(tmp_path: Path) -> None:
    kwargs: dict[str, Any] = {
        "property": "class-share:2:0.1:0.6",
        "method": "property-blackbox",
        "shadows": 2,
        "targets": 2,
        "epochs": 3,
        "train_size": 50,
        "queries": 8,
    }
    payload = run_property(cache=tmp_path / "a", **kwargs)
    json.dumps(payload, allow_nan=False)  # JSON-ready as returned
    a = payload["property_inference"]
    b = run_property(cache=tmp_path / "b", **kwargs)["property_inference"]
    assert a["attacks"][0]["scores"] == b["attacks"][0]["scores"]
    assert a["shadow_share_world0"] == pytest.approx(0.1)
    assert a["shadow_share_world1"] == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--property", "ink:0.1"), "unknown property"),
        (("--property", "class-share:0:0.1"), "C:LOW:HIGH"),
        (("--property", "class-share:12:0.1:0.5"), "classes 0..9, not 12"),
        (("--property", "class-share:0:0.1:0.9", "--train-size", "500"), "smaller training set"),
        (("--method", "knn"), "unknown reconstruction method"),
        (("--method", "dlg"), "is a gradients attack"),
        (("--targets", "3"), "must be even"),
        (("--shadows", "0"), "--shadows must be"),
        (("--queries", "2000"), "use fewer queries"),
        (("--epochs", "0"), "epochs"),
        (("--model", "nope"), "nope"),
        (("--dataset", "mnist5k", "--model", "cnn"), "layer '0' (Conv2d) is not Linear"),
        (("--dataset", "nope"), "nope"),
        (("--widths", "a"), "--widths"),
        (("--device", "tpu"), "device"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    assert message in fails(*args, "--cache", str(tmp_path / "c"))
    assert not (tmp_path / "c" / "models").exists()  # nothing was trained
