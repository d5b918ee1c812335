"""`lsb-entropy`: the low mantissa bits of the weights against uniformity (the check against
LSB encoding, Song et al. 2017 Sec. 4.1; seed 004, Exercise 4).

The low bits of a float32 weight that training moved are rounding noise: ≈ uniform. LSB
encoding overwrites them with the secret's bits — raw pixels or float32 rows, far from
uniform (mostly-black MNIST images make most written bytes 0). Per window of `window`
consecutive parameters (`parameter_vector` order) the low `bits` mantissa bits are tested
against uniformity over their 2^bits values (Pearson's chi-square,
`privacylab.stats.weight_tests.window_chi_square`); the statistic is -log10 of the
Bonferroni-corrected smallest window p-value (`bonferroni_log10`).

Honest models are not exactly uniform there: weights that never receive a gradient (first-layer
weights of pixels that are 0 in every training image) keep their initial values, whose low
bits are far from uniform (the victim MLP freshly initialised by torch's uniform rule scores
1,275-1,292 on this statistic, seeds 0-2; measured). The threshold is calibrated on trained
models of the victim recipe; a model trained for far fewer steps, or with frozen layers, keeps
more of its initialisation and needs its own calibration.

Evaded by: a secret encrypted, or XORed with a pseudo-random key stream the decoder knows,
before it is written — its bits are then uniform.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privacylab.data import Dataset
from privacylab.defenses.memorization.base import WeightCheck, register_weight_check, whole_number
from privacylab.stats.weight_tests import bonferroni_log10, window_chi_square, windows

__all__ = ["LSBEntropyCheck"]


@register_weight_check
class LSBEntropyCheck(WeightCheck):
    """Chi-square uniformity of the low `bits` mantissa bits per `window` parameters;
    statistic -log10(min(1, m · p_min)) over the m windows.

    Threshold 188, calibrated on honest models of the victim recipe (784-512-256-10 ReLU MLP, 20
    epochs of Adam) on mnist5k's 3,500 training rows, seeds 100..119 (command below): statistics
    54.1, 54.4, 54.7, 57.5, 70.4, 72.0, 76.8, 77.8, 79.7, 81.5, 84.9, 85.7, 87.9, 89.8, 90.2,
    92.1, 123.6, 123.6, 132.6, 137.6; mean 86.3, sd 25.33, max 137.6. Rule: threshold = max(mean
    + 4 sd, 1.25 max) of the honest statistics, rounded up: the 4-sd margin keeps a normal tail
    below 1e-4 and the 1.25 x max margin covers a heavier right tail than 20 seeds show (the
    bare maximum of 20 seeds would leave a 1/21 chance per new seed).

        OMP_NUM_THREADS=1 python benchmarks/memorization_calibrate.py --store /work/bench18/h4/calib
    """

    name = "lsb-entropy"
    default_threshold = 188.0

    def __init__(
        self, *, window: int = 4096, bits: int = 8, threshold: float | None = None
    ) -> None:
        self.window = whole_number(self.name, "window", window, 16)
        self.bits = whole_number(self.name, "bits", bits, 1, 16)
        super().__init__(threshold=threshold)

    def scan(self, vector: np.ndarray, data: Dataset | None) -> tuple[float, dict[str, Any]]:
        """(statistic, detail: worst window's [start, stop), its log10 p, window count)."""
        log_p = window_chi_square(vector, self.window, self.bits)
        worst = int(np.argmin(log_p))
        start, stop = windows(vector.size, self.window)[worst]
        return bonferroni_log10(log_p), {
            "windows": int(log_p.size),
            "worst_window": [start, stop],
            "worst_log10_p": float(log_p[worst] / np.log(10)),
        }
