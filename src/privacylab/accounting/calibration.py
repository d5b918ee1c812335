"""Noise calibration for DP-SGD: the smallest σ for a target (ε, δ), the most steps for a σ.

Both search with an accountant's ε as a black box and always round to the safe side: the σ
returned meets the target ε, and so does the number of steps.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from scipy.optimize import brentq

from privacylab.accounting import _validate as check
from privacylab.accounting.base import Accountant
from privacylab.accounting.composition import (
    AdvancedCompositionAccountant,
    NaiveCompositionAccountant,
)
from privacylab.accounting.events import dp_sgd
from privacylab.accounting.gdp import GdpAccountant
from privacylab.accounting.pld import PldAccountant
from privacylab.accounting.rdp import RdpAccountant
from privacylab.registry import Registry

ACCOUNTANTS: Registry[Callable[[], Accountant]] = Registry(
    "accountant", error=check.PrivacyParameterError
)
"""Accountant factories by name (a read-only mapping; see `privacylab.registry`)."""
ACCOUNTANTS.register("rdp", lambda: RdpAccountant(conversion="tight"))
ACCOUNTANTS.register("rdp-classic", lambda: RdpAccountant(conversion="classic"))
ACCOUNTANTS.register("pld", PldAccountant)
ACCOUNTANTS.register("gdp", GdpAccountant)
ACCOUNTANTS.register("naive", NaiveCompositionAccountant)
ACCOUNTANTS.register("advanced", AdvancedCompositionAccountant)


def make_accountant(name: str) -> Accountant:
    """A fresh accountant by name: rdp, rdp-classic, pld, gdp, naive or advanced."""
    return ACCOUNTANTS.make(name)


def steps_from_epochs(epochs: float, sample_rate: float) -> int:
    """Number of steps in `epochs` passes with Poisson rate q: ceil(epochs / q)."""
    e = check.positive("epochs", epochs)
    q = check.sample_rate(sample_rate)
    if e / q > check.MAX_STEPS:
        raise check.PrivacyParameterError(
            f"{e:g} epochs at sample rate {q:g} is more than {check.MAX_STEPS:g} steps"
        )
    return max(1, math.ceil(e / q - 1e-9))


@functools.lru_cache(maxsize=256)
def dp_sgd_epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "rdp"
) -> float:
    """ε of DP-SGD (Abadi et al. 2016, Alg. 1, Poisson sampling) by the named accountant.

    Memoised: trainers, audits and reports ask for the same settings many times."""
    acc = make_accountant(accountant)
    acc.compose(dp_sgd(noise_multiplier, sample_rate, steps))
    return acc.epsilon(delta)


@functools.lru_cache(maxsize=256)
def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    rtol: float = 1e-3,
) -> float:
    """Smallest noise multiplier σ (to relative tolerance `rtol`, rounded up) such that DP-SGD
    with rate q for `steps` steps is (target ε, δ)-DP under the named accountant.

    Brent's method on log σ ↦ log ε(σ) − log ε_target, which is smooth and decreasing; the σ
    returned is checked to meet the target.
    """
    target = check.target_epsilon(target_epsilon)
    d = check.delta(delta)
    q = check.sample_rate(sample_rate)
    t = check.steps(steps)
    make_accountant(accountant)

    seen: dict[float, float] = {}

    def gap(log_sigma: float) -> float:
        if log_sigma not in seen:
            eps = dp_sgd_epsilon(math.exp(log_sigma), q, t, d, accountant)
            seen[log_sigma] = math.log(max(eps, 1e-300)) - math.log(target)
        return seen[log_sigma]

    if accountant.lower().startswith("rdp"):
        lo, hi = math.log(0.05), math.log(1.0)
    else:
        # Bracket with the cheap RDP bound first: it is almost always looser, so its σ is
        # (nearly) enough; the slow accountant then only searches a narrow interval.
        rdp_sigma = calibrate_noise_multiplier(target, d, q, t, "rdp", rtol=1e-3)
        lo, hi = math.log(rdp_sigma * 0.85), math.log(rdp_sigma * 1.01)
    while gap(hi) > 0:
        lo, hi = hi, hi + math.log(4.0)
        if hi > math.log(1e6):
            raise check.PrivacyParameterError(
                f"no noise multiplier up to 1e6 reaches epsilon {target:g} at delta {d:g}"
            )
    while gap(lo) <= 0:
        hi, lo = lo, lo - math.log(2.0)
        if lo < math.log(1e-4):
            return math.exp(lo)  # a σ below 1e-4 already meets the target: nothing to gain
    xtol = rtol / 2
    root = brentq(gap, lo, hi, xtol=xtol, rtol=4 * np.finfo(float).eps)
    log_sigma = min(root + xtol, hi)
    while gap(log_sigma) > 0:
        log_sigma += xtol
    return math.exp(log_sigma)


def max_steps(
    noise_multiplier: float,
    sample_rate: float,
    target_epsilon: float,
    delta: float,
    accountant: str = "rdp",
    limit: int = 10**9,
) -> int:
    """Largest number of DP-SGD steps that stays (target ε, δ)-DP; 0 if even one step does not.

    Exponential then binary search over the step count (ε grows with the steps). The search
    stops at `limit`: a return value equal to `limit` means "at least `limit` steps" (see
    `step_budget`, which says so).
    """
    return step_budget(noise_multiplier, sample_rate, target_epsilon, delta, accountant, limit)[0]


def step_budget(
    noise_multiplier: float,
    sample_rate: float,
    target_epsilon: float,
    delta: float,
    accountant: str = "rdp",
    limit: int = 10**9,
) -> tuple[int, bool]:
    """`(steps, capped)`: the largest number of DP-SGD steps within (target ε, δ), found by an
    exponential then binary search, and whether the search stopped at its cap `limit` (then
    `steps == limit` fits, and more steps may fit too). Every step count returned is checked."""
    sigma = check.noise_multiplier(noise_multiplier)
    q = check.sample_rate(sample_rate)
    target = check.target_epsilon(target_epsilon)
    d = check.delta(delta)
    cap = check.steps(limit, "step search limit")
    make_accountant(accountant)

    def fits(steps: int) -> bool:
        return dp_sgd_epsilon(sigma, q, steps, d, accountant) <= target

    if not fits(1):
        return 0, False
    good, bad = 1, 2
    while bad <= cap and fits(bad):
        good, bad = bad, bad * 2
    if bad > cap:
        if fits(cap):
            return cap, True
        bad = cap
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good, False
