"""LSB encoding (Song et al. 2017, Sec. 4.1) on a small digits MLP (64 hidden units, 4,810
parameters): the secret comes back bit-exact, the weights move by less than the float32 bound
|Δθ| < 2^(b-23)·|θ| (normal θ) and the predictions do not move at all for b <= 16 (at b = 23
the weights may move by up to 100 %, and accuracy is tested within 2 points); the decoder
reading the wrong parameters gets coin flips; a secret larger than (parameters - offset)·b
bits is refused in one line. `write_lsb`/`read_lsb` are checked against an independent
per-word re-derivation with Python integers on random float32 vectors (hypothesis)."""

from __future__ import annotations

import copy
import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import nn

from privacylab.attacks.memorization import (
    MemorizationError,
    MemorizationTask,
    choose_secret,
    load_parameter_vector,
    make_memorization,
    memorization_names,
    parameter_count,
    parameter_vector,
    run_memorization,
    train_encoded,
    train_honest,
)
from privacylab.attacks.memorization.lsb import (
    MANTISSA_BITS,
    PRIVATE_REFUSAL,
    LSBEncoding,
    read_lsb,
    write_lsb,
)
from privacylab.attacks.poisoning.recipe import VictimRecipe
from privacylab.data import load_dataset, split_train_test
from privacylab.target import Access, AccessError, Target

RECIPE = VictimRecipe(model_options={"widths": [64], "activation": "relu"}, epochs=4)
ITEMS = 20


def _one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(error.value)
    assert text and "\n" not in text
    return text


def _predict(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).argmax(1)


@pytest.fixture(scope="module")
def digits() -> dict:
    """One honestly trained small MLP on digits, the secret (20 training images, 8-bit
    pixels) and the model `train_encoded` releases with LSB at b = 8."""
    data = load_dataset("digits")
    train, test = split_train_test(data, seed=0)
    honest, _ = train_honest(RECIPE, train, seed=0)
    rows = np.random.default_rng(0).permutation(len(train))[:ITEMS]
    secret = choose_secret(train, rows, 8)
    released, _ = train_encoded(LSBEncoding(bits=8), secret, RECIPE, train, seed=0)
    return {
        "train": train,
        "test": test,
        "honest": honest,
        "secret": secret,
        "released": released,
    }


def _release(honest: nn.Module, attack: LSBEncoding, secret, train) -> nn.Module:
    plan = attack.encode(secret, copy.deepcopy(honest), train)
    return plan.release(plan.model).eval()


def _decode(attack: LSBEncoding, model: nn.Module, secret, train, honest_accuracy: float = 0.0):
    target = Target(model, Access.WHITEBOX, train.num_classes)
    task = MemorizationTask(secret.layout, tuple(train.input_shape), train.num_classes)
    return run_memorization(
        attack,
        target,
        task,
        secret,
        clean_accuracy=0.0,
        honest_accuracy=honest_accuracy,
        candidates=train.features.numpy(),
    )


def test_registered_whitebox_and_not_private() -> None:
    assert "lsb" in memorization_names()
    attack = make_memorization("lsb", bits=4)
    assert isinstance(attack, LSBEncoding)
    assert attack.threat_model.access is Access.WHITEBOX
    assert attack.threat_model.side_information == ()
    assert LSBEncoding.private_ok is False
    assert json.loads(json.dumps(attack.to_dict())) == {"name": "lsb", "bits": 4, "offset": 0}


