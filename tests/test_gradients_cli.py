"""`privacylab attack gradients`: the issue's JSON contract, `--defense` parsed (several:
one object with `results`), one-line refusals (exit 2, nothing else on stderr or stdout),
`--out` writing the report with its pictures, and `--store` serving a second run.

Tiny and seeded: 8x8 digits, DLG's sigmoid LeNet, one image, 5 attack iterations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import privacylab.reconstruct as job
from _cli import command
from privacylab.defenses.update import parse_update_defense

invoke, run_json, fails = command("attack", "gradients")
FAST = ("--options", '{"iterations": 5}')
ISSUE_KEYS = {"method", "psnr", "ssim", "mse", "label_accuracy", "batch_size", "defense"}
FACT_KEYS = {"dataset", "model", "examples", "local_steps", "clients", "baseline_psnr"}


def test_one_defence_prints_the_issue_flat_object() -> None:
    out = run_json(
        "--dataset", "digits", "--model", "lenet-sigmoid", "--method", "ig",
        "--batch-size", "1", "--examples", "4", *FAST,
    )  # fmt: skip
    assert set(out) >= ISSUE_KEYS | FACT_KEYS
    assert out["method"] == "ig" and out["batch_size"] == 1 and out["defense"] == "none"
    assert out["dataset"] == "digits" and out["model"] == "lenet-sigmoid"
    assert out["examples"] == [4] and out["local_steps"] == 1 and out["clients"] == 1
    assert -1 <= out["ssim"] <= 1 and out["mse"] >= 0 and out["label_accuracy"] == 1.0
    assert "images" not in out  # the pixels stay in results.json


def test_several_defences_print_one_object_with_results() -> None:
    specs = ["none", "noise:1e-2", "prune:0.2", "fp16", "int8", "dp:4"]
    out = run_json("--method", "ig", "--defense", ",".join(specs), *FAST)
    assert out["method"] == "ig" and len(out["results"]) == len(specs)
    said = [r["defense"] for r in out["results"]]
    assert said == ["none"] + [parse_update_defense(s).spec for s in specs[1:]]  # type: ignore[union-attr]
    assert len({r["examples"][0] for r in out["results"]}) == 1  # the same digit each time
    assert all(set(r) >= ISSUE_KEYS for r in out["results"])


def test_local_steps_and_clients_reach_the_run() -> None:
    out = run_json("--method", "ig", "--batch-size", "2", "--local-steps", "2", *FAST)
    assert out["local_steps"] == 2 and out["training"]["algorithm"] == "fedavg"
    out = run_json("--method", "ig", "--clients", "2", *FAST)
    assert out["clients"] == 2 and out["secure_aggregation"]
    assert out["batch_size"] == 2 and out["client_batch_size"] == 1  # the update's 2 rows


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--batch-size", "0"), "batch size must be a whole number >= 1"),
        (("--defense", "blur:3"), "unknown update defense 'blur'"),
        (("--defense", "noise:-1"), "noise"),
        (("--defense", "none,"), "empty entry"),
        (("--method", "dlg", "--model", "mlp"), "dlg needs twice-differentiable activations"),
        (("--model", "cnn"), "model cnn needs images of at least 14x14 pixels"),
        (("--examples", "1,x"), "--examples must be comma-separated row indices"),
        (("--examples", "1,,2"), "--examples must be comma-separated row indices"),
        (("--examples", "100000"), "example 100000 is out of range"),
        (("--method", "nope"), "nope"),
        (("--options", "[1]"), "--options must be a JSON object"),
        (("--root", "/no/such/folder"), "--root /no/such/folder is not a folder"),
        (("--target", "/no/such/model"), "--target /no/such/model is not a model folder"),
    ],
)
def test_bad_input_is_one_line(args: tuple[str, ...], expected: str) -> None:
    assert expected in fails("--method", "ig", *FAST, *args)


def test_a_refusal_inside_the_attack_is_one_line_too() -> None:
    line = fails("--method", "analytic", "--model", "lenet-sigmoid")
    assert "analytic needs a fully connected first layer" in line


def test_dlg_on_a_fedavg_update_runs_its_fedavg_variant() -> None:
    out = run_json("--method", "dlg", "--local-steps", "2", *FAST)
    assert out["method"] == "dlg-fedavg" and out["training"]["epochs"] == 2


def test_out_writes_the_report_with_pictures(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = invoke("--method", "ig", "--defense", "none,dp:4", *FAST, "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "given" in result.stdout  # ig was given the labels: no label accuracy to claim
    page = (out / "index.html").read_text()
    assert 'id="gradient-inversion"' in page and "Dummy-initialisation baseline" in page
    assert "dp:4: ε = 4.000 at δ = 1.0e-05 (pld accountant)" in page and ">given</td>" in page
    payload = json.loads((out / "results.json").read_text())
    images = payload["reconstruction"]["images"]
    pictures = [images["grid"], images["objective"], *images["pairs"]]
    assert len(pictures) == 4
    for name in pictures:
        assert (out / name).is_file() and f'src="{name}"' in page
    row = payload["reconstruction"]["runs"][0]
    assert len(row["images"]["truth"]) == 64 and row["examples"]
    assert row["model"] == "lenet-sigmoid" and row["architecture"] == "lenet"


def test_store_serves_a_second_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    real = job._attack

    def counting(case: job.GradientCase) -> object:
        ran.append(case.config.defense)
        return real(case)

    monkeypatch.setattr(job, "_attack", counting)
    store = str(tmp_path / "runs.sqlite")
    first = run_json("--method", "ig", "--defense", "none,fp16", *FAST, "--store", store)
    assert ran == ["none", "fp16"]
    second = run_json("--method", "ig", "--defense", "none,fp16", *FAST, "--store", store)
    assert ran == ["none", "fp16"]  # nothing recomputed
    assert [r["from_store"] for r in second["results"]] == [True, True]
    assert [r["psnr"] for r in second["results"]] == [r["psnr"] for r in first["results"]]
