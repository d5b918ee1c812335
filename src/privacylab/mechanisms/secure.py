"""Secure sampling: standard normal draws from the OS CSPRNG.

Floating-point caveat (Mironov 2012, "On significance of the least significant bits for
differential privacy", CCS): a floating-point "Gaussian" sample is not a Gaussian — its values
lie on an irregular grid and, after adding it to a floating-point sum, the low-order bits of the
result can depend on the unperturbed value, which in principle leaks more than the idealised
real-valued mechanism. Sampling from ``os.urandom`` does not remove this (that needs a discrete
or snapping mechanism); it removes the other practical gap: a seeded pseudo-random generator
such as torch's Mersenne Twister is predictable to anyone who learns its state.
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

_TWO_POW_MINUS_53 = 2.0**-53


def secure_standard_normal(
    numel: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> Tensor:
    """``numel`` standard normal samples by Box–Muller over ``os.urandom`` bytes.

    Each pair of samples uses two 53-bit uniforms u₁ ∈ (0, 1], u₂ ∈ [0, 1) built from 64 random
    bits each: z₁ = √(−2 ln u₁) cos 2πu₂, z₂ = √(−2 ln u₁) sin 2πu₂ (Box & Muller 1958),
    computed in float64 and rounded to ``dtype``.  Tails are cut at √(−2 ln 2⁻⁵³) ≈ 8.57.
    """
    pairs = (numel + 1) // 2
    words = torch.frombuffer(bytearray(os.urandom(16 * pairs)), dtype=torch.int64)
    # The top 53 bits of each word (a logical shift: mask off the sign extension).
    mantissa = (words >> 11) & ((1 << 53) - 1)
    u = mantissa.to(torch.float64) * _TWO_POW_MINUS_53
    u1 = 1.0 - u[:pairs]
    theta = (2.0 * math.pi) * u[pairs:]
    radius = torch.sqrt(-2.0 * torch.log(u1))
    z = torch.cat([radius * torch.cos(theta), radius * torch.sin(theta)])[:numel]
    return z.to(dtype=dtype, device=device)
