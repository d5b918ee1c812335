"""The client's labels from its update alone, read off the last fully connected layer.

With softmax cross-entropy and logits z = W h + b, one example's gradient of the output layer
is dL/db = p - y and dL/dW = (p - y) h^T (Zhao, Mopuri & Bilen 2020, "iDLG: Improved Deep
Leakage from Gradients", Sec. 3). Every entry of p - y is positive except the true class's,
p_c - 1 = -(sum of the others): so the true class is the one negative entry of the bias
gradient (whatever the activations: the sign of h plays no part), and without a bias the row
of dL/dW with the largest norm, since |p_c - 1| >= p_i for every other i (Zhao et al. use the
sign of the row, which needs h >= 0; the norm rule does not).

For a batch of B examples (FedSGD: the gradient of the mean loss) the bias gradient is
g = m - n / B, m the batch's mean softmax and n the count of each class, so
n = B (m - g) (Geng et al. 2021, "Towards General Deep Leakage in Federated Learning",
Sec. 3.2; Wainakh et al. 2022, "User-Level Label Leakage from Gradients in Federated Learning",
LLG). m is not observed; it is estimated from the update itself: with the batch's
output-layer features h_b close to their mean h̄, dL/dW ~ g h̄^T, so
h̄ ~ (dL/dW)^T g / ||g||^2 (least squares) and m ~ softmax(W h̄ + b), W and b the parameters
the server sent. The counts are B (m - g) rounded to non-negative integers summing to B
(largest remainders). This is exact whenever the estimate of m is within 1 / (2B) of the truth
in every class, which holds for untrained and early-round models on small batches (the
regime of these attacks; measured in the tests, also with B larger than the number of
classes and repeated labels); it degrades as features spread or B grows.

A FedAvg update is w_0 - w_T = lr * (sum of the local steps' gradients): divided by lr * steps
(needs the local procedure) it is the mean over the steps of m_t - n_t / b, whose counts add up
to the same B (m̄ - ḡ) with m̄ the mean softmax over the local trajectory; m̄ is estimated as
above at the midpoint weights w_0 - (w_0 - w_T) / 2 (the trajectory's mean to first order). An
approximation, exact in the limit of a single step; measured on a U(-0.5, 0.5) LeNet (lr 0.1,
batches of 8): exact on 20 of 20 batches after 5 full-batch epochs (0 of 20 with the start
weights), 10 of 20 with local batches of 2. Under secure aggregation the update is the example-
weighted mean of k clients' deltas (rows split near-evenly), so it is divided by one client's
step count, that of N / k rows (2 clients of 4 rows, local batches of 2: 9 of 10 batches exact,
1 of 10 divided by the round's steps).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from privacylab.attacks.inversion.base import InversionError, client_steps
from privacylab.federated import LocalTraining, ObservedUpdate

__all__ = ["output_layer", "recover_labels"]


def output_layer(
    model: nn.Module, update: ObservedUpdate, num_classes: int
) -> tuple[str, str | None] | None:
    """The update's keys (weight, bias or None) of `model`'s output layer: its last
    parameterised module, an `nn.Linear` with `num_classes` outputs; None if it has none."""
    last: tuple[str, nn.Module] | None = None
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            last = (name, module)
    if last is None or not isinstance(last[1], nn.Linear):
        return None
    name, layer = last
    if layer.out_features != num_classes:
        return None
    for prefix in (name, name.removeprefix("inner.")):
        weight = f"{prefix}.weight" if prefix else "weight"
        if weight in update.update:
            bias = f"{prefix}.bias" if prefix else "bias"
            return weight, (bias if layer.bias is not None and bias in update.update else None)
    return None


def _mean_gradient(
    update: ObservedUpdate, keys: list[str], training: LocalTraining | None
) -> list[Tensor] | None:
    if update.training.algorithm == "fedsgd":
        return [update.update[k].detach().double() for k in keys]
    if training is None:
        return None
    scale = training.lr * client_steps(update, training)
    return [update.update[k].detach().double() / scale for k in keys]


def _counts(raw: Tensor, batch_size: int) -> Tensor:
    """Non-negative integers summing to `batch_size`, closest to `raw` (largest remainders)."""
    raw = raw.clamp(min=0)
    total = float(raw.sum())
    if total <= 0:
        raw = torch.ones_like(raw)
        total = float(raw.size(0))
    raw = raw * (batch_size / total) if abs(total - batch_size) > 0.5 else raw
    counts = raw.floor()
    missing = batch_size - int(counts.sum())
    if missing > 0:
        order = torch.argsort(raw - counts, descending=True, stable=True)
        counts[order[:missing]] += 1
    elif missing < 0:
        order = torch.argsort(raw - counts, stable=True)
        for index in order.tolist():
            if missing == 0:
                break
            if counts[index] > 0:
                counts[index] -= 1
                missing += 1
    return counts.long()


def recover_labels(
    update: ObservedUpdate,
    model: nn.Module,
    batch_size: int,
    num_classes: int,
    *,
    training: LocalTraining | None = None,
) -> Tensor | None:
    """The labels (batch_size,) of the examples behind `update`, sorted by class, or None when
    the rule does not apply (no `nn.Linear` output layer with `num_classes` outputs; a batch
    without an output bias; a FedAvg update of a batch without the local procedure
    `training`). One example: the iDLG rule (Zhao et al. 2020, Sec. 3), exact for any
    activation. A batch: counts n = B (m - g) from the bias gradient g (Geng et al. 2021;
    Wainakh et al. 2022) with the mean softmax m estimated from the update (module
    docstring), exact while that estimate is within 1 / (2B); on a FedAvg update, an
    approximation (module docstring)."""
    if isinstance(batch_size, bool) or int(batch_size) < 1:
        raise InversionError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    batch_size = int(batch_size)
    keys = output_layer(model, update, num_classes)
    if keys is None:
        return None
    weight_key, bias_key = keys
    if batch_size == 1:
        if bias_key is not None:
            label = torch.argmin(update.update[bias_key].detach())
        else:
            label = torch.argmax(update.update[weight_key].detach().norm(dim=1))
        return label.reshape(1).long().cpu()
    if bias_key is None:
        return None
    grads = _mean_gradient(update, [weight_key, bias_key], training)
    if grads is None:
        return None
    grad_w, grad_b = grads
    weight = update.state[weight_key].detach().double()
    bias = update.state[bias_key].detach().double()
    if update.training.algorithm != "fedsgd":
        weight = weight - update.update[weight_key].detach().double() / 2
        bias = bias - update.update[bias_key].detach().double() / 2
    norm = float(grad_b @ grad_b)
    if norm > 0:
        features = grad_w.T @ grad_b / norm
        mean_p = torch.softmax(weight @ features + bias, dim=0)
    else:
        mean_p = torch.full_like(grad_b, 1.0 / num_classes)
    counts = _counts((batch_size * (mean_p - grad_b)).cpu(), batch_size)
    return torch.repeat_interleave(torch.arange(num_classes), counts)
