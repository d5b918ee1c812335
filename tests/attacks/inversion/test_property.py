"""Property inference (Ganju et al. 2018) on 8x8 digits with a 64-16-10 MLP: the white-box
(permutation-invariant) and black-box meta-classifiers tell the share of class 0 (0.1 vs 0.5)
well above chance, stay within a binomial bound of chance on the control property
(row-parity), count their queries, and the white-box meta-classifier is exactly invariant to
permutations of every hidden layer's neurons."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy.stats import binomtest
from torch import nn

from privacylab.attacks.inversion import InversionError, inversion_names, make_inversion
from privacylab.attacks.inversion.property import (
    BlackBoxProperty,
    ClassShare,
    PermutationInvariantMeta,
    PropertyTask,
    RowParity,
    WhiteBoxProperty,
    dense_layers,
    draw_training_sets,
    parse_property,
    run_property_inference,
    split_pools,
    train_property_model,
    train_shadows,
)
from privacylab.data import load_dataset
from privacylab.models import ModelSpec, build_model
from privacylab.target import AccessError, Target

SPEC = ModelSpec("mlp", (1, 8, 8), 10, {"widths": [16]})
TRAINING = {"epochs": 8, "batch_size": 32, "lr": 0.05, "optimizer": "momentum"}
SIZE = 120


FAST = {"property-whitebox": {"epochs": 150, "lr": 2e-2}, "property-blackbox": {}}
"""Fewer meta-classifier epochs than the default (300), to keep the tests quick."""


@dataclass
class Case:
    task: PropertyTask
    targets: list[Target]
    worlds: list[int]


def _case(spec: str, shadows: int, targets_per_world: int) -> Case:
    x, y = load_dataset("digits").to_tensors()
    attacker, owner = split_pools(len(y), 0)
    assert not set(attacker) & set(owner)
    task = PropertyTask(
        x[attacker], y[attacker], SPEC, TRAINING, spec, shadows=shadows, train_size=SIZE, queries=32
    )
    task.shadow_models, task.shadow_worlds = train_shadows(task)
    targets, worlds = [], []
    ox, oy = x[owner], y[owner]
    for world, _, rows, seed in draw_training_sets(
        task.prop, oy.numpy(), SIZE, targets_per_world, 0, 1
    ):
        index = torch.as_tensor(rows)
        model, _ = train_property_model(SPEC, TRAINING, ox[index], oy[index], seed)
        targets.append(Target(model, "white-box", 10))
        worlds.append(world)
    return Case(task, targets, worlds)


@pytest.fixture(scope="module")
def class_share() -> Case:
    return _case("class-share:0:0.1:0.5", shadows=8, targets_per_world=3)


@pytest.fixture(scope="module")
def control() -> Case:
    return _case("row-parity", shadows=6, targets_per_world=8)


def test_registered_by_kind() -> None:
    assert inversion_names("property") == ["property-blackbox", "property-whitebox"]
    assert isinstance(make_inversion("ganju"), WhiteBoxProperty)


@pytest.mark.parametrize("method", ["property-whitebox", "property-blackbox"])
def test_class_share_well_above_chance(class_share: Case, method: str) -> None:
    result = run_property_inference(
        make_inversion(method, **FAST[method]),
        class_share.targets,
        class_share.worlds,
        class_share.task,
    )
    assert result.chance == 0.5
    assert result.accuracy >= 5 / 6
    assert result.auc >= 0.85
    assert result.params["meta_train_accuracy"] == 1.0
    assert result.params["shadows"] == 16
    assert result.interval[0] <= result.accuracy <= result.interval[1]
    scores = np.asarray(result.scores)
    assert ((scores >= 0) & (scores <= 1)).all()
    row = result.to_dict()
    assert {"method", "property", "accuracy", "auc", "chance", "queries"} <= set(row)
    assert row["property"] == "class-share:0:0.1:0.5"


@pytest.mark.parametrize("method", ["property-whitebox", "property-blackbox"])
def test_control_property_stays_near_chance(control: Case, method: str) -> None:
    result = run_property_inference(
        make_inversion(method, **FAST[method]), control.targets, control.worlds, control.task
    )
    n = len(control.targets)
    correct = round(result.accuracy * n)
    assert binomtest(correct, n, 0.5).pvalue > 0.01, result.to_dict()
    assert abs(result.auc - 0.5) < 0.35


def test_queries_counted(class_share: Case) -> None:
    white = run_property_inference(
        WhiteBoxProperty(epochs=5), class_share.targets, class_share.worlds, class_share.task
    )
    black = run_property_inference(
        BlackBoxProperty(), class_share.targets, class_share.worlds, class_share.task
    )
    assert white.queries == 0  # reading weights runs no forward pass
    assert white.access == "white-box"
    assert black.queries == len(class_share.targets) * class_share.task.queries
    assert black.access == "scores"


def _permuted(model: nn.Module, layer: int, order: torch.Tensor) -> nn.Module:
    """A copy of the MLP with hidden layer `layer`'s neurons put in `order`."""
    copy = build_model(
        "mlp", (1, 8, 8), 10, widths=[len(layer.weight) for layer in dense_layers(model)][:-1]
    )
    copy.load_state_dict(model.state_dict())
    layers = dense_layers(copy)
    with torch.no_grad():
        layers[layer].weight.copy_(layers[layer].weight[order])
        layers[layer].bias.copy_(layers[layer].bias[order])
        layers[layer + 1].weight.copy_(layers[layer + 1].weight[:, order])
    return copy


