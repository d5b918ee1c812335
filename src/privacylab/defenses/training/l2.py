"""L2-norm regularisation (seed 004, "Mitigating MIA"; Shokri et al. 2017, Sec. VII,
"Regularization"): train on ``loss + λ·(w₁² + w₂² + … + w_p²)``.

The penalty is the trainer's `weight_decay`, mapped exactly: its gradient is 2λ·w, and
`torch.optim.SGD`/`Adam` with `weight_decay = wd` add wd·w to every parameter's gradient
(before momentum or Adam's moments), the gradient of (wd/2)·‖w‖². So wd = 2λ — the factor 2
is the difference between the seed's λ‖w‖² and the optimiser's (wd/2)‖w‖². Every trainable
parameter is penalised (biases too), as in the seed's sum over all weights. Under DP-SGD the
decay is applied after clipping and noise (post-processing, no privacy cost), which is also why
it is not a per-example regulariser (`privacylab.training.hooks`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from privacylab.defenses.base import Parameter, TrainingDefense, register_defense
from privacylab.training import TrainConfig


@register_defense
class L2(TrainingDefense):
    """Add λ·Σw² to the training loss (through `weight_decay = 2λ`, added to the recipe's own)."""

    name = "l2"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("lam", float, 1e-3, "λ of the penalty λ·Σw² added to the loss", low=0.0),
    )
    paper = (
        "Shokri et al. 2017, Membership Inference Attacks Against ML Models, Sec. VII "
        "(L2 regularisation, Table: λ = 1e-4, 1e-3, 1e-2 on Purchase)"
    )

    def weight_decay(self) -> float:
        """The optimiser's weight decay equivalent to λ·Σw²: 2λ."""
        return 2.0 * float(self.params["lam"])

    def configure(self, config: TrainConfig) -> TrainConfig:
        """`config` with 2λ added to its weight decay (the recipe's own decay is kept)."""
        return replace(config, weight_decay=config.weight_decay + self.weight_decay())
