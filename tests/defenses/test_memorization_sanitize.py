"""Sanitisers of released weights (defenses.memorization.sanitize) against LSB encoding:
requantisation against an independent frexp-based rounding oracle and torch's own float16 /
bfloat16 casts, the |Δθ| < 2^-k |θ| bound (hypothesis), and on a tiny digits MLP carrying a
16-bit-per-weight LSB payload (H1's write_lsb / read_lsb): the default requantisation and
weight noise bring the decoder's bit accuracy to 1/2 at an accuracy cost within 1 point."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from privacylab.attacks.memorization.base import (
    choose_secret,
    load_parameter_vector,
    parameter_vector,
)
from privacylab.attacks.memorization.lsb import DEFAULT_BITS, read_lsb, write_lsb
from privacylab.attacks.memorization.training import train_honest
from privacylab.attacks.poisoning.recipe import VictimRecipe
from privacylab.data import load_dataset
from privacylab.defenses.memorization import (
    MemorizationDefenseError,
    add_weight_noise,
    requantize,
    sanitize_cost,
)


def _model_of(values: np.ndarray) -> torch.nn.Module:
    layer = torch.nn.Linear(len(values), 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(values.astype(np.float32)).reshape(1, -1))
    return layer


def _weights(model: torch.nn.Module) -> np.ndarray:
    return parameter_vector(model).numpy()


def _round_oracle(x: np.ndarray, keep: int, mode: str) -> np.ndarray:
    """Keep 1 + `keep` significant bits of the binary significand (frexp), rounding half away
    from zero ("round") or toward zero ("zero"), in float64."""
    m, e = np.frexp(x.astype(np.float64))
    scaled = np.abs(m) * 2.0 ** (keep + 1)
    kept = np.floor(scaled + 0.5) if mode == "round" else np.floor(scaled)
    return np.sign(m) * np.ldexp(kept / 2.0 ** (keep + 1), e)


@pytest.mark.parametrize("mode", ["round", "zero"])
@pytest.mark.parametrize("keep", [0, 3, 7, 10, 22])
def test_requantize_matches_the_frexp_oracle(mode: str, keep: int) -> None:
    rng = np.random.default_rng(keep)
    x = (rng.normal(size=3000) * np.exp(rng.uniform(-20, 20, 3000))).astype(np.float32)
    x[:3] = [0.0, -0.0, 1.0]
    model = _model_of(x)
    out = _weights(requantize(model, keep, fill=mode))
    np.testing.assert_array_equal(out.astype(np.float64), _round_oracle(x, keep, mode))
    np.testing.assert_array_equal(_weights(model), x)


def test_dtype_round_trips_are_torch_casts_and_the_original_is_untouched() -> None:
    x = np.random.default_rng(1).normal(0, 0.1, 500).astype(np.float32)
    model = _model_of(x)
    for name, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        out = _weights(requantize(model, dtype=name))
        np.testing.assert_array_equal(out, torch.from_numpy(x).to(dtype).float().numpy())
    np.testing.assert_array_equal(_weights(model), x)


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        64,
        elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=False).filter(lambda v: v != 0),
    ),
    st.integers(0, 23),
    st.sampled_from(["random", "round", "zero"]),
)
def test_requantize_moves_each_weight_less_than_one_kept_unit(x, keep, fill) -> None:  # type: ignore[no-untyped-def]
    out = _weights(requantize(_model_of(x), keep, fill=fill)).astype(np.float64)
    bound = 2.0 ** (-keep) * np.abs(x.astype(np.float64))
    assert np.all(np.abs(out - x) <= bound)
    assert np.all(np.sign(out) == np.sign(x))


def test_random_fill_is_seeded() -> None:
    x = np.random.default_rng(2).normal(size=200).astype(np.float32)
    a, b = (_weights(requantize(_model_of(x), 5, seed=s)) for s in (0, 0))
    c = _weights(requantize(_model_of(x), 5, seed=1))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_weight_noise_has_the_asked_spread() -> None:
    x = np.zeros(20_000, np.float32)
    model = _model_of(x)
    delta = _weights(add_weight_noise(model, 0.01, seed=3))
    np.testing.assert_array_equal(_weights(model), x)
    # sample sd of 20,000 normals: within 4 standard errors (sd / sqrt(2n))
    assert abs(delta.std() - 0.01) < 4 * 0.01 / np.sqrt(2 * 20_000)
    assert abs(delta.mean()) < 4 * 0.01 / np.sqrt(20_000)
    again = _weights(add_weight_noise(_model_of(x), 0.01, seed=3))
    np.testing.assert_array_equal(delta, again)
    y = np.random.default_rng(4).normal(0, 2.0, 20_000).astype(np.float32)
    relative = _weights(add_weight_noise(_model_of(y), 0.1, seed=3, relative=True)) - y
    assert relative.std() == pytest.approx(0.1 * y.std(), rel=0.05)


@pytest.fixture(scope="module")
def payload():  # type: ignore[no-untyped-def]
    """A tiny digits MLP with 40 training images (8-bit pixels) in the 16 low bits of its
    weights (Song et al. 2017 Sec. 4.1, H1's default bits), and its test rows."""
    data = load_dataset("digits")
    order = np.random.default_rng(0).permutation(len(data))
    train, test = data.subset(order[:1400]), data.subset(order[1400:])
    recipe = VictimRecipe(model_options={"widths": [64], "activation": "relu"}, epochs=4)
    model, _ = train_honest(recipe, train, seed=5)
    secret = choose_secret(train, np.arange(40), 8)
    bits = secret.bits()
    encoded = copy.deepcopy(model)
    load_parameter_vector(encoded, write_lsb(parameter_vector(model), bits, DEFAULT_BITS))
    return encoded, bits, test


def _decode(model: torch.nn.Module, bits: np.ndarray) -> float:
    return float(np.mean(read_lsb(parameter_vector(model), bits.size, DEFAULT_BITS) == bits))


def test_lsb_payload_reads_back_before_sanitising(payload) -> None:  # type: ignore[no-untyped-def]
    encoded, bits, _ = payload
    assert _decode(encoded, bits) == 1.0


@pytest.mark.parametrize(
    ("sanitise", "reads"),
    [
        (lambda m: requantize(m), "coin"),
        (lambda m: add_weight_noise(m, 1e-3, seed=0), "coin"),
        (lambda m: requantize(m, dtype="bfloat16"), "zeros"),
    ],
    ids=["requantize-7-random", "noise-1e-3", "bfloat16"],
)
def test_sanitisers_destroy_the_lsb_payload_at_negligible_cost(payload, sanitise, reads) -> None:  # type: ignore[no-untyped-def]
    """The seeded fills leave coin flips where the payload was (bit accuracy 1/2 within 6
    standard errors); bfloat16 leaves zeros (the decoder scores the secret's share of zero
    bits, and every decoded pixel is 0). Test accuracy moves by at most 1 point."""
    encoded, bits, test = payload
    before, mode = parameter_vector(encoded).clone(), encoded.training
    clean = sanitise(encoded)
    accuracy = _decode(clean, bits)
    cost = sanitize_cost(encoded, clean, test)
    assert set(cost) >= {"accuracy_before", "accuracy_after", "agreement"}
    assert abs(cost["accuracy_after"] - cost["accuracy_before"]) <= 0.01
    assert torch.equal(parameter_vector(encoded), before) and encoded.training == mode
    if reads == "coin":
        assert abs(accuracy - 0.5) < 6 * 0.5 / np.sqrt(bits.size)
    else:
        assert accuracy == pytest.approx(float(np.mean(bits == 0)), abs=0.01)


def test_round_fill_leaves_zeros_and_float16_leaves_the_top_bits(payload) -> None:  # type: ignore[no-untyped-def]
    """Rounding to 7 bits zeroes the 16 written bits (carries aside): the decoder reads the
    secret's share of zeros; float16 keeps 10 mantissa bits, so the top 3 of the 16 written
    bits partly survive — what `requantize`'s docstring states (b > 23 - k)."""
    encoded, bits, _ = payload
    read = read_lsb(parameter_vector(requantize(encoded, 7, fill="round")), bits.size, 16)
    assert np.mean(read == 0) > 0.99
    half = read_lsb(parameter_vector(requantize(encoded, dtype="float16")), bits.size, 16)
    top = (np.arange(bits.size) % 16) < 3
    # rounding carries and float16's subnormals below 6e-5 spoil some: above the all-zeros
    # guess by a clear margin, not exact
    assert np.mean(half[top] == bits[top]) > np.mean(bits[top] == 0) + 0.1
    assert abs(np.mean(half[~top] == bits[~top]) - np.mean(bits[~top] == 0)) < 0.05


@pytest.mark.parametrize(
    "call",
    [
        lambda m: requantize(m, 24),
        lambda m: requantize(m, 7, fill="dither"),
        lambda m: requantize(m, dtype="int8"),
        lambda m: add_weight_noise(m, -1.0),
        lambda m: add_weight_noise(m, float("nan")),
        lambda m: requantize(m.double()),
    ],
)
def test_bad_input_is_one_line(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MemorizationDefenseError) as error:
        call(_model_of(np.ones(4, np.float32)))
    assert "\n" not in str(error.value)
