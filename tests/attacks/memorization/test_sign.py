"""Sign encoding (Song et al. 2017, Sec. 4.3) on a small digits MLP and a tabular model: the
signs of the encoded parameters are the secret's bits, an honest model's are coin flips, and
the penalty matches its formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.attacks.memorization import (
    MemorizationError,
    MemorizationTask,
    choose_secret,
    make_memorization,
    parameter_count,
    parameter_vector,
    run_memorization,
    train_encoded,
    train_honest,
)
from privacylab.attacks.memorization._penalty import sign_terms
from privacylab.attacks.memorization.sign import SignEncoding
from privacylab.attacks.poisoning.recipe import VictimRecipe
from privacylab.data import load_dataset
from privacylab.target import Access, Target

RECIPE = VictimRecipe(model_options={"widths": [64]}, epochs=8)


def _accuracy(model: torch.nn.Module, data) -> float:
    with torch.no_grad():
        return float((model(data.features).argmax(1) == data.labels).float().mean())


@pytest.fixture(scope="module")
def setting():
    torch.set_num_threads(1)
    data = load_dataset("digits")
    order = np.random.default_rng(0).permutation(len(data))
    train, test = data.subset(order[:1200]), data.subset(order[1200:])
    honest, _ = train_honest(RECIPE, train)
    secret = choose_secret(train, np.arange(15), 4)
    encoded, _ = train_encoded(SignEncoding(), secret, RECIPE, train)
    return {"train": train, "test": test, "honest": honest, "secret": secret, "encoded": encoded}


def _decode(setting, model, secret=None, attack=None, train=None):
    secret = secret or setting["secret"]
    train = train or setting["train"]
    task = MemorizationTask(secret.layout, tuple(train.input_shape), train.num_classes)
    levels = (1 << secret.layout.value_bits) - 1
    candidates = None
    if secret.layout.kind == "image":
        candidates = np.rint(train.features.numpy().astype(np.float64) * levels) / levels
    return run_memorization(
        attack or SignEncoding(),
        Target(model, Access.WHITEBOX, train.num_classes),
        task,
        secret,
        clean_accuracy=0.0,
        honest_accuracy=0.0,
        candidates=candidates,
    )


def test_default_strength_writes_the_bits(setting):
    result = _decode(setting, setting["encoded"])
    assert result.bit_accuracy > 0.95
    assert result.recovered >= 0.8 * result.items
    assert result.bits_per_parameter > 0
    theta = parameter_vector(setting["encoded"])[: setting["secret"].layout.total_bits].numpy()
    truth = setting["secret"].bits()
    assert np.mean((theta > 0) == (truth == 1)) == pytest.approx(result.bit_accuracy)
    assert _accuracy(setting["encoded"], setting["test"]) >= (
        _accuracy(setting["honest"], setting["test"]) - 0.03
    )


def test_honest_signs_are_coin_flips(setting):
    """3,840 bits: a coin's share is 0.5 ± 0.008 (one standard deviation)."""
    result = _decode(setting, setting["honest"])
    assert abs(result.bit_accuracy - 0.5) < 0.04
    assert result.recovered == 0


def test_tabular_rows_through_signs():
    """Two breast-cancer rows (float32, 960 bits each) in the signs of a 30-64-2 MLP (40
    epochs: 569 rows are 9 steps an epoch)."""
    data = load_dataset("breast_cancer")
    recipe = VictimRecipe(model_options={"widths": [64]}, epochs=40)
    secret = choose_secret(data, [3, 7])
    model, _ = train_encoded(SignEncoding(), secret, recipe, data)
    result = _decode({}, model, secret=secret, train=data)
    assert result.bit_accuracy > 0.97
    assert result.psnr is None


@settings(max_examples=40)
@given(st.integers(0, 2**31 - 1), st.integers(1, 50))
def test_sign_term_formula(seed, width):
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(3, width))
    s = rng.choice([-1.0, 1.0], size=(3, width))
    expected = np.abs(np.minimum(0.0, theta * s)).sum(1) / width
    got = sign_terms(torch.tensor(theta), torch.tensor(s)).numpy()
    assert np.allclose(got, expected, atol=1e-12)
    matched = np.abs(theta) * s
    assert np.all(sign_terms(torch.tensor(matched), torch.tensor(s)).numpy() == 0)


def test_capacity_and_refusals(setting):
    model = setting["honest"]
    n = parameter_count(model)
    attack = SignEncoding(offset=100)
    assert attack.capacity(model, 10, 1200) == n - 100
    too_many = choose_secret(setting["train"], np.arange((n - 100) // 256 + 1), 4)
    with pytest.raises(MemorizationError) as error:
        attack.check_capacity(too_many.layout, model, 10, 1200)
    assert f"at most {n - 100} bits" in str(error.value) and "\n" not in str(error.value)
    short = SignEncoding(offset=n - 10)
    with pytest.raises(MemorizationError, match="no parameters"):
        _decode(setting, model, attack=short)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"strength": -1}, "strength"),
        ({"strength": True}, "strength"),
        ({"offset": -3}, "offset"),
        ({"blocks": "item"}, "sign"),
    ],
)
def test_bad_options_are_one_line(options, needle):
    with pytest.raises(MemorizationError) as error:
        make_memorization("sign", **options)
    assert needle in str(error.value) and "\n" not in str(error.value)
