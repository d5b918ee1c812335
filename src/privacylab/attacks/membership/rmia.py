"""RMIA, the robust membership inference attack (Zarifzadeh, Liu, Lee & Shokri 2024, "Low-Cost
High-Power Membership Inference Attacks", Sec. 3, Eqs. 3–5 and App. B.2.2 for offline Pr(x)).

LR(x, z) = [Pr(x|θ)/Pr(x)] / [Pr(z|θ)/Pr(z)] with Pr(·|θ) the target's probability of the true
label and Pr(·) its average over reference models; Score(x) = Pr_z[LR(x, z) ≥ γ] over population
points z the target never trained on. Offline, Pr(x) is estimated from OUT models only and
corrected by the linear approximation Pr(x) = ½[(1 + a)·Pr_OUT(x) + (1 − a)]; `a` is tuned, as
the paper does, by attacking one reference model with the others and keeping the `a` with the
best AUC. With a shared population the score is a monotone function of the ratio for x, so ties
of the count are broken by that ratio (adding less than one count step).
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
    reference_probabilities,
    target_probabilities,
    true_class_probability,
)
from privacylab.attacks.membership.result import AttackError
from privacylab.stats import roc_auc
from privacylab.target import Access, Target

A_GRID = tuple(np.round(np.linspace(0.0, 1.0, 11), 2))


class RMIA(MembershipAttack):
    """RMIA; `a=None` tunes a on the references, `gamma` is γ, `population` caps |Z|."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.SCORES, ("population", "references"))
    suite_order: ClassVar[float] = 80
    name = "rmia"

    def __init__(
        self,
        a: float | None = None,
        gamma: float = 1.0,
        population: int = 2500,
        online: bool = False,
    ) -> None:
        if a is not None and not 0.0 <= a <= 1.0:
            raise AttackError(f"a must lie in [0, 1], got {a!r}")
        if not gamma > 0:
            raise AttackError(f"gamma must be > 0, got {gamma!r}")
        if isinstance(population, bool) or population < 1:
            raise AttackError(f"population must be a whole number >= 1, got {population!r}")
        self.a, self.gamma, self.population, self.online = a, gamma, population, online

    def _prior(self, ref_p: np.ndarray, keep: np.ndarray, a: float) -> np.ndarray:
        """Pr(x) from reference probabilities (R, k) and their keep mask (R, k)."""
        if self.online:
            return ref_p.mean(0)
        out = ~keep
        p_out = (ref_p * out).sum(0) / np.maximum(out.sum(0), 1)
        return 0.5 * ((1.0 + a) * p_out + (1.0 - a))

    def _scores(
        self, p_x: np.ndarray, prior_x: np.ndarray, p_z: np.ndarray, prior_z: np.ndarray
    ) -> np.ndarray:
        ratio_x = np.log(np.maximum(p_x, 1e-300)) - np.log(np.maximum(prior_x, 1e-300))
        ratio_z = np.sort(np.log(np.maximum(p_z, 1e-300)) - np.log(np.maximum(prior_z, 1e-300)))
        count = np.searchsorted(ratio_z, ratio_x - np.log(self.gamma), side="right")
        tie = 1.0 / (1.0 + np.exp(-np.clip(ratio_x, -700, 700)))
        return (count + tie) / (len(ratio_z) + 1)

    def _tune_a(self, ref_p: np.ndarray, keep: np.ndarray, n: int, z: np.ndarray) -> float:
        """The a whose RMIA, run against reference 0 with the others as references, has the
        best AUC on the candidates (Zarifzadeh et al. 2024, Sec. 4, "choosing a")."""
        best, best_auc = 1.0, -1.0
        others, others_keep = ref_p[1:], keep[1:]
        truth = keep[0, :n]
        for a in A_GRID:
            prior = self._prior(others, others_keep, a)
            scores = self._scores(ref_p[0, :n], prior[:n], ref_p[0, n:][z], prior[n:][z])
            auc = roc_auc(scores, truth.astype(np.int64))
            if auc > best_auc + 1e-9:
                best, best_auc = float(a), auc
        return best

    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        task.require_references(self.name, 2 if self.a is None and not self.online else 1)
        if task.m == 0:
            raise AttackError("rmia needs population data the target never trained on")
        assert task.keep is not None
        n = task.n
        all_y = task.all_y().numpy()
        ref_p = np.stack(
            [true_class_probability(r[0], all_y) for r in reference_probabilities(task)]
        )
        rng = np.random.default_rng(0)
        z = np.sort(rng.permutation(task.m)[: self.population])
        a = self.a
        if a is None and not self.online:
            a = self._tune_a(ref_p, task.keep, n, z)
        prior = self._prior(ref_p, task.keep, a if a is not None else 1.0)
        probs = target_probabilities(target, task.all_x()[np.r_[np.arange(n), n + z]])[0]
        p_all = true_class_probability(probs, all_y[np.r_[np.arange(n), n + z]])
        scores = self._scores(p_all[:n], prior[:n], p_all[n:], prior[n:][z])
        params = {
            "a": a,
            "gamma": self.gamma,
            "population": len(z),
            "online": self.online,
            "references": len(task.references),
        }
        return AttackScores(scores, None, params)


register_attack("rmia")(RMIA)
