"""A small pre-LayerNorm transformer classifier over token ids.

The encoder follows Vaswani et al. 2017 ("Attention Is All You Need", Eq. 1 scaled dot-product
attention, multi-head attention of §3.2.2) with LayerNorm before each sub-layer (pre-LN, Xiong et
al. 2020, "On Layer Normalization in the Transformer Architecture"). Attention is written with
plain matrix products over nn.Linear projections instead of nn.MultiheadAttention, so that every
parameter sits in an nn.Linear, nn.Embedding or nn.LayerNorm (what the DP engine's per-layer norm
rules cover) and the forward pass is vmap-friendly for per-example gradients.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from privacylab.models import _checks
from privacylab.models.errors import ModelError
from privacylab.models.registry import register_model


class SelfAttention(nn.Module):
    """Multi-head self-attention: one Linear to queries, keys and values, one output Linear."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of `x` (..., L, dim), each (..., heads, L, head_dim)."""
        *batch, length, dim = x.shape
        qkv = self.qkv(x).reshape(*batch, length, 3, self.heads, dim // self.heads)
        q, k, v = qkv.movedim(-3, 0).transpose(-3, -2).unbind(0)
        return q, k, v

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor | None
    ) -> torch.Tensor:
        """Eq. 1 of Vaswani et al. with the scores where `hidden` is True masked out, heads
        merged and projected: (..., L, dim)."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if hidden is not None:
            scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
        out = self.dropout(scores.softmax(dim=-1)) @ v
        return self.proj(out.transpose(-3, -2).flatten(-2))

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """`x` (n, L, dim); `keep` (n, L) bool marks the keys that may be attended to."""
        q, k, v = self.project(x)
        return self.attend(q, k, v, None if keep is None else ~keep[..., None, None, :])


class Block(nn.Module):
    """Pre-LN encoder block: x + attention(LN(x)), then x + MLP(LN(x)) with a GELU MLP."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = SelfAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim),
            nn.GELU(),
            nn.Linear(mlp_ratio * dim, dim),
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.norm1(x), keep))
        return x + self.dropout(self.mlp(self.norm2(x)))


class TransformerClassifier(nn.Module):
    """Token + learned position embeddings, pre-LN blocks, final LayerNorm, mean pool, Linear.

    Input: int64 token ids of shape (n, L) with L <= max_len. With `pad_id` set, padding tokens
    are masked out of attention and of the mean pool.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        num_classes: int,
        dim: int = 64,
        heads: int = 4,
        blocks: int = 2,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        pad_id: int | None = None,
    ) -> None:
        super().__init__()
        self.max_len = max_len
        self.pad_id = pad_id
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(max_len, dim)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, dropout) for _ in range(blocks))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[-1]
        if length > self.max_len:
            raise ModelError(
                f"transformer: sequence length {length} exceeds max_len {self.max_len}"
            )
        # Positions expanded over the batch, so the position embedding sees the batch in
        # dimension 0 like every other layer (what per-example clipping by layer needs).
        positions = torch.arange(length, device=tokens.device).expand(tokens.shape)
        x = self.dropout(self.tokens(tokens) + self.positions(positions))
        keep = None if self.pad_id is None else tokens != self.pad_id
        for block in self.blocks:
            x = block(x, keep)
        x = self.norm(x)
        if keep is None:
            return self.head(x.mean(dim=-2))
        weights = keep.to(x.dtype).unsqueeze(-1)
        pooled = (x * weights).sum(dim=-2) / weights.sum(dim=-2).clamp_min(1.0)
        return self.head(pooled)


@register_model("transformer")
def transformer(
    input_shape: tuple[int, ...],
    num_classes: int,
    vocab_size: int,
    max_len: int | None = None,
    dim: int = 64,
    heads: int = 4,
    blocks: int = 2,
    mlp_ratio: int = 4,
    dropout: float = 0.0,
    pad_id: int | None = None,
) -> nn.Module:
    """A `TransformerClassifier` for token sequences of shape `input_shape == (L,)`.

    `max_len` (positions learned) defaults to L; `vocab_size` is required.
    """
    if len(input_shape) != 1:
        raise ModelError(f"transformer needs token inputs of shape (L,), got {input_shape}")
    vocab = _checks.positive_int("vocab_size", vocab_size, "transformer")
    length = (
        input_shape[0]
        if max_len is None
        else _checks.positive_int("max_len", max_len, "transformer")
    )
    if length < input_shape[0]:
        raise ModelError(f"transformer: max_len {length} < sequence length {input_shape[0]}")
    width = _checks.positive_int("dim", dim, "transformer")
    n_heads = _checks.positive_int("heads", heads, "transformer")
    if width % n_heads:
        raise ModelError(f"transformer: dim {width} must be divisible by heads {n_heads}")
    if pad_id is not None and (
        isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < vocab
    ):
        raise ModelError(f"transformer: pad_id must be an integer in [0, {vocab}), got {pad_id!r}")
    return TransformerClassifier(
        vocab_size=vocab,
        max_len=length,
        num_classes=num_classes,
        dim=width,
        heads=n_heads,
        blocks=_checks.positive_int("blocks", blocks, "transformer"),
        mlp_ratio=_checks.positive_int("mlp_ratio", mlp_ratio, "transformer"),
        dropout=_checks.dropout(dropout, "transformer"),
        pad_id=pad_id,
    )
