"""DP-SGD as a poisoning defence: what differential privacy promises about k poisons.

A training algorithm M that is (ε, δ)-DP for one record is (kε, δ_k)-DP for groups of k records,
δ_k = δ (e^{kε} − 1)/(e^ε − 1) (group privacy: Dwork & Roth 2014, Thm 2.2 for δ = 0;
Jagielski, Ullman & Oprea 2020, "Auditing Differentially Private Machine Learning", Lemma 1;
computed by `privacylab.mechanisms.group.group_privacy_dp`). The poisoned set X ∪ P differs
from the clean set X in the k = |P| poisons, so for every event E of the trained model,

    P[M(X ∪ P) ∈ E] ≤ e^{kε} · P[M(X) ∈ E] + δ_k.

Take E_x = "the model labels the triggered input x' as the target" for one triggered test
input; averaging over the triggered test inputs (the inequality is linear), the expected
attack success rate of the poisoned model is at most e^{kε} · p0 + δ_k, with p0 the expected
ASR of a model trained by the same DP recipe on the clean data (`baseline_asr` of
`BackdoorResult`: how often the patch alone sends an input to the target). Ma, Zhu & Hsu 2019
("Data Poisoning against Differentially-Private Learners") use the same group-privacy
argument as a lower bound on the attacker's cost.

The bound is vacuous beyond k ≈ 1/ε: e^{kε} then exceeds e, and with any p0 > 0 a few more
poisons push it to 1. At ε = 8 (a common "usable accuracy" budget) it says nothing for a
single poison unless p0 < e^{-8} ≈ 3·10⁻⁴; it is a guarantee for ε ≲ 1/k only. DP-SGD is not
a registered detector: it is a training recipe, used through
`VictimRecipe(epsilon=...)` (`privacylab.attacks.poisoning.recipe`), and its empirical
effect on BadNets is measured by `benchmarks/badnets_dp.py`.
"""

from __future__ import annotations

import math

import numpy as np

from privacylab.defenses.backdoor.base import BackdoorDefenseError
from privacylab.mechanisms.group import group_privacy_dp

__all__ = ["max_poisons_for", "poisoning_asr_bound"]

_SEARCH_CAP = 1 << 40


def _rate(name: str, value: object) -> float:
    real = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    number = float(value) if real else math.nan  # type: ignore[arg-type]
    if not 0.0 <= number <= 1.0:
        raise BackdoorDefenseError(f"{name} must be a number in [0, 1], got {value!r}")
    return number


def _poisons(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise BackdoorDefenseError(f"poisons must be a whole number >= 0, got {value!r}")
    return int(value)


def poisoning_asr_bound(epsilon: float, delta: float, poisons: int, clean_rate: float) -> float:
    """The largest expected attack success rate that (ε, δ)-DP training allows with
    `poisons` = k injected rows: min(1, e^{kε} · p0 + δ_k), (kε, δ_k) the group-privacy
    guarantee of `group_privacy_dp` (Jagielski et al. 2020, Lemma 1) and p0 = `clean_rate`,
    the expected ASR of the same recipe trained without poisons. k = 0 gives p0.

    Vacuous (1) as soon as k exceeds about 1/ε times ln(1/p0): the guarantee of DP weakens
    exponentially in the group size."""
    k = _poisons(poisons)
    p0 = _rate("clean rate", clean_rate)
    group_eps, group_delta = group_privacy_dp(epsilon, delta, max(k, 1))
    if k == 0:
        return p0
    if p0 == 0.0:
        return min(1.0, group_delta)
    log_term = group_eps + math.log(p0)
    if log_term >= 0.0:
        return 1.0
    return min(1.0, math.exp(log_term) + group_delta)


def max_poisons_for(epsilon: float, delta: float, clean_rate: float, asr: float) -> int:
    """The largest number of poisons k for which `poisoning_asr_bound` stays strictly below
    `asr`: DP-SGD at (ε, δ) provably keeps the expected ASR under `asr` against any k or
    fewer poisons. 0 when even a clean model may reach `asr` (p0 ≥ `asr`). The bound grows
    with k, so this is found by doubling then bisection; it is of order ln(asr / p0) / ε."""
    target = _rate("asr", asr)
    p0 = _rate("clean rate", clean_rate)
    group_privacy_dp(epsilon, delta, 1)
    if p0 >= target:
        return 0
    low, high = 0, 1
    while poisoning_asr_bound(epsilon, delta, high, p0) < target:
        low, high = high, 2 * high
        if high > _SEARCH_CAP:
            raise BackdoorDefenseError(
                f"the bound stays below asr {asr!r} beyond {_SEARCH_CAP} poisons (ε too small)"
            )
    while high - low > 1:
        middle = (low + high) // 2
        if poisoning_asr_bound(epsilon, delta, middle, p0) < target:
            low = middle
        else:
            high = middle
    return low
