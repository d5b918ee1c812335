"""Sign encoding (Song, Ristenpart & Shmatikov, "Machine Learning Models that Remember Too
Much", CCS 2017, Sec. 4.3).

Each secret bit is written in the sign of one parameter: the malicious training adds to the
loss P(θ, s) = λ_s/ℓ Σ_i |max(0, -θ_i s_i)|, s_i = +1 for a 1 bit and -1 for a 0 bit, over the
ℓ secret bits, which is zero once every parameter's sign is its bit's and otherwise pulls
the wrong-signed ones across zero. The decoder reads bit i as θ_i > 0 from parameter
`offset + i` of `parameter_vector` (bits MSB first, item by item: `Secret.bits`).

Any secret kind works (image pixels of any value bits, tabular float32 rows). Under DP-SGD
each secret item's bits form the block carried by that item's own training row (see
`_penalty`; the non-private penalty is the same mean over blocks of equal size).

capacity = parameters - offset bits (one bit per parameter).

Measured (the default setting: mnist5k, 3,500 training / 1,000 test rows, the victim
recipe's 535,818-parameter MLP, 20 epochs; the secret 40 4-bit training images = 125,440
bits from parameter 0; script /work/bench18/h2_default.py, one seed; honest test accuracy
0.945, an honest model's signs match the bits at 0.50):

    λ_s    accuracy  recovered  bit acc.   MAE      PSNR
    10     0.954     40/40      0.99716    2.9e-3   43.0
    100    0.955     40/40      0.999992   8.5e-6   98.5
    1000   0.958     40/40      1.0        0        100

No accuracy cost at any of them (the sign penalty only acts on wrong-signed weights).
Under DP-SGD (`recipe.private(8)`: σ = 1.03, Poisson batches of 256, clip 1, 20 epochs,
λ_s = 100 through each secret row's own loss, `_penalty`): accuracy 0.906 (honest DP model
0.904), 0/40 recovered, bit accuracy 0.498 — chance; at ε = 1 (σ = 4.71) accuracy 0.828
(honest DP 0.829), 0/40, bit accuracy 0.497 (script /work/bench18/h2_dp.py; 7-28 minutes a
model on the loaded machine: per-example vmap gradients of 535k parameters).
The default λ_s = 100 is the smallest of these that decodes (almost) every bit, and also
the one that writes > 95 % of the bits on the small digits MLP of the tests.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from torch import nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.memorization._penalty import (
    penalty_training,
    released_block,
    sign_terms,
)
from privacylab.attacks.memorization.base import (
    Decoded,
    MaliciousTraining,
    MemorizationAttack,
    MemorizationTask,
    Secret,
    number_option,
    parameter_count,
    register_memorization,
    whole_option,
)
from privacylab.data import Dataset
from privacylab.target import Access, Target

__all__ = ["SignEncoding"]


@register_memorization
class SignEncoding(MemorizationAttack):
    """Sign encoding of a secret's bits into the parameters' signs (Song et al. 2017,
    Sec. 4.3); see the module docstring. Options: `strength` λ_s, `offset`."""

    name: ClassVar[str] = "sign"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.WHITEBOX, ())
    private_ok: ClassVar[bool] = True
    default_items: ClassVar[int] = 40
    """The job's default secret: 40 4-bit images (the setting measured above)."""
    default_value_bits: ClassVar[int] = 4

    def __init__(self, *, strength: float = 100.0, offset: int = 0) -> None:
        self.strength = number_option(self.name, "strength", strength)
        self.offset = whole_option(self.name, "offset", offset, low=0)

    def capacity(self, model: nn.Module, num_classes: int, train_rows: int) -> int:
        """parameters - offset: one bit per parameter."""
        return max(parameter_count(model) - self.offset, 0)

    def encode(
        self,
        secret: Secret,
        model: nn.Module,
        data: Dataset,
        *,
        key: int = 0,
        private: bool = False,
    ) -> MaliciousTraining:
        """The training with λ_s/ℓ Σ max(0, -θ_i s_i) added to the loss; under DP-SGD each
        item's bits carried by its own row's loss (`_penalty.penalty_training`)."""
        layout = secret.layout
        self.check_capacity(layout, model, data.num_classes, len(data))
        bits = secret.bits().astype(np.float32).reshape(layout.items, layout.bits_per_item)
        targets = torch.as_tensor(2.0 * bits - 1.0)
        return penalty_training(
            model,
            data,
            targets,
            self.offset,
            sign_terms,
            self.strength,
            secret_rows=secret.rows,
            private=private,
        )

    def run(self, target: Target, task: MemorizationTask) -> Decoded:
        """Bit i = [θ_{offset+i} > 0], read into values by the layout."""
        layout = task.layout
        theta = released_block(self.name, target.model, self.offset, layout.total_bits)
        bits = (theta.numpy() > 0).astype(np.uint8)
        return Decoded(values=layout.bits_to_values(bits), bits=bits)
