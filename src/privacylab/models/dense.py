"""Fully connected models: multinomial logistic regression and the MLP."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

from torch import nn

from privacylab.models import _checks
from privacylab.models.registry import register_model


@register_model("logreg")
def logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Multinomial logistic regression: flatten, then one Linear layer to the class logits."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


@register_model("mlp")
def mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    widths: Sequence[int] = (512, 256),
    activation: str = "relu",
    dropout: float = 0.0,
) -> nn.Module:
    """Flatten, then Linear -> activation [-> Dropout] per hidden width, then a Linear head.

    The default 784-512-256-10 network on MNIST is the MLP benchmarked in issue 3.
    """
    sizes = (math.prod(input_shape), *_checks.widths(widths, "mlp"))
    rate = _checks.dropout(dropout, "mlp")
    act = _checks.activation_type(activation, "mlp")
    layers: list[nn.Module] = [nn.Flatten()]
    for fan_in, fan_out in pairwise(sizes):
        layers += [nn.Linear(fan_in, fan_out), act()]
        if rate:
            layers.append(nn.Dropout(rate))
    layers.append(nn.Linear(sizes[-1], num_classes))
    return nn.Sequential(*layers)
