"""What a report decides: the strongest attack per target, the verdict against a threshold on
TPR at low FPR, and per-example risk scores. numpy/scipy only.

The decision metric is the true positive rate at 0.1% false positive rate (Carlini et al. 2022,
"Membership Inference Attacks From First Principles", Sec. 4): an attack that identifies members
reliably while almost never wrongly accusing a non-member. AUC, balanced accuracy and the ε lower
bound are never used to rank attacks: a threshold-free attack can have a large ε lower bound
from a single operating point while identifying no member at 1% FPR.

A TPR measured on n members is noisy (5 of 1,000 members is 0.5%, and the best of 13 attacks is
biased upwards), so the verdict compares a one-sided Clopper–Pearson (1934) lower confidence
bound on each attack's TPR, Bonferroni-corrected over the attacks, with the threshold: a target
leaks when some attack's TPR is above the threshold with `VERDICT_CONFIDENCE` overall.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.stats import rankdata

from privacylab.report.metrics import clopper_pearson

if TYPE_CHECKING:
    from privacylab.report.metrics import ScoredResult

VERDICT_METRIC = "tpr_at_01pct_fpr"
VERDICT_FPR = 1e-3
DEFAULT_VERDICT_THRESHOLD = 2 * VERDICT_FPR
"""A target "leaks" when an attack's TPR at 0.1% FPR is above this (2× chance), with
`VERDICT_CONFIDENCE`."""
VERDICT_CONFIDENCE = 0.95

RISK_METHOD = (
    "percentile rank (0 to 1, 1 = most exposed) of each candidate's score under the strongest "
    "attack that scored every candidate, strongest by TPR at 0.1% FPR, then TPR at 1% FPR, "
    "then AUC; ties share their average rank"
)
MOST_EXPOSED = 10


def _value(attack: Mapping[str, Any], key: str) -> float:
    value = attack.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return -math.inf
    return float(value)


def strength_key(attack: Mapping[str, Any]) -> tuple[float, float, float]:
    """Sort key of an attack's strength: TPR at 0.1% FPR, then TPR at 1% FPR, then AUC."""
    return (
        _value(attack, "tpr_at_01pct_fpr"),
        _value(attack, "tpr_at_1pct_fpr"),
        _value(attack, "auc"),
    )


