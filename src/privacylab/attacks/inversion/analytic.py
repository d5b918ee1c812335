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
is recovered exactly too.

For a batch of B examples (FedSGD), row i is the mix sum_b delta_bi x_b / sum_b delta_bi of the
batch's examples. A unit that one example alone activates (delta_bi = 0 for the others, as a
ReLU gives) yields that example exactly, and every unit isolating the same example yields the
same row ratio, while units mixing several examples give ratios that differ from unit to unit
(their weights delta_bi depend on the unit). So the ratios are grouped (relative distance at
most `rtol`); groups of two or more units are the isolated examples (largest groups first, each
solved by least squares over its units), and where fewer than B are isolated the rest are
filled with the single ratios of the largest |db_i| (mixes, not examples; `params["isolated"]`
says how many are exact). This is the "exclusively activated neurons" of Pan et al. 2022
("Exploring the Security Boundary of Data Reconstruction via Neuron Exclusivity Analysis",
USENIX Security), and the per-unit separation Fowl et al. 2022 ("Robbing the Fed", Sec. 3)
force with malicious weights, here on an unmodified model: it needs wide ReLU layers (many
units active for one example only) and fails on smooth activations (every unit mixes every
example). A batch needs FedSGD (local steps over several examples change which units isolate
whom).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.inversion.base import (
    GradientAttack,
    GradientTask,
    InversionError,
    Reconstruction,
    number_option,
    register_inversion,
)
from privacylab.attacks.inversion.labels import recover_labels
from privacylab.target import Access, Target

__all__ = ["AnalyticRecovery", "first_linear", "separate", "span_residual"]


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
    (`labels.recover_labels`). One example: exact for any activation, FedSGD or FedAvg. A batch
    (FedSGD): the examples that some units of the first layer isolate (module docstring);
    `rtol` is the relative distance under which two units' row ratios count as the same
    example."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.UPDATES, ())
    paper: ClassVar[str] = (
        "Phong et al. 2018, Privacy-Preserving Deep Learning via Additively Homomorphic "
        "Encryption, Sec. 3; Geiping et al. 2020, Inverting Gradients, Sec. 3 Prop. 1"
    )
    aliases: ClassVar[tuple[str, ...]] = ("phong",)

    def __init__(self, rtol: float = 1e-5) -> None:
        self.rtol = number_option("analytic", "rtol", rtol)
        if self.rtol >= 1:
            raise InversionError(f"analytic: rtol must be a number in (0, 1), got {rtol!r}")

    def reconstruct(self, target: Target, task: GradientTask) -> Reconstruction:
        """One example: x = sum_i db_i dW_i / sum_i db_i^2 over the first layer's units; a
        batch: `separate`. `loss` is `span_residual`."""
        update = self.observed(target, task)
        model = target.model
        size = math.prod(task.input_shape)
        name, _ = first_linear(model, size)
        n = update.num_examples
        if n > 1 and update.training.algorithm != "fedsgd":
            raise InversionError(
                f"analytic separates a batch of {n} only from a FedSGD gradient, not a FedAvg delta"
            )
        grad_w = update.update[f"{name}.weight"].detach().double()
        grad_b = update.update[f"{name}.bias"].detach().double()
        if not (torch.isfinite(grad_w).all() and torch.isfinite(grad_b).all()):
            raise InversionError("analytic: the observed update is not finite")
        if float(grad_b.abs().max()) == 0.0:
            raise InversionError(
                f"analytic: the bias gradient of '{name}' is zero, so the update carries no input"
            )
        if n == 1:
            x = (grad_b @ grad_w / (grad_b @ grad_b)).unsqueeze(0)
            isolated = 1
        else:
            x, isolated = separate(grad_w, grad_b, n, self.rtol)
        residual = span_residual(grad_w, x)
        low, high = task.bounds
        labels = recover_labels(update, model, n, task.num_classes)
        return Reconstruction(
            x=x.reshape(n, *task.input_shape).clamp(low, high).to(target.dtype).cpu(),
            labels=None if labels is None else labels.cpu(),
            loss=residual,
            history=[(0, residual)],
            params={
                "layer": name,
                "units": int((grad_b != 0).sum()),
                "isolated": isolated,
                "rtol": self.rtol,
                "relative_residual": residual,
                "labels": "recovered" if labels is not None else "none",
            },
        )


def span_residual(grad_w: Tensor, x: Tensor) -> float:
    """||dW - dW X^+ X|| / ||dW||: how much of the first layer's gradient lies outside the span
    of the recovered inputs X (n, d); every row of dW is a combination of the batch's inputs,
    so it is 0 (up to rounding) when they are all recovered, and also for B mixes that span
    the batch (what a smooth first layer gives): a check, not a score."""
    projected = grad_w @ torch.linalg.pinv(x) @ x
    return float((grad_w - projected).norm() / grad_w.norm().clamp_min(1e-300))


def separate(grad_w: Tensor, grad_b: Tensor, n: int, rtol: float) -> tuple[Tensor, int]:
    """`n` inputs (n, d) from a batch's first-layer gradient: the row ratios dW_i / db_i
    grouped within relative distance `rtol`; groups of >= 2 units (isolated examples, largest
    first) solved by least squares over their units, the rest filled with the ratios of the
    largest remaining |db_i|. Also returns how many are isolated examples."""
    order = torch.argsort(grad_b.abs(), descending=True)
    order = order[grad_b[order] != 0]
    ratios = grad_w[order] / grad_b[order].unsqueeze(1)
    norms = ratios.norm(dim=1)
    close = (
        (torch.cdist(ratios, ratios) <= rtol * torch.maximum(norms[:, None], norms[None]))
        .cpu()
        .numpy()
    )
    free = np.ones(len(order), dtype=bool)
    groups: list[list[int]] = []
    for i in range(len(order)):
        if free[i]:
            members = np.flatnonzero(close[i] & free)
            free[members] = False
            groups.append(members.tolist())
    shared = sorted(
        (g for g in groups if len(g) >= 2),
        key=lambda g: (-len(g), -float(grad_b[order[g]].abs().sum())),
    )[:n]
    rows = []
    for g in shared:
        units = order[g]
        rows.append(grad_b[units] @ grad_w[units] / (grad_b[units] @ grad_b[units]))
    isolated = len(rows)
    singles = [g for g in groups if len(g) < 2]
    for g in singles[: n - isolated]:
        rows.append(ratios[g[0]])
    while len(rows) < n:
        rows.append(torch.zeros_like(grad_w[0]))
    return torch.stack(rows), isolated
