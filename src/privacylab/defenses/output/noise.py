"""Additive Gaussian noise on the confidence vector, the post-processor IBM ART ships as
`GaussianNoise` (art/defences/postprocessor/gaussian_noise.py), seeded and label-keeping.

Each query draws fresh noise N(0, scale²) per entry from the defence's own generator (seeded by
`seed`: the same seed and the same sequence of queries give the same answers), adds it to the
probabilities, clips negative entries to 0 and divides each row by its sum — ART's recipe.

Unlike ART's, the label is kept: where the noise makes another class the maximum, the values
of that class and of the model's arg-max are swapped, so the served label is the model's and
the row is a permutation of the noisy row (the same multiset of values, the same entropy).
A row whose entries all fall below 0 (possible with large `scale` and few classes; ART returns
NaN there) is returned as the one-hot of the model's arg-max. Repeated queries of one example
get independent noise, so an attacker who may repeat queries can average it away; the query
budget of the `Target` is what bounds that.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from privacylab.defenses.base import OutputDefense, Parameter, register_defense, seeded_generator
from privacylab.defenses.output import check_rows, first_max


@register_defense
class GaussianNoise(OutputDefense):
    """Add N(0, scale²) noise to every probability, clip at 0, renormalise, keep the label
    (the recipe of ART's `GaussianNoise` post-processor, with a seeded generator)."""

    name = "noise"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("scale", float, 0.1, "standard deviation of the noise on each probability",
                  low=0, low_open=True, high=1e3),
        Parameter("seed", int, 0, "seed of the defence's own noise generator", low=0),
    )  # fmt: skip
    paper = (
        "IBM Adversarial Robustness Toolbox, art.defences.postprocessor.GaussianNoise "
        "(Nicolae et al. 2018, arXiv:1807.01069)"
    )

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        self._generator = seeded_generator(self.params["seed"])

    def transform(self, probs: Tensor) -> Tensor:
        """Noisy rows: p + N(0, scale²), clipped at 0, renormalised, the model's arg-max
        swapped back to the top where the noise moved it."""
        check_rows(self, probs)
        noise = torch.randn(probs.shape, generator=self._generator, dtype=torch.float64)
        noisy = (probs.double() + float(self.params["scale"]) * noise.to(probs.device)).clamp_min(0)
        sums = noisy.sum(1, keepdim=True)
        label = probs.argmax(1, keepdim=True)
        empty = sums <= 0
        onehot = F.one_hot(label[:, 0], probs.shape[1]).to(noisy.dtype)
        rows = torch.where(empty, onehot, noisy / torch.where(empty, 1.0, sums))
        top = rows.argmax(1, keepdim=True)
        at_label, at_top = rows.gather(1, label), rows.gather(1, top)
        rows = rows.scatter(1, top, at_label).scatter(1, label, at_top)
        return first_max(rows.to(probs.dtype), label)
