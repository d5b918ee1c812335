"""Batch samplers: Poisson sampling (what the DP-SGD accountants assume) and shuffling.

Abadi et al. 2016, Alg. 1 ("take a random sample L_t with sampling probability q = L/N") and
the moments/RDP/PLD accountants analyse Poisson subsampling: every example joins each batch
independently with probability q, so batch sizes vary and may be 0.  Fixed-size shuffled
batches are a different mechanism; :class:`ShuffleSampler` says so through ``poisson = False``
so that whoever reports ε can state that the Poisson analysis is assumed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from privacylab.training.dp.errors import DPSGDError, check_count


class PoissonSampler:
    """Poisson-sampled index batches: each example included independently with probability q.

    Iterating yields ``steps_per_epoch = round(1/q)`` (at least 1) int64 index tensors — one
    epoch in expectation; batches may be empty.

    Args:
        num_examples: N, the size of the dataset.
        sample_rate: q ∈ (0, 1].
        generator: ``torch.Generator`` for reproducible batches (default: torch's global one).
    """

    poisson = True
    """The ε of the Poisson-subsampled Gaussian mechanism applies as computed."""

    def __init__(
        self, num_examples: int, sample_rate: float, generator: torch.Generator | None = None
    ) -> None:
        self.num_examples = check_count("num_examples", num_examples)
        try:
            q = float(sample_rate)
        except (TypeError, ValueError):
            raise DPSGDError(f"sample_rate must be a number, got {sample_rate!r}") from None
        if not 0.0 < q <= 1.0:
            raise DPSGDError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        self.sample_rate = q
        self.generator = generator

    @property
    def steps_per_epoch(self) -> int:
        """round(1/q): the number of batches that make one epoch in expectation."""
        return max(1, round(1.0 / self.sample_rate))

    @property
    def expected_batch_size(self) -> float:
        """q·N, the denominator of the noisy average (Abadi et al. 2016, Alg. 1)."""
        return self.sample_rate * self.num_examples

    def sample(self) -> Tensor:
        """One Poisson batch: the sorted indices of the included examples (possibly none)."""
        mask = torch.rand(self.num_examples, generator=self.generator) < self.sample_rate
        return mask.nonzero().squeeze(1)

    def __iter__(self) -> Iterator[Tensor]:
        for _ in range(self.steps_per_epoch):
            yield self.sample()

    def __len__(self) -> int:
        return self.steps_per_epoch


class ShuffleSampler:
    """Fixed-size batches of a fresh random permutation each epoch.

    Not Poisson sampling: ``poisson = False`` tells the trainer that an ε computed with the
    Poisson-subsampling accountants (with q = batch_size / N) assumes a sampling scheme that was
    not used, and must be reported as such.

    Args:
        num_examples: N.
        batch_size: examples per batch; the last batch of an epoch is smaller unless
            ``drop_last``.
        generator: ``torch.Generator`` for reproducible permutations.
        drop_last: drop the final incomplete batch.
    """

    poisson = False
    """The Poisson accountants' ε does not strictly apply to this sampler."""

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        generator: torch.Generator | None = None,
        drop_last: bool = False,
    ) -> None:
        self.num_examples = check_count("num_examples", num_examples)
        self.batch_size = check_count("batch_size", batch_size)
        if drop_last and batch_size > num_examples:
            raise DPSGDError(
                f"batch_size {batch_size} > num_examples {num_examples} with drop_last leaves "
                "no batch"
            )
        self.generator = generator
        self.drop_last = drop_last

    @property
    def sample_rate(self) -> float:
        """batch_size / N: the q a Poisson accountant would be given for this sampler."""
        return min(1.0, self.batch_size / self.num_examples)

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return self.num_examples // self.batch_size
        return math.ceil(self.num_examples / self.batch_size)

    @property
    def expected_batch_size(self) -> float:
        """The fixed batch size."""
        return float(min(self.batch_size, self.num_examples))

    def __iter__(self) -> Iterator[Tensor]:
        order = torch.randperm(self.num_examples, generator=self.generator)
        for step in range(self.steps_per_epoch):
            yield order[step * self.batch_size : (step + 1) * self.batch_size]

    def __len__(self) -> int:
        return self.steps_per_epoch
