"""The shadow-model attack (Shokri, Stronati, Song & Shmatikov 2017, "Membership Inference
Attacks Against Machine Learning Models", Sec. IV).

k shadow models are trained like the target on data whose membership the attacker knows (here
the reference models and their keep masks). For every class c an attack model learns, from the
shadow models' probability vectors on examples of class c, whether the example was IN; it is then
applied to the target's probability vector. Attack models are gradient-boosted trees on the
log-probabilities sorted and in class order, with the true class's log-probability as an extra
column (Shokri et al. used small neural networks; trees need no tuning). They run on one thread:
OpenMP in scikit-learn next to torch's own pool slows them a hundredfold.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from threadpoolctl import threadpool_limits

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.membership.base import (
    AttackScores,
    MembershipAttack,
    MembershipTask,
    register_attack,
)
from privacylab.attacks.membership.outputs import reference_probabilities, target_probabilities
from privacylab.attacks.membership.result import AttackError
from privacylab.target import Access, Target


def _features(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    logp = np.log(np.maximum(probs, 1e-30))
    true = logp[np.arange(len(y)), y]
    return np.column_stack([np.sort(logp, 1)[:, ::-1], true, logp])


@register_attack("shadow")
class ShadowModelAttack(MembershipAttack):
    """Per-class attack models trained on `shadows` shadow models (all references if None)."""

    name = "shadow"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.SCORES, ("population", "references"))
    suite_order: ClassVar[float] = 50

    def __init__(self, shadows: int | None = None, max_iter: int = 100, seed: int = 0) -> None:
        if shadows is not None and (isinstance(shadows, bool) or shadows < 1):
            raise AttackError(f"shadows must be a whole number >= 1, got {shadows!r}")
        self.shadows, self.max_iter, self.seed = shadows, max_iter, seed

    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        task.require_references(self.name)
        assert task.keep is not None
        k = min(self.shadows or len(task.references), len(task.references))
        all_y = task.all_y().numpy()
        ref_probs = reference_probabilities(task)[:k, 0]
        train_x = np.concatenate([_features(p, all_y) for p in ref_probs])
        train_y = task.keep[:k].reshape(-1).astype(np.int64)
        train_c = np.tile(all_y, k)
        y = task.y.numpy()
        test_x = _features(target_probabilities(target, task.x)[0], y)
        scores = np.full(task.n, 0.5)
        for c in range(task.num_classes):
            rows, cols = train_c == c, y == c
            if not cols.any():
                continue
            labels = train_y[rows]
            if len(np.unique(labels)) < 2:
                scores[cols] = labels.mean() if len(labels) else 0.5
                continue
            model = HistGradientBoostingClassifier(
                max_iter=self.max_iter, early_stopping=False, random_state=self.seed
            )
            with threadpool_limits(1):
                model.fit(train_x[rows], labels)
                scores[cols] = model.predict_proba(test_x[cols])[:, 1]
        predictions = (scores >= 0.5).astype(np.int64)
        return AttackScores(scores, predictions, {"shadows": k, "per_class": True})
