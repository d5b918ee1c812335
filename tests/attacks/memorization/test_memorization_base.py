"""The memorization family's core (Song, Ristenpart & Shmatikov, CCS 2017, Sec. 3):
secret layouts and their validation, choosing a secret from training rows (images quantised
within half a level, tabular rows bit-exact), the runner that shows the decoder only the
public layout and attaches the truth afterwards (checked with fake decoders and closed-form
metrics), the binary-symmetric-channel information count, the "recognised" rule against a
brute-force oracle, the registry, the one parameter order — and one contract test run over
every registered attack (after scikit-learn's `parametrize_with_checks`)."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction
from typing import ClassVar

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.memorization import (
    Decoded,
    MaliciousTraining,
    MemorizationAttack,
    MemorizationError,
    MemorizationTask,
    Secret,
    SecretLayout,
    channel_bits,
    choose_secret,
    load_parameter_vector,
    make_memorization,
    memorization_class,
    memorization_names,
    parameter_count,
    parameter_vector,
    run_memorization,
)
from privacylab.attacks.memorization.base import _recognised
from privacylab.data import Dataset, load_dataset
from privacylab.errors import PrivacylabError
from privacylab.models.errors import ModelError
from privacylab.target import Access, AccessError, Target


def _one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(error.value)
    assert text and "\n" not in text
    assert isinstance(error.value, PrivacylabError)
    return text


def _tiny_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def digits_small() -> Dataset:
    return load_dataset("digits").subset(np.arange(300))


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return digits_small()


# --- SecretLayout / Secret -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((0, (1, 8, 8), 8, "image"), "items must be a whole number >= 1"),
        ((2, (1, 8, 8), 0, "image"), "value_bits must be a whole number >= 1"),
        ((2, (1, 8, 8), 17, "image"), "image pixels take 1..16 bits"),
        ((2, (30,), 8, "tabular"), "value_bits must be 32"),
        ((2, (30,), 32, "text"), "secret kind must be one of image, tabular"),
        ((2, (), 8, "image"), "secret item shape must be positive"),
        ((2, (0, 3), 8, "image"), "secret item shape must be positive"),
        ((True, (1, 8, 8), 8, "image"), "items must be a whole number"),
    ],
)
def test_layout_validation_one_line(args: tuple, fragment: str) -> None:
    with pytest.raises(MemorizationError) as error:
        SecretLayout(*args)
    assert fragment in _one_line(error)


def test_layout_sizes_and_round_trip() -> None:
    layout = SecretLayout(3, [1, 8, 8], 5)
    assert layout.item_shape == (1, 8, 8)
    assert layout.values_per_item == 64
    assert layout.bits_per_item == 64 * 5
    assert layout.total_bits == 3 * 64 * 5
    assert layout.levels == 31
    assert SecretLayout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    with pytest.raises(MemorizationError) as error:
        layout.bits_to_values(np.zeros(layout.total_bits - 1, np.uint8))
    assert "959 bits but the secret has 960" in _one_line(error)


def test_secret_values_shape_and_bit_order() -> None:
    layout = SecretLayout(2, (3,), 4)
    with pytest.raises(MemorizationError) as error:
        Secret(layout, np.zeros((3, 2)), np.arange(2))
    assert "shape (2, 3)" in _one_line(error)
    values = np.array([[1, 2, 15], [8, 0, 5]])
    secret = Secret(layout, values, [4, 7])
    expected = "".join(format(int(v), "04b") for v in values.ravel())
    assert "".join(map(str, secret.bits())) == expected
    assert np.array_equal(layout.bits_to_values(secret.bits()), values)
    assert secret.rows.dtype == np.int64


@pytest.mark.parametrize("bits", [1, 3, 8])
def test_choose_secret_images_within_half_a_level(digits: Dataset, bits: int) -> None:
    rows = np.array([5, 0, 17, 299])
    secret = choose_secret(digits, rows, bits)
    assert secret.layout == SecretLayout(4, (1, 8, 8), bits, "image")
    assert np.array_equal(secret.rows, rows)
    pixels = digits.features[torch.as_tensor(rows)].numpy().astype(np.float64)
    levels = (1 << bits) - 1
    assert np.max(np.abs(secret.data() - pixels)) <= 1 / (2 * levels) + 1e-9
    assert secret.values.max() <= levels


def test_choose_secret_default_is_eight_bits(digits: Dataset) -> None:
    secret = choose_secret(digits, [1, 2])
    assert secret.layout.value_bits == 8
    pixels = digits.features[:3][1:].numpy()
    assert np.max(np.abs(secret.data() - pixels)) <= 1 / (2 * 255) + 1e-9


def test_choose_secret_tabular_exact() -> None:
    data = load_dataset("breast_cancer")
    secret = choose_secret(data, [3, 100, 568])
    assert secret.layout == SecretLayout(3, (30,), 32, "tabular")
    original = data.features[torch.tensor([3, 100, 568])].numpy()
    assert np.array_equal(
        secret.data().astype(np.float32).view(np.uint32), original.view(np.uint32)
    )
    assert np.array_equal(secret.values, original.view(np.uint32).astype(np.uint64))


def test_choose_secret_refusals(digits: Dataset) -> None:
    with pytest.raises(MemorizationError) as error:
        choose_secret(digits, [])
    assert "at least one training row" in _one_line(error)
    with pytest.raises(MemorizationError) as error:
        choose_secret(digits, [0, 300])
    assert "[0, 300)" in _one_line(error)
    with pytest.raises(MemorizationError) as error:
        choose_secret(load_dataset("breast_cancer"), [0], 8)
    assert "value_bits must be 32" in _one_line(error)
    bright = dataclasses.replace(digits, features=digits.features * 2)
    with pytest.raises(MemorizationError) as error:
        choose_secret(bright, [0, 1])
    assert "pixels in [0, 1]" in _one_line(error)


# --- the runner: the decoder sees only the layout --------------------------------------------


class _Recorder(MemorizationAttack):
    """A decoder that records what it is given and decodes all zeros."""

    name: ClassVar[str] = "recorder"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.WHITEBOX, ())

    def __init__(self) -> None:
        self._seen: list[tuple[Access, MemorizationTask]] = []

    def capacity(self, model: nn.Module, num_classes: int, train_rows: int) -> int:
        return parameter_count(model)

    def encode(self, secret, model, data, *, key=0, private=False) -> MaliciousTraining:
        return MaliciousTraining(model, data)

    def run(self, target: Target, task: MemorizationTask) -> Decoded:
        self._seen.append((target.access, task))
        layout = task.layout
        return Decoded(np.zeros((layout.items, layout.values_per_item), np.uint64))


class _Oracle(MemorizationAttack):
    """A label-access 'decoder' handed the answer in its constructor (to test the metrics):
    queries `queries` inputs, flips the low bit of the first `flips` values."""

    name: ClassVar[str] = "oracle"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.LABEL, ())

    def __init__(self, values: np.ndarray, queries: int, flips: int = 0) -> None:
        self._values = values
        self._queries = queries
        self._flips = flips

    def capacity(self, model: nn.Module, num_classes: int, train_rows: int) -> int:
        return 10**9

    def encode(self, secret, model, data, *, key=0, private=False) -> MaliciousTraining:
        return MaliciousTraining(model, data)

    def run(self, target: Target, task: MemorizationTask) -> Decoded:
        target.labels(torch.zeros(self._queries, *task.input_shape))
        values = self._values.copy().reshape(-1)
        values[: self._flips] ^= np.uint64(1)
        return Decoded(values.reshape(self._values.shape))


def _task(secret: Secret) -> MemorizationTask:
    return MemorizationTask(secret.layout, (1, 8, 8), 10, key=3)


def test_decoder_sees_only_the_public_task(digits: Dataset) -> None:
    secret_a = choose_secret(digits, [0, 1, 2], 4)
    secret_b = choose_secret(digits, [10, 20, 30], 4)
    attack = _Recorder()
    target = Target(_tiny_mlp(), Access.WHITEBOX, 10)
    results = [
        run_memorization(attack, target, _task(s), s, clean_accuracy=0.9, honest_accuracy=0.91)
        for s in (secret_a, secret_b)
    ]
    (access_a, task_a), (access_b, task_b) = attack._seen
    assert access_a is access_b is Access.WHITEBOX
    assert {f.name for f in dataclasses.fields(task_a)} == {
        "layout",
        "input_shape",
        "num_classes",
        "key",
    }
    assert task_a == task_b
    for secret, result in zip((secret_a, secret_b), results, strict=True):
        zeros = 1.0 - secret.bits().mean()
        assert result.bit_accuracy == pytest.approx(zeros)
        assert result.exact_match == float(np.mean(np.all(secret.values == 0, axis=1)))
        assert np.array_equal(result.original, secret.data())
        assert result.queries == 0
        assert result.parameters == parameter_count(_tiny_mlp())
        assert result.bits_per_query is None
        assert result.recovered_bits == pytest.approx(channel_bits(secret.layout.total_bits, zeros))
        assert result.clean_accuracy == 0.9 and result.honest_accuracy == 0.91
        assert json.loads(json.dumps(result.to_dict()))["method"] == "recorder"


def test_metrics_closed_forms_at_label_access(digits: Dataset) -> None:
    secret = choose_secret(digits, [3, 4, 5, 6], 8)
    target = Target(_tiny_mlp(), Access.LABEL, 10)
    exact = run_memorization(
        _Oracle(secret.values, 37),
        target,
        _task(secret),
        secret,
        clean_accuracy=0.5,
        honest_accuracy=0.5,
        candidates=digits.features.numpy(),
    )
    total = secret.layout.total_bits
    assert exact.bit_accuracy == 1.0 and exact.exact_match == 1.0
    assert exact.recovered == 4 and exact.mae == 0.0 and exact.psnr == 100.0
    assert exact.queries == 37 and exact.parameters == 0
    assert exact.bits_per_query == pytest.approx(total / 37)
    assert exact.bits_per_parameter is None
    assert exact.access is Access.LABEL
    flipped = run_memorization(
        _Oracle(secret.values, 5, flips=10),
        target,
        _task(secret),
        secret,
        clean_accuracy=0.5,
        honest_accuracy=0.5,
    )
    assert flipped.bit_accuracy == pytest.approx(1 - 10 / total)
    assert flipped.exact_match == 0.75
    assert flipped.mae == pytest.approx(10 / 255 / (4 * 64))
    assert flipped.recovered == 3


def test_runner_refusals(digits: Dataset) -> None:
    secret = choose_secret(digits, [0, 1], 8)
    other = choose_secret(digits, [0, 1], 4)
    target = Target(_tiny_mlp(), Access.WHITEBOX, 10)
    with pytest.raises(MemorizationError) as error:
        run_memorization(
            _Recorder(), target, _task(other), secret, clean_accuracy=0, honest_accuracy=0
        )
    assert "layout is not the secret's" in _one_line(error)
    with pytest.raises(MemorizationError) as error:
        run_memorization(
            _Oracle(secret.values[:1], 1),
            target,
            _task(secret),
            secret,
            clean_accuracy=0,
            honest_accuracy=0,
        )
    assert "decoded values of shape (1, 64)" in _one_line(error)
    with pytest.raises(AccessError):
        run_memorization(
            _Recorder(),
            Target(_tiny_mlp(), Access.LOGITS, 10),
            _task(secret),
            secret,
            clean_accuracy=0,
            honest_accuracy=0,
        )


# --- channel_bits and _recognised ------------------------------------------------------------


def test_channel_bits_closed_forms() -> None:
    assert channel_bits(1000, 1.0) == 1000.0
    assert channel_bits(1000, 0.0) == 1000.0
    assert channel_bits(1000, 0.5) == pytest.approx(0.0, abs=1e-12)
    assert channel_bits(1000, 1.7) == 1000.0
    for accuracy in (0.51, 0.6, 0.75, 0.9, 0.999):
        h = scipy.stats.entropy([accuracy, 1 - accuracy], base=2)
        assert channel_bits(640, accuracy) == pytest.approx(640 * (1 - h), rel=1e-12)
        assert channel_bits(640, accuracy) == pytest.approx(channel_bits(640, 1 - accuracy))


@given(st.floats(0.5, 1.0), st.floats(0.5, 1.0))
def test_channel_bits_monotone(a: float, b: float) -> None:
    low, high = sorted((a, b))
    assert 0.0 <= channel_bits(100, low) <= channel_bits(100, high) + 1e-9 <= 100.0 + 1e-9


def _recognised_oracle(decoded: np.ndarray, original: np.ndarray, pool: np.ndarray) -> int:
    count = 0
    for d, o in zip(decoded, original, strict=True):
        own = np.mean((d - o) ** 2)
        nearest = min(np.mean((d - c) ** 2) for c in pool)
        count += int(own <= nearest + 1e-12)
    return count


def test_recognised_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    pool = rng.random((40, 1, 4, 4))
    own = rng.integers(0, 40, 300)
    original = pool[own]
    decoded = original + rng.normal(0, 0.25, original.shape)
    count = _recognised(decoded, original, pool)
    assert count == _recognised_oracle(
        decoded.reshape(300, -1), original.reshape(300, -1), pool.reshape(40, -1)
    )
    assert 0 < count < 300
    assert _recognised(original, original, pool) == 300


def test_recognised_wild_decodings_against_exact_arithmetic() -> None:
    """Float32 rows read from noise (values up to 3e38) against an exact-rational oracle:
    MSE(d, c) - MSE(d, o) is decided exactly, not lost in the cancellation of d^2 terms
    (which counted every such row as recognised); non-finite decodings never count."""
    rng = np.random.default_rng(1)
    pool = rng.normal(size=(12, 5)).astype(np.float32).astype(np.float64)
    original = pool[:8]
    scale = 10.0 ** rng.uniform(-3, 38, size=original.shape)
    decoded = (original + rng.choice([-1.0, 1.0], size=original.shape) * scale).astype(np.float32)
    decoded = decoded.astype(np.float64)
    decoded[6] = original[6]
    decoded[7] = original[7] + 1e-4

    def exact(d: np.ndarray, o: np.ndarray) -> int:
        def mse(a: np.ndarray, b: np.ndarray) -> Fraction:
            return sum((Fraction(x) - Fraction(y)) ** 2 for x, y in zip(a, b, strict=True))

        return int(all(mse(d, o) <= mse(d, c) for c in pool))

    expected = sum(exact(d, o) for d, o in zip(decoded, original, strict=True))
    assert _recognised(decoded, original, pool) == expected
    assert 2 <= expected < 8
    wild = np.tile(original[:1] + 1e30, (3, 1))
    assert _recognised(wild, original[:3], pool) == 0
    broken = original.copy()
    broken[0, 0], broken[1, 2] = np.inf, np.nan
    assert _recognised(broken, original, pool) == 6
    assert _recognised(broken, original, None) == 6


def test_recognised_rules() -> None:
    pool = np.eye(4)
    original = pool[:2]
    assert _recognised(pool[[1, 0]], original, pool) == 0
    assert _recognised(pool[[0, 3]], original, pool) == 1
    halfway = np.array([[0.5, 0.5, 0, 0], [0, 1, 0, 0]])
    assert _recognised(halfway, original, pool) == 2
    assert _recognised(original, original, None) == 2
    assert _recognised(original + 1e-3, original, None) == 0


# --- registry and parameter order ------------------------------------------------------------


def test_registry() -> None:
    names = memorization_names()
    assert {"lsb", "correlation", "sign", "capacity"} <= set(names)
    assert names == sorted(set(names))
    with pytest.raises(MemorizationError) as error:
        make_memorization("nope")
    line = _one_line(error)
    assert "'nope'" in line and "lsb" in line
    with pytest.raises(MemorizationError) as error:
        make_memorization("lsb", nope=1)
    assert _one_line(error).startswith("lsb: ")


def test_parameter_vector_order_and_round_trip() -> None:
    model = _tiny_mlp()
    vector = parameter_vector(model)
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(vector, expected)
    assert vector.numel() == parameter_count(model) == 64 * 32 + 32 + 32 * 10 + 10
    other = _tiny_mlp()
    for p in other.parameters():
        nn.init.zeros_(p)
    load_parameter_vector(other, vector)
    assert torch.equal(parameter_vector(other), vector)
    with pytest.raises(ModelError) as error:
        load_parameter_vector(other, vector[:-1])
    assert "for 2410 parameters" in _one_line(error)
    with pytest.raises(ModelError) as error:
        parameter_vector(nn.ReLU())
    assert "no parameters" in _one_line(error)


# --- the contract every registered attack keeps ----------------------------------------------


@pytest.mark.parametrize("name", memorization_names())
def test_contract(name: str) -> None:
    cls = memorization_class(name)
    assert cls.name == name
    assert isinstance(cls.threat_model, ThreatModel)
    assert isinstance(cls.private_ok, bool)
    attack = make_memorization(name)
    model = _tiny_mlp()
    room = attack.capacity(model, 10, 200)
    assert isinstance(room, int) and room > 0
    options = json.loads(json.dumps(attack.to_dict()))
    assert options["name"] == name
    layout = SecretLayout(room // 512 + 1, (1, 8, 8), 8)
    with pytest.raises(MemorizationError) as error:
        attack.check_capacity(layout, model, 10, 200)
    line = _one_line(error)
    assert line.startswith(f"{name}: the secret needs {layout.total_bits} bits")
    assert f"at most {room} bits" in line
    if cls.threat_model.access is not Access.LABEL:
        secret = choose_secret(digits_small(), [0], 8)
        task = MemorizationTask(secret.layout, (1, 8, 8), 10)
        with pytest.raises(AccessError):
            run_memorization(
                attack,
                Target(model, Access.LABEL, 10),
                task,
                secret,
                clean_accuracy=0,
                honest_accuracy=0,
            )
