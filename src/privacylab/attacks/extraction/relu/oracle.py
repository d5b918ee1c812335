"""The float64 query oracle the exact attack talks to: flat numpy rows in, logits out."""

from __future__ import annotations

import numpy as np
import torch

from privacylab.target import Target


class Oracle:
    """`f(x)` for rows `x` of shape (n, d) in float64, asked of `target.logits` (every row is
    one query, counted by the target); `d` is the flattened input size, `k` the logits."""

    def __init__(self, target: Target, input_shape: tuple[int, ...], chunk: int = 4096) -> None:
        self.target = target
        self.input_shape = tuple(input_shape)
        self.d = int(np.prod(self.input_shape))
        self.k = int(target.num_classes)
        self.chunk = int(chunk)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64).reshape(-1, self.d)
        out = []
        for i in range(0, len(x), self.chunk):
            batch = torch.from_numpy(x[i : i + self.chunk].reshape(-1, *self.input_shape))
            out.append(self.target.logits(batch).detach().cpu().double().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.k))

    @property
    def queries(self) -> int:
        """Queries sent so far through the target."""
        return int(self.target.queries)
