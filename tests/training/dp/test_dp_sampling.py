"""Poisson and shuffle samplers."""

from __future__ import annotations

import pytest
import torch

from privacylab.training.dp import DPSGDError, PoissonSampler, ShuffleSampler


def test_poisson_inclusion_rate_is_q() -> None:
    sampler = PoissonSampler(1000, 0.05, torch.Generator().manual_seed(0))
    counts = torch.zeros(1000)
    draws = 0
    for _ in range(10):
        for batch in sampler:
            counts[batch] += 1
            draws += 1
            assert batch.dtype == torch.long and batch.unique().numel() == batch.numel()
    assert draws == 10 * sampler.steps_per_epoch == 200
    assert counts.sum().item() / (1000 * draws) == pytest.approx(0.05, abs=0.003)
    assert counts.std().item() == pytest.approx((draws * 0.05 * 0.95) ** 0.5, rel=0.15)


def test_poisson_batches_vary_and_can_be_empty() -> None:
    sampler = PoissonSampler(10, 0.05, torch.Generator().manual_seed(1))
    sizes = [sampler.sample().numel() for _ in range(200)]
    assert sizes.count(0) > 50 and max(sizes) >= 2
    assert sampler.steps_per_epoch == 20 and len(sampler) == 20
    assert sampler.expected_batch_size == pytest.approx(0.5)
    assert PoissonSampler.poisson is True


def test_poisson_is_reproducible() -> None:
    first = list(PoissonSampler(50, 0.3, torch.Generator().manual_seed(2)))
    second = list(PoissonSampler(50, 0.3, torch.Generator().manual_seed(2)))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_full_sampling_takes_everything() -> None:
    sampler = PoissonSampler(7, 1.0)
    assert sampler.steps_per_epoch == 1
    assert torch.equal(sampler.sample(), torch.arange(7))


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, float("nan"), "x"])
def test_bad_sample_rate(rate) -> None:
    with pytest.raises(DPSGDError, match="sample_rate"):
        PoissonSampler(10, rate)


def test_bad_size() -> None:
    with pytest.raises(DPSGDError, match="num_examples"):
        PoissonSampler(0, 0.5)
    with pytest.raises(DPSGDError, match="batch_size"):
        ShuffleSampler(10, 0)


def test_shuffle_sampler_covers_each_example_once_per_epoch() -> None:
    sampler = ShuffleSampler(10, 4, torch.Generator().manual_seed(0))
    batches = list(sampler)
    assert [b.numel() for b in batches] == [4, 4, 2]
    assert torch.equal(torch.cat(batches).sort().values, torch.arange(10))
    assert sampler.poisson is False
    assert sampler.sample_rate == pytest.approx(0.4)
    dropped = ShuffleSampler(10, 4, drop_last=True)
    assert [b.numel() for b in dropped] == [4, 4] and len(dropped) == 2
