"""Sanitisers of released weights against LSB encoding (Song et al. 2017 Sec. 4.1; seed 004,
Exercise 4): whatever the low mantissa bits held, re-quantising or perturbing the weights
overwrites it, at a cost in accuracy this module measures.

- `requantize(model, mantissa_bits=k)` keeps the top k of float32's 23 mantissa bits of every
  parameter and replaces the 23 - k below: `fill="round"` rounds to nearest at k bits (the
  dropped bits become 0; ties away from zero), `"zero"` truncates, `"random"` (default)
  truncates and fills the dropped bits with seeded coin flips — so that an LSB decoder reads a
  fair coin (bit accuracy 1/2), not zeros (whose bit accuracy is the secret's share of 0
  bits). Each weight moves by less than one unit in the k-th place: |Δθ| < 2^-k |θ|.
  `requantize(model, dtype="float16" | "bfloat16")` is the round trip through that type
  (float16: 10 mantissa bits and a range of ±65504; bfloat16: 7 bits, float32's range).
- `add_weight_noise(model, std, seed)` adds seeded N(0, std²) to every parameter
  (`relative=True`: std times each tensor's own standard deviation).

Both return a copy; the user's model is never rewritten. `sanitize_cost` measures the test
accuracy before and after. LSB encoding with b bits per weight survives requantisation only
where b > 23 - k (its top b + k - 23 bits).

Measured on the default setting (mnist5k, 3,500 training / 1,000 test rows, the victim MLP,
seed 0; LSB models of benchmarks/memorization_table.py: 8-bit training images in the low b
bits of every weight; script /work/bench18/h4/measure.py): the decoder's bit accuracy / the
test accuracy (0.925 before) after each sanitiser; "zeros" = the secret's share of 0 bits,
0.880, what a decoder reading only zeros scores.

    sanitiser                 b = 8            b = 16           b = 20
    requantize k=7 random     0.500 / 0.925    0.500 / 0.925    0.600 / 0.925
    requantize k=7 round      0.880 (zeros)    0.880 (zeros)    0.888 / 0.925
    requantize k=3 random     0.500 / 0.925    0.500 / 0.925    0.500 / 0.925
    requantize k=10 random    0.500 / 0.925    0.594 / 0.925    0.675 / 0.925
    float16                   0.880 (zeros)    0.884 / 0.925    0.906 / 0.925
    bfloat16                  0.880 (zeros)    0.880 (zeros)    0.889 / 0.925
    noise std 1e-3            0.503 / 0.925    0.502 / 0.925    0.498 / 0.924
    noise std 1e-2            0.522 / 0.920    0.511 / 0.920    0.509 / 0.918

The default (k = 7, random fill) leaves a fair coin where LSB's default 16 bits were, with
no test prediction changed; k = 3 covers b up to 20 at the same accuracy here.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.data import Dataset
from privacylab.defenses.backdoor.base import predicted_labels
from privacylab.defenses.memorization.base import (
    MemorizationDefenseError,
    positive_number,
    whole_number,
)

__all__ = ["DTYPES", "FILLS", "add_weight_noise", "requantize", "sanitize_cost"]

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
FILLS = ("random", "round", "zero")


def _float32_params(model: nn.Module, what: str) -> list[nn.Parameter]:
    params = list(model.parameters())
    if not params:
        raise MemorizationDefenseError(f"{what}: the model has no parameters")
    for p in params:
        if p.dtype != torch.float32:
            raise MemorizationDefenseError(f"{what}: parameters must be float32, got {p.dtype}")
    return params


def _requantize_bits(
    bits: np.ndarray, keep: int, fill: str, rng: np.random.Generator
) -> np.ndarray:
    drop = 23 - keep
    if drop == 0:
        return bits
    low = np.uint32((1 << drop) - 1)
    if fill == "round":
        sign = bits & np.uint32(0x80000000)
        magnitude = bits & np.uint32(0x7FFFFFFF)
        finite = magnitude < np.uint32(0x7F800000)
        rounded = (magnitude + np.uint32(1 << (drop - 1))) & ~low
        return np.where(finite, sign | np.minimum(rounded, np.uint32(0x7F800000)), bits)
    exponent_all_ones = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    kept = bits & ~low
    if fill == "random":
        kept = kept | (rng.integers(0, 1 << drop, size=bits.shape, dtype=np.uint32) & low)
    return np.where(exponent_all_ones, bits, kept)


def requantize(
    model: nn.Module,
    mantissa_bits: int | None = 7,
    *,
    dtype: str | None = None,
    fill: str = "random",
    seed: int = 0,
) -> nn.Module:
    """A copy of `model` with every float32 parameter re-quantised: to `mantissa_bits` (0..23)
    mantissa bits with the dropped bits filled by `fill` ("random": seeded coin flips; "round";
    "zero"), or, with `dtype`, through float16 / bfloat16 and back (`mantissa_bits` ignored)."""
    if dtype is not None:
        if dtype not in DTYPES:
            raise MemorizationDefenseError(
                f"requantize: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}"
            )
        out = copy.deepcopy(model)
        with torch.no_grad():
            for p in _float32_params(out, "requantize"):
                p.copy_(p.to(DTYPES[dtype]).to(torch.float32))
        return out
    keep = whole_number("requantize", "mantissa_bits", mantissa_bits, 0, 23)
    if fill not in FILLS:
        raise MemorizationDefenseError(
            f"requantize: fill must be one of {', '.join(FILLS)}, got {fill!r}"
        )
    whole_number("requantize", "seed", seed, 0)
    out = copy.deepcopy(model)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for p in _float32_params(out, "requantize"):
            bits = p.detach().cpu().numpy().astype(np.float32).view(np.uint32)
            new = _requantize_bits(bits, keep, fill, rng).view(np.float32)
            p.copy_(torch.from_numpy(np.ascontiguousarray(new)).to(p.device))
    return out


def add_weight_noise(
    model: nn.Module, std: float, seed: int = 0, *, relative: bool = False
) -> nn.Module:
    """A copy of `model` with seeded Gaussian noise N(0, std²) added to every parameter
    (`relative`: std times each tensor's own standard deviation)."""
    sd = positive_number("add_weight_noise", "std", std)
    whole_number("add_weight_noise", "seed", seed, 0)
    out = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for p in _float32_params(out, "add_weight_noise"):
            scale = sd * (float(p.detach().std()) if relative and p.numel() > 1 else 1.0)
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32) * scale
            p.add_(noise.to(p.device))
    return out


def sanitize_cost(model: nn.Module, sanitized: nn.Module, test: Dataset) -> dict[str, Any]:
    """Test accuracy of `model` and of its `sanitized` copy, and the share of test rows whose
    predicted label is unchanged (`agreement`); both models are left in the mode they were in."""
    if len(test) == 0:
        raise MemorizationDefenseError("sanitize_cost: the test set is empty")
    before = predicted_labels(model, test.features, 4096)
    after = predicted_labels(sanitized, test.features, 4096)
    labels = test.labels.cpu().numpy()
    return {
        "accuracy_before": float(np.mean(before == labels)),
        "accuracy_after": float(np.mean(after == labels)),
        "agreement": float(np.mean(before == after)),
    }
