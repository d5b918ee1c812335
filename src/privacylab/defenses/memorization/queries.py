"""An anomaly detector over inputs against capacity abuse (Song et al. 2017 Sec. 5; seed 004,
"Mitigation: use an anomaly detection algorithm to detect abnormal samples (either during
training or inference) and filter them").

Capacity abuse trains on, and later queries, synthetic inputs made by a deterministic
generator (noise images, or images with one non-zero pixel) — inputs unlike any the holder
has. The detector scores an input by its distance to its k-th nearest neighbour among the
holder's training inputs (Ramaswamy, Rastogi & Shim 2000, "Efficient Algorithms for Mining
Outliers from Large Data Sets", the D^k outlier score), with the cosine distance by default
(1 - cos of the angle between the flattened inputs): a real digit points in nearly the same
direction as some other digit, uniform noise and a single lit pixel do not — which the
Euclidean distance misses for a nearly black image, close to every thin digit. The threshold
is the (1 - fpr) quantile of the scores of held-out clean rows (given, or a seeded `holdout`
share of the fitted rows kept out of the reference set).

Uses: `monitor(block=True)` is a `Target` query monitor (`target.with_monitor(...)`) that
refuses a batch holding a flagged query with one `QueryRefused` line; `filter_training(x)`
is the "during training" variant — the mask of rows of a training set to keep (rows that are
the holder's own reference rows are scored without themselves).

Measured on the default setting (mnist5k, seed 0: fitted on the 3,500 training rows, 700 of
them held out for the threshold at fpr 0.01; script /work/bench18/h4/measure.py): 1.4 % of the
1,000 test digits flagged; 100 % of 2,000 synthetic inputs of capacity abuse's "noise" and
"pixel" generators (`attacks.memorization.capacity.synthetic_inputs`). The Euclidean
distance flags 1.3 % of the test rows and all noise inputs but none of the one-pixel inputs.

Evaded by: synthetic inputs drawn near the data (e.g. natural images from another source, or
perturbed training rows), at the price of capacity (the attacker's labels then fight the
data's own).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from privacylab.defenses.memorization.base import (
    MemorizationDefenseError,
    positive_number,
    whole_number,
)
from privacylab.defenses.query.prada import QueryRefused

__all__ = ["METRICS", "QueryAnomalyDetector", "QueryWatch"]

METRICS = ("cosine", "euclidean")


def _rows(x: object, what: str) -> np.ndarray:
    if isinstance(x, Tensor):
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim < 2 or len(a) == 0:
        raise MemorizationDefenseError(
            f"{what}: inputs must be a non-empty batch, got shape {a.shape}"
        )
    a = a.reshape(len(a), -1)
    if not np.all(np.isfinite(a)):
        raise MemorizationDefenseError(f"{what}: inputs hold NaN or infinite values")
    return a


class QueryAnomalyDetector:
    """k-th-nearest-neighbour distance of inputs to the holder's training inputs (cosine or
    Euclidean), thresholded at false-positive rate `fpr` on held-out clean rows."""

    def __init__(
        self,
        *,
        k: int = 5,
        metric: str = "cosine",
        fpr: float = 0.01,
        holdout: float = 0.2,
        seed: int = 0,
    ) -> None:
        self.k = whole_number("query detector", "k", k)
        if metric not in METRICS:
            raise MemorizationDefenseError(
                f"query detector: metric must be one of {', '.join(METRICS)}, got {metric!r}"
            )
        self.metric = metric
        self.fpr = positive_number("query detector", "fpr", fpr)
        self.holdout = positive_number("query detector", "holdout", holdout)
        if self.fpr >= 1 or self.holdout >= 1:
            raise MemorizationDefenseError("query detector: fpr and holdout must lie in (0, 1)")
        self.seed = whole_number("query detector", "seed", seed, 0)
        self.threshold: float | None = None
        self._reference: np.ndarray | None = None

    def fit(self, x: object, held_out: object | None = None) -> QueryAnomalyDetector:
        """Fit on the holder's training inputs `x`; the threshold is set on `held_out` clean
        rows, or on a seeded `holdout` share of `x` kept out of the reference. Returns self."""
        rows = _rows(x, "query detector")
        if held_out is None:
            order = np.random.default_rng(self.seed).permutation(len(rows))
            cut = round(self.holdout * len(rows))
            if cut < 1 or len(rows) - cut < self.k:
                raise MemorizationDefenseError(
                    f"query detector: {len(rows)} rows are too few to hold out {self.holdout:g} "
                    f"and keep k = {self.k} neighbours"
                )
            calibration, rows = rows[order[:cut]], rows[order[cut:]]
        else:
            calibration = _rows(held_out, "query detector")
            if calibration.shape[1] != rows.shape[1]:
                raise MemorizationDefenseError(
                    f"query detector: held-out rows of {calibration.shape[1]} values, training "
                    f"inputs of {rows.shape[1]}"
                )
        if len(rows) < self.k:
            raise MemorizationDefenseError(
                f"query detector: fewer reference rows than k = {self.k}"
            )
        self._reference = self._prepare(rows)
        scores = self._score(self._prepare(calibration), exclude_self=False)
        self.threshold = float(np.quantile(scores, 1.0 - self.fpr, method="higher"))
        return self

    def _prepare(self, rows: np.ndarray) -> np.ndarray:
        if self.metric == "cosine":
            norm = np.linalg.norm(rows, axis=1, keepdims=True)
            return np.divide(rows, norm, out=np.zeros_like(rows), where=norm > 0)
        return rows

    def _score(self, q: np.ndarray, exclude_self: bool) -> np.ndarray:
        assert self._reference is not None
        ref = self._reference
        k = min(self.k + (1 if exclude_self else 0), len(ref))
        out = np.empty(len(q))
        ref_sq = (ref**2).sum(1)
        for start in range(0, len(q), 512):
            block = q[start : start + 512]
            if self.metric == "cosine":
                dist = 1.0 - block @ ref.T
            else:
                sq = (block**2).sum(1)[:, None] - 2 * block @ ref.T + ref_sq[None, :]
                dist = np.sqrt(np.maximum(sq, 0.0))
            nearest = np.partition(dist, k - 1, axis=1)[:, :k]
            nearest.sort(axis=1)
            kth = nearest[:, min(self.k, k) - 1]
            if exclude_self:
                is_self = nearest[:, 0] <= 1e-9
                kth = np.where(is_self, nearest[:, -1], kth)
            out[start : start + len(block)] = kth
        return out

    def _fitted(self) -> float:
        if self.threshold is None or self._reference is None:
            raise MemorizationDefenseError("query detector: fit it on the training inputs first")
        return self.threshold

    def _queries(self, x: object) -> np.ndarray:
        self._fitted()
        rows = _rows(x, "query detector")
        width = self._reference.shape[1]  # type: ignore[union-attr]
        if rows.shape[1] != width:
            raise MemorizationDefenseError(
                f"query detector: inputs of {rows.shape[1]} values, fitted on {width}"
            )
        return self._prepare(rows)

    def score(self, x: object) -> np.ndarray:
        """The anomaly score of each input of the batch `x` (larger: less like the data)."""
        return self._score(self._queries(x), exclude_self=False)

    def flags(self, x: object) -> np.ndarray:
        """Boolean mask of the inputs whose score exceeds the threshold."""
        threshold = self._fitted()
        return self.score(x) > threshold

    def filter_training(self, x: object) -> np.ndarray:
        """Boolean mask of the rows of a training set `x` to keep (not anomalous); a row equal
        to a reference row is scored against the others (leave-one-out)."""
        threshold = self._fitted()
        return self._score(self._queries(x), exclude_self=True) <= threshold

    def monitor(self, block: bool = True) -> QueryWatch:
        """A query monitor for `Target.with_monitor`: counts flagged queries and, with `block`,
        refuses each batch holding one (`QueryRefused`, one line)."""
        self._fitted()
        return QueryWatch(self, block)

    def to_dict(self) -> dict[str, Any]:
        """Options and the fitted threshold, JSON-ready."""
        return {
            "k": self.k,
            "metric": self.metric,
            "fpr": self.fpr,
            "holdout": self.holdout,
            "seed": self.seed,
            "threshold": self.threshold,
        }


class QueryWatch:
    """The detector as a query monitor: `seen` queries, `flagged` among them, `refused`
    batches; raises QueryRefused on a batch with a flagged query when `block`."""

    def __init__(self, detector: QueryAnomalyDetector, block: bool) -> None:
        self.detector = detector
        self.block = bool(block)
        self.seen = 0
        self.flagged = 0
        self.refused = 0

    def __call__(self, x: Tensor) -> None:
        with torch.no_grad():
            hits = self.detector.flags(x)
        self.seen += len(hits)
        count = int(hits.sum())
        self.flagged += count
        if count and self.block:
            self.refused += 1
            raise QueryRefused(
                f"query anomaly detector: {count} of {len(hits)} queries look unlike the "
                f"training inputs (score above {self.detector.threshold:.4g}); refused"
            )

    def verdict(self) -> dict[str, Any]:
        """Queries seen, flagged and batches refused."""
        return {"seen": self.seen, "flagged": self.flagged, "refused": self.refused}
