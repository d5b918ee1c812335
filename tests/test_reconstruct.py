"""The gradient-inversion job (`privacylab.reconstruct`): what the server observes (the
client's defence, FedAvg, secure aggregation) checked against closed forms computed here with
`local_update`; the rows behind the update; the store serving a second grid; one-line
refusals; and the report's pictures and section.

Tiny and seeded: 8x8 digits, DLG's sigmoid LeNet, Inverting Gradients with 20 iterations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import privacylab.reconstruct as job
from privacylab.attacks.inversion import InversionError
from privacylab.data import load_dataset
from privacylab.data.dataset import train_test_indices
from privacylab.defenses import DefenseError
from privacylab.errors import PrivacylabError
from privacylab.federated import LocalTraining, local_update
from privacylab.reconstruct import (
    GradientConfig,
    attack_gradients,
    defense_configs,
    defense_grid,
    prepare,
    result_row,
)
from privacylab.report.html import render_html
from privacylab.report.plots import PNG_SIGNATURE
from privacylab.report.reconstruction import (
    grid_plot,
    reconstruction_images,
    run_arrays,
    run_labels,
)

FAST = {"iterations": 20}
LEAK = {"iterations": 60}
"""Enough iterations for Inverting Gradients to recover one 8x8 digit (about 29 dB against a
5 dB baseline)."""


def ig(**changes: object) -> GradientConfig:
    """Inverting Gradients, 20 iterations, on one digit and DLG's LeNet (the fast setting)."""
    settings: dict[str, object] = {"method": "ig", "options": dict(FAST)}
    settings.update(changes)
    return GradientConfig(**settings)  # type: ignore[arg-type]


def _sent(case: job.GradientCase) -> dict[str, torch.Tensor]:
    (update,) = case.target.updates
    return update.update


def _clean_update(case: job.GradientCase, training: LocalTraining) -> dict[str, torch.Tensor]:
    """The undefended update of the case's rows, computed here from the sent parameters."""
    (update,) = case.target.updates
    return local_update(case.target.model, update.state, case.truth.x, case.truth.y, training)


def test_the_update_leaks_the_digit_and_heavy_noise_stops_it() -> None:
    result = attack_gradients(ig(options=LEAK))
    assert result.method == "ig" and result.defense == "none" and result.batch_size == 1
    assert result.access == "updates" and result.queries > 0
    assert result.psnr > result.baseline_psnr + 10  # the update leaks the digit
    assert result.label_accuracy == 1.0  # labels known and used by ig
    clean, noisy = defense_grid(defense_configs(ig(options=LEAK), ["none", "noise:1e-1"]))
    assert clean["psnr"] == result.psnr  # seeded: the same run again gives the same numbers
    assert noisy["defense"] == "noise:0.1" and noisy["psnr"] < noisy["baseline_psnr"] + 3


def test_the_rows_are_the_named_training_rows() -> None:
    case = prepare(ig(examples=(7,)))
    data = load_dataset("digits")
    train, _ = train_test_indices(data, seed=0)
    assert case.facts["examples"] == [7] and case.facts["dataset_rows"] == [int(train[7])]
    assert torch.equal(case.truth.x, data.features[[int(train[7])]])
    assert torch.equal(case.truth.y, data.labels[[int(train[7])]])
    default = prepare(ig(batch_size=3, seed=4)).facts["examples"]
    assert len(set(default)) == 3 and default == prepare(ig(batch_size=3, seed=4)).facts["examples"]


def test_fedsgd_update_is_the_gradient_and_the_client_applies_the_defence() -> None:
    case = prepare(ig(batch_size=2))
    for name, value in _clean_update(case, LocalTraining()).items():
        torch.testing.assert_close(_sent(case)[name], value)
    half = prepare(ig(batch_size=2, defense="fp16"))
    assert half.target.updates[0].defense == "fp16"
    for name, value in _clean_update(half, LocalTraining()).items():
        assert torch.equal(_sent(half)[name], value.half().float())


def test_noise_defence_has_the_spec_variance_and_is_seeded() -> None:
    clean = prepare(ig())
    noisy = prepare(ig(defense="noise:1e-2"))
    diff = torch.cat([(_sent(noisy)[k] - _sent(clean)[k]).reshape(-1) for k in _sent(clean)])
    assert diff.numel() > 5000
    assert abs(float(diff.var()) / 1e-2 - 1) < 0.1
    again = prepare(ig(defense="noise:1e-2"))
    assert all(torch.equal(_sent(again)[k], _sent(noisy)[k]) for k in _sent(noisy))


