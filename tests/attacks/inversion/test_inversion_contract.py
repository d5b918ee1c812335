"""The contract every registered gradient-inversion attack keeps (after scikit-learn's
`parametrize_with_checks`): it runs over `inversion_names("gradients")`, so an attack added in a
new file of `privacylab.attacks.inversion` is checked with no edit here.

On one tiny client update (8x8 digits, a sigmoid LeNet or, for attacks that need a fully
connected first layer, a sigmoid MLP; FedSGD, or 2-step FedAvg for attacks that replay local
training) each attack must: declare updates access; refuse a target without it (AccessError);
return a batch of the right shape inside the box; be reproducible under its seed; never see
the truth (the same output whatever the truth says); and count its forward passes as queries.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from privacylab.attacks.inversion import (
    INVERSION_ATTACKS,
    GradientTask,
    GradientTruth,
    InversionError,
    inversion_names,
    make_inversion,
    non_smooth_layer,
    replay,
    run_reconstruction,
)
from privacylab.federated import LocalTraining, ObservedUpdate, local_update
from privacylab.federated.clients import observe
from privacylab.models import build_model
from privacylab.target import Access, AccessError, Target

CHEAP: dict[str, dict[str, Any]] = {
    "dlg": {"iterations": 3},
    "dlg-fedavg": {"iterations": 3},
    "idlg": {"iterations": 3},
    "idlg-fedavg": {"iterations": 3},
    "ig": {"iterations": 10},
}
"""Light settings (the contract, not the attack's strength, is tested here)."""

GRADIENT_ATTACKS = inversion_names("gradients")


def _model(name: str) -> nn.Module:
    if name == "analytic":
        return build_model("mlp", (1, 8, 8), 10, widths=(16,), activation="sigmoid", seed=0)
    return build_model("lenet", (1, 8, 8), 10, init="uniform", seed=0)


def _training(name: str) -> LocalTraining:
    side = INVERSION_ATTACKS.get(name).threat_model.side_information
    return (
        LocalTraining("fedavg", epochs=2, lr=0.1) if "local-training" in side else LocalTraining()
    )


def _case(name: str, labels_seed: int = 0) -> tuple[Target, GradientTask, GradientTruth]:
    model = _model(name)
    gen = torch.Generator().manual_seed(7)
    x, y = torch.rand(1, 1, 8, 8, generator=gen), torch.tensor([3])
    training = _training(name)
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    update = ObservedUpdate(0, (0,), state, local_update(model, state, x, y, training), 1, training)
    target = Target(model, "updates", 10, updates=[update])
    task = GradientTask((1, 8, 8), 10, labels=y, local_training=training, seed=labels_seed)
    return target, task, GradientTruth(x, y)


def test_every_gradient_attack_is_registered_with_updates_access() -> None:
    assert {"dlg", "idlg", "ig", "analytic"} <= set(GRADIENT_ATTACKS)
    for name in GRADIENT_ATTACKS:
        cls = INVERSION_ATTACKS.get(name)
        assert cls.threat_model.access is Access.UPDATES, name
        assert cls.paper, f"{name} names no paper"


@pytest.mark.parametrize("name", GRADIENT_ATTACKS)
def test_contract(name: str) -> None:
    target, task, truth = _case(name)
    attack = make_inversion(name, **CHEAP.get(name, {}))
    with pytest.raises(AccessError):
        run_reconstruction(attack, target.with_access("white-box"), task, truth)
    first = run_reconstruction(attack, target, task, truth)
    assert first.x is not None and tuple(first.x.shape) == (1, 1, 8, 8)
    assert float(first.x.min()) >= 0.0 and float(first.x.max()) <= 1.0
    assert target.queries == first.queries  # every forward pass went through the view
    assert first.queries > 0 or name == "analytic"  # analytic: a closed form of the update
    assert first.method == name and first.access == "updates"
    assert {"method", "psnr", "ssim", "mse", "label_accuracy", "batch_size", "defense"} <= set(
        first.to_dict()
    )
    # the truth is attached only afterwards: a different truth changes the scores, not the output
    lie = GradientTruth(torch.zeros_like(truth.x), torch.tensor([0]))
    target2, task2, _ = _case(name)
    second = run_reconstruction(make_inversion(name, **CHEAP.get(name, {})), target2, task2, lie)
    torch.testing.assert_close(second.x, first.x)


@pytest.mark.parametrize(
    ("options", "word"),
    [
        ({"input_shape": (1, 0, 8)}, "input_shape"),
        ({"input_shape": ()}, "input_shape"),
        ({"num_classes": 1}, "num_classes"),
        ({"update": -1}, "update"),
        ({"seed": 1.5}, "seed"),
        ({"bounds": (1.0, 0.0)}, "bounds"),
        ({"labels": torch.tensor([3, 10])}, "labels must lie in 0..9"),
        ({"labels": torch.tensor([-1])}, "labels must lie in 0..9"),
    ],
)
def test_bad_task_is_one_line(options: dict[str, Any], word: str) -> None:
    base: dict[str, Any] = {"input_shape": (1, 8, 8), "num_classes": 10}
    with pytest.raises(InversionError, match=word) as info:
        GradientTask(**{**base, **options})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("layer", [nn.ReLU(), nn.Hardsigmoid(), nn.ReLU6(), nn.Threshold(0, 0)])
def test_second_order_attacks_refuse_piecewise_linear_layers(layer: nn.Module) -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), layer, nn.Linear(16, 10))
    assert non_smooth_layer(model) == f"'2' ({type(layer).__name__})"
    with pytest.raises(InversionError, match="twice-differentiable"):
        INVERSION_ATTACKS.get("dlg").check_model(model)
    smooth = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Sigmoid(), nn.MaxPool1d(2))
    assert non_smooth_layer(smooth) is None


@pytest.mark.parametrize(
    ("training", "clients"),
    [
        (LocalTraining(), 1),
        (LocalTraining(), 3),
        (LocalTraining("fedavg", epochs=2, batch_size=2, lr=0.1), 1),
        (LocalTraining("fedavg", epochs=2, batch_size=2, lr=0.1), 3),
    ],
)
def test_replay_of_the_true_batch_is_the_observed_update(
    training: LocalTraining, clients: int
) -> None:
    """The attacker's replay is the protocol: on the client's true rows it gives back exactly
    what the server observed, also for the mean of k securely aggregated FedAvg clients (each
    stepping on its own rows; one client on all rows would differ)."""
    model = _model("dlg")
    gen = torch.Generator().manual_seed(3)
    x, y = torch.rand(7, 1, 8, 8, generator=gen), torch.randint(0, 10, (7,), generator=gen)
    (update,) = observe(
        model, x, y, training=training, clients=clients, secure_aggregation=clients > 1
    )
    replayed = replay(model, update, x, y, training)
    for name, value in update.update.items():
        torch.testing.assert_close(replayed[name].detach(), value, rtol=1e-5, atol=1e-7)
