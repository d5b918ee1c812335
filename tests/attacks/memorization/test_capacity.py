"""Capacity abuse (Song et al. 2017, Sec. 5) on sklearn's 8x8 digits (1,000 training rows, a
256-unit MLP, 10 epochs): two 4-bit images (512 bits, ⌈512 / 3⌉ = 171 synthetic inputs, 8
copies each) are decoded from label queries alone at >= 95 % bit accuracy and recognised
among the training rows, with ⌈bits / ⌊log2 10⌋⌉ queries counted; the same queries to an
honestly trained model decode no better than the best constant answer and recognise nothing;
a query budget covering only the first image decodes that image and leaves the second black,
spending the budget exactly. The label chunks are checked against a Python-string
re-derivation (hypothesis), the generators for determinism (same key same inputs, other key
other inputs, a longer run extending a shorter one) and the pixel generator's structure; a
secret above ⌊ratio · rows / copies⌋ · 3 bits is refused in one line before training."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from privacylab.attacks.memorization import (
    MemorizationError,
    MemorizationResult,
    MemorizationTask,
    Secret,
    SecretLayout,
    choose_secret,
    make_memorization,
    memorization_names,
    run_memorization,
    train_encoded,
    train_honest,
)
from privacylab.attacks.memorization.capacity import (
    CapacityAbuse,
    label_chunks,
    synthetic_inputs,
    synthetic_limit,
)
from privacylab.attacks.poisoning.recipe import VictimRecipe
from privacylab.data import Dataset, load_dataset
from privacylab.errors import PrivacylabError
from privacylab.stats.memorization import to_bits
from privacylab.target import Access, Target

RECIPE = VictimRecipe(model_options={"widths": [256], "activation": "relu"}, epochs=10)
COPIES = 8
ITEMS = 2
BITS = 4
K = 3


def _one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(error.value)
    assert text and "\n" not in text
    return text


@dataclass
class Game:
    train: Dataset
    test: Dataset
    secret: Secret
    task: MemorizationTask
    attack: CapacityAbuse
    encoded: nn.Module
    honest: nn.Module


def _accuracy(model: nn.Module, data: Dataset) -> float:
    with torch.no_grad():
        return float((model(data.features).argmax(1) == data.labels).float().mean())


@pytest.fixture(scope="module")
def game() -> Game:
    data = load_dataset("digits")
    order = np.random.default_rng(0).permutation(len(data))
    train, test = data.subset(order[:1000]), data.subset(order[1000:])
    secret = choose_secret(train, [3, 17], BITS)
    attack = CapacityAbuse(generator="noise", ratio=3.0, copies=COPIES)
    encoded, _ = train_encoded(attack, secret, RECIPE, train, seed=0, key=5)
    honest, _ = train_honest(RECIPE, train, seed=0)
    task = MemorizationTask(secret.layout, train.input_shape, train.num_classes, key=5)
    return Game(train, test, secret, task, attack, encoded, honest)


def _decode(game: Game, model: nn.Module, **target: object) -> MemorizationResult:
    return run_memorization(
        game.attack,
        Target(model, Access.LABEL, game.train.num_classes, **target),  # type: ignore[arg-type]
        game.task,
        game.secret,
        clean_accuracy=_accuracy(model, game.test),
        honest_accuracy=_accuracy(game.honest, game.test),
        candidates=game.train.features.numpy(),
    )


def test_registered_with_label_access() -> None:
    assert "capacity" in memorization_names()
    attack = make_memorization("capacity")
    assert isinstance(attack, CapacityAbuse)
    assert attack.threat_model.access is Access.LABEL
    assert attack.to_dict() == {"name": "capacity", "generator": "pixel", "ratio": 2.0, "copies": 1}


def test_decodes_the_secret_from_label_queries(game: Game) -> None:
    result = _decode(game, game.encoded)
    bits = ITEMS * 64 * BITS
    assert result.queries == math.ceil(bits / K) == 171
    assert result.access is Access.LABEL
    assert result.bit_accuracy >= 0.95
    assert result.recovered == ITEMS
    assert result.mae < 0.05
    assert result.bits_per_query is not None and result.bits_per_query > 0.8 * K
    assert result.clean_accuracy >= result.honest_accuracy - 0.05


def test_pixel_generator_decodes_one_image(game: Game) -> None:
    secret = choose_secret(game.train, [3], BITS)
    attack = CapacityAbuse(generator="pixel", ratio=2.0, copies=2 * COPIES)
    model, _ = train_encoded(attack, secret, RECIPE, game.train, seed=0, key=2)
    task = MemorizationTask(secret.layout, game.train.input_shape, 10, key=2)
    result = run_memorization(
        attack,
        Target(model, Access.LABEL, 10),
        task,
        secret,
        clean_accuracy=_accuracy(model, game.test),
        honest_accuracy=_accuracy(game.honest, game.test),
        candidates=game.train.features.numpy(),
    )
    assert result.queries == math.ceil(64 * BITS / K) == 86
    assert result.bit_accuracy >= 0.99
    assert result.recovered == 1
    assert result.clean_accuracy >= result.honest_accuracy - 0.05


def test_white_box_target_is_narrowed_to_labels(game: Game) -> None:
    target = Target(game.encoded, Access.WHITEBOX, game.train.num_classes)
    result = run_memorization(
        game.attack, target, game.task, game.secret, clean_accuracy=0.0, honest_accuracy=0.0
    )
    assert result.access is Access.LABEL
    assert result.queries == 171 == target.queries


def test_honest_model_decodes_at_chance(game: Game) -> None:
    result = _decode(game, game.honest)
    truth = game.secret.bits()
    constant = max(
        float(np.mean(truth == np.tile(to_bits(np.array([c]), K), 171)[: truth.size]))
        for c in range(1 << K)
    )
    assert result.bit_accuracy <= constant + 0.02
    assert 0.3 <= result.bit_accuracy <= 0.75
    assert result.recovered == 0


def test_budget_decodes_what_it_pays_for(game: Game) -> None:
    full = _decode(game, game.encoded)
    first = math.ceil(64 * BITS / K)
    partial = _decode(game, game.encoded, query_budget=first)
    assert partial.queries == first
    assert partial.decoded is not None and full.decoded is not None
    np.testing.assert_array_equal(partial.decoded[0], full.decoded[0])
    assert not partial.decoded[1].any()
    nothing = _decode(game, game.encoded, query_budget=0)
    assert nothing.queries == 0 and nothing.decoded is not None and not nothing.decoded.any()


def test_a_refusing_monitor_is_not_swallowed(game: Game) -> None:
    class RefusedError(PrivacylabError):
        pass

    def monitor(x: torch.Tensor) -> None:
        raise RefusedError("query refused")

    target = Target(game.encoded, Access.LABEL, 10).with_monitor(monitor)
    with pytest.raises(RefusedError):
        game.attack.run(target, game.task)


def test_encode_appends_labelled_copies(game: Game) -> None:
    model = RECIPE.spec(game.train).build(seed=0)
    plan = game.attack.encode(game.secret, model, game.train, key=5, private=True)
    n = len(game.train)
    assert plan.extra_rows == 171 * COPIES == len(plan.data) - n
    assert plan.model is model and plan.regularizer is None and plan.clipping is None
    torch.testing.assert_close(plan.data.features[:n], game.train.features)
    x = plan.data.features[n:].reshape(171, COPIES, -1)
    y = plan.data.labels[n:].reshape(171, COPIES)
    torch.testing.assert_close(
        x[:, 0], synthetic_inputs(5, 171, (1, 8, 8), "noise").reshape(171, -1)
    )
    assert bool((x == x[:, :1]).all()) and bool((y == y[:, :1]).all())
    assert int(y.max()) < 1 << K
    np.testing.assert_array_equal(y[:, 0].numpy(), label_chunks(game.secret.bits(), 10))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=1, max_size=200), st.integers(2, 300))
def test_label_chunks_match_a_string_rederivation(bits: list[int], classes: int) -> None:
    k = classes.bit_length() - 1
    text = "".join(map(str, bits))
    text += "0" * (-len(text) % k)
    expected = [int(text[i : i + k], 2) for i in range(0, len(text), k)]
    assert label_chunks(np.array(bits), classes).tolist() == expected


@pytest.mark.parametrize("generator", ["noise", "pixel"])
def test_generators_are_deterministic_functions_of_key_and_index(generator: str) -> None:
    shape = (1, 8, 8)
    a = synthetic_inputs(7, 300, shape, generator)
    assert a.shape == (300, 1, 8, 8) and a.dtype == torch.float32
    assert float(a.min()) >= 0 and float(a.max()) <= 1
    torch.testing.assert_close(synthetic_inputs(7, 300, shape, generator), a)
    torch.testing.assert_close(synthetic_inputs(7, 120, shape, generator), a[:120])
    differs = (a != synthetic_inputs(8, 300, shape, generator)).flatten(1).any(1)
    assert float(differs.float().mean()) >= (1.0 if generator == "noise" else 0.9)
    assert len({tuple(row) for row in a.flatten(1).tolist()}) == 300


def test_pixel_generator_structure() -> None:
    p = 64
    x = synthetic_inputs(3, synthetic_limit((1, 8, 8), "pixel"), (1, 8, 8), "pixel").flatten(1)
    assert synthetic_limit((1, 8, 8), "pixel") == p * (1 + (p - 1) // 2) == len(x)
    ones = (x > 0).sum(1)
    assert bool((ones[:p] == 1).all()) and bool((ones[p:] == 2).all())
    assert bool(((x == 0) | (x == 1)).all())
    assert sorted(x[:p].argmax(1).tolist()) == list(range(p))
    assert len({tuple(row) for row in x.tolist()}) == len(x)
    with pytest.raises(MemorizationError) as error:
        synthetic_inputs(3, len(x) + 1, (1, 8, 8), "pixel")
    assert "at most" in _one_line(error)


def test_capacity_formula_and_refusal(game: Game) -> None:
    attack = CapacityAbuse(ratio=0.5, copies=2)
    model = RECIPE.spec(game.train).build(seed=0)
    assert attack.capacity(model, 10, 1000) == (500 // 2) * 3
    assert attack.capacity(model, 2, 1000) == 250
    assert attack.capacity(model, 1, 1000) == 0
    big = choose_secret(game.train, list(range(3)), 8)
    with pytest.raises(MemorizationError) as error:
        train_encoded(attack, big, RECIPE, game.train)
    assert _one_line(error).startswith(
        "capacity: the secret needs 1536 bits but this model can hold at most 750 bits"
    )


def test_pixel_generator_limit_bounds_the_capacity() -> None:
    """On 8x8 digits the pixel generator makes 64 · 32 = 2,048 distinct inputs (6,144 bits),
    below the ratio's room at ratio 3 (9,000 bits): refused at the generator's bound, in the
    capacity refusal's one line, before any training."""
    attack = CapacityAbuse(generator="pixel", ratio=3.0)
    model = RECIPE.spec(load_dataset("digits")).build(seed=0)
    assert attack.capacity(model, 10, 1000) == 3000 * K
    limit = synthetic_limit((1, 8, 8), "pixel")
    assert limit == 2048
    attack.check_capacity(SecretLayout(24, (1, 8, 8), BITS), model, 10, 1000)
    with pytest.raises(MemorizationError) as error:
        attack.check_capacity(SecretLayout(25, (1, 8, 8), BITS), model, 10, 1000)
    assert _one_line(error) == (
        "capacity: the secret needs 6400 bits but this model can hold at most 6144 bits "
        "(the pixel generator makes 2048 distinct inputs; 24 items of 256 bits)"
    )
    CapacityAbuse(generator="noise", ratio=3.0).check_capacity(
        SecretLayout(35, (1, 8, 8), BITS), model, 10, 1000
    )


def test_tabular_rows_ride_on_two_class_labels() -> None:
    data = load_dataset("breast_cancer")
    secret = choose_secret(data, [0], None)
    model = RECIPE.spec(data).build(seed=0)
    plan = CapacityAbuse(generator="noise", ratio=2.0).encode(secret, model, data, key=1)
    assert plan.extra_rows == 30 * 32
    np.testing.assert_array_equal(plan.data.labels[len(data) :].numpy(), secret.bits())


@pytest.mark.parametrize(
    "options",
    [{"ratio": 0}, {"ratio": -1.0}, {"copies": 0}, {"generator": "gan"}, {"colour": 1}],
)
def test_bad_options_are_one_line(options: dict[str, object]) -> None:
    with pytest.raises(MemorizationError) as error:
        make_memorization("capacity", **options)
    _one_line(error)


def test_bad_key_is_one_line() -> None:
    with pytest.raises(MemorizationError) as error:
        synthetic_inputs(-1, 3, (1, 8, 8), "noise")
    assert "key" in _one_line(error)
