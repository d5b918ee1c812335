"""STRIP (Gao et al. 2019) on a tiny BadNets game: an MLP on sklearn's 8x8 digits trained with
5% of its rows stamped with a 2x2 white corner and relabelled 0, and the same MLP trained
clean; 300 clean held-out rows for calibration, the rest for measuring.

Checked: the entropy equals the closed form for a model with constant outputs (log2 K for a
uniform one) and a by-hand re-computation with the same draws; superimposition is the clipped
sum; the boundary rules against numpy's quantile and scipy's normal, and by Monte Carlo; on
the backdoored model triggered inputs have far lower entropy than clean ones, FRR on clean
held-out rows is close to the chosen rate and FAR is low, the filter rejects triggered inputs
and ASR after it is low; on the clean model triggered inputs pass (FAR high: nothing to find);
the training-set verdict flags the poisoned rows and class 0 (backdoored) and nothing
(clean), with the binomial p-value re-derived from its sum; the model is never modified and
the filter holds its own copy; seeded; bad options are one line.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.datasets import load_digits
from torch import nn

from privacylab.attacks.poisoning.trigger import parse_trigger
from privacylab.data import Dataset
from privacylab.defenses.backdoor import (
    BackdoorDefenseError,
    BackdoorEvidence,
    Detection,
    backdoor_defense_names,
    evaluate_mitigation,
    make_backdoor_defense,
)
from privacylab.defenses.backdoor.strip import (
    STRIP,
    strip_boundary,
    strip_entropy,
    superimpose,
)

TARGET = 0


@dataclass
class Game:
    bad: nn.Module
    clean_model: nn.Module
    clean: Dataset
    test: Dataset
    triggered: torch.Tensor
    poisoned: np.ndarray
    bad_detection: Detection
    clean_detection: Detection


def _train(x: torch.Tensor, y: torch.Tensor, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(20):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), 64):
            rows = order[start : start + 64]
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
            optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def game() -> Iterator[Game]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, held, test = order[:1200], order[1200:1500], order[1500:]
    trigger = parse_trigger("square:2@corner")
    xp, yp = x[train].clone(), y[train].clone()
    poisoned = np.random.default_rng(1).choice(np.flatnonzero(yp.numpy() != TARGET), 60, False)
    xp[poisoned] = trigger.stamp(xp[poisoned])
    yp[poisoned] = TARGET
    bad = _train(xp, yp, 1)
    clean_model = _train(x[train], y[train], 1)
    clean = Dataset("held", x[held], y[held], 10, (1, 8, 8), "image")
    test_set = Dataset("test", x[test], y[test], 10, (1, 8, 8), "image")
    triggered = trigger.stamp(x[test])
    defence = STRIP(triggered=triggered)
    yield Game(
        bad=bad,
        clean_model=clean_model,
        clean=clean,
        test=test_set,
        triggered=triggered,
        poisoned=np.sort(poisoned),
        bad_detection=defence.inspect(
            bad,
            BackdoorEvidence(
                10, clean=clean, training=Dataset("p", xp, yp, 10, (1, 8, 8), "image")
            ),
        ),
        clean_detection=defence.inspect(
            clean_model,
            BackdoorEvidence(
                10, clean=clean, training=Dataset("c", x[train], y[train], 10, (1, 8, 8), "image")
            ),
        ),
    )
    torch.set_num_threads(before)


def test_registered() -> None:
    assert "strip" in backdoor_defense_names()
    assert isinstance(make_backdoor_defense("strip", n=4), STRIP)


def test_superimpose_is_the_clipped_sum() -> None:
    a = torch.tensor([[0.2, 0.7, 1.0]])
    b = torch.tensor([[0.5, 0.6, 0.0]])
    assert torch.allclose(superimpose(a, b), torch.tensor([[0.7, 1.0, 1.0]]))
    assert torch.allclose(superimpose(a, b, "average"), torch.tensor([[0.35, 0.65, 0.5]]))


def test_entropy_closed_form_for_constant_outputs() -> None:
    bias = torch.tensor([2.0, 0.5, -1.0, 0.0])
    model = nn.Linear(5, 4)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.copy_(bias)
    inputs = torch.rand(7, 5)
    clean = torch.rand(11, 5)
    expected = stats.entropy(torch.softmax(bias.double(), 0).numpy(), base=2)
    np.testing.assert_allclose(strip_entropy(model, inputs, clean, n=6), expected, rtol=1e-9)
    with torch.no_grad():
        model.bias.zero_()
    np.testing.assert_allclose(strip_entropy(model, inputs, clean, n=3), 2.0, rtol=1e-12)


def test_entropy_by_hand_with_the_same_draws(game: Game) -> None:
    inputs = game.test.features[:5]
    pool = game.clean.features
    got = strip_entropy(game.bad, inputs, pool, n=4, seed=9)
    draws = torch.randint(0, len(pool), (5, 4), generator=torch.Generator().manual_seed(9))
    for i in range(5):
        blended = (inputs[i : i + 1] + pool[draws[i]]).clamp(0, 1)
        with torch.no_grad():
            p = torch.softmax(game.bad(blended).double(), 1).numpy()
        by_hand = np.mean([-(row * np.log2(row)).sum() for row in p])
        assert got[i] == pytest.approx(by_hand, rel=1e-9)
    assert np.array_equal(got, strip_entropy(game.bad, inputs, pool, n=4, seed=9))


def test_boundary_rules() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(3.0, 0.5, size=4000)
    assert strip_boundary(values, 0.05) == np.quantile(values, 0.05, method="lower")
    assert np.mean(values < strip_boundary(values, 0.05)) <= 0.05
    fitted = stats.norm(values.mean(), values.std(ddof=1)).ppf(0.02)
    assert strip_boundary(values, 0.02, "normal") == pytest.approx(fitted, rel=1e-12)
    fresh = rng.normal(3.0, 0.5, size=20_000)
    # Monte Carlo: FRR of the normal-rule boundary on fresh normal data, 4 sigma of both samples
    frr = np.mean(fresh < strip_boundary(values, 0.02, "normal"))
    assert abs(frr - 0.02) < 0.01


def test_triggered_inputs_have_low_entropy(game: Game) -> None:
    pool = game.clean.features
    clean = strip_entropy(game.bad, game.test.features, pool, seed=1)
    bad = strip_entropy(game.bad, game.triggered, pool, seed=2)
    assert np.median(bad) < np.quantile(clean, 0.05)
    assert bad.mean() < 0.25 * clean.mean()
    # the clean model has no backdoor: the corner changes nothing
    clean_bad = strip_entropy(game.clean_model, game.triggered, pool, seed=2)
    assert np.median(clean_bad) > np.quantile(clean, 0.2)


def test_frr_near_the_chosen_rate_and_far_low(game: Game) -> None:
    details = game.bad_detection.details
    assert details["far"] < 0.15
    assert details["frr"] <= 0.01
    reject = game.bad_detection.mitigation.reject
    frr_default = reject(game.test.features).mean()
    assert frr_default <= 0.04
    held = STRIP(frr=0.1).inspect(game.bad, BackdoorEvidence(10, clean=game.clean))
    assert held.detected is None and "no verdict" in held.details["verdict"]
    frr = held.mitigation.reject(game.test.features).mean()
    # calibration on 300 rows and measurement on 297: sd about 0.025 together
    assert abs(frr - 0.1) < 0.075
    far = 1 - held.mitigation.reject(game.triggered)[game.test.labels.numpy() != TARGET].mean()
    assert far < 0.1


def test_filter_rejects_triggered_inputs(game: Game) -> None:
    wanted = np.full(len(game.test), TARGET)
    before = evaluate_mitigation(None, game.bad, game.test, game.triggered, wanted)
    after = evaluate_mitigation(
        game.bad_detection.mitigation, game.bad, game.test, game.triggered, wanted
    )
    assert before["asr"] > 0.9
    assert after["rejected_triggered"] > 0.85
    assert after["asr"] < 0.15
    assert after["rejected_clean"] < 0.05
    assert after["accuracy"] >= before["accuracy"] - 0.05
    assert game.bad_detection.mitigation.model is None


def test_clean_model_lets_triggers_through(game: Game) -> None:
    assert game.clean_detection.details["far"] > 0.7


def _binomial_tail(count: int, n: int, p: float) -> float:
    """P(X >= count) for X ~ Binomial(n, p), summed term by term in log space."""
    terms = [
        math.lgamma(n + 1)
        - math.lgamma(k + 1)
        - math.lgamma(n - k + 1)
        + k * math.log(p)
        + (n - k) * math.log1p(-p)
        for k in range(count, n + 1)
    ]
    return math.fsum(math.exp(t) for t in terms)


def test_verdict_on_training_rows(game: Game) -> None:
    detection = game.bad_detection
    assert detection.detected is True
    assert detection.flagged_class == TARGET
    flagged = set(detection.flagged_rows.tolist())
    poisoned = set(game.poisoned.tolist())
    assert len(flagged & poisoned) >= 0.9 * len(poisoned)
    assert len(flagged - poisoned) <= 0.03 * 1200
    details = detection.details
    count, n = details["flagged"], details["training_rows"]
    tail = _binomial_tail(count, n, 0.01)
    assert details["p_value"] == pytest.approx(tail, rel=1e-6, abs=1e-300)
    assert details["p_value"] < 0.01

    quiet = game.clean_detection
    assert quiet.detected is False
    assert quiet.flagged_class is None
    count, n = quiet.details["flagged"], quiet.details["training_rows"]
    tail = _binomial_tail(count, n, 0.01)
    assert quiet.details["p_value"] == pytest.approx(tail, rel=1e-6)
    assert quiet.details["p_value"] >= 0.01


def test_model_untouched_filter_holds_a_copy(game: Game) -> None:
    model = _train(game.clean.features[:100], game.clean.labels[:100], 3)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    detection = STRIP(n=5).inspect(model, BackdoorEvidence(10, clean=game.clean))
    assert model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key])
    first = detection.mitigation.reject(game.test.features)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert np.array_equal(first, detection.mitigation.reject(game.test.features))
    again = STRIP(n=5).inspect(
        _train(game.clean.features[:100], game.clean.labels[:100], 3),
        BackdoorEvidence(10, clean=game.clean),
    )
    assert again.details["threshold"] == detection.details["threshold"]


def test_shapes_and_evidence_refused(game: Game) -> None:
    with pytest.raises(BackdoorDefenseError, match="needs clean-data"):
        STRIP().inspect(game.bad, BackdoorEvidence(10))
    with pytest.raises(BackdoorDefenseError, match="cannot be superimposed"):
        strip_entropy(game.bad, torch.zeros(2, 1, 4, 4), game.clean.features)
    with pytest.raises(BackdoorDefenseError, match="shape"):
        STRIP(triggered=torch.zeros(3, 1, 4, 4)).inspect(
            game.bad, BackdoorEvidence(10, clean=game.clean)
        )


@pytest.mark.parametrize(
    "options",
    [
        {"n": 0},
        {"n": 2.5},
        {"frr": 0.0},
        {"frr": 1.0},
        {"frr": "low"},
        {"alpha": float("nan")},
        {"rule": "gamma"},
        {"blend": "max"},
        {"triggered": [1, 2]},
        {"max_rows": 0},
        {"seed": -1},
    ],
)
def test_bad_options_one_line(options: dict[str, object]) -> None:
    with pytest.raises(BackdoorDefenseError) as error:
        STRIP(**options)  # type: ignore[arg-type]
    assert "\n" not in str(error.value)
    assert str(error.value).startswith("strip")
