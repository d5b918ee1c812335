"""Weight checks against white-box memorization (defenses.memorization) on a tiny digits MLP:
each check flags the model with its encoding written into the parameters (LSB: H1's
write_lsb; correlated values and signs written directly, as the decoders read them) and passes
the honestly trained one; the query anomaly detector flags capacity abuse's synthetic inputs
(H3's synthetic_inputs), passes held-out digits at about its false-positive rate, refuses as a
Target monitor and filters a training set."""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest
import torch
from scipy import stats

from privacylab.attacks.memorization.base import (
    choose_secret,
    load_parameter_vector,
    parameter_vector,
)
from privacylab.attacks.memorization.capacity import synthetic_inputs
from privacylab.attacks.memorization.lsb import write_lsb
from privacylab.attacks.memorization.training import train_honest
from privacylab.attacks.poisoning.recipe import VictimRecipe
from privacylab.data import load_dataset
from privacylab.defenses.memorization import (
    WEIGHT_CHECKS,
    CheckResult,
    MemorizationDefenseError,
    QueryAnomalyDetector,
    make_weight_check,
    run_weight_checks,
)
from privacylab.defenses.query.prada import QueryRefused
from privacylab.target import Access, Target

RECIPE = VictimRecipe(model_options={"widths": [64], "activation": "relu"}, epochs=4)


@pytest.fixture(scope="module")
def setting():  # type: ignore[no-untyped-def]
    data = load_dataset("digits")
    order = np.random.default_rng(0).permutation(len(data))
    train, test = data.subset(order[:1400]), data.subset(order[1400:])
    model, _ = train_honest(RECIPE, train, seed=3)
    return model, train, test


@pytest.fixture(scope="module")
def thresholds(setting):  # type: ignore[no-untyped-def]
    """The calibration procedure of benchmarks/memorization_calibrate.py in small: twice the
    largest statistic of honest tiny models of other seeds (the defaults are calibrated on
    the victim recipe's 535,818-parameter MNIST MLP, whose honest statistics are larger)."""
    _, train, _ = setting
    honest = [train_honest(RECIPE, train, seed=s)[0] for s in (10, 11, 12)]
    return {
        name: 2 * max(make_weight_check(name).statistic(m, train) for m in honest)
        for name in WEIGHT_CHECKS.names()
    }


def _with_vector(model: torch.nn.Module, vector: torch.Tensor) -> torch.nn.Module:
    out = copy.deepcopy(model)
    load_parameter_vector(out, vector)
    return out


def _lsb(model, train):  # type: ignore[no-untyped-def]
    secret = choose_secret(train, np.arange(8), 8)
    return _with_vector(model, write_lsb(parameter_vector(model), secret.bits(), 8))


def _correlated(model, train):  # type: ignore[no-untyped-def]
    """θ of the first 20 item-sized blocks ≈ a·image + small residue: what correlated value
    encoding leaves (Song et al. 2017 Sec. 4.2, the decoder reads the block as the image)."""
    v = parameter_vector(model).clone()
    images = train.features[:20].reshape(20, -1).double()
    for k in range(20):
        block = v[k * 64 : (k + 1) * 64].double()
        v[k * 64 : (k + 1) * 64] = (0.3 * block + 0.2 * (images[k] - images[k].mean())).float()
    return _with_vector(model, v)


def _signed(model, train):  # type: ignore[no-untyped-def]
    """sign(θ_i) = the i-th bit of 16 images at 4 bits a pixel (Song et al. 2017 Sec. 4.3)."""
    bits = choose_secret(train, np.arange(16), 4).bits()
    v = parameter_vector(model).clone()
    signs = torch.from_numpy(np.where(bits == 1, 1.0, -1.0)).float()
    v[: len(bits)] = v[: len(bits)].abs() * signs
    return _with_vector(model, v)


ENCODINGS = {"lsb-entropy": _lsb, "correlation": _correlated, "sign-pattern": _signed}


def test_registry_holds_the_three_checks() -> None:
    assert set(WEIGHT_CHECKS.names()) == {"lsb-entropy", "correlation", "sign-pattern"}
    with pytest.raises(MemorizationDefenseError) as error:
        make_weight_check("nope")
    assert "lsb-entropy" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_each_check_flags_its_encoding_and_passes_the_honest_model(
    setting, thresholds, name
) -> None:  # type: ignore[no-untyped-def]
    model, train, _ = setting
    check = make_weight_check(name, threshold=thresholds[name])
    honest = check.check(model, train)
    encoded = check.check(ENCODINGS[name](model, train), train)
    assert isinstance(honest, CheckResult) and honest.name == name
    assert not honest.flagged, honest
    assert encoded.flagged, encoded
    assert encoded.statistic > 2 * thresholds[name]
    assert math.isfinite(encoded.statistic)


def test_checks_do_not_cross_flag_other_encodings_much(setting) -> None:  # type: ignore[no-untyped-def]
    """LSB writing leaves the signs and block correlations alone (it moves each weight by less
    than 2^-15 of itself), so only lsb-entropy sees it."""
    model, train, _ = setting
    lsb = _lsb(model, train)
    for name in ("correlation", "sign-pattern"):
        check = make_weight_check(name)
        assert check.statistic(lsb, train) == pytest.approx(check.statistic(model, train), rel=0.05)


