"""Top-k confidence masking (Shokri et al. 2017, Sec. VII "Mitigation": "restrict the
prediction vector to top k classes").

Only the k largest probabilities are returned; the others are set to 0. The kept values are
returned as they are (not renormalised), as in the paper and ART's `HighConfidence`-style
post-processors, so the attacker sees exactly the model's top-k scores. Ties are broken by
class index, so the arg-max is the model's own.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from privacylab.defenses.base import OutputDefense, Parameter, register_defense


@register_defense
class TopK(OutputDefense):
    """Keep the k highest probabilities of each row, zero the rest."""

    name = "topk"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("k", int, 3, "number of classes whose probability is returned", low=1),
    )
    paper = "Shokri et al. 2017, Membership Inference Attacks Against ML Models, Sec. VII"

    def transform(self, probs: Tensor) -> Tensor:
        """Rows with all but their k largest entries set to 0."""
        k = min(int(self.params["k"]), probs.shape[1])
        top = probs.topk(k, dim=1).indices
        out = torch.zeros_like(probs)
        return out.scatter_(1, top, probs.gather(1, top))