def test_fedavg_update_is_w0_minus_wt_and_the_task_knows_the_procedure() -> None:
    case = prepare(ig(batch_size=2, local_steps=3, local_lr=0.05))
    training = LocalTraining("fedavg", epochs=3, lr=0.05)
    assert case.task.local_training == training and case.target.updates[0].training == training
    for name, value in _clean_update(case, training).items():
        torch.testing.assert_close(_sent(case)[name], value)
    minibatch = prepare(ig(batch_size=4, local_steps=1, local_batch_size=2))
    assert minibatch.task.local_training == LocalTraining("fedavg", epochs=1, batch_size=2)


def test_secure_aggregation_shows_only_the_mean_of_the_clients() -> None:
    case = prepare(ig(batch_size=2, clients=3))
    (update,) = case.target.updates
    assert update.aggregated and update.clients == (0, 1, 2) and update.num_examples == 6
    assert case.facts["update_examples"] == 6 and tuple(case.truth.x.shape) == (6, 1, 8, 8)
    # FedSGD with equal clients: the mean of their mean gradients is the pooled gradient
    for name, value in _clean_update(case, LocalTraining()).items():
        torch.testing.assert_close(update.update[name], value)


def test_labels_known_or_not() -> None:
    assert prepare(ig()).task.labels is not None
    assert prepare(ig(labels_known=False)).task.labels is None


def test_grid_resumes_from_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = job._attack

    def counting(case: job.GradientCase):
        calls.append(case.config.defense)
        return real(case)

    monkeypatch.setattr(job, "_attack", counting)
    store = tmp_path / "grid.sqlite"
    first = defense_grid(defense_configs(ig(), ["none"]), store)  # a run killed after one
    assert calls == ["none"] and not first[0]["from_store"]
    rows = defense_grid(defense_configs(ig(), ["none", "noise:1e-1"]), store)
    assert calls == ["none", "noise:1e-1"]  # only the missing one ran
    assert [r["from_store"] for r in rows] == [True, False]
    assert rows[0]["psnr"] == first[0]["psnr"] and rows[1]["defense"] == "noise:0.1"
    again = defense_grid(defense_configs(ig(), ["none", "noise:0.1"]), store)
    assert calls == ["none", "noise:1e-1"]  # the same spec spelt differently: same key
    assert all(r["from_store"] for r in again)
    assert [r["psnr"] for r in again] == [r["psnr"] for r in rows]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"batch_size": 0}, "batch size must be a whole number >= 1"),
        ({"batch_size": 5000}, "needs 5000 rows but the training part of digits has"),
        ({"examples": (1, 2)}, "names 2 rows but 1 client(s) of batch size 1 hold 1"),
        ({"examples": (99999,)}, "example 99999 is out of range"),
        ({"dataset": "cifar"}, "unknown dataset 'cifar'"),
        ({"model": "resnet"}, "unknown model 'resnet'"),
        ({"method": "nope"}, "nope"),
        ({"model": "cnn"}, "model cnn needs images of at least 14x14 pixels but digits has 8x8"),
        ({"options": {"bogus": 1}}, "ig: bad options"),
        ({"clients": 0}, "clients must be a whole number"),
        ({"clients": 2000}, "clients must be at most 1,024"),
        ({"seed": -1}, "seed must be a whole number >= 0"),
    ],
)
def test_bad_input_is_one_line(changes: dict[str, object], expected: str) -> None:
    with pytest.raises(PrivacylabError) as caught:
        attack_gradients(ig(**changes))
    message = str(caught.value)
    assert expected in message and "\n" not in message


def test_unknown_defence_is_one_line() -> None:
    with pytest.raises(DefenseError, match="unknown update defense 'blur'") as caught:
        defense_grid(defense_configs(ig(), ["none", "blur:1"]))
    assert "\n" not in str(caught.value)


def test_dlg_refuses_a_relu_model_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[object] = []
    monkeypatch.setattr(job, "_attack", ran.append)
    with pytest.raises(InversionError, match="twice-differentiable") as caught:
        defense_grid([GradientConfig(method="dlg", model="mlp", options=dict(FAST))])
    assert "\n" not in str(caught.value) and "ReLU" in str(caught.value) and not ran


# --- the report ---------------------------------------------------------------------------


Pictures = tuple[list[dict[str, Any]], dict[str, Any], dict[str, bytes]]


