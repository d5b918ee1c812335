"""Metric-based membership attacks: threshold one statistic of the target's output.

Loss (Yeom et al. 2018, "Privacy Risk in Machine Learning", Sec. 3.2), confidence, entropy and
modified entropy (Song & Mittal 2021, "Systematic Evaluation of Privacy Risks of Machine
Learning Models", Eqs. 3–5). The threshold is global or one per class, and is chosen on the
reference (shadow) models' outputs on data whose membership the attacker knows — never on the
target's candidates. Without reference models the attack still scores (AUC is threshold-free) but
makes no hard decisions.
"""

from __future__ import annotations

from collections.abc import Callable
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
    best_threshold,
    cross_entropy,
    entropy,
    modified_entropy,
    reference_probabilities,
    target_probabilities,
    true_class_probability,
)
from privacylab.attacks.membership.result import AttackError
from privacylab.target import Access, Target

Statistic = Callable[[np.ndarray, np.ndarray], np.ndarray]


class MetricAttack(MembershipAttack):
    """Member iff statistic(p, y) ≥ τ, with τ global or τ_y per class (Song & Mittal 2021,
    Sec. III-B). Statistics are signed so that members score higher."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.SCORES, ("population", "references"))
    statistic: ClassVar[Statistic]

    def __init__(self, thresholds: str = "class") -> None:
        if thresholds not in ("global", "class"):
            raise AttackError(f"thresholds must be 'global' or 'class', got {thresholds!r}")
        self.thresholds = thresholds

    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        y = task.y.numpy()
        values = type(self).statistic(target_probabilities(target, task.x)[0], y)
        params = {"thresholds": self.thresholds, "references": len(task.references)}
        if not task.references:
            return AttackScores(values, None, params)
        assert task.keep is not None
        all_y = task.all_y().numpy()
        ref_values = np.concatenate(
            [type(self).statistic(p[0], all_y) for p in reference_probabilities(task)]
        )
        ref_labels = np.tile(all_y, len(task.references))
        ref_member = task.keep.reshape(-1)
        tau = np.full(task.num_classes, best_threshold(ref_values, ref_member))
        if self.thresholds == "class":
            for c in range(task.num_classes):
                rows = ref_labels == c
                if rows.any():
                    tau[c] = best_threshold(ref_values[rows], ref_member[rows])
        shift = np.where(np.isfinite(tau[y]), tau[y], 0.0)
        scores = values - shift
        predictions = (values >= tau[y]).astype(np.int64)
        params["threshold"] = tau.tolist() if self.thresholds == "class" else float(tau[0])
        return AttackScores(scores, predictions, params)


def _negative(fn: Statistic) -> Statistic:
    return lambda probs, y: -fn(probs, y)


@register_attack("loss")
class LossAttack(MetricAttack):
    """Member iff −log p_y ≤ τ (Yeom et al. 2018)."""

    name = "loss"
    suite_order = 10
    statistic = staticmethod(_negative(cross_entropy))


@register_attack("confidence")
class ConfidenceAttack(MetricAttack):
    """Member iff p_y ≥ τ (Song & Mittal 2021, Eq. 3)."""

    name = "confidence"
    suite_order = 20
    statistic = staticmethod(true_class_probability)


@register_attack("entropy")
class EntropyAttack(MetricAttack):
    """Member iff H(p) ≤ τ (Song & Mittal 2021, Eq. 4)."""

    name = "entropy"
    suite_order = 30
    statistic = staticmethod(lambda probs, y: -entropy(probs))


@register_attack("modified-entropy")
class ModifiedEntropyAttack(MetricAttack):
    """Member iff Mentr(p, y) ≤ τ (Song & Mittal 2021, Eq. 5)."""

    name = "modified-entropy"
    suite_order = 40
    statistic = staticmethod(_negative(modified_entropy))
