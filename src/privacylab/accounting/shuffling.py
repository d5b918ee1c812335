"""Privacy amplification by shuffling: n local reports, permuted by a trusted shuffler.

Feldman, McMillan & Talwar 2021, "Hiding Among the Clones: A Simple and Nearly Optimal Analysis
of Privacy Amplification by Shuffling" (FOCS'21):

* Theorem 3.1 (ε0-LDP randomizers, adaptively chosen): for δ ∈ (0, 1) with
  ε0 ≤ log(n / (16 log(2/δ))), the shuffled reports are (ε, δ)-DP with

      ε = log(1 + (e^ε0 − 1)/(e^ε0 + 1) · (8 √(e^ε0 log(4/δ)) / √n + 8 e^ε0 / n)).

* Theorem 3.8 ((ε0, δ0)-LDP randomizers): under the same condition, the shuffled reports are
  (ε, δ + (e^ε + 1)(1 + e^(−ε0)/2) n δ0)-DP with the same ε.

Outside the condition the theorem says nothing (the reports stay ε0-DP, which needs no
shuffler), so `shuffled_epsilon` refuses. DP-Forward (Du et al. 2023, Sec. 3.4) applies this to
users who each send one noisy embedding per epoch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from privacylab.accounting import _validate as check

SHUFFLE_ASSUMPTION = (
    "a trusted shuffler permutes the n users' reports uniformly at random before the analyst "
    "sees them; each user sends one report, randomized locally with fresh randomness"
)


@dataclass(frozen=True)
class ShuffleGuarantee:
    """The central (ε, δ) of n shuffled local reports, with the theorem and its assumption."""

    epsilon: float
    delta: float
    n: int
    epsilon0: float
    delta0: float
    theorem: str
    assumption: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (plain floats, ints and strings)."""
        return asdict(self)


def shuffle_threshold(n: int, delta: float) -> float:
    """The largest ε0 the theorem covers: log(n / (16 log(2/δ))) (−inf when n is too small)."""
    n = check.count(n, "number of users n")
    delta = check.delta(delta)
    ratio = n / (16.0 * math.log(2.0 / delta))
    return math.log(ratio) if ratio > 0 else -math.inf


def _closed_form(epsilon0: float, n: int, delta: float) -> float:
    grow = math.exp(epsilon0)
    spread = 8.0 * math.sqrt(grow * math.log(4.0 / delta) / n) + 8.0 * grow / n
    return math.log1p(math.tanh(epsilon0 / 2.0) * spread)


def shuffled_epsilon(
    epsilon0: float, n: int, delta: float, *, delta0: float = 0.0
) -> ShuffleGuarantee:
    """The central guarantee of shuffling n (ε0, δ0)-LDP reports (Feldman, McMillan & Talwar
    2021, Theorem 3.1 for δ0 = 0, Theorem 3.8 otherwise).

    `delta` is the δ of the amplification; with δ0 > 0 the reported δ adds
    (e^ε + 1)(1 + e^(−ε0)/2)·n·δ0. Raises PrivacyParameterError (one line) where the theorem
    does not apply: ε0 > log(n / (16 log(2/δ))), or a total δ of 1 or more.
    """
    epsilon0 = check.positive("local epsilon0", epsilon0)
    n = check.count(n, "number of users n")
    delta = check.delta(delta)
    delta0 = check._as_float("local delta0", delta0)
    if not 0.0 <= delta0 < 1.0:
        raise check.PrivacyParameterError(f"local delta0 must be in [0, 1), got {delta0!r}")
    limit = shuffle_threshold(n, delta)
    if epsilon0 > limit:
        needed = 16.0 * math.log(2.0 / delta) * math.exp(epsilon0)
        raise check.PrivacyParameterError(
            f"shuffling amplification (Feldman, McMillan & Talwar 2021) needs "
            f"epsilon0 <= log(n / (16 log(2/delta))) = {limit:.4g}, got {epsilon0:g}; "
            f"it needs n >= {math.ceil(needed)} users at this epsilon0"
        )
    epsilon = _closed_form(epsilon0, n, delta)
    total = delta
    theorem = "Feldman, McMillan & Talwar 2021, Theorem 3.1"
    if delta0 > 0.0:
        total = delta + (math.exp(epsilon) + 1.0) * (1.0 + math.exp(-epsilon0) / 2.0) * n * delta0
        theorem = "Feldman, McMillan & Talwar 2021, Theorem 3.8"
        if total >= 1.0:
            raise check.PrivacyParameterError(
                f"shuffling {n} reports with local delta0 = {delta0:g} gives a total delta of "
                f"{total:.3g} >= 1: no guarantee"
            )
    return ShuffleGuarantee(epsilon, total, n, epsilon0, delta0, theorem, SHUFFLE_ASSUMPTION)
