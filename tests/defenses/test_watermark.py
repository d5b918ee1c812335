"""Ownership watermarks (Adi et al. 2018): trigger sets, the exact binomial test, storage, and
the watermark's presence in the model it was embedded in and absence from independent ones."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from privacylab.data import load_dataset, split_train_test
from privacylab.defenses.watermark import (
    TriggerSet,
    WatermarkError,
    binomial_p_value,
    embed_watermark,
    load_trigger_set,
    make_trigger_set,
    save_trigger_set,
    trigger_copies,
    verify_watermark,
    watermark_job,
)
from privacylab.models import ModelSpec, build_model, load_model
from privacylab.target import Access, QueryBudgetError, Target
from privacylab.training import TrainConfig, train

CONFIG = TrainConfig(epochs=15, batch_size=128, lr=0.1, seed=0)
WIDTHS = (128,)


def exact_tail(k: int, n: int, classes: int) -> Fraction:
    """P[Binomial(n, 1/K) >= k] as an exact rational: the closed-form sum."""
    p = Fraction(1, classes)
    return sum((math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1)), Fraction(0))


@pytest.mark.parametrize(
    ("k", "n", "classes"),
    [(0, 10, 10), (1, 10, 10), (3, 20, 10), (7, 7, 2), (12, 50, 4), (40, 100, 10), (100, 100, 10)],
)
def test_p_value_is_the_binomial_tail(k: int, n: int, classes: int) -> None:
    expected = exact_tail(k, n, classes)
    got = binomial_p_value(k, n, classes)
    assert got == pytest.approx(float(expected), rel=1e-9, abs=1e-300)
    assert got == pytest.approx(stats.binom.sf(k - 1, n, 1 / classes), rel=1e-12)


def test_p_value_edges_and_monotonicity() -> None:
    assert binomial_p_value(0, 100, 10) == 1.0
    assert binomial_p_value(100, 100, 10) == pytest.approx(1e-100, rel=1e-9)
    values = [binomial_p_value(k, 60, 10) for k in range(61)]
    assert all(a > b for a, b in itertools.pairwise(values))
    for bad in [(-1, 10, 10), (11, 10, 10), (1, 0, 10), (1, 10, 1), (1.5, 10, 10)]:
        with pytest.raises(WatermarkError):
            binomial_p_value(*bad)  # type: ignore[arg-type]


def test_null_is_exact_for_any_fixed_predictor() -> None:
    """Labels uniform and independent of a fixed predictor: p-values are super-uniform
    (P[p <= a] <= a), whatever the predictor does — here it always says class 3."""
    rng = np.random.default_rng(0)
    n, classes, trials = 50, 10, 4000
    predictions = np.full(n, 3)
    p_values = np.array(
        [
            binomial_p_value(int((rng.integers(0, classes, n) == predictions).sum()), n, classes)
            for _ in range(trials)
        ]
    )
    tails = [float(exact_tail(k, n, classes)) for k in range(n + 1)]
    for alpha in (0.01, 0.05, 0.2):
        # the test's exact size at alpha: the largest tail P[X >= k] that is <= alpha
        size = max(t for t in tails if t <= alpha)
        assert size <= alpha
        se = math.sqrt(size * (1 - size) / trials)
        assert abs(np.mean(p_values <= alpha) - size) <= 4 * se


def test_trigger_set_is_seeded_in_domain_and_labels_uniform() -> None:
    a = make_trigger_set((1, 8, 8), 10, 2000, seed=7, low=-1.0, high=2.0)
    b = make_trigger_set((1, 8, 8), 10, 2000, seed=7, low=-1.0, high=2.0)
    c = make_trigger_set((1, 8, 8), 10, 2000, seed=8, low=-1.0, high=2.0)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.labels, c.labels)
    assert a.inputs.shape == (2000, 1, 8, 8) and a.input_shape == (1, 8, 8)
    assert float(a.inputs.min()) >= -1.0 and float(a.inputs.max()) <= 2.0
    counts = np.bincount(a.labels.numpy(), minlength=10)
    assert stats.chisquare(counts).pvalue > 0.01
    # labels come from their own stream: the same whatever the inputs are
    patterns = make_trigger_set((1, 8, 8), 10, 2000, seed=7, kind="patterns", low=-1, high=2)
    assert torch.equal(patterns.labels, a.labels)
    assert not torch.equal(patterns.inputs, a.inputs)
    assert float(patterns.inputs.min()) >= -1.0 and float(patterns.inputs.max()) <= 2.0

    # abstract patterns are blocky: neighbouring pixels agree far more than in noise
    def roughness(x: torch.Tensor) -> float:
        return float((x[..., 1:] - x[..., :-1]).abs().mean())

    assert roughness(patterns.inputs) < 0.5 * roughness(a.inputs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0},
        {"n": 2.5},
        {"kind": "photos"},
        {"low": 1.0, "high": 0.0},
        {"low": float("nan")},
        {"seed": -1},
        {"num_classes": 1},
    ],
)
def test_bad_trigger_settings_are_one_line(kwargs: dict) -> None:
    args = {"input_shape": (4,), "num_classes": 3, "n": 10, **kwargs}
    with pytest.raises(WatermarkError) as error:
        make_trigger_set(**args)
    assert "\n" not in str(error.value)


def test_storage_round_trip_and_tampering(tmp_path) -> None:
    trigger = make_trigger_set((1, 8, 8), 10, 30, seed=3, kind="patterns")
    save_trigger_set(trigger, tmp_path)
    back = load_trigger_set(tmp_path)
    assert torch.equal(back.inputs, trigger.inputs) and torch.equal(back.labels, trigger.labels)
    assert (back.kind, back.seed, back.num_classes) == ("patterns", 3, 10)
    assert load_trigger_set(tmp_path / "watermark.json").labels.tolist() == trigger.labels.tolist()
    spec = json.loads((tmp_path / "watermark.json").read_text())
    assert spec["triggers"] == 30 and spec["input_shape"] == [1, 8, 8]
    blob = bytearray((tmp_path / "watermark.safetensors").read_bytes())
    blob[-1] ^= 1
    (tmp_path / "watermark.safetensors").write_bytes(bytes(blob))
    with pytest.raises(WatermarkError, match="sha256"):
        load_trigger_set(tmp_path)
    with pytest.raises(WatermarkError, match="no watermark"):
        load_trigger_set(tmp_path / "elsewhere")
    (tmp_path / "watermark.json").write_text("{not json")
    with pytest.raises(WatermarkError, match="corrupt"):
        load_trigger_set(tmp_path)


@pytest.mark.parametrize(
    ("n_train", "n", "f"), [(1438, 100, 0.1), (4000, 100, 0.1), (10, 100, 0.5)]
)
def test_trigger_copies_is_the_smallest_sufficient(n_train: int, n: int, f: float) -> None:
    r = trigger_copies(n_train, n, f)
    assert r >= 1
    assert r * n / (n_train + r * n) >= f - 1e-12
    if r > 1:
        assert (r - 1) * n / (n_train + (r - 1) * n) < f
    with pytest.raises(WatermarkError):
        trigger_copies(n_train, n, 1.0)


@pytest.fixture(scope="module")
def digits_split():
    torch.manual_seed(0)
    data = load_dataset("digits")
    return split_train_test(data, seed=0)


@pytest.fixture(scope="module")
def marked(digits_split):
    members, nonmembers = digits_split
    trigger = make_trigger_set(members.input_shape, members.num_classes, 100, seed=11)
    net = build_model("mlp", members.input_shape, 10, seed=0, widths=WIDTHS)
    return embed_watermark(net, members, trigger, CONFIG, eval_data=nonmembers)


def test_watermarked_model_is_claimed_and_independent_ones_are_not(marked, digits_split) -> None:
    members, nonmembers = digits_split
    own = verify_watermark(marked.model, marked.trigger)
    assert own.p_value < 1e-6 and own.owned
    assert own.matches >= 60 and own.queries == 100
    assert own.p_value == pytest.approx(binomial_p_value(own.matches, 100, 10))
    for seed in (1, 2, 3):
        config = TrainConfig(**{**CONFIG.to_dict(), "seed": seed})
        net = build_model("mlp", members.input_shape, 10, seed=seed, widths=WIDTHS)
        independent = train(net, members, config).model
        result = verify_watermark(independent, marked.trigger)
        assert result.p_value > 0.05 and not result.owned, (seed, result)
        # the independent model is a good model: the test does not pass by it being broken
        accuracy = (independent(nonmembers.features).argmax(1) == nonmembers.labels).float()
        assert float(accuracy.mean()) > 0.85


def test_verification_goes_through_the_target(marked) -> None:
    trigger = marked.trigger
    target = Target(marked.model, Access.SCORES, 10)
    result = verify_watermark(target, trigger, threshold=1e-6)
    assert target.queries == len(trigger) == result.queries
    assert result.threshold == 1e-6
    assert result.to_dict()["chance"] == pytest.approx(0.1)
    with pytest.raises(QueryBudgetError):
        verify_watermark(Target(marked.model, Access.LABEL, 10, query_budget=50), trigger)
    with pytest.raises(WatermarkError, match="classes"):
        verify_watermark(Target(nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), "label", 3), trigger)
    wrong = TriggerSet(torch.rand(5, 7), torch.zeros(5, dtype=torch.int64), 10)
    with pytest.raises(WatermarkError, match="shape"):
        verify_watermark(marked.model, wrong)
    with pytest.raises(WatermarkError, match="threshold"):
        verify_watermark(marked.model, trigger, threshold=0.0)


def test_job_saves_model_trigger_set_and_baseline(tmp_path) -> None:
    summary = watermark_job(
        "digits",
        "mlp",
        CONFIG,
        tmp_path / "wm",
        model_options={"widths": WIDTHS},
        triggers=50,
        kind="patterns",
        trigger_seed=5,
    )
    assert summary["p_value"] < 1e-6 and summary["owned"] and summary["note"] is None
    assert summary["baseline"]["p_value"] > 0.05 and not summary["baseline"]["owned"]
    # the accuracy cost is the difference of the two saved models' test accuracies
    assert summary["accuracy_cost"] == pytest.approx(
        summary["baseline_test_accuracy"] - summary["test_accuracy"]
    )
    assert abs(summary["accuracy_cost"]) < 0.05
    model, _spec, metadata = load_model(tmp_path / "wm")
    assert metadata["watermark"]["triggers"] == 50 and metadata["watermark"]["kind"] == "patterns"
    trigger = load_trigger_set(tmp_path / "wm")
    assert trigger.seed == 5 and len(trigger) == 50
    assert verify_watermark(model, trigger).matches == summary["matches"]
    plain, _, _ = load_model(tmp_path / "wm" / "baseline")
    assert verify_watermark(plain, trigger).matches == summary["baseline"]["matches"]
    _, nonmembers = split_train_test(load_dataset("digits"), seed=0)
    accuracy = float((plain(nonmembers.features).argmax(1) == nonmembers.labels).float().mean())
    assert accuracy == pytest.approx(summary["baseline_test_accuracy"])


def _extraction_available(*names: str) -> bool:
    try:
        from privacylab.attacks.extraction import extraction_names
    except ImportError:
        return False
    return set(names) <= set(extraction_names())


@pytest.mark.skipif(
    not _extraction_available("random", "copycat"),
    reason="the learning-based extraction attacks are not registered",
)
def test_watermark_survives_where_the_thief_queries_near_the_triggers(marked, digits_split) -> None:
    """Noise triggers travel with a copy stolen by uniform random queries (the thief asks the
    victim about inputs like the triggers and copies its answers there), and not with a copy
    stolen from in-distribution data: the trigger-set watermark proves theft only when the
    thief's queries reach the triggers (Adi et al. 2018's threat model is fine-tuning, not
    extraction; Jia et al. 2021 make the same observation)."""
    from privacylab.attacks.extraction import (
        ExtractionTask,
        Truth,
        make_extraction,
        predicted_labels,
        run_extraction,
    )

    members, nonmembers = digits_split
    spec = ModelSpec("mlp", members.input_shape, 10, {"widths": WIDTHS})
    half = len(nonmembers) // 2
    truth = Truth(marked.model, nonmembers.features[half:], nonmembers.labels[half:])
    outcomes = {}
    for method in ("random", "copycat"):
        attack = make_extraction(method)
        kept: dict = {}
        steal = attack.steal

        def recording(target, task, steal=steal, kept=kept):
            kept["stolen"] = steal(target, task)
            return kept["stolen"]

        attack.steal = recording  # type: ignore[method-assign]
        task = ExtractionTask(
            input_shape=members.input_shape,
            num_classes=10,
            pool=nonmembers.features[:half],
            architecture=spec,
            budget=1000,
            seed=0,
        )
        result = run_extraction(attack, Target(marked.model, Access.SCORES, 10), task, truth)
        copy = kept["stolen"].model
        labels = predicted_labels(copy, truth.x)
        assert result.fidelity == pytest.approx(
            float((labels == predicted_labels(marked.model, truth.x)).double().mean())
        )
        outcomes[method] = (result.fidelity, verify_watermark(copy, marked.trigger))
    fidelity, random_copy = outcomes["random"]
    assert random_copy.p_value < 1e-6 and random_copy.owned
    fidelity, pool_copy = outcomes["copycat"]
    assert fidelity > 0.85  # a good copy of the task ...
    assert pool_copy.p_value > 1e-3 and not pool_copy.owned  # ... without the watermark
    assert pool_copy.matches < random_copy.matches / 2


def test_job_says_when_the_mark_did_not_take(tmp_path) -> None:
    """One epoch with few trigger rows does not memorise 100 random labels: the summary says
    the watermarked model itself is not claimed, rather than saving it silently."""
    config = TrainConfig(epochs=1, batch_size=128, lr=0.01, seed=0)
    summary = watermark_job(
        "digits",
        "mlp",
        config,
        tmp_path / "weak",
        model_options={"widths": WIDTHS},
        trigger_fraction=0.01,
        baseline=False,
    )
    assert not summary["owned"] and summary["p_value"] >= summary["threshold"]
    assert "not verifiable" in summary["note"]
    assert summary["baseline"] is None and summary["accuracy_cost"] is None
