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
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from torch import nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.memorization._penalty import penalty_training, sign_terms
from privacylab.attacks.memorization.base import (
    Decoded,
    MaliciousTraining,
    MemorizationAttack,
    MemorizationError,
    MemorizationTask,
    Secret,
    number_option,
    parameter_count,
    parameter_vector,
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
        theta = parameter_vector(target.model)[self.offset : self.offset + layout.total_bits]
        if theta.numel() < layout.total_bits:
            raise MemorizationError(
                f"{self.name}: the model has no parameters "
                f"[{self.offset}, {self.offset + layout.total_bits})"
            )
        bits = (theta.numpy() > 0).astype(np.uint8)
        return Decoded(values=layout.bits_to_values(bits), bits=bits)