def _row(psnr: float, defense: str, order: list[int]) -> dict[str, object]:
    n = len(order)
    truth = np.linspace(0, 1, n * 64).reshape(n, 1, 8, 8)
    rec = truth[order] * 0.5
    return {
        "method": "ig",
        "defense": defense,
        "dataset": "digits",
        "model": "lenet-sigmoid",
        "examples": list(range(n)),
        "batch_size": n,
        "psnr": psnr,
        "ssim": 0.5,
        "mse": 0.01,
        "label_accuracy": 1.0,
        "baseline_psnr": 5.0,
        "bounds": [0.0, 1.0],
        "order": order,
        "per_example": [{"psnr": psnr, "ssim": 0.5, "mse": 0.01}] * n,
        "history": [[0, 1.0], [1, 0.5]],
        "images": {
            "shape": [n, 1, 8, 8],
            "truth": truth.reshape(-1).tolist(),
            "reconstruction": rec.reshape(-1).tolist(),
            "true_labels": list(range(n)),
        },
    }


@pytest.fixture(scope="module")
def pictures() -> Pictures:
    rows = [_row(31.0, "none", [1, 0]), _row(8.0, "noise:0.1", [0, 1])]
    rows[1]["params"] = {"labels": "given"}
    names, files = reconstruction_images(rows)
    return rows, names, files


def test_pictures_pair_each_reconstruction_with_its_truth(pictures: Pictures) -> None:
    rows, names, files = pictures
    row = rows[0]
    arrays = run_arrays(row)
    assert arrays is not None
    truth, paired, scores = arrays
    np.testing.assert_allclose(paired, truth * 0.5)  # order undone: rec[order[i]] ~ truth[i]
    assert len(scores) == 2
    assert run_labels(rows) == ["none", "noise:0.1"]
    assert names["grid"] in files and names["objective"] in files
    assert all(p in files for p in names["pairs"])
    assert all(content.startswith(PNG_SIGNATURE) for content in files.values())


def test_grid_has_a_row_per_run_or_for_one_or_two_examples_a_column() -> None:
    wide = grid_plot([_row(31.0, "none", [0, 1]), _row(8.0, "noise:0.1", [1, 0])])
    assert len(wide.axes) == 6
    assert [ax.get_title() for ax in wide.axes[:3]] == ["truth", "none", "noise:0.1"]
    tall = grid_plot([_row(31.0, "none", [0, 1, 2]), _row(8.0, "fp16", [2, 1, 0])])
    assert len(tall.axes) == 9
    assert [tall.axes[3 * r].get_ylabel() for r in range(3)] == ["truth", "none", "fp16"]


def test_section_states_the_baseline_and_links_the_pictures(
    pictures: Pictures, tmp_path: Path
) -> None:
    rows, names, files = pictures
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    page = render_html(tmp_path, {"reconstruction": {"runs": rows, "images": names}})
    assert 'id="gradient-inversion"' in page
    assert "baseline: PSNR 5.0 dB" in page and "none (1 of 2 runs)" in page
    assert page.count(">1.000</td>") == 1 and page.count(">given</td>") == 1  # label accuracy
    for name in files:
        assert f'src="{name}"' in page


def test_result_row_keeps_the_issue_keys_and_the_pixels() -> None:
    case = prepare(ig(batch_size=2))
    row = result_row(case, job._attack(case))
    for key in ("method", "psnr", "ssim", "mse", "label_accuracy", "batch_size", "defense"):
        assert key in row
    assert row["images"]["shape"] == [2, 1, 8, 8] and len(row["images"]["truth"]) == 128
    np.testing.assert_allclose(
        np.asarray(row["images"]["truth"]).reshape(2, 1, 8, 8), case.truth.x.numpy(), atol=1e-5
    )


def test_a_saved_model_is_attacked_on_its_own_training_rows(tmp_path: Path) -> None:
    from privacylab.models import ModelSpec, build_model, save_model

    options = {"activation": "sigmoid", "init": "uniform"}
    model = build_model("lenet", (1, 8, 8), 10, seed=3, **options)
    meta = {"data": {"name": "digits"}, "training": {"seed": 5}}
    save_model(model, tmp_path / "saved", ModelSpec("lenet", (1, 8, 8), 10, options), meta)
    case = prepare(ig(target=str(tmp_path / "saved"), examples=(2,)))
    sent = case.target.updates[0].state
    assert all(torch.equal(sent[k], v) for k, v in model.state_dict().items())
    train, _ = train_test_indices(load_dataset("digits"), seed=5)
    assert case.facts["dataset_rows"] == [int(train[2])] and case.facts["model"] == "lenet"
    assert job.store_key(ig(target=str(tmp_path / "saved"))) != job.store_key(ig())
    with pytest.raises(InversionError, match="was trained on digits, not mnist5k"):
        prepare(ig(target=str(tmp_path / "saved"), dataset="mnist5k"))
