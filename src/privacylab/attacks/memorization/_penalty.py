"""The penalty-through-training machinery of the white-box encodings that go through the
loss: correlated value encoding and sign encoding (Song, Ristenpart & Shmatikov, "Machine
Learning Models that Remember Too Much", CCS 2017, Sec. 4.2-4.3).

Both add to the training loss a term of the parameters alone, made of one term per *block*:
the parameters `parameter_vector(model)[offset + k·m : offset + (k+1)·m]` that hold secret
item k (m = the item's values for correlation, its bits for sign encoding), or one block over
the whole secret (Song's single correlation, "global").

- Without DP the term is a scalar, `strength × mean over blocks`, added to the mean loss
  through the trainer's regulariser hook (`scalar_regularizer`).
- Under DP-SGD (Abadi et al. 2016, Alg. 1) every example's gradient is clipped and noised, so
  a term of the weights alone is no example's loss. The malicious code then makes it one:
  `SlotModule` takes `(x, slot)`, `slot` = the secret item a training row *is* (-1 for the
  other rows), and returns the logits with one more column, the row's own block's term
  computed from the functional parameters (inside `torch.func.vmap`, so the per-example
  gradient of the row is the gradient of CE + its block's term, clipped and noised together);
  `slot_loss` adds that column to the cross-entropy. Each block's term is scaled by N/K
  (rows / items) so that the expected penalty of a Poisson batch of rate q, averaged over its
  expected size qN, is the non-private one: E[Σ_batch N/K·t_slot]/(qN) = (1/K) Σ_k t_k.
  A global correlation is a function of all blocks at once, so it is not any one example's
  loss: under DP only per-item blocks exist. In evaluation mode `SlotModule` returns the
  plain logits (accuracy is read from them); `release` unwraps it.

What DP-SGD leaves of the encodings (digits, 64-unit MLP, 1,200 training rows; scripts
/work/bench18/h2_dp_sigma.py and h2_dp_quick.py; Poisson batches of 64, Adam 5e-3, 10 epochs,
clip 1, λ_c = 5 on 20 8-bit images / λ_s = 100 on 15 4-bit images; mean |corr| decoded vs original,
sign bit accuracy; without DP: 0.98-1.0 / 0.977):

    σ                          0.001   0.05    0.3 (ε=100)  0.80 (ε=8)  2.94 (ε=1)
    correlation, mean |corr|   0.50    0.40    0.17         0.12        0.11
    sign, bit accuracy         0.69    0.57    0.50         0.49        0.49

An honest model's |corr| is 0.15 and its bit accuracy 0.5: from ε = 100 on nothing is left.
Even at σ = 0.001 most of the encoding is gone — the clipping does it: with the clipping norm
at 1000 (σ = 1e-5) the same runs decode |corr| 0.93 and 93 % of the bits. Each secret row
carries its block only in the steps it is sampled in, and then with norm ≤ C like any
example: DP-SGD's sensitivity bound is exactly what limits the encoding (the seed's
"even with a vanishingly small amount of noise").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.attacks.memorization.base import (
    MaliciousTraining,
    MemorizationError,
    parameter_count,
    parameter_vector,
)
from privacylab.data import Dataset

__all__ = [
    "BlockTerm",
    "SlotModule",
    "correlation_terms",
    "parameter_slice",
    "penalty_training",
    "released_block",
    "scalar_regularizer",
    "sign_terms",
    "slot_loss",
    "slots",
]

BlockTerm = Callable[[Tensor, Tensor], Tensor]
"""``term(theta, targets) -> (K,)``: one penalty per block from the blocks' parameters
`theta` (K, m) and their secret targets (K, m); smaller is better encoded."""


def correlation_terms(theta: Tensor, targets: Tensor, *, absolute: bool = False) -> Tensor:
    """Minus the Pearson correlation of each row of `theta` with the same row of `targets`
    (Song et al. 2017, Sec. 4.2: C(θ, s) = -|Σ(θ_i - θ̄)(s_i - s̄)| / sqrt(Σ(θ_i - θ̄)²
    Σ(s_i - s̄)²), without λ_c); `absolute` takes |corr| as Song does, else the signed
    correlation (the decoder then knows the orientation). A constant row has correlation 0."""
    t = theta - theta.mean(-1, keepdim=True)
    s = targets - targets.mean(-1, keepdim=True)
    denominator = torch.sqrt((t * t).sum(-1) * (s * s).sum(-1) + 1e-20)
    corr = (t * s).sum(-1) / denominator
    return -(corr.abs() if absolute else corr)


def sign_terms(theta: Tensor, targets: Tensor) -> Tensor:
    """Per block, the mean over its ℓ parameters of max(0, -θ_i s_i), s_i in {-1, +1} the
    secret bit (Song et al. 2017, Sec. 4.3: P(θ, s) = λ_s/ℓ Σ|max(0, -θ_i s_i)|, without
    λ_s): zero once every parameter's sign is its bit's."""
    return F.relu(-theta * targets).mean(-1)


def parameter_slice(params: Sequence[Tensor], start: int, length: int) -> Tensor:
    """Entries [start, start + length) of the parameters flattened in order (the order of
    `parameter_vector`), differentiable, touching only the parameters that overlap it."""
    pieces, position, end = [], 0, start + length
    for p in params:
        n = p.numel()
        lo, hi = max(start, position), min(end, position + n)
        if lo < hi:
            pieces.append(p.reshape(-1)[lo - position : hi - position])
        position += n
        if position >= end:
            break
    if position < end:
        raise MemorizationError(
            f"parameters [{start}, {end}) lie beyond the model's {position} parameters"
        )
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0]


def released_block(name: str, model: nn.Module, offset: int, size: int) -> Tensor:
    """The decoder's read: parameters [offset, offset + size) of the released `model` in
    `parameter_vector` order (detached, float32, CPU), or one line when the model is shorter."""
    theta = parameter_vector(model)[offset : offset + size]
    if theta.numel() < size:
        raise MemorizationError(f"{name}: the model has no parameters [{offset}, {offset + size})")
    return theta


def _block_terms(params: Sequence[Tensor], targets: Tensor, offset: int, term: BlockTerm) -> Tensor:
    blocks, width = targets.shape
    theta = parameter_slice(params, offset, blocks * width).reshape(blocks, width)
    return term(theta, targets.to(theta.device, theta.dtype))


def scalar_regularizer(
    model: nn.Module, targets: Tensor, offset: int, term: BlockTerm, strength: float
) -> Callable[[nn.Module, Tensor, Tensor, Tensor], Tensor]:
    """The trainer's regulariser (a scalar, without DP): `strength` × the mean of the block
    terms of `model`'s parameters (those of the module being trained: the closure holds
    `model`, whose parameters the trainer updates in place)."""
    params = list(model.parameters())

    def regularizer(body: nn.Module, x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
        return strength * _block_terms(params, targets, offset, term).mean()

    return regularizer


class SlotModule(nn.Module):
    """`model` with its per-example penalty (DP-SGD path; see the module docstring).

    `forward(x, slot)` in training mode returns (B, C + 1): the logits and, as the last
    column, `scale` × the term of block `slot` of the parameters (0 where slot = -1); in
    evaluation mode the logits alone. The block terms are computed from `self.model`'s
    parameters as `functional_call` binds them, so `vmap(grad(...))` differentiates each
    example's own term."""

    def __init__(
        self, model: nn.Module, targets: Tensor, offset: int, term: BlockTerm, scale: float
    ) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("targets", targets.detach().clone())
        self.offset = int(offset)
        self.term = term
        self.scale = float(scale)

    def forward(self, x: Tensor, slot: Tensor) -> Tensor:
        logits = self.model(x)
        if not self.training:
            return logits
        terms = _block_terms(list(self.model.parameters()), self.targets, self.offset, self.term)
        blocks = torch.arange(terms.shape[0], device=slot.device)
        mine = (slot.reshape(-1, 1) == blocks.reshape(1, -1)).to(terms.dtype)
        own = (mine * terms.reshape(1, -1)).sum(-1) * self.scale
        return torch.cat([logits, own.reshape(-1, 1).to(logits.dtype)], dim=-1)


