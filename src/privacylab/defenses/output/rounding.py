"""Rounding the confidence vector to d decimals (Shokri et al. 2017, Membership Inference
Attacks Against ML Models, Sec. VII "Mitigation": "round classification probabilities down to
d floating point digits").

Every probability is rounded to the nearest multiple of 10^-d (half to even, as numpy's and
ART's `Rounded`), so every entry moves by at most 0.5·10^-d. Rounding is monotone, so the
model's arg-max is still a maximum of the rounded row, but it may tie with other classes (0.47
and 0.46 both round to 0.5 at d = 1 and to 0 at d = 0), and then the served label (the first
maximum) could change. We keep the model's label: in a row whose rounded maximum is shared,
the model's arg-max alone is lifted one step (10^-d) above the others, so it is the unique
maximum. That entry then differs from the model's probability by at most 1.5·10^-d; every
other entry, and every entry of a row without a tie, by at most 0.5·10^-d. ART's `Rounded`
does not do this (it returns the ties and the label may change).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from privacylab.defenses.base import OutputDefense, Parameter, register_defense
from privacylab.defenses.output import check_rows


@register_defense
class Rounding(OutputDefense):
    """Round each probability to `d` decimals, keeping the model's arg-max the unique maximum
    (Shokri et al. 2017, Sec. VII)."""

    name = "rounding"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("d", int, 3, "decimals kept (0: every score becomes 0 or 1)", low=0, high=15),
    )
    paper = "Shokri et al. 2017, Membership Inference Attacks Against ML Models, Sec. VII"

    def transform(self, probs: Tensor) -> Tensor:
        """Rows rounded to d decimals; in a row whose maximum is shared after rounding, the
        model's arg-max is raised by 10^-d."""
        check_rows(self, probs)
        d = int(self.params["d"])
        rounded = torch.round(probs.double(), decimals=d)
        top = rounded.max(1, keepdim=True).values
        tied = (rounded == top).sum(1) > 1
        if bool(tied.any()):
            label = probs[tied].argmax(1, keepdim=True)
            rows = rounded[tied]
            lifted = rows.gather(1, label) + 10.0**-d
            rounded[tied] = rows.scatter(1, label, lifted)
        return rounded.to(probs.dtype)
