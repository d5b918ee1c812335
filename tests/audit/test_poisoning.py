"""Poisoning audits of DP-SGD (Jagielski, Ullman & Oprea 2020, Algorithms 2–4, Theorem 2)."""

from __future__ import annotations

import math

import pytest

from privacylab.audit.poisoning import (
    PoisoningAudit,
    build_datasets,
    choose_threshold,
    poisoning_trial,
    run_poisoning_audit,
)
from privacylab.audit.runner import NAMESPACE
from privacylab.execution import ResultStore

# Full-batch DP-GD from a fixed initialisation: the regime where a black-box audit is tightest
# (no subsampling or initialisation randomness for the test statistic to fight), and fast.
FAST = {"init": "fixed", "epochs": 3, "train_size": 300}


def _audit(tmp_path, trials: int, **options):
    store = ResultStore(tmp_path / "audit.sqlite")
    return run_poisoning_audit(PoisoningAudit(**options), trials, store=store)


def _separation(result) -> float:
    c = result.counts
    pooled = math.sqrt((c["std_stat_d0"] ** 2 + c["std_stat_d1"] ** 2) / 2.0)
    return (c["mean_stat_d1"] - c["mean_stat_d0"]) / pooled


@pytest.mark.parametrize("method", ["backdoor", "clipbkd", "mi"])
@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_lower_bound_is_below_the_accountant(tmp_path, method, epsilon):
    result = _audit(tmp_path, 40, method=method, epsilon=epsilon, **FAST)
    assert result.method == method
    assert result.trials == 40
    assert result.epsilon_theory <= epsilon * 1.001
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_theory
    assert not result.violated
    counts = result.counts
    assert counts["trials_d0"] == counts["trials_d1"] == 20
    assert result.params["noise_multiplier"] == result.params["noise_multiplier_used"] > 0
    assert result.params["bug_injected"] is False
    assert result.to_dict()["violated"] is False


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 8.0])
def test_clipbkd_lower_bound_is_sound_across_epsilons(tmp_path, epsilon):
    result = _audit(tmp_path, 40, method="clipbkd", epsilon=epsilon, **FAST)
    assert result.epsilon_lower_bound <= result.epsilon_theory


def test_clipbkd_beats_the_backdoor_at_the_same_epsilon_and_trials(tmp_path):
    """Full-batch DP-GD at ε = 8, T = 60: one clipping-aware poison (k = 1) certifies more than
    the plain backdoor, which needs k = 8 poisons and so pays for them in ε_LB = ln(p̂0/p̂1)/k."""
    common = {"epsilon": 8.0, **FAST}
    clip = _audit(tmp_path / "clip", 60, method="clipbkd", **common)
    backdoor = _audit(tmp_path / "backdoor", 60, method="backdoor", **common)
    assert backdoor.params["k"] == 8 and clip.params["k"] == 1
    assert clip.epsilon_lower_bound > backdoor.epsilon_lower_bound > 0.0
    assert clip.epsilon_lower_bound <= clip.epsilon_theory


def test_clipbkd_separates_better_than_membership_inference(tmp_path):
    """Poisson-minibatch DP-SGD at ε = 8 (the paper's regime): the poison along the direction of
    least variance separates the two worlds better than a membership canary from the data, whose
    loss also moves with the sampling of the other rows (Jagielski et al. 2020, Sec. 3.2)."""
    common = {"epsilon": 8.0, "init": "fixed", "epochs": 4, "batch_size": 50, "seed": 0}
    clip = _audit(tmp_path / "clip", 80, method="clipbkd", **common)
    mi = _audit(tmp_path / "mi", 80, method="mi", **common)
    assert _separation(clip) > _separation(mi) + 0.2


