"""Analytic recovery of an input from the gradient of a fully connected first layer:
Phong, Aono, Hayashi, Wang & Moriai 2018, "Privacy-Preserving Deep Learning via Additively
Homomorphic Encryption" (IEEE TIFS), Sec. 3; Geiping et al. 2020, "Inverting Gradients",
Sec. 3, Prop. 1.

For a first layer z = W_1 x + b_1 and one example, dL/dW_1[i, :] = dL/db_1[i] * x for every
unit i, so x = dL/dW_1[i, :] / dL/db_1[i] for any unit with a non-zero bias gradient, whatever
comes after the layer (ReLU included) and with no optimisation. All units are combined by least
squares, x = sum_i db_i dW_i / sum_i db_i^2, which weights the rows by db_i^2 (the largest
|db_i| dominate) and is exact up to rounding.

The same identity holds for the change of W_1 and b_1 over several local SGD steps on that one
example (each step's gradient is delta_t x^T with the same x), so a one-example FedAvg delta
is recovered exactly too. For a batch, row i is the mix sum_b delta_bi x_b / sum_b delta_bi
of the batch's examples (exact only for units that one example alone activates); that case is
refused rather than answered with a blend.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.inversion.base import (
    GradientAttack,
    GradientTask,
    InversionError,
    Reconstruction,
    register_inversion,
)
from privacylab.attacks.inversion.labels import recover_labels
from privacylab.target import Access, Target

__all__ = ["AnalyticRecovery", "first_linear"]


def first_linear(model: nn.Module, input_size: int) -> tuple[str, nn.Linear]:
    """The name (without a counting wrapper's `inner.` prefix) and module of `model`'s first
    parameterised layer, which must be an `nn.Linear` with a bias taking the flattened input
    of `input_size` features; else InversionError naming the layer."""
    for name, module in model.named_modules():
        if not any(True for _ in module.parameters(recurse=False)):
            continue
        label = name.removeprefix("inner.")
        kind = type(module).__name__
        if not isinstance(module, nn.Linear):
            raise InversionError(
                f"analytic needs a fully connected first layer; the first layer '{label}' is {kind}"
            )
        if module.bias is None:
            raise InversionError(f"analytic needs a bias in the first layer '{label}' (Linear)")
        if module.in_features != input_size:
            raise InversionError(
                f"analytic: the first layer '{label}' takes {module.in_features} features, "
                f"not the flattened input's {input_size}"
            )
        return label, module
    raise InversionError("analytic: the model has no parameters")


@register_inversion("analytic")
class AnalyticRecovery(GradientAttack):
    """Closed-form recovery of one example from the gradient of a fully connected first layer
    with a bias (Phong et al. 2018; Geiping et al. 2020, Prop. 1); the label by the iDLG rule
    (`labels.recover_labels`). No options. Any activation; one example per update (FedSGD or
    FedAvg)."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.UPDATES, ())
    paper: ClassVar[str] = (
        "Phong et al. 2018, Privacy-Preserving Deep Learning via Additively Homomorphic "
        "Encryption, Sec. 3; Geiping et al. 2020, Inverting Gradients, Sec. 3 Prop. 1"
    )
    aliases: ClassVar[tuple[str, ...]] = ("phong",)

    def reconstruct(self, target: Target, task: GradientTask) -> Reconstruction:
        """x = sum_i db_i dW_i / sum_i db_i^2 over the first layer's units."""
        update = self.observed(target, task)
        model = target.model
        size = math.prod(task.input_shape)
        name, _ = first_linear(model, size)
        n = update.num_examples
        if n != 1:
            raise InversionError(
                f"analytic recovers one example per update; this update has {n} "
                "(each row of the first layer's gradient mixes them)"
            )
        grad_w = update.update[f"{name}.weight"].detach().double()
        grad_b = update.update[f"{name}.bias"].detach().double()
        weight = grad_b @ grad_b
        if not (torch.isfinite(grad_w).all() and torch.isfinite(grad_b).all()):
            raise InversionError("analytic: the observed update is not finite")
        if float(weight) == 0.0:
            raise InversionError(
                f"analytic: the bias gradient of '{name}' is zero, so the update carries no input"
            )
        x = (grad_b @ grad_w) / weight
        residual = float((grad_w - torch.outer(grad_b, x)).norm() / grad_w.norm().clamp_min(1e-300))
        low, high = task.bounds
        labels = recover_labels(update, model, 1, task.num_classes)
        units = int((grad_b != 0).sum())
        return Reconstruction(
            x=x.reshape(1, *task.input_shape).clamp(low, high).to(target.dtype).cpu(),
            labels=None if labels is None else labels.cpu(),
            loss=residual,
            history=[(0, residual)],
            params={
                "layer": name,
                "units": units,
                "relative_residual": residual,
                "labels": "recovered" if labels is not None else "none",
            },
        )