def _params(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.weight.detach(), layer.bias.detach()) for layer in dense_layers(model)]


def test_permuting_hidden_neurons_leaves_the_meta_classifier_unchanged() -> None:
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10, widths=[12, 8], seed=3)
    meta = PermutationInvariantMeta([(12, 64), (8, 12), (10, 8)], width=16, dim=6)
    x = torch.rand(5, 1, 8, 8)
    base = meta([(w[None], b[None]) for w, b in _params(model)])
    for layer, width in ((0, 12), (1, 8)):
        order = torch.randperm(width, generator=torch.Generator().manual_seed(layer))
        other = _permuted(model, layer, order)
        torch.testing.assert_close(other(x), model(x))  # the same function
        assert not torch.equal(_params(other)[layer][0], _params(model)[layer][0])
        out = meta([(w[None], b[None]) for w, b in _params(other)])
        torch.testing.assert_close(out, base, rtol=0, atol=1e-5)


def test_fitted_whitebox_attack_is_permutation_invariant(class_share: Case) -> None:
    attack = WhiteBoxProperty(epochs=50).fit(class_share.task)
    model = class_share.targets[0]._model
    order = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    other = _permuted(model, 0, order)
    a = attack.run(Target(model, "white-box", 10), class_share.task)
    b = attack.run(Target(other, "white-box", 10), class_share.task)
    assert abs(a - b) < 1e-5


def test_whitebox_refuses_convolutions_naming_the_layer(class_share: Case) -> None:
    cnn = build_model("cnn", (1, 16, 16), 10, seed=0)
    with pytest.raises(InversionError, match=r"layer '0' \(Conv2d\)") as info:
        dense_layers(cnn)
    assert "\n" not in str(info.value)
    attack = WhiteBoxProperty(epochs=5).fit(class_share.task)
    wider = build_model("mlp", (1, 8, 8), 10, widths=[20], seed=0)
    with pytest.raises(InversionError, match="differ from the architecture"):
        attack.run(Target(wider, "white-box", 10), class_share.task)


def test_whitebox_needs_whitebox_access(class_share: Case) -> None:
    scores_only = [Target(t._model, "scores", 10) for t in class_share.targets]
    with pytest.raises(AccessError):
        run_property_inference(
            WhiteBoxProperty(epochs=5), scores_only, class_share.worlds, class_share.task
        )


def test_class_share_draws_exact_counts() -> None:
    labels = np.repeat(np.arange(10), 60)
    prop = parse_property("class-share:3:0.1:0.5")
    assert isinstance(prop, ClassShare)
    for world, share in ((0, 0.1), (1, 0.5)):
        rows = prop.draw(labels, 100, world, np.random.default_rng(world))
        assert len(set(rows.tolist())) == 100
        assert prop.share(labels[rows]) == share
    with pytest.raises(InversionError, match="use a smaller training set"):
        prop.draw(labels, 200, 1, np.random.default_rng(0))


def test_row_parity_worlds_are_one_distribution() -> None:
    """Each world's set is a uniform random subset of the pool: every row is about as likely
    in world 0 as in world 1."""
    prop = parse_property("row-parity")
    assert isinstance(prop, RowParity)
    labels = np.zeros(40, dtype=np.int64)
    counts = np.zeros((2, 40))
    for world in (0, 1):
        for i in range(400):
            counts[world, prop.draw(labels, 10, world, np.random.default_rng([world, i]))] += 1
    assert counts.min() > 40  # every row is drawn in both worlds (expected 100)
    assert np.abs(counts[0] - counts[1]).max() < 60


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty property"),
        ("ink-share:0.1", "unknown property"),
        ("class-share:0:0.1", "takes C:LOW:HIGH"),
        ("class-share:x:0.1:0.5", "C must be a class index"),
        ("class-share:0:0.1:1.5", "HIGH must be a number in"),
        ("class-share:0:0.5:0.5", "must differ"),
        ("row-parity:1", "takes no parameters"),
    ],
)
def test_bad_property_specs_are_one_line(spec: str, message: str) -> None:
    with pytest.raises(InversionError, match=message) as info:
        parse_property(spec)
    assert "\n" not in str(info.value)


def test_bad_task_and_options() -> None:
    x, y = torch.rand(10, 1, 8, 8), torch.arange(10)
    with pytest.raises(InversionError, match="shadows must be"):
        PropertyTask(x, y, SPEC, TRAINING, "row-parity", shadows=0)
    with pytest.raises(InversionError, match="as many labels as rows"):
        PropertyTask(x, y[:5], SPEC, TRAINING, "row-parity")
    with pytest.raises(InversionError, match="epochs must be"):
        WhiteBoxProperty(epochs=0)
    with pytest.raises(InversionError, match="C must be"):
        BlackBoxProperty(C=-1.0)
    with pytest.raises(InversionError, match="one world per target"):
        task = PropertyTask(x, y, SPEC, TRAINING, "row-parity", queries=4)
        run_property_inference(BlackBoxProperty(), [], [], task)
    with pytest.raises(InversionError, match="use fewer queries"):
        PropertyTask(x, y, SPEC, TRAINING, "row-parity", queries=10)
