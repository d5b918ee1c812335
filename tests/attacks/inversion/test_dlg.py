"""DLG (Zhu et al. 2019) and iDLG (Zhao et al. 2020) on 8x8 digits and DLG's sigmoid LeNet."""

from __future__ import annotations

import math

import pytest
import torch

from privacylab.attacks.inversion import (
    InversionError,
    inversion_names,
    make_inversion,
    run_reconstruction,
)
from privacylab.attacks.inversion import dlg as dlg_module
from privacylab.attacks.inversion.dlg import PAPER_MAX_BATCH
from privacylab.federated import LocalTraining


def test_registered():
    names = inversion_names("gradients")
    assert {"dlg", "idlg", "dlg-fedavg", "idlg-fedavg"} <= set(names)


def test_dlg_recovers_one_digit_and_its_label(lenet, pick, make_case):
    case = make_case(lenet, *pick(0))
    result = run_reconstruction(
        make_inversion("dlg", iterations=100), case.target, case.task, case.truth
    )
    assert result.psnr > 30
    assert result.baseline_psnr < 10
    assert result.label_accuracy == 1.0
    assert result.params["labels"] == "optimised"
    # each objective evaluation is one forward pass of one dummy example through the target
    assert result.queries == result.params["evaluations"] > 0
    assert result.history[0][1] > 1e3 * result.loss
    assert len(result.restarts) == 1 and result.restarts[0] == result.loss


def test_dlg_fails_on_a_heavily_noised_update(lenet, pick, make_case):
    case = make_case(lenet, *pick(0), noise=1e-1)
    result = run_reconstruction(
        make_inversion("dlg", iterations=40), case.target, case.task, case.truth
    )
    assert result.psnr < 15
    assert abs(result.psnr - result.baseline_psnr) < 5


def test_dlg_refuses_relu_in_one_line(mlp_relu, pick, make_case):
    case = make_case(mlp_relu, *pick(0))
    with pytest.raises(InversionError) as info:
        run_reconstruction(make_inversion("dlg"), case.target, case.task, case.truth)
    message = str(info.value)
    assert "\n" not in message and "'2' (ReLU)" in message


def test_same_seed_same_x_other_seed_other_x(lenet, pick, make_case):
    x, y = pick(3)
    runs = []
    for seed in (4, 4, 5):
        case = make_case(lenet, x, y, seed=seed)
        attack = make_inversion("dlg", iterations=10)
        runs.append(run_reconstruction(attack, case.target, case.task, case.truth).x)
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_idlg_recovers_labels_then_data(lenet, pick, make_case):
    case = make_case(lenet, *pick(0, 1, 11))  # labels 0, 1, 1: one class twice
    assert case.truth.y.tolist() == [0, 1, 1]
    result = run_reconstruction(
        make_inversion("idlg", iterations=100), case.target, case.task, case.truth
    )
    assert result.params["labels"] == "recovered"
    assert result.label_accuracy == 1.0
    assert result.psnr > 25


def test_fedavg_needs_the_local_procedure(lenet, pick, make_case):
    training = LocalTraining("fedavg", epochs=2, lr=0.1)
    case = make_case(lenet, *pick(2), training, local_training=True)
    with pytest.raises(InversionError, match="local-training"):
        run_reconstruction(make_inversion("dlg"), case.target, case.task, case.truth)
    result = run_reconstruction(
        make_inversion("idlg-fedavg", iterations=60), case.target, case.task, case.truth
    )
    assert result.params["local_steps"] == 2
    assert result.label_accuracy == 1.0
    assert result.psnr > 30


def test_nan_restart_is_discarded(lenet, pick, make_case, monkeypatch):
    real = dlg_module.match_gradients
    calls = []

    def first_diverges(*args, **kwargs):
        run = real(*args, **kwargs)
        calls.append(run)
        if len(calls) == 1:
            run.loss = math.nan
        return run

    monkeypatch.setattr(dlg_module, "match_gradients", first_diverges)
    case = make_case(lenet, *pick(0))
    rec = make_inversion("dlg", iterations=5, restarts=2).reconstruct(case.target, case.task)
    assert math.isnan(rec.restarts[0]) and rec.restarts[1] == rec.loss
    assert rec.params["kept_restart"] == 1
    assert torch.equal(rec.initial, calls[1].initial)


def test_large_batch_warns(lenet, digits, make_case):
    x, y = digits
    case = make_case(lenet, x[: PAPER_MAX_BATCH + 1], y[: PAPER_MAX_BATCH + 1])
    rec = make_inversion("dlg", iterations=1).reconstruct(case.target, case.task)
    assert rec.x.shape == (PAPER_MAX_BATCH + 1, 1, 8, 8)
    assert float(rec.x.min()) >= 0 and float(rec.x.max()) <= 1
    assert "at most 8" in rec.params["warning"]


def test_wrong_input_shape_is_one_line(lenet, pick, make_case):
    case = make_case(lenet, *pick(0))
    case.task.input_shape = (1, 8)
    with pytest.raises(InversionError) as info:
        run_reconstruction(make_inversion("idlg"), case.target, case.task, case.truth)
    assert str(info.value).startswith("idlg: the model cannot replay")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("options", "word"),
    [({"iterations": 0}, "iterations"), ({"restarts": 1.5}, "restarts"), ({"tol": -1}, "tol")],
)
def test_bad_options_one_line(options, word):
    with pytest.raises(InversionError, match=word):
        make_inversion("dlg", **options)
