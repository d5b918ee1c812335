"""A user's own model and training loop, not in the zoo: what `privacylab run --model-factory`
and `privacylab.byo.report_own_model` are tested with."""

from __future__ import annotations

import math

import torch
from torch import nn


class UserMLP(nn.Module):
    """Flatten, Linear, tanh, Linear: the zoo's `mlp` with one tanh layer, as a user writes it."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(math.prod(input_shape), width)
        self.fc2 = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


def make_net(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The factory privacylab calls for a fresh, untrained model."""
    return UserMLP(input_shape, num_classes)


def make_softmax_net(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The same network ending in a softmax: it returns probabilities, not logits."""
    return nn.Sequential(UserMLP(input_shape, num_classes), nn.Softmax(dim=1))


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int = 60) -> None:
    """A plain PyTorch loop: full-batch Adam on the cross-entropy (overfits small data)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(epochs):
        optimizer.zero_grad()
        out = model(x)
        loss = (
            nn.functional.nll_loss(out.clamp_min(1e-12).log(), y)
            if isinstance(model, nn.Sequential)
            else nn.functional.cross_entropy(out, y)
        )
        loss.backward()
        optimizer.step()


def make_batchnorm_net(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A network with BatchNorm, which DP-SGD cannot clip per example."""
    width = math.prod(input_shape)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(width, 32), nn.BatchNorm1d(32), nn.Linear(32, num_classes)
    )


def make_wrong_width_net(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A network whose head has the wrong number of classes."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes - 1))
