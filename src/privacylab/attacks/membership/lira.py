"""The likelihood-ratio attack, LiRA (Carlini, Chien, Nasr, Song, Terzis & Tramèr 2022,
"Membership Inference Attacks From First Principles", Algorithm 1).

For each candidate (x, y) the logit-scaled confidence φ = log p_y − log Σ_{y'≠y} p_{y'} of the
reference models that did (IN) and did not (OUT) train on it is fitted by Gaussians
N(μ_in, σ²_in), N(μ_out, σ²_out), one per augmented query. Online, the score is the log
likelihood ratio Σ_v [log N(φ_v; μ_in, σ_in) − log N(φ_v; μ_out, σ_out)] (Alg. 1, line 16).
Offline (Sec. VI-C), only OUT models are used and the one-sided test 1 − Pr[Z > φ],
Z ~ N(μ_out, σ²_out), is scored by its z-value averaged over the queries (a monotone, stable
form of the same test). With few references the variance is fixed across examples (Sec. VI-A).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.membership.base import (
    AttackScores,
    MembershipAttack,
    MembershipTask,
    register_attack,
)
from privacylab.attacks.membership.outputs import (
    identity_views,
    logit_confidence,
    reference_probabilities,
    shift_views,
    target_probabilities,
)
from privacylab.attacks.membership.result import AttackError
from privacylab.target import Access, Target

FIXED_VARIANCE_BELOW = 32
"""Below this many IN or OUT models per example the variance is fixed (Carlini et al., Fig. 6)."""


def _moments(
    obs: np.ndarray, mask: np.ndarray, fixed: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masked mean and std over references. obs: (R, V, n); mask: (R, n). Returns μ, σ of
    shape (V, n) and the counts (n,)."""
    w = mask[:, None, :].astype(np.float64)
    count = mask.sum(0)
    safe = np.maximum(count, 1)[None, :]
    mean = (obs * w).sum(0) / safe
    var = (((obs - mean[None]) ** 2) * w).sum(0) / np.maximum(safe - 1, 1)
    if fixed:
        pooled = (var * (count - 1)[None, :]).sum(1) / max(int((count - 1).clip(0).sum()), 1)
        var = np.broadcast_to(pooled[:, None], var.shape).copy()
    return mean, np.sqrt(np.maximum(var, 1e-12)), count


def _log_normal(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    return -0.5 * ((x - mean) / std) ** 2 - np.log(std)


class LiRA(MembershipAttack):
    """LiRA, online or offline; `fixed_variance=None` fixes it when a side has fewer than 32
    models; `shifts` > 0 adds the image shifted by up to that many pixels as extra queries."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.SCORES, ("population", "references"))
    online: ClassVar[bool]

    def __init__(self, fixed_variance: bool | None = None, shifts: int = 1) -> None:
        if isinstance(shifts, bool) or not isinstance(shifts, int) or shifts < 0:
            raise AttackError(f"shifts must be a whole number >= 0, got {shifts!r}")
        self.fixed_variance = fixed_variance
        self.shifts = shifts

    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        task.require_references(self.name, 2 if self.online else 1)
        assert task.keep is not None
        views = shift_views(self.shifts) if task.x.dim() == 4 else identity_views
        y = task.y.numpy()
        phi = np.stack(
            [logit_confidence(p, y) for p in target_probabilities(target, task.x, views)]
        )
        ref_probs = reference_probabilities(task, views, key=f"shifts={self.shifts}")
        ref_phi = ref_probs_to_phi(ref_probs, task.n, y)
        keep = task.keep[:, : task.n]
        fewest = min(int(keep.sum(0).min()), int((~keep).sum(0).min()))
        fixed = (
            fewest < FIXED_VARIANCE_BELOW if self.fixed_variance is None else self.fixed_variance
        )
        mu_out, sd_out, n_out = _moments(ref_phi, ~keep, fixed)
        params = {
            "online": self.online,
            "fixed_variance": bool(fixed),
            "queries_per_example": len(phi),
            "references": len(task.references),
        }
        offline = ((phi - mu_out) / sd_out).mean(0)
        if not self.online:
            if (n_out == 0).any():
                raise AttackError(
                    "offline LiRA needs at least one OUT model for every candidate; build the "
                    "references' keep mask with privacylab.attacks.membership.reference_keep, "
                    "which makes every example IN for half of them and OUT for the rest"
                )
            return AttackScores(offline, None, params)
        mu_in, sd_in, n_in = _moments(ref_phi, keep, fixed)
        ratio = (_log_normal(phi, mu_in, sd_in) - _log_normal(phi, mu_out, sd_out)).sum(0)
        lacking = (n_in == 0) | (n_out == 0)
        params["offline_fallbacks"] = int(lacking.sum())
        return AttackScores(np.where(lacking, offline, ratio), None, params)


def ref_probs_to_phi(ref_probs: np.ndarray, n: int, y: np.ndarray) -> np.ndarray:
    """φ of every reference on the n candidates, shape (R, V, n)."""
    return np.stack([np.stack([logit_confidence(p[:n], y) for p in r]) for r in ref_probs])


@register_attack("lira-online")
class OnlineLiRA(LiRA):
    """LiRA with IN and OUT models (Carlini et al. 2022, Alg. 1)."""

    name = "lira-online"
    online = True
    suite_order = 60
    aliases = ("lira",)


@register_attack("lira-offline")
class OfflineLiRA(LiRA):
    """LiRA with OUT models only (Carlini et al. 2022, Sec. VI-C)."""

    name = "lira-offline"
    online = False
    suite_order = 70