def strongest_attack(attacks: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The attack (a metrics dict) with the highest `strength_key`, None when there is none.
    Ties keep the first attack."""
    best: Mapping[str, Any] | None = None
    for attack in attacks:
        if not isinstance(attack, Mapping):
            continue
        if best is None or strength_key(attack) > strength_key(best):
            best = attack
    return best


def check_threshold(threshold: float) -> float:
    """`threshold` as a float in [0, 1), or ValueError."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise ValueError(f"verdict threshold must be a number in [0, 1), got {threshold!r}")
    if not 0.0 <= float(threshold) < 1.0:
        raise ValueError(f"verdict threshold must be in [0, 1), got {threshold!r}")
    return float(threshold)


def attack_members(attack: Mapping[str, Any], target: Mapping[str, Any]) -> int | None:
    """How many members the attack was scored on: its `members`, else the target's when the
    attack scored every candidate, else half its examples (balanced subsample); None if unknown."""
    value = attack.get("members")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    examples = attack.get("examples")
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 2:
        return None
    members, nonmembers = target.get("members"), target.get("nonmembers")
    if (
        isinstance(members, int)
        and isinstance(nonmembers, int)
        and members + nonmembers == examples
    ):
        return members
    return examples // 2


def tpr_lower_bound(tpr: float, members: int, confidence: float) -> float:
    """One-sided Clopper–Pearson lower bound at `confidence` on a TPR measured as a fraction of
    `members`: Beta⁻¹(1 − confidence; k, n − k + 1) with k = round(tpr · n), 0 when k = 0."""
    k = min(members, max(0, round(tpr * members)))
    if k == 0:
        return 0.0
    return clopper_pearson(k, members, confidence=1.0 - 2.0 * (1.0 - confidence))[0]


def target_verdict(
    target: Mapping[str, Any],
    threshold: float = DEFAULT_VERDICT_THRESHOLD,
    confidence: float = VERDICT_CONFIDENCE,
) -> dict[str, Any]:
    """The verdict on one target (a payload target with `attacks`).

    Each attack's TPR at 0.1% FPR gets a one-sided Clopper–Pearson lower bound at confidence
    1 − (1 − `confidence`)/k for k attacks (Bonferroni); the verdict's attack is the one with the
    largest lower bound (then by `strength_key`). `leaks` is True when that lower bound exceeds
    `threshold`, False when not, None when no attack has a TPR at 0.1% FPR. When an attack's
    member count is unknown its bound is its measured TPR.
    """
    attacks = [a for a in target.get("attacks") or [] if isinstance(a, Mapping)]
    scored = [a for a in attacks if _value(a, "tpr_at_01pct_fpr") > -math.inf]
    each = 1.0 - (1.0 - confidence) / max(1, len(scored))
    out: dict[str, Any] = {
        "metric": VERDICT_METRIC,
        "fpr": VERDICT_FPR,
        "threshold": float(threshold),
        "confidence": float(confidence),
        "attack": None,
        "tpr_at_01pct_fpr": None,
        "tpr_lower_bound": None,
        "tpr_at_1pct_fpr": None,
        "auc": None,
        "examples": None,
        "members": None,
        "leaks": None,
    }
    best: tuple[tuple[float, ...], Mapping[str, Any], float, int | None] | None = None
    for attack in scored:
        tpr = _value(attack, "tpr_at_01pct_fpr")
        members = attack_members(attack, target)
        low = tpr if members is None else tpr_lower_bound(tpr, members, each)
        key = (low, *strength_key(attack))
        if best is None or key > best[0]:
            best = (key, attack, low, members)
    if best is None:
        return out
    _, attack, low, members = best
    out.update(
        attack=attack.get("attack"),
        tpr_at_01pct_fpr=attack.get("tpr_at_01pct_fpr"),
        tpr_lower_bound=low,
        tpr_at_1pct_fpr=attack.get("tpr_at_1pct_fpr"),
        auc=attack.get("auc"),
        examples=attack.get("examples"),
        members=members,
        leaks=bool(low > threshold),
    )
    return out


def risk_scores(
    results: Sequence[ScoredResult],
    metrics: Sequence[Mapping[str, Any]],
    *,
    labels: Any,
    indices: Any | None = None,
    top: int = MOST_EXPOSED,
) -> dict[str, Any] | None:
    """Per-example membership risk of one target's candidates, and its most exposed members.

    Risk is `RISK_METHOD`: only attacks that scored every candidate qualify (label-only attacks
    run on a subsample). `labels` are the candidates' class labels and `indices` their rows in
    the dataset (None when unknown: `candidate` positions are given instead). Returns None when
    no attack scored every candidate. Columns are parallel lists, risk rounded to 4 digits.
    """
    if not results:
        return None
    n = max(int(np.asarray(r.scores).size) for r in results)
    full = [(r, m) for r, m in zip(results, metrics, strict=True) if r.scores.size == n]
    best = strongest_attack([m for _, m in full])
    if best is None:
        return None
    result = next(r for r, m in full if m is best)
    risk = rankdata(result.scores, method="average") / n
    member = np.asarray(result.membership, dtype=np.int64)
    label_list = np.asarray(labels).reshape(-1).astype(np.int64).tolist()
    index_list = None if indices is None else np.asarray(indices).reshape(-1).tolist()
    if len(label_list) != n or (index_list is not None and len(index_list) != n):
        return None
    order = [int(i) for i in np.argsort(-risk, kind="stable") if member[i] == 1][:top]
    exposed = [
        {
            "candidate": i,
            "index": None if index_list is None else int(index_list[i]),
            "label": label_list[i],
            "risk": round(float(risk[i]), 4),
            "score": float(result.scores[i]) if np.isfinite(result.scores[i]) else None,
        }
        for i in order
    ]
    return {
        "method": RISK_METHOD,
        "attack": result.attack,
        "index": index_list,
        "label": label_list,
        "member": member.tolist(),
        "risk": np.round(risk, 4).tolist(),
        "most_exposed": exposed,
    }
