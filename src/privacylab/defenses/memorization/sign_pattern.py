"""`sign-pattern`: the randomness of the weights' signs (the check against sign encoding,
Song et al. 2017 Sec. 4.3; seed 004, Exercise 4).

Sign encoding pushes sign(θ_i) to the secret's i-th bit. The bits of images are far from a
fair coin: quantised MNIST pixels are mostly 0 (long runs of one sign) and a pixel's b bits
and neighbouring pixels are correlated. Per window of `window` consecutive parameters
(`parameter_vector` order) two tests run on the signs (zero counts as positive): the
Wald-Wolfowitz runs test (too few runs: serial dependence at lag 1) and the share of positive
signs against 1/2 (`privacylab.stats.weight_tests.runs_test`, `positive_share_test`); the
statistic is -log10 of the Bonferroni-corrected smallest p-value over the 2m tests. The detail
also reports the sign serial correlation at lag 1 and at `row_width` (an image row).

Honest weights have some sign dependence (smooth first-layer templates, units that are mostly
inhibitory); the threshold is calibrated on honest models.

Evaded by: a secret XORed with a pseudo-random key stream (or encrypted) before the signs are
set — its bits are then a fair coin, independent from one position to the next.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privacylab.data import Dataset
from privacylab.defenses.memorization.base import WeightCheck, register_weight_check, whole_number
from privacylab.stats.weight_tests import (
    bonferroni_log10,
    positive_share_test,
    runs_test,
    serial_sign_correlation,
    windows,
)

__all__ = ["SignPatternCheck"]


@register_weight_check
class SignPatternCheck(WeightCheck):
    """Runs test and positive-share test of the signs per `window` parameters; statistic
    -log10(min(1, 2m · p_min)).

    Threshold 143, calibrated on honest models of the victim recipe (784-512-256-10 ReLU MLP, 20
    epochs of Adam) on mnist5k's 3,500 training rows, seeds 100..119 (command below): statistics
    92.2, 96.7, 101.0, 101.2, 102.2, 102.4, 102.6, 104.7, 104.9, 105.0, 105.0, 105.7, 105.9,
    106.4, 106.4, 107.5, 107.6, 107.7, 112.3, 114.2; mean 104.6, sd 4.83, max 114.2. Rule:
    threshold = max(mean + 4 sd, 1.25 max) of the honest statistics, rounded up: the 4-sd margin
    keeps a normal tail below 1e-4 and the 1.25 x max margin covers a heavier right tail than 20
    seeds show (the bare maximum of 20 seeds would leave a 1/21 chance per new seed).

        OMP_NUM_THREADS=1 python benchmarks/memorization_calibrate.py --store /work/bench18/h4/calib
    """

    name = "sign-pattern"
    default_threshold = 143.0

    def __init__(
        self, *, window: int = 4096, row_width: int = 28, threshold: float | None = None
    ) -> None:
        self.window = whole_number(self.name, "window", window, 16)
        self.row_width = whole_number(self.name, "row_width", row_width)
        super().__init__(threshold=threshold)

    def scan(self, vector: np.ndarray, data: Dataset | None) -> tuple[float, dict[str, Any]]:
        """(statistic, detail: worst window, its runs z and share z, serial correlations)."""
        signs = vector >= 0
        spans = windows(vector.size, self.window)
        tests = np.array(
            [(runs_test(signs[a:b]), positive_share_test(signs[a:b])) for a, b in spans]
        )
        log_p = tests[:, :, 1]
        worst = int(np.argmin(log_p.min(axis=1)))
        detail: dict[str, Any] = {
            "windows": len(spans),
            "worst_window": list(spans[worst]),
            "runs_z": float(tests[worst, 0, 0]),
            "share_z": float(tests[worst, 1, 0]),
        }
        for lag in (1, self.row_width):
            if lag < vector.size - 1:
                detail[f"serial_r_lag{lag}"] = serial_sign_correlation(vector, lag)
        return bonferroni_log10(log_p), detail
