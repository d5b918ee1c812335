"""Analytic recovery from a fully connected first layer (Phong et al. 2018; Geiping et al.
2020, Prop. 1)."""

from __future__ import annotations

import pytest
import torch

from privacylab.attacks.inversion import InversionError, make_inversion, run_reconstruction
from privacylab.federated import LocalTraining
from privacylab.models import build_model


@pytest.mark.parametrize("row", [0, 7, 42, 1000])
def test_exact_on_a_relu_mlp(mlp_relu, pick, make_case, row):
    case = make_case(mlp_relu, *pick(row))
    result = run_reconstruction(make_inversion("analytic"), case.target, case.task, case.truth)
    assert result.psnr >= 60
    assert result.label_accuracy == 1.0
    assert result.params["relative_residual"] < 1e-5
    assert result.queries == 0  # closed form: no forward pass


def test_exact_on_a_multi_step_fedavg_delta_of_one_example(pick, make_case):
    model = build_model("mlp", (1, 8, 8), 10, widths=(16, 16), activation="tanh", seed=1)
    case = make_case(model, *pick(5), LocalTraining("fedavg", epochs=3, lr=0.1))
    result = run_reconstruction(make_inversion("analytic"), case.target, case.task, case.truth)
    assert result.psnr >= 60
    assert result.label_accuracy == 1.0


def test_refuses_a_cnn_in_one_line(lenet, pick, make_case):
    case = make_case(lenet, *pick(0))
    with pytest.raises(InversionError) as info:
        run_reconstruction(make_inversion("analytic"), case.target, case.task, case.truth)
    message = str(info.value)
    assert "\n" not in message and "'0' is Conv2d" in message


def test_a_batch_is_separated_by_units_one_example_alone_activates(pick, make_case):
    wide = build_model("mlp", (1, 8, 8), 10, widths=(256,), seed=0)
    case = make_case(wide, *pick(10, 11, 12, 13))
    result = run_reconstruction(make_inversion("analytic"), case.target, case.task, case.truth)
    assert result.params["isolated"] == 4
    assert min(p["psnr"] for p in result.per_example) >= 60
    assert result.label_accuracy == 1.0
    assert result.loss < 1e-5  # the recovered inputs span the first layer's gradient


def test_a_batch_through_smooth_units_is_only_mixed(pick, make_case):
    smooth = build_model("mlp", (1, 8, 8), 10, widths=(256,), activation="sigmoid", seed=0)
    case = make_case(smooth, *pick(10, 11, 12, 13))
    result = run_reconstruction(make_inversion("analytic"), case.target, case.task, case.truth)
    assert result.params["isolated"] == 0  # every sigmoid unit mixes every example
    assert result.psnr < 20


def test_refusals(mlp_relu, pick, make_case):
    case = make_case(mlp_relu, *pick(0, 1), LocalTraining("fedavg", epochs=1, lr=0.1))
    with pytest.raises(InversionError, match="FedSGD"):
        make_inversion("analytic").reconstruct(case.target, case.task)
    no_bias = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(64, 16, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 10),
    )
    case = make_case(no_bias, *pick(0))
    with pytest.raises(InversionError, match="bias"):
        make_inversion("analytic").reconstruct(case.target, case.task)
    with pytest.raises(InversionError, match="rtol"):
        make_inversion("analytic", rtol=0)
