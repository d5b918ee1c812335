"""Shared tiny fixtures for the gradient-inversion tests: 8x8 digits, DLG's sigmoid LeNet,
and the honest-but-curious server's view of one client update (a `Target` at updates access,
the `GradientTask` and the evaluator's `GradientTruth`).

Stable fixtures (other test files rely on them; test modules here are not a package, so use
the fixtures, not imports of this file): `digits`, `pick`, `lenet`, `mlp_relu`, `observe`
(= `observe_update`), `make_case` (returns a `Case`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from privacylab.attacks.inversion import GradientTask, GradientTruth
from privacylab.data import load_dataset
from privacylab.federated import LocalTraining, ObservedUpdate, local_update
from privacylab.models import build_model
from privacylab.target import Target

INPUT_SHAPE = (1, 8, 8)
NUM_CLASSES = 10


@dataclass
class Case:
    """One attacked client update: the server's `target` and `task`, the hidden `truth`,
    and the `update` itself."""

    target: Target
    task: GradientTask
    truth: GradientTruth
    update: ObservedUpdate


def observe_update(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    training: LocalTraining | None = None,
    *,
    noise: float = 0.0,
    seed: int = 0,
) -> ObservedUpdate:
    """The update a client holding (`x`, `y`) sends from `model`'s parameters; `noise` is the
    variance of Gaussian noise added to every coordinate (a crude update defence)."""
    training = training or LocalTraining()
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    update = local_update(model, state, x, y, training)
    defense = None
    if noise > 0:
        gen = torch.Generator().manual_seed(seed)
        update = {
            k: v + noise**0.5 * torch.randn(v.shape, generator=gen, dtype=v.dtype)
            for k, v in update.items()
        }
        defense = f"noise:{noise:g}"
    return ObservedUpdate(
        round=0,
        clients=(0,),
        state=state,
        update=update,
        num_examples=int(x.shape[0]),
        training=training,
        defense=defense,
    )


def _make_case(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    training: LocalTraining | None = None,
    *,
    noise: float = 0.0,
    seed: int = 0,
    labels: bool = False,
    local_training: bool = False,
) -> Case:
    update = observe_update(model, x, y, training, noise=noise, seed=seed)
    target = Target(model, "updates", NUM_CLASSES, updates=[update])
    task = GradientTask(
        input_shape=tuple(x.shape[1:]),
        num_classes=NUM_CLASSES,
        labels=y if labels else None,
        local_training=update.training if local_training else None,
        seed=seed,
    )
    return Case(target, task, GradientTruth(x=x, y=y), update)


@pytest.fixture(scope="session")
def digits() -> tuple[Tensor, Tensor]:
    """sklearn's digits: x (1797, 1, 8, 8) float32 in [0, 1], y (1797,) int64."""
    x, y = load_dataset("digits").to_tensors()
    return x.float(), y.long()


@pytest.fixture
def pick(digits: tuple[Tensor, Tensor]) -> Callable[..., tuple[Tensor, Tensor]]:
    """`pick(*rows)`: the digits at those rows, (x, y)."""
    x, y = digits

    def _pick(*rows: int) -> tuple[Tensor, Tensor]:
        index = torch.tensor(rows, dtype=torch.long)
        return x[index].clone(), y[index].clone()

    return _pick


@pytest.fixture
def lenet() -> nn.Module:
    """The sigmoid LeNet of Zhu et al. 2019 on 8x8 inputs, U(-0.5, 0.5) weights, seed 0."""
    return build_model("lenet", INPUT_SHAPE, NUM_CLASSES, init="uniform", seed=0)


@pytest.fixture
def mlp_relu() -> nn.Module:
    """A ReLU MLP 64-32-10, seed 0 (first layer fully connected with a bias)."""
    return build_model("mlp", INPUT_SHAPE, NUM_CLASSES, widths=(32,), seed=0)


@pytest.fixture
def observe() -> Callable[..., ObservedUpdate]:
    """`observe(model, x, y, training=None, *, noise=0.0, seed=0)`: the client's update as
    the server receives it (`observe_update`)."""
    return observe_update


@pytest.fixture
def make_case() -> Callable[..., Case]:
    """`make_case(model, x, y, training=None, *, noise=0.0, seed=0, labels=False,
    local_training=False)`: the server's view of one client's update (see `Case`)."""
    return _make_case