def slot_loss(num_classes: int) -> Callable[[Tensor, Tensor], Tensor]:
    """Per-example loss of a `SlotModule`'s output: cross-entropy on the first `num_classes`
    columns plus the penalty column when there is one (training mode)."""

    def loss(out: Tensor, target: Tensor) -> Tensor:
        ce = F.cross_entropy(out[..., :num_classes], target, reduction="none")
        if out.shape[-1] == num_classes + 1:
            return ce + out[..., num_classes]
        return ce

    return loss


def slots(rows: int, secret_rows: Sequence[int] | Tensor) -> Tensor:
    """int64 (rows,): k at the training row of secret item k, -1 elsewhere."""
    index = torch.as_tensor(secret_rows, dtype=torch.int64).reshape(-1)
    out = torch.full((rows,), -1, dtype=torch.int64)
    out[index] = torch.arange(len(index), dtype=torch.int64)
    return out


def _unwrap(module: nn.Module) -> nn.Module:
    return module.model if isinstance(module, SlotModule) else module


def penalty_training(
    model: nn.Module,
    data: Dataset,
    targets: Tensor,
    offset: int,
    term: BlockTerm,
    strength: float,
    *,
    secret_rows: Sequence[int] | Tensor,
    private: bool,
) -> MaliciousTraining:
    """The malicious training of an encoding by penalty: blocks `targets` (K, m) written from
    parameter `offset`. Without DP the model itself with `scalar_regularizer`; with `private`
    a `SlotModule` on ((x, slot), y), per-example `slot_loss`, clipping "per_sample" and
    `release` unwrapping it (each block's term scaled by N/K, see the module docstring)."""
    blocks, width = targets.shape
    if offset + blocks * width > parameter_count(model):
        raise MemorizationError(
            f"the encoding needs parameters [{offset}, {offset + blocks * width}) but the model "
            f"has {parameter_count(model)}"
        )
    if not private:
        return MaliciousTraining(
            model=model,
            data=data,
            regularizer=scalar_regularizer(model, targets, offset, term, strength),
        )
    index = torch.as_tensor(secret_rows, dtype=torch.int64).reshape(-1)
    if len(index) != blocks or len(torch.unique(index)) != blocks:
        raise MemorizationError(
            f"under DP-SGD each of the {blocks} blocks needs its own training row, got "
            f"{len(torch.unique(index))} distinct rows"
        )
    if int(index.min()) < 0 or int(index.max()) >= len(data):
        raise MemorizationError(
            f"the secret's rows must be training rows in [0, {len(data)}), got "
            f"{int(index.min())}..{int(index.max())}"
        )
    scale = strength * len(data) / blocks
    wrapper = SlotModule(model, targets, offset, term, scale)
    return MaliciousTraining(
        model=wrapper,
        data=((data.features, slots(len(data), index)), data.labels),
        loss_fn=slot_loss(data.num_classes),
        release=_unwrap,
        clipping="per_sample",
    )
