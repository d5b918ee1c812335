"""Correlated value encoding (Song, Ristenpart & Shmatikov, "Machine Learning Models that
Remember Too Much", CCS 2017, Sec. 4.2).

The malicious training adds to the loss C(θ, s) = -λ_c |Σ(θ_i - θ̄)(s_i - s̄)| /
sqrt(Σ(θ_i - θ̄)² Σ(s_i - s̄)²): minus λ_c times the Pearson correlation between a stretch of
the parameters and the secret's pixel values, so that the parameters come to *look like*
the images, up to an affine map. The decoder reads the same stretch, maps it back to pixel
values and quantises.

Choices made here (all options):
- `blocks`: "global" is Song's single correlation over the whole secret vector; "item" one
  correlation per image (its own block of m = pixels parameters), averaged. Per-item blocks
  fix each image's own affine map, so the per-item min-max decoding below fits each item;
  a global correlation lets items differ in scale and still score well. Under DP-SGD only
  "item" exists (a global correlation is no single example's loss; see `_penalty`).
- `signed`: True (default) penalises -corr rather than -|corr|, so the decoder knows the
  orientation — a deviation from Song, who decodes with |corr|; with `signed=False` the
  orientation is resolved per item by the images' prior of a dark background (the
  orientation whose median pixel is darker: MNIST and digits are white strokes on black).
- Decoding maps each item's block by min-max to [0, 2^b - 1] and rounds: the secret items are
  images with (nearly) black background and (nearly) white strokes, so their own minimum and
  maximum are ≈ 0 and 1, and the affine map of a linear fit is recovered by the extremes.
- `strength` λ_c; `offset` the first parameter used (`parameter_vector` order).

capacity = (parameters - offset) × value bits (one parameter per pixel value).

Measured (the default setting: mnist5k, 3,500 training / 1,000 test rows of a seeded split,
the victim recipe's 784-512-256-10 MLP of 535,818 parameters, 20 epochs of Adam; the secret
100 8-bit training images = 627,200 bits, i.e. the input weights of the first 100 hidden
units; recovered = decoded nearer to its original than to any other training row; PSNR per
item capped at 100 dB; script /work/bench18/h2_default.py, one seed). The honest model: test
accuracy 0.945; an honest model's slice decodes nothing (on the digits MLP of the tests: mean
|corr| 0.16, 0 of 20 recovered).

    blocks  λ_c    accuracy  recovered  bit acc.  MAE       PSNR
    item    1      0.954     100/100    0.9916    1.9e-4    82.6
    item    3      0.959     100/100    0.9950    9.7e-5    89.4
    item    10     0.961     100/100    0.9955    8.2e-5    93.9
    item    100    0.956     100/100    0.9955    8.2e-5    93.9
    item    1000   0.959     100/100    0.9956    8.2e-5    93.9
    global  1      0.958     100/100    0.9923    1.7e-4    86.7
    global  3      0.956     100/100    0.9953    8.7e-5    91.6
    600 images (470,400 parameters: all 512 first-layer units, the biases, 87 second-layer units)
    item    1      0.964     590/600    0.5967    0.167     16.5   (|r| 0.947)
    item    100    0.950     600/600    0.7940    0.020     42.1   (|r| 0.9997)

The decoded images correlate with the originals at |r| > 0.99999: what is left are single
levels lost where one parameter overshoots the block's extreme (the min-max map). On this
setting the encoding costs no accuracy — image-like first-layer units act as a regulariser
(+1 point over the honest 0.945); the cost Song et al. report grows with λ_c once the secret
reaches the layers the task needs (600 images: 0.964 at λ_c = 1, 0.950 at 100; digits,
64-unit MLP, 72 images spilling into the output layer: 0.941 at λ_c = 1, 0.26 at λ_c = 300,
tests/attacks/memorization/test_correlation.py). "item" and "global" both recover all 100
images (global's PSNR is 2-4 dB higher at > 80 dB, i.e. a few pixels one level off, one
seed); "item" is the default because it is the one DP-SGD can apply to, so the private and
non-private runs use one encoder. λ_c = 1 (the value Song et al.'s code is tested with)
already decodes every image.

Under DP-SGD (`recipe.private(ε)`: Poisson batches of 256, clip 1, 20 epochs, per-item blocks
through each secret row's own loss, `_penalty`), nothing is recovered: at ε = 8 (σ = 1.03,
λ_c = 3) accuracy 0.901 (honest DP model 0.904), 0/100 recovered, mean |r| 0.052, bit accuracy
0.501; at ε = 1 (σ = 4.71, λ_c = 1) accuracy 0.830 (honest DP 0.829), 0/100, |r| 0.033,
bit accuracy 0.502 (script /work/bench18/h2_dp.py, 8-11 CPU-minutes a model).
"""

from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.memorization._penalty import (
    correlation_terms,
    penalty_training,
    released_block,
)
from privacylab.attacks.memorization.base import (
    Decoded,
    MaliciousTraining,
    MemorizationAttack,
    MemorizationError,
    MemorizationTask,
    Secret,
    SecretLayout,
    _refuse_above,
    number_option,
    parameter_count,
    register_memorization,
    whole_option,
)
from privacylab.data import Dataset
from privacylab.target import Access, Target

