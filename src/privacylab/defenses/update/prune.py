"""Gradient pruning: the "gradient compression and sparsification" defence of Zhu et al. 2019
(Deep Leakage from Gradients, Sec. 5, Fig. 8: pruning ratios 1% ... 70%; from 20% on the
attack failed), the top-k sparsification of Lin et al. 2018 (Deep Gradient Compression):
in each tensor the fraction P of entries with the smallest magnitude is set to zero.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from privacylab.defenses.base import Parameter
from privacylab.defenses.update.base import UpdateDefense, register_update_defense

__all__ = ["GradientPruning", "pruned_count"]


def pruned_count(ratio: float, n: int) -> int:
    """How many of a tensor's `n` entries pruning at `ratio` zeroes: floor(ratio · n) (with a
    1e-9 allowance for the float error of the product), so at least one entry survives."""
    return min(n - 1, math.floor(ratio * n + 1e-9)) if n > 0 else 0


@register_update_defense
class GradientPruning(UpdateDefense):
    """Per tensor, the floor(P · n) smallest-magnitude entries set to zero (Zhu et al. 2019,
    Sec. 5, after Lin et al. 2018); ties are broken by position (stable sort), so the result
    is deterministic. No randomness."""

    name = "prune"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter(
            "ratio",
            float,
            None,
            "fraction of each tensor's entries (smallest magnitude first) set to zero",
            low=0.0,
            high=1.0,
            high_open=True,
        ),
    )
    paper = "Zhu et al. 2019, Deep Leakage from Gradients, Sec. 5; Lin et al. 2018, DGC"

    def transform(self, tensor: Tensor, generator: torch.Generator) -> Tensor:
        """A copy of `tensor` with its floor(P · n) smallest |entries| zeroed."""
        out = tensor.clone()
        k = pruned_count(self.params["ratio"], out.numel())
        if k:
            flat = out.view(-1)
            order = torch.sort(flat.abs(), stable=True).indices
            flat[order[:k]] = 0
        return out
