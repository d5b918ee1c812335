"""`correlation`: parameter blocks correlated with the holder's own training rows (the check
against correlated value encoding, Song et al. 2017 Sec. 4.2; seed 004, Exercise 4).

Correlated value encoding trains the parameters θ to be linearly correlated with the secret s,
the concatenated training items, so that θ_i ≈ a·s_i + b and each item reads back from its
stretch of parameters. The holder knows its training rows. The check cuts the parameter vector
(`parameter_vector` order) into blocks of the item size d, aligned at multiples of d, and
computes |Pearson r| between every block and every training row
(`privacylab.stats.weight_tests.block_correlations`). The statistic turns the largest |r| into
a Bonferroni-corrected p-value over all m = blocks × rows pairs with Fisher's z
(atanh r · sqrt(d - 3) ~ N(0, 1) for independent vectors): -log10 min(1, m · p).

Honest first-layer rows of an MLP are template-like (each hidden unit's 784 input weights
resemble strokes of digits), so honest models are not null; the threshold is calibrated on
them.

Evaded by: an encoding that permutes the secret's values (or writes at an offset that is not
a multiple of d, or into another order of the parameters) — any fixed permutation of the
parameters known to the decoder keeps its decoding and breaks the alignment this check needs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from privacylab.data import Dataset
from privacylab.defenses.memorization.base import (
    MemorizationDefenseError,
    WeightCheck,
    register_weight_check,
    whole_number,
)
from privacylab.stats.weight_tests import block_correlations

__all__ = ["CorrelationCheck"]


@register_weight_check
class CorrelationCheck(WeightCheck):
    """Largest |Pearson r| between aligned d-blocks of the parameters and the holder's training
    rows (d = one row's size), as -log10 of its Bonferroni-corrected Fisher-z p-value.
    `max_rows` (None: all) scans a seeded sample of the rows.

    Threshold 63, calibrated on honest models of the victim recipe (784-512-256-10 ReLU MLP, 20
    epochs of Adam) on mnist5k's 3,500 training rows, seeds 100..119 (command below): statistics
    32.1, 32.1, 32.7, 32.9, 33.8, 36.9, 37.8, 38.1, 38.6, 39.1, 39.1, 39.2, 40.1, 40.4, 41.6,
    43.3, 43.5, 47.1, 49.7, 49.8; mean 39.4, sd 5.36, max 49.8. Rule: threshold = max(mean + 4
    sd, 1.25 max) of the honest statistics, rounded up: the 4-sd margin keeps a normal tail
    below 1e-4 and the 1.25 x max margin covers a heavier right tail than 20 seeds show (the
    bare maximum of 20 seeds would leave a 1/21 chance per new seed).

        OMP_NUM_THREADS=1 python benchmarks/memorization_calibrate.py --store /work/bench18/h4/calib
    """

    name = "correlation"
    default_threshold = 63.0
    needs_data = True

    def __init__(
        self, *, max_rows: int | None = None, seed: int = 0, threshold: float | None = None
    ) -> None:
        self.max_rows = None if max_rows is None else whole_number(self.name, "max_rows", max_rows)
        self.seed = whole_number(self.name, "seed", seed, 0)
        super().__init__(threshold=threshold)

    def scan(self, vector: np.ndarray, data: Dataset | None) -> tuple[float, dict[str, Any]]:
        """(statistic, detail: largest |r|, its block's start and the row, pairs tested)."""
        if data is None:
            raise MemorizationDefenseError(
                f"{self.name}: the check needs the holder's training rows"
            )
        rows = data.features.detach().cpu().numpy().reshape(len(data), -1)
        if self.max_rows is not None and len(rows) > self.max_rows:
            pick = np.random.default_rng(self.seed).choice(len(rows), self.max_rows, replace=False)
            rows = rows[np.sort(pick)]
        d = rows.shape[1]
        if vector.size < d or d < 4:
            return 0.0, {"pairs": 0, "max_abs_r": 0.0}
        r = block_correlations(vector, rows, d)
        block, row = np.unravel_index(int(np.argmax(r)), r.shape)
        top = float(r[block, row])
        pairs = r.size
        z = math.atanh(min(top, 1 - 1e-15)) * math.sqrt(d - 3)
        log_p = math.log(2.0) + float(stats.norm.logsf(z))
        value = max(0.0, -(log_p + math.log(pairs)) / math.log(10))
        return value, {
            "pairs": int(pairs),
            "max_abs_r": top,
            "block_start": int(block) * d,
            "row": int(row),
            "blocks_over_0.5": int(np.sum(r.max(axis=1) > 0.5)),
        }