def test_train_encoded_is_honest_training_plus_low_bits(digits: dict) -> None:
    """The released model is the honest model of the same seed with only the low 8 bits of the
    first ceil(total/8) parameters changed, and those bits are the secret's."""
    secret, honest, released = digits["secret"], digits["honest"], digits["released"]
    before = parameter_vector(honest).numpy().view(np.uint32)
    after = parameter_vector(released).numpy().view(np.uint32)
    used = -(-secret.layout.total_bits // 8)
    assert np.array_equal(before[used:], after[used:])
    assert np.array_equal(before[:used] >> 8, after[:used] >> 8)
    low = (after[:used] & 0xFF).astype(np.uint64)
    expected = secret.values.reshape(-1)
    assert np.array_equal(low[: expected.size], expected)
    assert np.array_equal(
        _predict(honest, digits["test"].features), _predict(released, digits["test"].features)
    )


def test_exact_recovery_from_released_model(digits: dict) -> None:
    result = _decode(LSBEncoding(bits=8), digits["released"], digits["secret"], digits["train"])
    assert result.bit_accuracy == 1.0
    assert result.exact_match == 1.0
    assert result.recovered == ITEMS
    assert result.queries == 0
    assert result.recovered_bits == digits["secret"].layout.total_bits
    assert result.bits_per_parameter == pytest.approx(
        digits["secret"].layout.total_bits / parameter_count(digits["released"])
    )
    assert np.array_equal(result.decoded, digits["secret"].data())


@pytest.mark.parametrize("bits", [1, 8, 16, 23])
def test_weight_change_bound_and_accuracy(digits: dict, bits: int) -> None:
    """|Δθ| < 2^(b-23)·|θ| for every normal weight; predictions unchanged for b <= 16; test
    accuracy within 2 points at b = 23 (the whole low mantissa replaced)."""
    train, test, honest = digits["train"], digits["test"], digits["honest"]
    items = min(ITEMS, parameter_count(honest) * bits // (64 * 8))
    secret = choose_secret(train, np.arange(items), 8)
    attack = LSBEncoding(bits=bits)
    released = _release(honest, attack, secret, train)
    result = _decode(attack, released, secret, train)
    assert result.bit_accuracy == 1.0 and result.exact_match == 1.0
    w0 = parameter_vector(honest).double()
    w1 = parameter_vector(released).double()
    normal = w0.abs() >= torch.finfo(torch.float32).tiny
    assert torch.all((w1 - w0).abs()[normal] < 2.0 ** (bits - MANTISSA_BITS) * w0.abs()[normal])
    assert torch.all(torch.sign(w1[normal]) == torch.sign(w0[normal]))
    p0, p1 = _predict(honest, test.features), _predict(released, test.features)
    if bits <= 16:
        assert torch.equal(p0, p1)
    else:
        a0 = (p0 == test.labels).float().mean().item()
        a1 = (p1 == test.labels).float().mean().item()
        assert abs(a1 - a0) <= 0.02


def test_wrong_offset_reads_coin_flips(digits: dict) -> None:
    """A decoder reading parameters the encoder did not write (offset past the written region)
    reads the honest weights' low bits: bit accuracy within 0.03 of 1/2 (stream of 10,240 bits:
    7 standard deviations), no item exact."""
    secret, train = digits["secret"], digits["train"]
    used = -(-secret.layout.total_bits // 8)
    result = _decode(LSBEncoding(bits=8, offset=used), digits["released"], secret, train)
    assert abs(result.bit_accuracy - 0.5) < 0.03
    assert result.exact_match == 0.0


def test_offset_round_trip_and_capacity(digits: dict) -> None:
    train, honest = digits["train"], digits["honest"]
    params = parameter_count(honest)
    offset = params - 600
    attack = LSBEncoding(bits=16, offset=offset)
    assert attack.capacity(honest, 10, len(train)) == 600 * 16
    secret = choose_secret(train, np.arange(18), 8)
    released = _release(honest, attack, secret, train)
    before = parameter_vector(honest).numpy().view(np.uint32)
    after = parameter_vector(released).numpy().view(np.uint32)
    assert np.array_equal(before[:offset], after[:offset])
    assert _decode(attack, released, secret, train).exact_match == 1.0
    assert LSBEncoding(bits=3).capacity(honest, 10, len(train)) == 3 * params
    assert LSBEncoding(offset=params + 5).capacity(honest, 10, len(train)) == 0


def test_capacity_refusal_is_one_line(digits: dict) -> None:
    train = digits["train"]
    params = parameter_count(digits["honest"])
    secret = choose_secret(train, np.arange(10), 8)
    with pytest.raises(MemorizationError) as error:
        train_encoded(LSBEncoding(bits=1), secret, RECIPE, train, seed=0)
    line = _one_line(error)
    assert line.startswith("lsb: the secret needs 5120 bits")
    assert f"at most {params} bits" in line


def test_tabular_rows_exact() -> None:
    """breast_cancer rows (30 float32 features, 960 bits each) come back bit-exact."""
    data = load_dataset("breast_cancer")
    train, _ = split_train_test(data, seed=0)
    recipe = VictimRecipe(model_options={"widths": [16]}, epochs=2)
    secret = choose_secret(train, np.arange(0, 20, 2), None)
    assert secret.layout.kind == "tabular" and secret.layout.value_bits == 32
    attack = LSBEncoding(bits=20)
    released, _ = train_encoded(attack, secret, recipe, train, seed=1)
    result = _decode(attack, released, secret, train)
    assert result.exact_match == 1.0 and result.bit_accuracy == 1.0
    assert result.psnr is None
    decoded = result.decoded.astype(np.float32)
    original = train.features[torch.as_tensor(secret.rows)].numpy()
    assert np.array_equal(decoded.view(np.uint32), original.view(np.uint32))


def test_needs_whitebox(digits: dict) -> None:
    secret, train = digits["secret"], digits["train"]
    target = Target(digits["released"], Access.LABEL, 10)
    task = MemorizationTask(secret.layout, tuple(train.input_shape), 10)
    with pytest.raises(AccessError):
        run_memorization(
            LSBEncoding(bits=8), target, task, secret, clean_accuracy=0, honest_accuracy=0
        )


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"bits": 0}, "bits must be a whole number >= 1"),
        ({"bits": 24}, "bits must be a whole number in [1, 23]"),
        ({"bits": True}, "bits must be a whole number"),
        ({"bits": 2.0}, "bits must be a whole number"),
        ({"offset": -1}, "offset must be a whole number >= 0"),
    ],
)
def test_bad_options_one_line(options: dict, fragment: str) -> None:
    with pytest.raises(MemorizationError) as error:
        LSBEncoding(**options)
    assert fragment in _one_line(error)


