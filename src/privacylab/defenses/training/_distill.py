"""Soft-label training shared by the distillation defences (DMP, SELENA): a model trained by
the project's one trainer on (inputs, soft labels) with the temperature-scaled KL loss of
knowledge distillation (Hinton, Vinyals & Dean 2015, "Distilling the Knowledge in a Neural
Network", Sec. 2), and helpers to read a model's probabilities and to derive seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.training import TrainConfig, train

SEED_LIMIT = 2**31 - 1


def derived_seed(seed: int, *path: int) -> int:
    """A seed for a sub-task (`path`: which stage, which sub-model) of a run seeded `seed`:
    deterministic, >= 0, and different for different paths."""
    value = int(seed)
    for part in path:
        value = (value * 1_000_003 + int(part) + 1) % SEED_LIMIT
    return value


@torch.no_grad()
def probabilities(
    model: nn.Module, features: Tensor, temperature: float = 1.0, chunk: int = 2048
) -> Tensor:
    """softmax(model(x) / T) for every row of `features`, in evaluation mode, on the CPU."""
    was = model.training
    model.eval()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    rows = [
        torch.softmax(model(features[i : i + chunk].to(device)) / temperature, dim=1).cpu()
        for i in range(0, len(features), chunk)
    ]
    model.train(was)
    return torch.cat(rows) if rows else torch.empty(0)


def distillation_loss(temperature: float) -> Callable[[Tensor, Tensor], Tensor]:
    """Per-example T²·KL(q ‖ softmax(logits / T)) for soft targets q (Hinton et al. 2015,
    Sec. 2: the T² keeps the gradients' scale independent of T). Shape (B,)."""
    t = float(temperature)

    def loss(logits: Tensor, soft: Tensor) -> Tensor:
        log_p = F.log_softmax(logits / t, dim=1)
        return (torch.xlogy(soft, soft) - soft * log_p).sum(1) * (t * t)

    return loss


def train_soft(
    model: nn.Module,
    inputs: Tensor,
    soft: Tensor,
    config: TrainConfig,
    *,
    temperature: float = 1.0,
    folder: Path | None = None,
) -> nn.Module:
    """`model` trained on (`inputs`, `soft`) with `distillation_loss(temperature)` by the one
    trainer (label smoothing off: the soft labels are the targets); `folder` holds its
    checkpoint, so a killed run resumes."""
    config = dataclasses.replace(config, label_smoothing=0.0, early_stopping=None)
    result = train(
        model,
        (inputs, soft),
        config,
        checkpoint_dir=folder,
        loss_fn=distillation_loss(temperature),
    )
    return result.model
