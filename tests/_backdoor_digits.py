"""What the backdoor defence tests share: sklearn's 8x8 digits as images, a BadNets-style
poisoned training set made from them (a 3x3 white corner on rows of other classes relabelled
to the target), and a small model trained full-batch with Adam, seeded.

    x, y = digits()
    features, labels, poisons = poisoned(x, y, count=60)
    model = fit(lambda: nn.Sequential(...), features, labels, steps=200)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import Tensor, nn

from privacylab.attacks.poisoning.trigger import parse_trigger

TARGET = 0
TRIGGER = "square:3@corner"


def digits() -> tuple[Tensor, Tensor]:
    """The 1,797 digits as (n, 1, 8, 8) float images in [0, 1] and int64 labels."""
    data = load_digits()
    x = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    return x, torch.tensor(data.target, dtype=torch.int64)


def poisoned(
    x: Tensor, y: Tensor, count: int, target: int = TARGET, trigger: str = TRIGGER
) -> tuple[Tensor, Tensor, np.ndarray]:
    """(features, labels, poison positions): `x` followed by its first `count` rows of a
    class other than `target`, stamped with `trigger` and labelled `target`."""
    donors = np.flatnonzero(y.numpy() != target)[:count]
    features = torch.cat([x, parse_trigger(trigger).stamp(x[donors])])
    labels = torch.cat([y, torch.full((len(donors),), target, dtype=torch.int64)])
    return features, labels, np.arange(len(x), len(features))


def fit(
    build: Callable[[], nn.Module],
    x: Tensor,
    y: Tensor,
    *,
    steps: int,
    lr: float = 0.01,
    seed: int = 0,
) -> nn.Module:
    """`build()` under `torch.manual_seed(seed)`, trained `steps` full-batch Adam steps on
    cross-entropy; returned in eval mode."""
    torch.manual_seed(seed)
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.eval()
