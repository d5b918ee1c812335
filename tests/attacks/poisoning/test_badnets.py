"""BadNets (Gu et al. 2017): the poisons it crafts (counts, labels, target rows excluded, the
stamp present and the rest of each row an untouched source image; all-to-all labels; seeded;
one-line errors) and a tiny game on sklearn's 8x8 digits: a 2x2 corner trigger reaches a high
ASR with poisons, and none without (the clean model trained by the same recipe)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from privacylab.attacks.poisoning import (
    PoisonError,
    PoisonTask,
    Trigger,
    make_backdoor,
    predict_labels,
    run_poisoning,
)
from privacylab.attacks.poisoning.badnets import BadNets
from privacylab.attacks.poisoning.recipe import VictimRecipe, train_victim
from privacylab.data import Dataset, load_dataset
from privacylab.stats.backdoor import attack_success_rate

RECIPE = VictimRecipe(
    model="mlp", model_options={"widths": [64]}, epochs=20, batch_size=64, lr=5e-3
)


@dataclass
class Digits:
    train: Dataset
    source: Dataset
    test: Dataset


@pytest.fixture(scope="module")
def digits() -> Digits:
    data = load_dataset("digits")
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(data)))
    return Digits(
        data.subset(order[:1000]), data.subset(order[1000:1400]), data.subset(order[1400:])
    )


def _origin(poison: torch.Tensor, source: Dataset, box: torch.Tensor) -> int:
    """The one source row equal to `poison` outside the trigger's box."""
    keep = ~box
    same = (source.features[:, :, keep] == poison[:, keep]).flatten(1).all(1)
    rows = torch.nonzero(same).flatten()
    assert len(rows) >= 1
    return int(rows[0])


def test_craft_all_to_one(digits: Digits) -> None:
    attack = BadNets("square:2@corner")
    poisons = attack.craft(PoisonTask(digits.source, 30, target_class=3, seed=5))
    assert len(poisons) == 30 and poisons.features.shape == (30, 1, 8, 8)
    assert (poisons.labels == 3).all()
    assert poisons.trigger == Trigger("square", 2, "corner")
    assert (poisons.target_class, poisons.mode) == (3, "all-to-one")
    box = torch.zeros(8, 8, dtype=torch.bool)
    box[6:, 6:] = True
    assert (poisons.features[:, 0, 6:, 6:] == 1.0).all()
    origins = [_origin(p, digits.source, box) for p in poisons.features]
    assert len(set(origins)) == 30
    assert (digits.source.labels[origins] != 3).all()


def test_craft_all_to_all_random_positions(digits: Digits) -> None:
    attack = BadNets("pattern:2@random:0.5", mode="all-to-all")
    task = PoisonTask(digits.source, 60, target_class=0, mode="all-to-all", seed=2)
    poisons = attack.craft(task)
    again = attack.craft(task)
    assert torch.equal(poisons.features, again.features)
    assert torch.equal(poisons.labels, again.labels)
    distance = torch.cdist(poisons.features.flatten(1), digits.source.features.flatten(1))
    origins = distance.argmin(1)
    assert torch.equal(poisons.labels, (digits.source.labels[origins] + 1) % 10)
    grid = torch.tensor([[r, c] for r in range(7) for c in range(7)])
    trigger = Trigger("pattern", 2, "random", 0.5)
    places = set()
    for poison, origin in zip(poisons.features, origins.tolist(), strict=True):
        original = digits.source.features[origin].expand(len(grid), 1, 8, 8)
        candidates = trigger.stamp(original, places=grid)
        fits = torch.nonzero((candidates == poison).flatten(1).all(1)).flatten()
        assert len(fits) >= 1
        places.add(int(fits[0]))
    assert len(places) >= 10
    other = attack.craft(PoisonTask(digits.source, 60, 0, mode="all-to-all", seed=3))
    assert not torch.equal(other.features, poisons.features)


def test_all_to_all_uses_target_rows_too(digits: Digits) -> None:
    source = digits.source.subset(torch.nonzero(digits.source.labels <= 1).flatten())
    attack = BadNets("square:2@corner", mode="all-to-all")
    poisons = attack.craft(PoisonTask(source, len(source), 0, mode="all-to-all"))
    assert sorted(poisons.labels.tolist()) == sorted(((source.labels + 1) % 10).tolist())


