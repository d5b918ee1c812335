"""Reverse sigmoid (Lee et al. 2019, "Defending Against NN Model Stealing Attacks Using
Deceptive Perturbations", IEEE S&P Workshops, Sec. 4, the perturbation r of Eq. (3)-(5)), with
exactly the formula of IBM ART's `ReverseSigmoid` post-processor so that the two compare like
with like.

For each probability p (clipped to [1e-9, 1 - 1e-9] inside the logit):

    r(p) = β · (σ(γ · σ⁻¹(p)) − 1/2),   σ⁻¹(p) = log(p / (1 − p)),
    q    = clip(p − r(p), 0, 1),         returned: q / Σ_classes q.

The same map f(p) = clip(p − r(p), 0, 1) is applied to every entry and the normalisation is a
positive per-row factor, so within a row the order of two classes is the order of f at their
probabilities. f is *not* monotone: its slope 1 − βγ·σ'(γ σ⁻¹(p)) / (p(1 − p)) is negative near
0 and near 1, so tiny probabilities are raised (f(0) = β(1/2 − σ(γ σ⁻¹(1e-9)))) and confident ones
lowered — that is the deception. It can reorder classes and change the arg-max (a row with
top probability 0.3 and many near-zero classes), as ART's does: `keeps_label = False`.
f(1 − p) = 1 − f(p) before clipping (symmetry of σ).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from privacylab.defenses.base import OutputDefense, Parameter, register_defense
from privacylab.defenses.output import check_rows

CLIP = 1e-9
"""Probabilities are clipped to [CLIP, 1 − CLIP] inside the logit (ART's value)."""


@register_defense
class ReverseSigmoid(OutputDefense):
    """Subtract β(σ(γ·logit p) − 1/2) from every probability, clip to [0, 1], renormalise
    (Lee et al. 2019, Sec. 4; ART's `ReverseSigmoid`)."""

    name = "reverse-sigmoid"
    keeps_label: ClassVar[bool] = False
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("beta", float, 1.0, "magnitude β of the perturbation", low=0, low_open=True,
                  high=1e6),
        Parameter("gamma", float, 0.1, "convergence γ (slope inside the sigmoid)", low=0,
                  low_open=True, high=1e6),
    )  # fmt: skip
    paper = (
        "Lee et al. 2019, Defending Against NN Model Stealing Attacks Using Deceptive "
        "Perturbations, Sec. 4"
    )

    def perturbation(self, probs: Tensor) -> Tensor:
        """r(p) = β(σ(γ log(p / (1 − p))) − 1/2), p clipped to [1e-9, 1 − 1e-9] (float64)."""
        p = probs.double().clamp(CLIP, 1.0 - CLIP)
        beta, gamma = float(self.params["beta"]), float(self.params["gamma"])
        return beta * (torch.sigmoid(gamma * torch.log(p / (1.0 - p))) - 0.5)

    def transform(self, probs: Tensor) -> Tensor:
        """clip(p − r(p), 0, 1) renormalised per row; a row that clips to all zeros (only
        possible with one class) is returned unchanged."""
        check_rows(self, probs)
        q = (probs.double() - self.perturbation(probs)).clamp(0.0, 1.0)
        sums = q.sum(1, keepdim=True)
        empty = sums <= 0
        out = torch.where(empty, probs.double(), q / torch.where(empty, 1.0, sums))
        return out.to(probs.dtype)
