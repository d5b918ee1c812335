"""Per-example statistics of model outputs shared by the confidence-based attacks, and the
reference models' outputs on the attacker's data.

All statistics are computed in float64 from probability vectors, the way an attacker with
score access sees them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from privacylab.attacks.membership.base import MembershipTask
from privacylab.target import Access, Target

TINY = 1e-300


def true_class_probability(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """p_y(x), the probability given to the true label."""
    return probs[np.arange(len(y)), y]


def logit_confidence(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """φ(p) = log p_y − log Σ_{y'≠y} p_{y'} (Carlini et al. 2022, Sec. IV-B, "logit scaling").

    The sum over the other classes is taken directly rather than as 1 − p_y, so the statistic
    stays finite and ordered when p_y rounds to 1.
    """
    p_y = true_class_probability(probs, y)
    others = probs.copy()
    others[np.arange(len(y)), y] = 0.0
    return np.log(np.maximum(p_y, TINY)) - np.log(np.maximum(others.sum(1), TINY))


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy H(p) = −Σ p_i log p_i (Song & Mittal 2021, Eq. 4)."""
    return -(probs * np.log(np.maximum(probs, TINY))).sum(1)


def modified_entropy(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mentr(p, y) = −(1 − p_y) log p_y − Σ_{i≠y} p_i log(1 − p_i) (Song & Mittal 2021, Eq. 5)."""
    p_y = true_class_probability(probs, y)
    others = probs * np.log(np.maximum(1.0 - probs, TINY))
    others[np.arange(len(y)), y] = 0.0
    return -(1.0 - p_y) * np.log(np.maximum(p_y, TINY)) - others.sum(1)


def cross_entropy(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The loss −log p_y (Yeom et al. 2018)."""
    return -np.log(np.maximum(true_class_probability(probs, y), TINY))


Views = Callable[[Tensor], list[Tensor]]


def identity_views(x: Tensor) -> list[Tensor]:
    """Only the example itself."""
    return [x]


def shift_views(shifts: int) -> Views:
    """The image and its copies shifted by ±1..`shifts` pixels along each axis (zero padded),
    the "augmented queries" of Carlini et al. 2022, Sec. V-D, for data without mirror symmetry."""

    def views(x: Tensor) -> list[Tensor]:
        if x.dim() != 4 or shifts == 0:
            return [x]
        out = [x]
        for s in range(1, shifts + 1):
            for dy, dx in ((s, 0), (-s, 0), (0, s), (0, -s)):
                shifted = torch.roll(x, shifts=(dy, dx), dims=(2, 3))
                if dy > 0:
                    shifted[:, :, :dy, :] = 0
                elif dy < 0:
                    shifted[:, :, dy:, :] = 0
                if dx > 0:
                    shifted[:, :, :, :dx] = 0
                elif dx < 0:
                    shifted[:, :, :, dx:] = 0
                out.append(shifted)
        return out

    return views


def target_probabilities(target: Target, x: Tensor, views: Views = identity_views) -> np.ndarray:
    """The target's probability vectors, shape (views, n, classes)."""
    return np.stack([target.probabilities(v).double().numpy() for v in views(x)])


def reference_probabilities(
    task: MembershipTask, views: Views = identity_views, key: str = "plain"
) -> np.ndarray:
    """Every reference model's probabilities on candidates then population, shape
    (R, views, n + m, classes); cached on the task under `key` (references are the attacker's
    own models, so these calls are not target queries)."""
    cache = task.reference_outputs
    if key not in cache:
        x = task.all_x()
        refs = task.reference_targets(Access.SCORES)
        cache[key] = np.stack(
            [np.stack([r.probabilities(v).double().numpy() for v in views(x)]) for r in refs]
        )
    return cache[key]


def best_threshold(scores: np.ndarray, members: np.ndarray) -> float:
    """The threshold τ maximising balanced accuracy of "member iff score ≥ τ" on labelled
    scores — reference in/out outputs (Song & Mittal 2021, Sec. III-B: thresholds chosen on
    shadow data); +inf (nobody is a member) when one class is absent or nothing beats chance."""
    scores = np.asarray(scores, dtype=np.float64)
    members = np.asarray(members, dtype=bool)
    inside, outside = np.sort(scores[members]), np.sort(scores[~members])
    if inside.size == 0 or outside.size == 0:
        return math.inf
    candidates = np.unique(scores)
    tpr = 1.0 - np.searchsorted(inside, candidates, side="left") / inside.size
    tnr = np.searchsorted(outside, candidates, side="left") / outside.size
    balanced = (tpr + tnr) / 2
    best = int(np.argmax(balanced))
    return float(candidates[best]) if balanced[best] > 0.5 else math.inf