def test_correlation_detail_points_at_the_encoded_block(setting) -> None:  # type: ignore[no-untyped-def]
    model, train, _ = setting
    result = make_weight_check("correlation").check(_correlated(model, train), train)
    assert result.detail["max_abs_r"] > 0.9
    assert result.detail["block_start"] % 64 == 0 and result.detail["block_start"] < 20 * 64
    assert result.detail["row"] < 20


def test_correlation_is_evaded_by_a_permuting_encoder(setting, thresholds) -> None:  # type: ignore[no-untyped-def]
    """The documented blind spot: the same encoding with the values of each item written in a
    fixed secret order (the decoder undoes it) is aligned with no training row."""
    model, train, _ = setting
    v = parameter_vector(model).clone()
    images = train.features[:20].reshape(20, -1)
    order = torch.from_numpy(np.random.default_rng(9).permutation(64))
    for k in range(20):
        block = v[k * 64 : (k + 1) * 64]
        v[k * 64 : (k + 1) * 64] = 0.3 * block + 0.2 * (images[k] - images[k].mean())[order]
    check = make_weight_check("correlation", threshold=thresholds["correlation"])
    assert check.check(_correlated(model, train), train).flagged
    assert not check.check(_with_vector(model, v), train).flagged


def test_a_key_stream_evades_lsb_entropy_and_sign_pattern(setting, thresholds) -> None:  # type: ignore[no-untyped-def]
    """The documented blind spot of both: the secret's bits XORed with a pseudo-random key
    stream (which the decoder regenerates) are a fair coin, as honest low bits and signs are."""
    model, train, _ = setting
    bits = choose_secret(train, np.arange(8), 8).bits()
    key = np.random.default_rng(11).integers(0, 2, bits.size).astype(np.uint8)
    lsb = _with_vector(model, write_lsb(parameter_vector(model), bits ^ key, 8))
    lsb_check = make_weight_check("lsb-entropy", threshold=thresholds["lsb-entropy"])
    assert lsb_check.check(_lsb(model, train)).flagged and not lsb_check.check(lsb).flagged
    four = choose_secret(train, np.arange(16), 4).bits()
    stream = four ^ np.random.default_rng(12).integers(0, 2, four.size).astype(np.uint8)
    v = parameter_vector(model).clone()
    v[: four.size] = (
        v[: four.size].abs() * torch.from_numpy(np.where(stream == 1, 1.0, -1.0)).float()
    )
    sign_check = make_weight_check("sign-pattern", threshold=thresholds["sign-pattern"])
    assert sign_check.check(_signed(model, train)).flagged
    assert not sign_check.check(_with_vector(model, v)).flagged


def test_run_weight_checks_and_needs_data(setting) -> None:  # type: ignore[no-untyped-def]
    model, train, _ = setting
    everything = run_weight_checks(model, train)
    assert set(everything) == set(WEIGHT_CHECKS.names())
    assert "correlation" not in run_weight_checks(model)
    with pytest.raises(MemorizationDefenseError, match="training rows"):
        make_weight_check("correlation").check(model)
    with pytest.raises(MemorizationDefenseError):
        make_weight_check("lsb-entropy", window=3)
    with pytest.raises(MemorizationDefenseError):
        make_weight_check("sign-pattern", threshold=-1)
    assert everything["lsb-entropy"].to_dict()["name"] == "lsb-entropy"


@pytest.fixture(scope="module")
def detector(setting):  # type: ignore[no-untyped-def]
    _, train, _ = setting
    return QueryAnomalyDetector(fpr=0.02).fit(train.features)


@pytest.mark.parametrize("generator", ["noise", "pixel"])
def test_detector_flags_capacity_abuse_inputs(detector, generator) -> None:  # type: ignore[no-untyped-def]
    queries = synthetic_inputs(7, 60, (1, 8, 8), generator)
    assert detector.flags(queries).mean() == 1.0


def test_detector_false_positives_on_held_out_digits_near_fpr(setting, detector) -> None:  # type: ignore[no-untyped-def]
    _, _, test = setting
    flagged = int(detector.flags(test.features).sum())
    # the threshold is an empirical 98 % quantile of 280 held-out rows: allow the binomial
    # spread of a 2 % rate on 397 rows plus the quantile's own (99.9 % upper bound at 4 %)
    assert flagged <= stats.binom.ppf(0.999, len(test), 0.04)


def test_detector_as_target_monitor_refuses_flagged_batches(setting, detector) -> None:  # type: ignore[no-untyped-def]
    model, _, test = setting
    watch = detector.monitor(block=True)
    target = Target(model, Access.LABEL, 10).with_monitor(watch)
    clean = test.features[:5]
    keep = ~detector.flags(clean)
    target.labels(clean[torch.from_numpy(keep)])
    with pytest.raises(QueryRefused) as error:
        target.labels(synthetic_inputs(1, 4, (1, 8, 8), "noise"))
    assert "\n" not in str(error.value)
    assert watch.verdict()["refused"] == 1 and watch.flagged == 4
    passive = detector.monitor(block=False)
    Target(model, Access.LABEL, 10).with_monitor(passive).labels(synthetic_inputs(1, 3, (1, 8, 8)))
    assert passive.flagged == 3