__all__ = ["BLOCKS", "CorrelatedValueEncoding"]

BLOCKS = ("item", "global")
"""Correlation blocks: one per secret item (default), or Song's one over the whole secret."""


@register_memorization
class CorrelatedValueEncoding(MemorizationAttack):
    """Correlated value encoding of image pixels into the parameters (Song et al. 2017,
    Sec. 4.2); see the module docstring. Options: `strength` λ_c, `blocks` ("item" or
    "global"), `signed`, `offset`."""

    name: ClassVar[str] = "correlation"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.WHITEBOX, ())
    private_ok: ClassVar[bool] = True
    default_items: ClassVar[int] = 100
    """The job's default secret: 100 8-bit images (the setting measured above)."""
    default_value_bits: ClassVar[int] = 8

    def __init__(
        self,
        *,
        strength: float = 1.0,
        blocks: str = "item",
        signed: bool = True,
        offset: int = 0,
    ) -> None:
        self.strength = number_option(self.name, "strength", strength)
        if blocks not in BLOCKS:
            raise MemorizationError(
                f"{self.name}: blocks must be one of {', '.join(BLOCKS)}, got {blocks!r}"
            )
        self.blocks = blocks
        if not isinstance(signed, bool):
            raise MemorizationError(f"{self.name}: signed must be true or false, got {signed!r}")
        self.signed = signed
        self.offset = whole_option(self.name, "offset", offset, low=0)

    def _values(self, model: nn.Module) -> int:
        return max(parameter_count(model) - self.offset, 0)

    def capacity(self, model: nn.Module, num_classes: int, train_rows: int) -> int:
        """(parameters - offset) × 8: one parameter per 8-bit pixel value (the default
        secret's; `check_capacity` counts with the secret's own value bits)."""
        return self._values(model) * 8

    def check_capacity(
        self, layout: SecretLayout, model: nn.Module, num_classes: int, train_rows: int
    ) -> None:
        """One line when the secret is tabular (a correlation recovers values only up to an
        affine map: float32 rows cannot be decoded) or needs more parameters than the model
        has after `offset` (one per pixel value: (parameters - offset) × value bits)."""
        if layout.kind != "image":
            raise MemorizationError(
                f"{self.name}: encodes image pixels; a {layout.kind} secret is recovered only "
                "up to an affine map (use lsb or sign)"
            )
        _refuse_above(self.name, layout, self._values(model) * layout.value_bits)

    def encode(
        self,
        secret: Secret,
        model: nn.Module,
        data: Dataset,
        *,
        key: int = 0,
        private: bool = False,
    ) -> MaliciousTraining:
        """The training with -λ_c corr added to the loss (per item or global); under DP-SGD
        per-item blocks carried by each secret row's own loss (`_penalty.penalty_training`)."""
        layout = secret.layout
        self.check_capacity(layout, model, data.num_classes, len(data))
        if private and self.blocks == "global":
            raise MemorizationError(
                f"{self.name}: a global correlation is no single example's loss, so DP-SGD "
                "cannot clip it; use blocks='item'"
            )
        targets = torch.as_tensor(secret.values.astype(np.float64), dtype=torch.float32)
        if self.blocks == "global":
            targets = targets.reshape(1, -1)
        term = functools.partial(correlation_terms, absolute=not self.signed)
        return penalty_training(
            model,
            data,
            targets,
            self.offset,
            term,
            self.strength,
            secret_rows=secret.rows,
            private=private,
        )

    def run(self, target: Target, task: MemorizationTask) -> Decoded:
        """Each item's block of the released parameters, oriented, min-max mapped to
        [0, 2^b - 1] and rounded."""
        layout = task.layout
        if layout.kind != "image":
            raise MemorizationError(f"{self.name}: decodes image secrets only")
        size = layout.items * layout.values_per_item
        theta = released_block(self.name, target.model, self.offset, size)
        blocks = theta.double().numpy().reshape(layout.items, layout.values_per_item)
        return Decoded(values=decode_blocks(blocks, layout.levels, oriented=self.signed))


def decode_blocks(blocks: np.ndarray, levels: int, *, oriented: bool = True) -> np.ndarray:
    """Rows of parameters as quantised pixels: min-max per row onto [0, `levels`], rounded;
    unless `oriented`, a row whose median lies in its upper half is flipped first (dark
    background prior). A constant row decodes as zeros."""
    rows = np.array(blocks, dtype=np.float64)
    low = rows.min(1, keepdims=True)
    span = rows.max(1, keepdims=True) - low
    unit = np.divide(rows - low, span, out=np.zeros_like(rows), where=span > 0)
    if not oriented:
        flip = np.median(unit, axis=1) > 0.5
        unit[flip] = 1.0 - unit[flip]
    return np.rint(unit * levels).astype(np.uint64)