@pytest.mark.parametrize(("bug", "trials"), [(0.05, 40), (0.1, 200)])
def test_broken_dp_sgd_is_caught(tmp_path, bug, trials):
    options = {"method": "clipbkd", "epsilon": 1.0, "init": "fixed", "epochs": 3}
    broken = _audit(tmp_path / "bug", trials, noise_scale_bug=bug, **options)
    assert broken.params["bug_injected"] is True
    assert broken.params["noise_multiplier_used"] == pytest.approx(
        bug * broken.params["noise_multiplier"]
    )
    assert broken.epsilon_theory <= 1.001
    assert broken.epsilon_lower_bound > broken.epsilon_theory
    assert broken.violated


def test_partial_audit_resumes_from_the_store(tmp_path):
    config = PoisoningAudit(method="mi", epsilon=4.0, **FAST)
    store = ResultStore(tmp_path / "audit.sqlite")
    first = run_poisoning_audit(config, 20, store=store)
    stored = store.items(NAMESPACE)
    assert len(stored) == 20
    second = run_poisoning_audit(config, 40, store=store)
    assert store.count(NAMESPACE) == 40
    after = store.items(NAMESPACE)
    assert all(after[key] == value for key, value in stored.items())
    assert first.trials == 20 and second.trials == 40
    again = run_poisoning_audit(config, 40, store=store)
    assert store.count(NAMESPACE) == 40
    assert again.epsilon_lower_bound == second.epsilon_lower_bound
    assert again.counts == second.counts
    # A stored trial is exactly what a fresh run of that trial gives (seeded by its index).
    key = sorted(stored)[3]
    task = {"config": {**_task_config(config, second)}, "trial": 3}
    assert poisoning_trial(task) == stored[key]


def _task_config(config: PoisoningAudit, result) -> dict:
    from dataclasses import asdict

    return {
        **asdict(config),
        "k": config.poisons,
        "noise_multiplier": result.params["noise_multiplier_used"],
    }


def test_datasets_differ_by_k_rows():
    for method, k in (("backdoor", 8), ("clipbkd", 1), ("mi", 3)):
        d0, d1 = build_datasets(PoisoningAudit(method=method, k=k if method == "mi" else None))
        assert len(d1) == len(d0) + k
        assert (d1.features[: len(d0)] == d0.features).all()
        assert (d1.labels[: len(d0)] == d0.labels).all()
    d0, d1 = build_datasets(PoisoningAudit(method="clipbkd", k=2))
    poison = d1.features[-1].flatten()
    assert float((d0.features.flatten(1) @ poison).abs().max()) < 1e-3
    assert float(poison.norm()) == pytest.approx(float(d0.features.flatten(1).norm(dim=1).max()))


def test_threshold_is_chosen_where_the_worlds_split():
    z = choose_threshold([0.0] * 20, [1.0] * 20, k=1, delta=1e-5, alpha=0.05)
    assert 0.0 < z < 1.0


@pytest.mark.parametrize(
    ("options", "trials", "message"),
    [
        ({"method": "bogus"}, 10, "unknown poisoning method"),
        ({"k": 0}, 10, "k must be"),
        ({}, 1, "trials must be"),
        ({"epsilon": 0.0}, 10, "epsilon must be"),
        ({"epsilon": math.nan}, 10, "epsilon must be"),
        ({"delta": 1.5}, 10, "delta must be"),
        ({"init": "zeros"}, 10, "init must be"),
        ({"batch_size": 500, "train_size": 100}, 10, "batch_size"),
        ({"noise_scale_bug": -1.0}, 10, "noise_scale_bug"),
        ({"accountant": "nope"}, 10, "accountant"),
        ({"train_size": 5000}, 10, "train_size"),
        ({"dataset": "nope"}, 10, "nope"),
    ],
)
def test_bad_input_is_one_line(tmp_path, options, trials, message):
    with pytest.raises(ValueError, match=message) as info:
        run_poisoning_audit(
            PoisoningAudit(**options), trials, store=ResultStore(tmp_path / "s.sqlite")
        )
    assert "\n" not in str(info.value)


def test_bad_confidence_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="confidence"):
        run_poisoning_audit(
            PoisoningAudit(), 4, store=ResultStore(tmp_path / "s.sqlite"), confidence=1.0
        )
