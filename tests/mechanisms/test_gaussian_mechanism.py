"""The tensor Gaussian mechanism owns the noise and states its event."""

from __future__ import annotations

import pytest
import torch

from privacylab.accounting import Gaussian, PrivacyParameterError
from privacylab.mechanisms import GaussianMechanism


def test_noise_has_std_sigma_times_sensitivity() -> None:
    mechanism = GaussianMechanism(2.0, 0.5, generator=torch.Generator().manual_seed(0))
    z = mechanism.noise(torch.empty(200_000))
    assert mechanism.std == 1.0
    assert z.std().item() == pytest.approx(1.0, abs=0.01)
    assert abs(z.mean().item()) < 0.01


def test_seeded_draws_are_those_of_the_generator() -> None:
    """Same draws, in the same order, as ``normal_(0, σΔ, generator)`` — what DP-SGD drew
    before the mechanism owned the noise."""
    like = torch.empty(3, 4)
    drawn = GaussianMechanism(1.5, 2.0, generator=torch.Generator().manual_seed(7)).noise(like)
    expected = torch.empty(3, 4).normal_(0.0, 3.0, generator=torch.Generator().manual_seed(7))
    assert torch.equal(drawn, expected)


def test_event_is_gaussian_in_units_of_the_sensitivity() -> None:
    mechanism = GaussianMechanism(1.3, 4.0)
    assert mechanism.event == Gaussian(1.3)
    released, event = mechanism.release(torch.zeros(5))
    assert released.shape == (5,) and event == Gaussian(1.3)


def test_no_noise_no_event_no_draw() -> None:
    generator = torch.Generator().manual_seed(1)
    state = generator.get_state()
    mechanism = GaussianMechanism(0.0, generator=generator)
    assert mechanism.event is None
    assert torch.equal(mechanism.noise(torch.ones(4)), torch.zeros(4))
    assert torch.equal(generator.get_state(), state)


def test_secure_noise_is_drawn_from_the_os() -> None:
    z = GaussianMechanism(1.0, secure=True).noise(torch.empty(100_000, dtype=torch.float64))
    assert z.dtype == torch.float64
    assert z.std().item() == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        ((-1.0,), {}, "noise multiplier"),
        ((float("nan"),), {}, "noise multiplier"),
        ((1.0, 0.0), {}, "sensitivity"),
        ((1.0,), {"secure": True, "generator": torch.Generator()}, "secure"),
    ],
)
def test_bad_parameters_are_one_line(args, options, message) -> None:
    with pytest.raises(PrivacyParameterError, match=message):
        GaussianMechanism(*args, **options)
