"""ScatterNet: a fixed wavelet scattering front end followed by a small trainable classifier.

Tramèr & Boneh (2021), "Differentially Private Learning Needs Better Features (or Much More
Data)", Sec. 3: a linear model on hand-crafted scattering features (Oyallon & Mallat 2015) beats
end-to-end DP-SGD on small image data sets, because the features cost no privacy (they never look
at the data) and shrink the dimension the noise is spread over.

The transform here is the first-order 2-D scattering of Mallat (2012), "Group Invariant
Scattering", Eq. (2.13)–(2.16): S0 x = x ⋆ φ_J and S1 x(j, θ) = |x ⋆ ψ_{j,θ}| ⋆ φ_J, with Morlet
wavelets ψ at scales 2^j (j < J) and L orientations, a Gaussian low-pass φ_J, sub-sampled by 2^J.
Convolutions are circular on a reflect-padded grid, computed with the FFT. The module has buffers
only, no parameters, so DP-SGD clips and noises the classifier alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from privacylab.models import _checks
from privacylab.models.errors import ModelError
from privacylab.models.registry import register_model


def _grid(size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Periodic coordinates centred at 0 for a grid of `size`."""
    rows = torch.fft.fftfreq(size[0], d=1.0 / size[0]).double()
    cols = torch.fft.fftfreq(size[1], d=1.0 / size[1]).double()
    return torch.meshgrid(rows, cols, indexing="ij")


def _gabor(
    size: tuple[int, int], sigma: float, theta: float, xi: float, slant: float
) -> torch.Tensor:
    y, x = _grid(size)
    xr = x * math.cos(theta) + y * math.sin(theta)
    yr = -x * math.sin(theta) + y * math.cos(theta)
    envelope = torch.exp(-(xr**2 + (slant * yr) ** 2) / (2.0 * sigma**2))
    return envelope * torch.exp(1j * xi * xr)


def morlet_filter_bank(
    size: tuple[int, int], scales: int, orientations: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fourier transforms of the Morlet wavelets ψ_{j,θ} (j < J, L angles) and the low-pass φ_J.

    Morlet ψ = Gabor − β·envelope with β making ψ zero-mean; σ_j = 0.8·2^j, ξ_j = 3π/(4·2^j),
    slant 4/L, as in Oyallon & Mallat (2015) and kymatio's filter bank.
    """
    wavelets = []
    for j in range(scales):
        sigma, xi = 0.8 * 2**j, 3.0 * math.pi / 4.0 / 2**j
        for k in range(orientations):
            theta = math.pi * k / orientations
            gabor = _gabor(size, sigma, theta, xi, 4.0 / orientations)
            envelope = _gabor(size, sigma, theta, 0.0, 4.0 / orientations)
            psi = gabor - (gabor.sum() / envelope.sum()) * envelope
            psi = psi / psi.abs().sum()
            wavelets.append(torch.fft.fft2(psi))
    low = _gabor(size, 0.8 * 2**scales, 0.0, 0.0, 1.0).real
    low = low / low.sum()
    return torch.stack(wavelets), torch.fft.fft2(low)


class Scattering2D(nn.Module):
    """First-order 2-D scattering transform (Mallat 2012) of (n, C, H, W) images.

    Output: (n, C·(1 + J·L), ⌈H/2^J⌉, ⌈W/2^J⌉). No trainable parameters.
    """

    def __init__(self, input_shape: Sequence[int], scales: int = 2, orientations: int = 8) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ModelError(
                f"scattering needs (C, H, W) image inputs, got shape {tuple(input_shape)}"
            )
        if not (1 <= int(scales) <= 4) or not (1 <= int(orientations) <= 16):
            raise ModelError("scattering needs 1 <= scales <= 4 and 1 <= orientations <= 16")
        self.scales, self.orientations = int(scales), int(orientations)
        channels, height, width = (int(s) for s in input_shape)
        step = 2**self.scales
        if min(height, width) < step:
            raise ModelError(
                f"images of {height}x{width} are smaller than the scattering scale {step}"
            )
        self.pad = step
        padded = (self._round_up(height + 2 * step, step), self._round_up(width + 2 * step, step))
        self.extra = (padded[0] - height - 2 * step, padded[1] - width - 2 * step)
        psi, phi = morlet_filter_bank(padded, self.scales, self.orientations)
        self.register_buffer("psi", psi.to(torch.complex64), persistent=False)
        self.register_buffer("phi", phi.real.float(), persistent=False)
        self.out_size = (math.ceil(height / step), math.ceil(width / step))
        self.out_channels = channels * (1 + self.scales * self.orientations)

    @staticmethod
    def _round_up(value: int, step: int) -> int:
        return -(-value // step) * step

    def _lowpass(self, spectrum: torch.Tensor) -> torch.Tensor:
        step = 2**self.scales
        smooth = torch.fft.ifft2(spectrum * self.phi).real[..., ::step, ::step]
        top = self.pad // step
        return smooth[..., top : top + self.out_size[0], top : top + self.out_size[1]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        padded = F.pad(
            x,
            (self.pad, self.pad + self.extra[1], self.pad, self.pad + self.extra[0]),
            mode="reflect",
        )
        spectrum = torch.fft.fft2(padded)
        modulus = torch.fft.ifft2(spectrum[:, :, None] * self.psi).abs()
        first = self._lowpass(torch.fft.fft2(modulus))
        zeroth = self._lowpass(spectrum)[:, :, None]
        return torch.cat([zeroth, first], dim=2).reshape(n, self.out_channels, *self.out_size)


@register_model("scatnet")
def scatnet(
    input_shape: tuple[int, ...],
    num_classes: int,
    widths: Sequence[int] = (),
    activation: str = "tanh",
    scales: int = 2,
    orientations: int = 8,
) -> nn.Module:
    """Scattering features → per-example standardisation → logistic regression (default) or an
    MLP with hidden `widths` (Tramèr & Boneh 2021, "ScatterNet + linear").

    The standardisation is a LayerNorm without affine parameters: it uses each example alone, so
    it costs no privacy.
    """
    front = Scattering2D(input_shape, scales, orientations)
    features = front.out_channels * front.out_size[0] * front.out_size[1]
    sizes = (features, *_checks.widths(widths, "scatnet"))
    layers: list[nn.Module] = [
        front,
        nn.Flatten(),
        nn.LayerNorm(features, elementwise_affine=False),
    ]
    for fan_in, fan_out in pairwise(sizes):
        layers += [nn.Linear(fan_in, fan_out), _checks.activation(activation, "scatnet")]
    layers.append(nn.Linear(sizes[-1], num_classes))
    return nn.Sequential(*layers)