def test_refusals_one_line(digits: dict) -> None:
    secret, train = digits["secret"], digits["train"]
    model = copy.deepcopy(digits["honest"])
    with pytest.raises(MemorizationError) as error:
        LSBEncoding().encode(secret, model, train, private=True)
    assert _one_line(error) == PRIVATE_REFUSAL
    with pytest.raises(MemorizationError) as error:
        LSBEncoding().capacity(model.double(), 10, len(train))
    assert "float32" in _one_line(error)
    with pytest.raises(MemorizationError) as error:
        write_lsb(np.zeros(4, np.float64), [1, 0], 1)
    assert "float32" in _one_line(error)
    with pytest.raises(MemorizationError) as error:
        write_lsb(np.zeros(4, np.float32), np.ones(9, np.uint8), 2)
    assert "need 5 parameters" in _one_line(error)
    with pytest.raises(MemorizationError) as error:
        read_lsb(np.zeros(4, np.float32), 9, 2, offset=1)
    assert "only 3 are there" in _one_line(error)


def test_float64_target_copy_decodes(digits: dict) -> None:
    """A target answering in float64 holds an exact float64 copy: the low bits survive."""
    secret, train = digits["secret"], digits["train"]
    target = Target(digits["released"], Access.WHITEBOX, 10, precision="float64")
    task = MemorizationTask(secret.layout, tuple(train.input_shape), 10)
    result = run_memorization(
        LSBEncoding(bits=8), target, task, secret, clean_accuracy=0, honest_accuracy=0
    )
    assert result.exact_match == 1.0


def _oracle_word(value: float, chunk: list[int], bits: int) -> int:
    word = struct.unpack("<I", struct.pack("<f", value))[0]
    low = int("".join(map(str, chunk)), 2) if chunk else 0
    return (word >> bits << bits) | low


@given(
    vector=arrays(
        np.float32,
        st.integers(1, 40),
        elements=st.floats(width=32, allow_nan=False, allow_infinity=False),
    ),
    bits=st.integers(1, MANTISSA_BITS),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_write_read_round_trip(vector: np.ndarray, bits: int, seed: int, data) -> None:
    """read(write(s)) == s; each written word equals a re-derivation with Python integers
    (high 32-b bits kept, low b bits = the next chunk, zero-padded at the end); the other
    words are untouched; normal values move by less than 2^(b-23)·|θ|."""
    offset = data.draw(st.integers(0, vector.size - 1))
    length = data.draw(st.integers(0, (vector.size - offset) * bits))
    stream = np.random.default_rng(seed).integers(0, 2, length, dtype=np.uint8)
    written = write_lsb(vector, stream, bits, offset).numpy()
    assert np.array_equal(read_lsb(written, length, bits, offset), stream)
    before, after = vector.view(np.uint32), written.view(np.uint32)
    slots = -(-length // bits)
    padded = np.zeros(slots * bits, np.uint8)
    padded[:length] = stream
    for k in range(slots):
        chunk = padded[k * bits : (k + 1) * bits].tolist()
        assert int(after[offset + k]) == _oracle_word(float(vector[offset + k]), chunk, bits)
    untouched = np.ones(vector.size, bool)
    untouched[offset : offset + slots] = False
    assert np.array_equal(before[untouched], after[untouched])
    v0, v1 = vector.astype(np.float64), written.astype(np.float64)
    normal = np.abs(v0) >= np.finfo(np.float32).tiny
    assert np.all(np.abs(v1 - v0)[normal] < 2.0 ** (bits - MANTISSA_BITS) * np.abs(v0)[normal])
    assert np.all(np.isfinite(v1))


@given(bits=st.integers(1, MANTISSA_BITS), seed=st.integers(0, 2**32 - 1))
def test_model_round_trip(bits: int, seed: int) -> None:
    """Through a module's parameters: load_parameter_vector keeps the written bits."""
    model = nn.Linear(5, 3)
    stream = np.random.default_rng(seed).integers(0, 2, 18 * bits, dtype=np.uint8)
    load_parameter_vector(model, write_lsb(parameter_vector(model), stream, bits))
    assert np.array_equal(read_lsb(parameter_vector(model), stream.size, bits), stream)
