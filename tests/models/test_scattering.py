"""ScatterNet front end: shapes, no parameters, invariances a wavelet scattering must have."""

from __future__ import annotations

import pytest
import torch

from privacylab.models import ModelError, Scattering2D, build_model


def test_shape_and_no_parameters() -> None:
    front = Scattering2D((1, 28, 28))
    out = front(torch.rand(3, 1, 28, 28))
    assert out.shape == (3, 17, 7, 7)
    assert list(front.parameters()) == []
    model = build_model("scatnet", (3, 32, 32), 10, seed=0)
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    trainable = [name for name, _ in model.named_parameters()]
    assert trainable == ["3.weight", "3.bias"]


def test_wavelets_have_zero_mean_and_lowpass_keeps_constants() -> None:
    front = Scattering2D((1, 28, 28))
    constant = torch.full((1, 1, 28, 28), 0.7)
    out = front(constant)
    assert torch.allclose(out[0, 0], torch.full((7, 7), 0.7), atol=1e-5)
    assert out[0, 1:].abs().max() < 1e-4


def test_first_order_is_nearly_translation_invariant() -> None:
    """|x ⋆ ψ| ⋆ φ_J is stable to shifts much smaller than 2^J (Mallat 2012, Thm 2.10)."""
    front = Scattering2D((1, 28, 28))
    image = torch.zeros(1, 1, 28, 28)
    image[0, 0, 10:18, 12:14] = 1.0
    shifted = torch.roll(image, shifts=1, dims=-1)
    a, b = front(image), front(shifted)
    assert (a - b).norm() / a.norm() < 0.25


def test_bad_input() -> None:
    with pytest.raises(ModelError, match="image"):
        Scattering2D((784,))
    with pytest.raises(ModelError, match="smaller"):
        Scattering2D((1, 2, 2), scales=2)
