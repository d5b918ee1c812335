"""The DP defaults rule (`privacylab.training.defaults.dp_defaults`)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.training import defaults as rule
from privacylab.training.config import TrainingError
from privacylab.training.defaults import dp_defaults


def test_mnist5k_at_epsilon_1_and_8() -> None:
    low = dp_defaults(1.0, 1e-5, 4000)
    assert (low.batch_size, low.steps, low.optimizer, low.max_grad_norm) == (
        1000, rule.BASE_STEPS, "momentum", 1.0,
    )  # fmt: skip
    assert low.epochs == rule.BASE_STEPS // 4
    high = dp_defaults(8.0, 1e-5, 4000)
    assert high.batch_size == 1000
    assert high.steps > low.steps
    assert high.lr >= low.lr


@settings(max_examples=200, deadline=None)
@given(
    epsilon=st.floats(0.05, 100.0),
    n=st.integers(1, 10**7),
    delta=st.floats(1e-10, 0.1),
)
def test_rule_is_within_its_bounds(epsilon: float, n: int, delta: float) -> None:
    chosen = dp_defaults(epsilon, delta, n)
    assert 1 <= chosen.batch_size <= min(n, rule.MAX_BATCH)
    assert chosen.batch_size >= min(n, rule.MIN_BATCH)
    per_epoch = max(1, round(n / chosen.batch_size))
    assert chosen.steps == chosen.epochs * per_epoch
    # The step budget is met within one epoch's worth of steps, and never exceeds the cap by more.
    budget = chosen.steps - per_epoch
    assert budget < rule.MAX_STEPS
    assert chosen.steps >= min(rule.BASE_STEPS, per_epoch)
    assert 0 < chosen.lr * chosen.max_grad_norm <= rule.MAX_LR_TIMES_CLIP + 1e-12


@settings(max_examples=100, deadline=None)
@given(eps=st.floats(0.05, 50.0), factor=st.floats(1.0, 10.0))
def test_more_budget_never_means_fewer_steps(eps: float, factor: float) -> None:
    assert dp_defaults(eps * factor, 1e-5, 4000).steps >= dp_defaults(eps, 1e-5, 4000).steps


@pytest.mark.parametrize("clip", [0.1, 0.5, 3.0])
def test_a_given_clipping_norm_keeps_lr_times_c(clip: float) -> None:
    base = dp_defaults(2.0, 1e-5, 4000)
    other = dp_defaults(2.0, 1e-5, 4000, max_grad_norm=clip)
    assert other.max_grad_norm == clip
    assert other.lr * clip == pytest.approx(base.lr * base.max_grad_norm)
    assert (other.batch_size, other.epochs) == (base.batch_size, base.epochs)


def test_large_data_hits_de_et_al_batch() -> None:
    chosen = dp_defaults(8.0, 1e-6, 60_000)
    assert chosen.batch_size == rule.MAX_BATCH == 4096


def test_tiny_data_uses_every_example() -> None:
    chosen = dp_defaults(1.0, 1e-5, 10)
    assert chosen.batch_size == 10
    assert chosen.steps == chosen.epochs


@pytest.mark.parametrize(
    "args",
    [
        (0.0, 1e-5, 100),
        (math.inf, 1e-5, 100),
        (math.nan, 1e-5, 100),
        (1.0, 0.0, 100),
        (1.0, 1.0, 100),
        (1.0, 1e-5, 0),
        (1.0, 1e-5, 2.5),
        (1.0, 1e-5, True),
    ],
)
def test_bad_input_is_one_line(args) -> None:
    with pytest.raises(TrainingError) as info:
        dp_defaults(*args)
    assert "\n" not in str(info.value)


def test_bad_clip_is_refused() -> None:
    with pytest.raises(TrainingError):
        dp_defaults(1.0, 1e-5, 100, max_grad_norm=0.0)
