"""Label-only output (Shokri et al. 2017, Sec. VII "Mitigation": top k = 1 *label*, "the model
only returns the label of the most likely class without reporting its probability").

The deployment is served at `Access.LABEL`; where a caller still reads vectors (the target's
own `labels` goes through them), each row is the one-hot of the model's arg-max. ART's
`ClassLabels` is the same idea.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from privacylab.defenses.base import OutputDefense, register_defense
from privacylab.defenses.output import check_rows
from privacylab.target import Access


@register_defense
class LabelOnly(OutputDefense):
    """Return only the predicted label: the one-hot of each row's arg-max (Shokri et al.
    2017, Sec. VII, "top k = 1 label")."""

    name = "label-only"
    serves: ClassVar[Access] = Access.LABEL
    paper = "Shokri et al. 2017, Membership Inference Attacks Against ML Models, Sec. VII"

    def transform(self, probs: Tensor) -> Tensor:
        """One-hot rows of the arg-max (first of equal maxima), in `probs`' dtype."""
        check_rows(self, probs)
        return torch.zeros_like(probs).scatter_(1, probs.argmax(1, keepdim=True), 1.0)