def test_craft_errors_are_one_line(digits: Digits) -> None:
    few = digits.source.subset(torch.arange(10))
    outside = int((few.labels != 0).sum())
    errors = [
        lambda: BadNets("square:2@corner").craft(PoisonTask(few, outside + 1, 0)),
        lambda: BadNets("square:9@corner").craft(PoisonTask(few, 1, 0)),
        lambda: BadNets("square:2@7,7").craft(PoisonTask(few, 1, 0)),
        lambda: BadNets("circle:2@corner"),
        lambda: BadNets(mode="one-to-one"),
        lambda: BadNets(seed=-1),
        lambda: BadNets().craft(PoisonTask(few, 1, 0, mode="all-to-all")),
        lambda: make_backdoor("badnet"),
    ]
    for error in errors:
        with pytest.raises(PoisonError) as caught:
            error()
        assert str(caught.value) and "\n" not in str(caught.value)
    BadNets("square:2@corner").craft(PoisonTask(few, outside, 0))


@dataclass
class Game:
    clean: nn.Module
    asr: float
    baseline_asr: float
    accuracy: float
    baseline_accuracy: float
    queries: int
    test_rows: int


@pytest.fixture(scope="module")
def game(digits: Digits) -> Iterator[Game]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        clean, _ = train_victim(RECIPE, digits.train, seed=0)
        result, _, poisons = run_poisoning(
            make_backdoor("badnets", trigger="square:2@corner"),
            PoisonTask(digits.source, 40, target_class=0, seed=0),
            digits.train,
            digits.test,
            lambda data: train_victim(RECIPE, data, seed=0)[0],
            clean_model=clean,
        )
    finally:
        torch.set_num_threads(before)
    assert len(poisons) == 40 and result.poisons == 40
    assert result.poison_rate == pytest.approx(40 / 1040)
    yield Game(
        clean,
        result.asr,
        result.baseline_asr,
        result.clean_accuracy,
        result.baseline_accuracy,
        result.queries,
        len(digits.test),
    )


def test_backdoor_takes_with_poisons(game: Game) -> None:
    assert game.asr >= 0.9
    assert game.accuracy >= game.baseline_accuracy - 0.04
    assert game.queries == game.test_rows


def test_no_backdoor_without_poisons(game: Game, digits: Digits) -> None:
    assert game.baseline_asr <= 0.1
    assert game.baseline_accuracy >= 0.9
    triggered = Trigger("square", 2, "corner").stamp(digits.test.features)
    asr = attack_success_rate(predict_labels(game.clean, triggered), digits.test.labels.numpy(), 0)
    assert asr == pytest.approx(game.baseline_asr)


def test_task_and_recipe_refuse_malformed_values_in_one_line(digits: Digits) -> None:
    for call in (
        lambda: PoisonTask(digits.source, 3, target_class="a"),  # type: ignore[arg-type]
        lambda: PoisonTask(digits.source, 3, target_class=1.5),  # type: ignore[arg-type]
        lambda: PoisonTask(digits.source, 3, target_class=10),
        lambda: PoisonTask(digits.source, 3, target_class=1, seed=-1),
        lambda: VictimRecipe(model_options=5),  # type: ignore[arg-type]
        lambda: VictimRecipe(model=3),  # type: ignore[arg-type]
        lambda: VictimRecipe.from_dict([1]),  # type: ignore[arg-type]
        lambda: VictimRecipe.from_dict({"depth": 3}),
    ):
        with pytest.raises(PoisonError) as caught:
            call()
        assert "\n" not in str(caught.value)
    assert VictimRecipe.from_dict(RECIPE.to_dict()) == RECIPE


def test_predictions_leave_the_models_mode_alone(game: Game, digits: Digits) -> None:
    game.clean.train()
    try:
        first = predict_labels(game.clean, digits.test.features)
        assert game.clean.training
    finally:
        game.clean.eval()
    assert np.array_equal(first, predict_labels(game.clean, digits.test.features))
