"""LSB encoding (Song, Ristenpart & Shmatikov, "Machine Learning Models that Remember Too
Much", CCS 2017, Sec. 4.1): the malicious code trains honestly, then overwrites the `bits`
least significant bits of each float32 parameter with the secret's bit stream.

Memory. The parameters in `parameter_vector` order, from position `offset`: parameter
`offset + k` holds bits [k·b, (k+1)·b) of the stream (most significant first) in its low b
mantissa bits, read through a uint32 view; the last parameter's unused low bits are written 0.
The capacity is (parameters - offset)·b bits.

Why accuracy is unchanged. A normal float32 θ = ±1.m·2^e keeps its sign and exponent: only
the low b of its 23 mantissa bits change, so |Δθ| < 2^(b-23)·2^e ≤ 2^(b-23)·|θ| (for 0 and
subnormals |Δθ| < 2^(b-149)). At b = 16 that is under 2^-7 = 0.8 % of every weight.

Measured on the default setting (mnist5k: 3,500 training and 1,000 test rows of a seeded
permutation; the victim MLP, 535,818 parameters, 20 epochs of Adam, seed 0; honest test
accuracy 0.962). Secret: 200 training images at 8 bits a pixel (1,254,400 bits): for b = 3, 8,
12, 16, 20, 21, 22, 23 every image comes back exact (bit accuracy 1, 200/200 recognised), the
largest relative weight change is just under the bound 2^(b-23) each time, and test accuracy
is 0.962 at every b but b = 22 (0.963); 0 test predictions change for b <= 20, 2 at b = 21,
3 at b = 22 and 23 (b < 3 is refused: 535,818·2 bits hold 170 items); `train_encoded` at
b = 16 releases a model of the same 0.962. That secret fills only the first 78,400 parameters
at b = 16 (first-layer weights, many on border pixels that are always 0). Every parameter filled
with random bits (3 streams each; the worst case, all 535,818 parameters written): 0.962 for
b = 8, 12, 16, 18; 0.961-0.963 at b = 20 and 21; 0.958-0.959 at b = 22; 0.960-0.961 at b = 23.
Seed 1 (honest 0.951), every parameter filled: 0.951 for b <= 18, 0.949-0.953 for b = 20-23.
(Throwaway scripts /work/bench18/lsb_bits.py and lsb_fill.py, run as
`OMP_NUM_THREADS=2 python /work/bench18/lsb_bits.py 0`.)

It is post-processing of the trained model, so DP-SGD cannot bound it (`private_ok` False):
the privacy guarantee of DP-SGD covers the training algorithm, and this code runs its own.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.memorization.base import (
    Decoded,
    MaliciousTraining,
    MemorizationAttack,
    MemorizationError,
    MemorizationTask,
    Secret,
    load_parameter_vector,
    parameter_count,
    parameter_vector,
    register_memorization,
    whole_option,
)
from privacylab.data import Dataset
from privacylab.stats.memorization import from_bits, to_bits
from privacylab.target import Access, Target

__all__ = ["DEFAULT_BITS", "MANTISSA_BITS", "LSBEncoding", "read_lsb", "write_lsb"]

MANTISSA_BITS = 23
"""Explicit mantissa bits of an IEEE-754 float32: the most LSB encoding may overwrite
without touching the exponent or the sign."""

DEFAULT_BITS = 16
"""Bits overwritten per parameter by default: the authors' code default (csong27/ml-model-remember,
`--bits 16`), and on our MLP two bits below the largest b that changed no test accuracy with every
parameter written (18; module docstring). Capacity of the victim MLP at 16 bits: 8,573,088
bits, 1,366 mnist images of 8-bit pixels."""

PRIVATE_REFUSAL = "lsb writes the weights after training; DP-SGD cannot apply to it"


def _bits_option(bits: object) -> int:
    b = whole_option("lsb", "bits", bits)
    if b > MANTISSA_BITS:
        raise MemorizationError(
            f"lsb: bits must be a whole number in [1, {MANTISSA_BITS}] (the float32 mantissa), "
            f"got {bits!r}"
        )
    return b


def _float_vector(vector: Tensor | np.ndarray) -> np.ndarray:
    v = vector.detach().cpu().numpy() if isinstance(vector, Tensor) else np.asarray(vector)
    if v.dtype != np.float32:
        raise MemorizationError(f"lsb: parameters must be float32, got {v.dtype}")
    return np.ascontiguousarray(v.ravel())


def write_lsb(vector: Tensor | np.ndarray, stream: object, bits: int, offset: int = 0) -> Tensor:
    """A copy of the float32 `vector` whose entries from `offset` hold the 0/1 `stream` in
    their `bits` low mantissa bits, `bits` stream bits per entry, most significant first (Song
    et al. 2017, Sec. 4.1); one line when the stream does not fit."""
    b = _bits_option(bits)
    start = whole_option("lsb", "offset", offset, low=0)
    v = _float_vector(vector)
    s = np.asarray(stream).ravel()
    slots = -(-s.size // b)
    if start + slots > v.size:
        raise MemorizationError(
            f"lsb: {s.size} bits need {slots} parameters from offset {start}, "
            f"but only {max(v.size - start, 0)} are there"
        )
    padded = np.zeros(slots * b, dtype=np.uint8)
    padded[: s.size] = s
    chunks = from_bits(padded, b).astype(np.uint32)
    words = v.view(np.uint32).copy()
    mask = np.uint32((1 << b) - 1)
    words[start : start + slots] = (words[start : start + slots] & ~mask) | chunks
    return torch.from_numpy(words.view(np.float32))


def read_lsb(vector: Tensor | np.ndarray, count: int, bits: int, offset: int = 0) -> np.ndarray:
    """The `count` stream bits `write_lsb` wrote into `vector` with `bits` and `offset`."""
    b = _bits_option(bits)
    start = whole_option("lsb", "offset", offset, low=0)
    n = whole_option("lsb", "count", count, low=0)
    v = _float_vector(vector)
    slots = -(-n // b)
    if start + slots > v.size:
        raise MemorizationError(
            f"lsb: {n} bits need {slots} parameters from offset {start}, "
            f"but only {max(v.size - start, 0)} are there"
        )
    words = v.view(np.uint32)[start : start + slots]
    low = (words & np.uint32((1 << b) - 1)).astype(np.uint64)
    return to_bits(low, b)[:n]


def _require_float32(model: nn.Module) -> None:
    for p in model.parameters():
        if p.dtype != torch.float32:
            raise MemorizationError(
                f"lsb: parameters must be float32 to write their low mantissa bits, got {p.dtype}"
            )


@register_memorization
class LSBEncoding(MemorizationAttack):
    """Song et al. 2017, Sec. 4.1: honest training, then the secret's bits overwrite the `bits`
    (1..23) low mantissa bits of each float32 parameter from position `offset` of
    `parameter_vector`; decoding reads them back from the white-box model. Not available under
    DP-SGD (post-processing outside the private training)."""

    name: ClassVar[str] = "lsb"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.WHITEBOX, ())
    private_ok: ClassVar[bool] = False

    def __init__(self, *, bits: int = DEFAULT_BITS, offset: int = 0) -> None:
        self.bits = _bits_option(bits)
        self.offset = whole_option("lsb", "offset", offset, low=0)

    def capacity(self, model: nn.Module, num_classes: int, train_rows: int) -> int:
        """(parameters - offset) · bits: every float32 parameter after `offset` holds `bits`."""
        _require_float32(model)
        return max(parameter_count(model) - self.offset, 0) * self.bits

    def encode(
        self,
        secret: Secret,
        model: nn.Module,
        data: Dataset,
        *,
        key: int = 0,
        private: bool = False,
    ) -> MaliciousTraining:
        """Honest training of `model` on `data`; `release` writes the secret into the trained
        weights' low bits (in place) and returns them."""
        if private:
            raise MemorizationError(PRIVATE_REFUSAL)
        _require_float32(model)
        stream = secret.bits()
        self.check_capacity(secret.layout, model, data.num_classes, len(data))

        def release(trained: nn.Module) -> nn.Module:
            _require_float32(trained)
            vector = write_lsb(parameter_vector(trained), stream, self.bits, self.offset)
            load_parameter_vector(trained, vector)
            return trained

        return MaliciousTraining(model, data, release=release)

    def run(self, target: Target, task: MemorizationTask) -> Decoded:
        """Read `task.layout.total_bits` bits from the low mantissa bits of `target.model`'s
        parameters (no forward pass: no queries)."""
        model = target.model
        for p in model.parameters():
            if p.dtype not in (torch.float32, torch.float64):
                raise MemorizationError(f"lsb: parameters must be float32, got {p.dtype}")
        layout = task.layout
        stream = read_lsb(parameter_vector(model), layout.total_bits, self.bits, self.offset)
        return Decoded(layout.bits_to_values(stream), stream)
