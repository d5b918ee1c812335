"""Top-k confidence masking (Shokri et al. 2017, Membership Inference Attacks Against Machine
Learning Models, Sec. VII "Mitigation": "restrict the prediction vector to top k classes").

Only the k largest probabilities of each row are returned; the others are set to 0. The kept
values are returned as they are (not renormalised), as in the paper, so the attacker sees exactly
the model's top-k scores. Ties are broken by class index (a stable descending sort), so the
arg-max is the model's own (`torch.argmax` also picks the first of equal maxima). The k-th
largest value is the threshold; only rows with more than k entries at or above it (ties at the
threshold) are resolved class by class.

ART has no exact twin: its `HighConfidence(cutoff)` zeroes every score below a fixed cutoff,
which may return more or fewer than k scores (none at all when the top score is below it).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from privacylab.defenses.base import OutputDefense, Parameter, register_defense
from privacylab.defenses.output import check_rows


@register_defense
class TopK(OutputDefense):
    """Keep the k highest probabilities of each row, zero the rest (Shokri et al. 2017,
    Sec. VII)."""

    name = "topk"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("k", int, 3, "number of classes whose probability is returned", low=1),
    )
    paper = "Shokri et al. 2017, Membership Inference Attacks Against ML Models, Sec. VII"

    def transform(self, probs: Tensor) -> Tensor:
        """Rows with all but their k largest entries set to 0 (ties: lower class index kept)."""
        check_rows(self, probs)
        k = min(int(self.params["k"]), probs.shape[1])
        if k == probs.shape[1]:
            return probs.clone()
        kth = probs.topk(k, dim=1).values[:, -1:]
        keep = probs >= kth
        crowded = keep.sum(1) > k
        if bool(crowded.any()):
            rows = keep[crowded]
            above = probs[crowded] > kth[crowded]
            room = k - above.sum(1, keepdim=True)
            equal = rows & ~above
            keep[crowded] = above | (equal & (equal.cumsum(1) <= room))
        return torch.where(keep, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