def test_detector_filters_a_training_set(setting, detector) -> None:  # type: ignore[no-untyped-def]
    _, train, _ = setting
    mixed = torch.cat([train.features, synthetic_inputs(3, 100, (1, 8, 8), "pixel")])
    keep = detector.filter_training(mixed)
    assert keep[len(train) :].sum() == 0
    assert keep[: len(train)].mean() >= 0.95


def test_detector_bad_input(setting) -> None:  # type: ignore[no-untyped-def]
    _, train, _ = setting
    with pytest.raises(MemorizationDefenseError, match="fit"):
        QueryAnomalyDetector().score(train.features[:2])
    with pytest.raises(MemorizationDefenseError):
        QueryAnomalyDetector(metric="manhattan")
    with pytest.raises(MemorizationDefenseError):
        QueryAnomalyDetector(fpr=1.5)
    fitted = QueryAnomalyDetector().fit(train.features[:200])
    with pytest.raises(MemorizationDefenseError, match="values"):
        fitted.score(torch.zeros(2, 5))
    with pytest.raises(MemorizationDefenseError, match="NaN"):
        fitted.score(torch.full((2, 1, 8, 8), float("nan")))


def test_checks_leave_the_model_as_it_was(setting) -> None:  # type: ignore[no-untyped-def]
    model, train, _ = setting
    before = parameter_vector(model).clone()
    was = model.training
    run_weight_checks(model, train)
    assert torch.equal(parameter_vector(model), before) and model.training == was


def test_detector_threshold_is_the_held_out_quantile(setting) -> None:  # type: ignore[no-untyped-def]
    """Fitted with explicit held-out rows, the threshold is their scores' empirical (1 - fpr)
    quantile ("higher"), so at most fpr of those rows score above it."""
    _, train, test = setting
    detector = QueryAnomalyDetector(fpr=0.05).fit(train.features, held_out=test.features)
    scores = detector.score(test.features)
    assert detector.threshold == float(np.quantile(scores, 0.95, method="higher"))
    assert 0 < np.mean(scores > detector.threshold) <= 0.05
    assert np.mean(scores >= detector.threshold) > 0.05 - 1 / len(test)


def test_detector_filter_scores_reference_rows_without_themselves() -> None:
    """Leave-one-out on a line of points 0, 1, 2, 4 (Euclidean, k = 1): each reference row's
    score is the distance to its nearest other row, a new row's to its nearest row; with
    k = 4 (all reference rows), a reference row's farthest other row and a new row's farthest
    row."""
    ref = np.array([[0.0], [1.0], [2.0], [4.0]])
    detector = QueryAnomalyDetector(k=1, metric="euclidean").fit(ref, held_out=np.array([[1.5]]))
    assert detector.threshold == pytest.approx(0.5)
    assert detector.filter_training(ref).tolist() == [False, False, False, False]
    assert detector.filter_training(np.array([[0.25], [3.0]])).tolist() == [True, False]
    wide = QueryAnomalyDetector(k=4, metric="euclidean").fit(ref, held_out=np.array([[2.5]]))
    assert wide.threshold == pytest.approx(2.5)
    assert wide.filter_training(ref).tolist() == [False, False, True, False]
    assert wide.filter_training(np.array([[3.0], [1.75]])).tolist() == [False, True]


def test_detector_width_mismatches_are_one_line(setting) -> None:  # type: ignore[no-untyped-def]
    _, train, _ = setting
    with pytest.raises(MemorizationDefenseError, match="held-out rows of 5") as error:
        QueryAnomalyDetector().fit(train.features, held_out=torch.zeros(3, 5))
    assert "\n" not in str(error.value)
    fitted = QueryAnomalyDetector().fit(train.features[:200])
    with pytest.raises(MemorizationDefenseError, match="inputs of 5 values"):
        fitted.filter_training(torch.zeros(2, 5))


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_default_threshold_follows_the_documented_calibration(name) -> None:  # type: ignore[no-untyped-def]
    """Each check's docstring lists the 20 honest statistics that calibrated it: the stated
    rule max(mean + 4 sd, 1.25 max), rounded up, gives the default threshold."""
    cls = WEIGHT_CHECKS.get(name)
    doc = " ".join((cls.__doc__ or "").split())
    head = re.search(r"Threshold (\d+), calibrated", doc)
    values = re.search(r"statistics ((?:[\d.]+, )+[\d.]+); mean", doc)
    assert head and values, doc
    honest = np.array([float(v) for v in values.group(1).split(", ")])
    assert len(honest) == 20 and float(head.group(1)) == cls.default_threshold
    rule = max(honest.mean() + 4 * honest.std(ddof=1), 1.25 * honest.max())
    assert math.ceil(rule - 0.05) == cls.default_threshold
