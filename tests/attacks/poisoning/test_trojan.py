"""The trojaning attack (Liu et al. 2018) on a tiny CNN over sklearn's 8x8 digits.

Oracles: neuron selection against sums written out by hand; the TV denoiser (Eq. 5) against
the closed-form ROF minimiser of a two-level step image and against the fixed point of a
constant image; the attack against the original model (Orig+Tri high after trojaning, the
same trigger harmless before); the target's weights compared bit for bit after the attack.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_digits
from torch import nn

from privacylab.attacks.poisoning import (
    BackdoorResult,
    PoisonError,
    TrojanOutput,
    TrojanTask,
    backdoor_names,
    make_backdoor,
    run_trojan,
)
from privacylab.attacks.poisoning._inversion import total_variation, tv_denoise
from privacylab.attacks.poisoning.trojan import Trojan, hidden_layer, select_neurons
from privacylab.data import Dataset
from privacylab.target import Access, Target

SHAPE = (1, 8, 8)
FAST = {
    "trigger": "square:3@corner",
    "images_per_class": 10,
    "inversion_steps": 60,
    "trigger_steps": 100,
    "retrain_epochs": 20,
}


def _net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(512, 32),
        nn.ReLU(),
        nn.Linear(32, 10),
    )


@dataclass
class Game:
    model: nn.Module
    state: dict[str, torch.Tensor]
    test: Dataset
    result: BackdoorResult
    out: TrojanOutput
    public: torch.Tensor


@pytest.fixture(scope="module")
def game() -> Iterator[Game]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, test_rows, public = order[:1000], order[1000:1400], order[1400:1700]
    torch.manual_seed(0)
    model = _net()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(80):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[train]), y[train]).backward()
        optimizer.step()
    model.zero_grad(set_to_none=True)
    model.eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    test = Dataset(
        name="digits-test",
        features=x[test_rows],
        labels=y[test_rows],
        num_classes=10,
        input_shape=SHAPE,
        kind="image",
    )
    attack = make_backdoor("trojan", **FAST)
    task = TrojanTask(SHAPE, 10, target_class=0, public=x[public], seed=0)
    result, out = run_trojan(attack, model, task, test, external=torch.rand(100, *SHAPE))
    yield Game(model, state, test, result, out, x[public])
    torch.set_num_threads(before)


# ------------------------------------------------------------------------ neuron selection


def test_weights_selection_is_the_argmax_of_incoming_sums() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        net[1].weight.copy_(
            torch.tensor([[1.0, -1.0, 0.0], [0.5, 0.5, 3.0], [-4.0, 0.0, 0.1], [2.0, 2.0, 0.0]])
        )
        net[3].weight.copy_(torch.tensor([[0.0, 1.0, 0.0, -5.0], [9.0, 0.0, 0.0, 1.0]]))
    # |W| rows (weights from previous layer j into t): 2, 4, 4.1, 4 -> 2, then 1 and 3 tie
    assert select_neurons(net, "1", 1, "weights") == (2,)
    assert select_neurons(net, "1", 3, "weights") == (2, 1, 3)
    # outgoing sums to the next layer: 9, 1, 0, 6
    assert select_neurons(net, "1", 2, "weights-out") == (0, 3)
    assert hidden_layer(net) == "1"


def test_conv_selection_sums_channels_and_kernels() -> None:
    net = _net()
    with torch.no_grad():
        net[0].weight.zero_()
        net[0].weight[5, 0, 1, 1] = -2.0
    assert select_neurons(net, "0", 1, "weights") == (5,)
    scores = net[3].weight.detach().abs().view(32, 8, 64).sum(dim=(0, 2))
    assert select_neurons(net, "0", 1, "weights-out") == (int(scores.argmax()),)


def test_random_selection_is_seeded() -> None:
    net = _net()
    draw = [
        select_neurons(net, "3", 3, "random", torch.Generator().manual_seed(4)) for _ in range(2)
    ]
    assert draw[0] == draw[1] and len(set(draw[0])) == 3
    assert all(0 <= n < 32 for n in draw[0])


# ----------------------------------------------------------------------------- TV denoising


def test_constant_image_is_a_fixed_point() -> None:
    image = torch.full((2, 1, 6, 7), 0.37)
    assert torch.equal(tv_denoise(image, 0.3, iterations=50), image)
    assert float(total_variation(image).sum()) == 0.0


def test_step_image_matches_the_closed_form_rof_minimiser() -> None:
    # columns: a = 3 at 0, b = 5 at h; per row 1/2 (a d1^2 + b d2^2) + lam (h - d1 - d2)
    # is minimised by d1 = lam / a, d2 = lam / b (the jump stays positive).
    a, b, h, lam = 3, 5, 1.0, 0.3
    image = torch.zeros(4, a + b)
    image[:, a:] = h
    y = tv_denoise(image, lam, iterations=3000)
    assert torch.allclose(y[:, :a], torch.full((4, a), lam / a), atol=1e-3)
    assert torch.allclose(y[:, a:], torch.full((4, b), h - lam / b), atol=1e-3)
    assert float(total_variation(y)) == pytest.approx(4 * (h - lam / a - lam / b), abs=1e-2)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), lam=st.floats(0.01, 1.0))
def test_denoising_lowers_variation_and_keeps_the_range(seed: int, lam: float) -> None:
    image = torch.rand((1, 1, 6, 6), generator=torch.Generator().manual_seed(seed))
    y = tv_denoise(image, lam, iterations=30)
    energy = 0.5 * ((image - y) ** 2).sum() + lam * total_variation(y).sum()
    assert float(total_variation(y).sum()) <= float(total_variation(image).sum()) + 1e-5
    assert float(energy) <= float(lam * total_variation(image).sum()) + 1e-5
    assert float(y.min()) >= float(image.min()) - 1e-5
    assert float(y.max()) <= float(image.max()) + 1e-5


# --------------------------------------------------------------------------------- the attack


def test_trigger_raises_the_neuron_and_writes_only_inside_the_mask(game: Game) -> None:
    details = game.out.details
    assert details["selection"] == "weights"
    assert game.out.layer == "3"
    expected = select_neurons(game.model, "3", 1, "weights")
    assert game.out.neurons == expected
    assert details["neuron_value_after"][0] > details["neuron_value_before"][0] + 1.0
    images = game.test.features[:20]
    stamped = game.out.trigger.stamp(images)
    mask = torch.tensor(details["mask"]) > 0
    changed = (stamped != images).any(dim=0).any(dim=0)
    assert not bool(changed[~mask].any())
    assert bool(changed[mask].any())
    assert game.out.trigger.learned and game.out.trigger.position == "corner"


def test_retrained_model_carries_the_trojan_and_the_original_does_not(game: Game) -> None:
    result = game.result
    assert result.asr >= 0.5
    assert result.baseline_asr is not None and result.baseline_asr <= 0.1
    assert result.details["orig_tri"] == result.asr
    assert result.details["orig_dec"] <= 0.1
    assert result.clean_accuracy >= 0.8
    assert result.details["ext_tri"] is not None
    assert result.queries > 0
    assert set(result.details["phase_seconds"]) == {
        "trigger_generation",
        "data_generation",
        "retraining",
    }


def test_inverted_images_are_labelled_by_the_original_model(game: Game) -> None:
    out = game.out
    assert out.inverted.shape == (100, *SHAPE)
    assert float(out.inverted.min()) >= 0.0 and float(out.inverted.max()) <= 1.0
    with torch.no_grad():
        assert torch.equal(game.model(out.inverted).argmax(dim=1), out.inverted_labels)


def test_target_untouched_and_only_later_layers_retrained(game: Game) -> None:
    for key, value in game.model.state_dict().items():
        assert torch.equal(value, game.state[key]), key
    assert all(p.grad is None for p in game.model.parameters())
    trojaned = game.out.model
    assert trojaned is not game.model
    assert torch.equal(trojaned[0].weight, game.model[0].weight)
    assert not torch.equal(trojaned[3].weight, game.model[3].weight)
    assert game.out.details["retrained"] == ["3.bias", "3.weight", "5.bias", "5.weight"]


def test_same_seed_same_trojan(game: Game) -> None:
    attack = Trojan(**{**FAST, "images_per_class": 2, "retrain_epochs": 1, "inversion_steps": 5})
    task = TrojanTask(SHAPE, 10, 0, public=game.public)
    runs = [attack.run(Target(game.model, Access.WHITEBOX, 10), task) for _ in range(2)]
    assert torch.equal(runs[0].inverted, runs[1].inverted)
    assert torch.equal(runs[0].trigger.pattern, runs[1].trigger.pattern)


def test_output_neuron_selection_drives_the_target_logit(game: Game) -> None:
    attack = Trojan(
        **{**FAST, "images_per_class": 2, "retrain_epochs": 1, "inversion_steps": 5},
        selection="output",
        init_average=None,
    )
    task = TrojanTask(SHAPE, 10, 7, public=game.public)
    out = attack.run(Target(game.model, Access.WHITEBOX, 10), task)
    assert out.layer == "5" and out.neurons == (7,)
    assert out.details["neuron_value_after"][0] > out.details["neuron_value_before"][0]


def test_registered() -> None:
    assert "trojan" in backdoor_names()
    assert isinstance(make_backdoor("trojan"), Trojan)


@pytest.mark.parametrize(
    "options",
    [
        {"selection": "largest"},
        {"neurons": 0},
        {"neurons": True},
        {"trigger": "square:3@random"},
        {"trigger": "pattern:3@corner"},
        {"trigger": "blob:3@corner"},
        {"selection": "output", "layer": "3"},
        {"selection": "output", "neurons": 2},
        {"inversion_value": 1.5},
        {"tv_weight": -1.0},
        {"retrain_epochs": 0},
        {"denoise": "yes"},
        {"init_average": 0},
    ],
)
def test_bad_options_are_one_line(options: dict[str, object]) -> None:
    with pytest.raises(PoisonError) as info:
        Trojan(**options)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("options", "task"),
    [
        ({"trigger": "square:9@corner"}, TrojanTask(SHAPE, 10, 0)),
        ({"layer": "nope"}, TrojanTask(SHAPE, 10, 0)),
        ({"layer": "1"}, TrojanTask(SHAPE, 10, 0)),
        ({"neurons": 33}, TrojanTask(SHAPE, 10, 0)),
        ({}, TrojanTask(SHAPE, 10, 10)),
        ({}, TrojanTask(SHAPE, 10, 0, public=torch.zeros(3, 1, 5, 5))),
    ],
)
def test_bad_tasks_are_one_line(options: dict[str, object], task: TrojanTask) -> None:
    target = Target(_net().eval(), Access.WHITEBOX, 10)
    with pytest.raises(PoisonError) as info:
        Trojan(**options).run(target, task)
    assert "\n" not in str(info.value)
