"""Temperature scaling of the returned confidence vector (seed 004's "Temperature t = 5 / 20"
rows, after Shokri et al. 2017 Sec. VII "increase entropy of the prediction vector": the
softmax of the logits divided by t; here applied to the served probabilities).

Returns softmax(log p / t): since softmax(z) ∝ exp(z) and log p equals the logits up to a per-row
constant, this is exactly the softmax of the model's logits divided by t. t = 1 is the identity,
t > 1 flattens the vector towards uniform (t → ∞: uniform over the classes with p > 0), t < 1
sharpens it. A class the model gives probability 0 stays at 0. The map is strictly monotone
per row, so the arg-max is kept; where float rounding of the result makes two classes equal,
the model's arg-max is moved to the next float up so the label is still the model's.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from privacylab.defenses.base import OutputDefense, Parameter, register_defense
from privacylab.defenses.output import check_rows, first_max


@register_defense
class Temperature(OutputDefense):
    """Return softmax(log p / t) (seed 004's temperature rows; Shokri et al. 2017 Sec. VII)."""

    name = "temperature"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("t", float, 5.0, "temperature (> 1 flattens, 1 is the identity)", low=0,
                  low_open=True, high=1e6),
    )  # fmt: skip
    paper = (
        "Shokri et al. 2017, Membership Inference Attacks Against ML Models, Sec. VII "
        "(increase the entropy of the prediction vector)"
    )

    def transform(self, probs: Tensor) -> Tensor:
        """softmax(log p / t) per row, computed in float64 and returned in `probs`' dtype."""
        check_rows(self, probs)
        scaled = torch.softmax(probs.double().log() / float(self.params["t"]), dim=1)
        return first_max(scaled.to(probs.dtype), probs.argmax(1, keepdim=True))
