"""Correlated value encoding (Song et al. 2017, Sec. 4.2) on a small digits MLP: the encoded
model decodes recognisable images, an honest one does not, the accuracy cost grows with λ_c,
and the correlation term and the decoder match independent computations."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.attacks.memorization import (
    MemorizationError,
    MemorizationTask,
    choose_secret,
    make_memorization,
    parameter_count,
    run_memorization,
    train_encoded,
    train_honest,
)
from privacylab.attacks.memorization._penalty import correlation_terms
from privacylab.attacks.memorization.correlation import CorrelatedValueEncoding, decode_blocks
from privacylab.attacks.poisoning.recipe import VictimRecipe
from privacylab.data import load_dataset
from privacylab.target import Access, Target

RECIPE = VictimRecipe(model_options={"widths": [64]}, epochs=8)
OFFSET = 128
"""The decode test's secret starts at parameter 128 (the third hidden unit's weights)."""


def _accuracy(model: torch.nn.Module, data) -> float:
    with torch.no_grad():
        return float((model(data.features).argmax(1) == data.labels).float().mean())


def _quantised(data, levels: int) -> np.ndarray:
    """The training rows quantised as the secret is (the candidates an item must be told
    apart from: its own row is then exactly its original)."""
    return np.rint(data.features.numpy().astype(np.float64) * levels) / levels


def _mean_abs_corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(
        np.mean([abs(np.corrcoef(x.ravel(), y.ravel())[0, 1]) for x, y in zip(a, b, strict=True)])
    )


@pytest.fixture(scope="module")
def setting():
    torch.set_num_threads(1)
    data = load_dataset("digits")
    order = np.random.default_rng(0).permutation(len(data))
    train, test = data.subset(order[:1200]), data.subset(order[1200:])
    honest, _ = train_honest(RECIPE, train)
    secret = choose_secret(train, np.arange(20), 8)
    attack = CorrelatedValueEncoding(offset=OFFSET)
    encoded, _ = train_encoded(attack, secret, RECIPE, train)
    # Song et al.'s own loss: one correlation over the whole secret, in absolute value
    song_attack = CorrelatedValueEncoding(offset=OFFSET, blocks="global", signed=False)
    song, _ = train_encoded(song_attack, secret, RECIPE, train)
    # 72 images fill the 64 first-layer rows and spill into the biases and the output layer
    costly = choose_secret(train, np.arange(72), 8)
    weak, _ = train_encoded(CorrelatedValueEncoding(strength=1.0), costly, RECIPE, train)
    strong, _ = train_encoded(CorrelatedValueEncoding(strength=300.0), costly, RECIPE, train)
    return {
        "train": train,
        "test": test,
        "honest": honest,
        "secret": secret,
        "attack": attack,
        "encoded": encoded,
        "song": (song_attack, song),
        "accuracy": {
            name: _accuracy(model, test)
            for name, model in [("honest", honest), ("weak", weak), ("strong", strong)]
        },
    }


def _decode(setting, model, attack=None):
    secret = setting["secret"]
    task = MemorizationTask(secret.layout, tuple(setting["train"].input_shape), 10)
    return run_memorization(
        attack or setting["attack"],
        Target(model, Access.WHITEBOX, 10),
        task,
        secret,
        clean_accuracy=_accuracy(model, setting["test"]),
        honest_accuracy=setting["accuracy"]["honest"],
        candidates=_quantised(setting["train"], secret.layout.levels),
    )


def test_encoded_model_decodes_recognisable_images(setting):
    result = _decode(setting, setting["encoded"])
    assert _mean_abs_corr(result.decoded, result.original) > 0.8
    assert result.recovered >= 0.8 * result.items
    assert result.psnr > 15
    assert result.clean_accuracy >= setting["accuracy"]["honest"] - 0.03


def test_song_global_absolute_correlation_decodes_too(setting):
    """blocks='global', signed=False (C = -λ_c |corr| over the whole secret, Song's Sec. 4.2):
    the per-item min-max decoding, oriented by the dark-background prior, recovers the items."""
    attack, model = setting["song"]
    result = _decode(setting, model, attack)
    assert _mean_abs_corr(result.decoded, result.original) > 0.8
    assert result.recovered >= 0.8 * result.items


def test_honest_model_holds_no_images(setting):
    result = _decode(setting, setting["honest"])
    assert _mean_abs_corr(result.decoded, result.original) < 0.35
    assert result.recovered <= 1
    assert abs(result.bit_accuracy - 0.5) < 0.05


def test_decoder_at_the_wrong_offset_fails(setting):
    """Read two items early, each block holds another digit: none is recognised."""
    result = _decode(setting, setting["encoded"], CorrelatedValueEncoding(offset=0))
    assert result.recovered <= 1


def test_accuracy_cost_grows_with_strength(setting):
    """Tolerance: the weak encoding stays within 3 points of the honest model; λ_c = 300 on a
    secret that reaches the output layer costs at least 10 points more than λ_c = 1."""
    acc = setting["accuracy"]
    assert acc["weak"] >= acc["honest"] - 0.03
    assert acc["strong"] <= acc["weak"] - 0.10


@settings(max_examples=40)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=3, max_size=40),
    st.integers(0, 2**31 - 1),
)
def test_correlation_term_is_minus_pearson(values, seed):
    theta = np.asarray(values)
    s = np.random.default_rng(seed).normal(size=theta.size)
    if np.ptp(theta) < 1e-3:
        return
    expected = scipy.stats.pearsonr(theta, s)[0]
    t, v = torch.tensor(theta[None]), torch.tensor(s[None])
    assert float(correlation_terms(t, v)[0]) == pytest.approx(-expected, abs=1e-9)
    assert float(correlation_terms(t, v, absolute=True)[0]) == pytest.approx(
        -abs(expected), abs=1e-9
    )


@settings(max_examples=40)
@given(
    st.integers(0, 2**31 - 1),
    st.floats(0.01, 100.0),
    st.floats(-10.0, 10.0),
    st.integers(1, 8),
)
def test_min_max_decoding_inverts_any_increasing_affine_map(seed, scale, shift, bits):
    """Rows holding both 0 and 2^b - 1 (black background, a white stroke) are recovered exactly
    from a·s + b, a > 0, whatever a and b; unoriented, also from a < 0 when the background
    (the median) is dark."""
    levels = (1 << bits) - 1
    rng = np.random.default_rng(seed)
    rows = np.zeros((5, 30), dtype=np.int64)
    rows[:, :8] = rng.integers(0, levels + 1, size=(5, 8))
    rows[:, 0], rows[:, 1] = 0, levels
    assert np.array_equal(decode_blocks(scale * rows + shift, levels), rows)
    assert np.array_equal(decode_blocks(-scale * rows + shift, levels, oriented=False), rows)


def test_capacity_and_refusals(setting):
    model = setting["honest"]
    n = parameter_count(model)
    attack = CorrelatedValueEncoding(offset=10)
    assert attack.capacity(model, 10, 1200) == (n - 10) * 8
    train = setting["train"]
    too_many = choose_secret(train, np.arange(n // 64 + 1), 8)
    with pytest.raises(MemorizationError) as error:
        attack.check_capacity(too_many.layout, model, 10, 1200)
    message = str(error.value)
    assert "\n" not in message and f"at most {(n - 10) * 8} bits" in message
    four_bit = choose_secret(train, np.arange(3), 4)
    attack.check_capacity(four_bit.layout, model, 10, 1200)
    tabular = choose_secret(load_dataset("breast_cancer"), [0])
    with pytest.raises(MemorizationError, match="image pixels"):
        attack.check_capacity(tabular.layout, model, 2, 400)
    with pytest.raises(MemorizationError, match="blocks='item'"):
        CorrelatedValueEncoding(blocks="global").encode(
            setting["secret"], RECIPE.spec(train).build(seed=0), train, private=True
        )


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"strength": 0}, "strength"),
        ({"strength": float("nan")}, "strength"),
        ({"blocks": "rows"}, "blocks"),
        ({"signed": "yes"}, "signed"),
        ({"offset": -1}, "offset"),
        ({"offset": 1.5}, "offset"),
        ({"lambda": 1}, "correlation"),
    ],
)
def test_bad_options_are_one_line(options, needle):
    with pytest.raises(MemorizationError) as error:
        make_memorization("correlation", **options)
    assert needle in str(error.value) and "\n" not in str(error.value)
