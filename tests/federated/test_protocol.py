"""The federated protocol and the one local-training function both sides run: FedSGD is the
gradient of the mean loss, FedAvg the unrolled SGD steps; the attacker's differentiable replay
equals what the client sent."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from privacylab.federated import (
    FederatedError,
    LocalTraining,
    ObservedUpdate,
    cross_entropy,
    local_update,
)
from privacylab.models import build_model


def _setup(seed: int = 0) -> tuple[nn.Module, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    model = build_model("lenet", (1, 8, 8), 10, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.rand(5, 1, 8, 8, generator=gen), torch.randint(0, 10, (5,), generator=gen)
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    return model, state, x, y


def test_fedsgd_sends_the_gradient_of_the_mean_loss() -> None:
    model, state, x, y = _setup()
    sent = local_update(model, state, x, y, LocalTraining())
    expected = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    for (name, value), ref in zip(sent.items(), expected, strict=True):
        torch.testing.assert_close(value, ref, msg=name)


def test_fedavg_sends_the_change_after_plain_sgd_steps() -> None:
    model, state, x, y = _setup(1)
    training = LocalTraining("fedavg", epochs=2, batch_size=2, lr=0.05)
    sent = local_update(model, state, x, y, training)
    manual = build_model("lenet", (1, 8, 8), 10, seed=1)
    opt = torch.optim.SGD(manual.parameters(), lr=0.05)
    for start, stop in training.batches(5):
        opt.zero_grad()
        F.cross_entropy(manual(x[start:stop]), y[start:stop]).backward()
        opt.step()
    assert training.batches(5) == [(0, 2), (2, 4), (4, 5)] * 2 and training.steps(5) == 6
    for name, p in manual.named_parameters():
        torch.testing.assert_close(sent[name], state[name] - p.detach(), msg=name)
    for name, p in model.named_parameters():  # the caller's model is untouched
        torch.testing.assert_close(p.detach(), state[name])


@pytest.mark.parametrize("algorithm", ["fedsgd", "fedavg"])
def test_the_attackers_replay_is_differentiable_and_equal_to_what_was_sent(algorithm: str) -> None:
    model, state, x, y = _setup(2)
    training = LocalTraining(algorithm, epochs=3 if algorithm == "fedavg" else 1)
    sent = local_update(model, state, x, y, training)
    dummy = x.clone().requires_grad_(True)
    replay = local_update(model, state, dummy, y, training, create_graph=True)
    for name in sent:
        torch.testing.assert_close(replay[name].detach(), sent[name], rtol=1e-5, atol=1e-7)
    objective = sum(((replay[k] - sent[k]) ** 2).sum() for k in sent) + replay["0.weight"].sum()
    (grad,) = torch.autograd.grad(objective, dummy)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_soft_labels_equal_hard_ones_when_one_hot() -> None:
    logits = torch.randn(4, 3)
    y = torch.tensor([0, 2, 1, 2])
    torch.testing.assert_close(
        cross_entropy(logits, F.one_hot(y, 3).float()), cross_entropy(logits, y)
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"algorithm": "fedprox"},
        {"algorithm": "fedavg", "epochs": 0},
        {"algorithm": "fedavg", "batch_size": 0},
        {"lr": float("nan")},
        {"algorithm": "fedsgd", "epochs": 2},
    ],
)
def test_bad_local_training_is_one_line(kwargs: dict) -> None:
    with pytest.raises(FederatedError) as info:
        LocalTraining(**kwargs)
    assert "\n" not in str(info.value)


def test_an_update_must_match_the_state() -> None:
    state = {"w": torch.zeros(2, 2)}
    with pytest.raises(FederatedError, match="shape"):
        ObservedUpdate(0, (0,), state, {"w": torch.zeros(3)}, 1)
    with pytest.raises(FederatedError, match="different parameters"):
        ObservedUpdate(0, (0,), state, {"v": torch.zeros(2, 2)}, 1)
    with pytest.raises(FederatedError, match="num_examples must be a whole number >= 1"):
        ObservedUpdate(0, (0,), state, {"w": torch.zeros(2, 2)}, None)  # type: ignore[arg-type]
