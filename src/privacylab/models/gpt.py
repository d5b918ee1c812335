"""A small causal (GPT-style) transformer language model over token ids.

Radford et al. 2019 ("Language Models are Unsupervised Multitask Learners", GPT-2): token and
learned position embeddings, pre-LayerNorm blocks of masked multi-head self-attention
(Vaswani et al. 2017, Eq. 1, with the causal mask of their decoder, Sec. 3.2.3) and a GELU MLP,
a final LayerNorm and a linear head to next-token logits. As in the classifier of
`privacylab.models.transformer`, every parameter sits in an nn.Linear, nn.Embedding or
nn.LayerNorm (the DP engine's ghost-clipping rules cover them; the head is not tied to the
token embedding, so each parameter belongs to one layer) and positions are expanded over the
batch so per-example norms see the batch in dimension 0.

Generation uses a key/value cache (`CausalLM.step`): each new token costs one position of
work instead of re-running the whole prefix.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from privacylab.models import _checks
from privacylab.models.errors import ModelError
from privacylab.models.registry import register_model
from privacylab.models.transformer import SelfAttention

Cache = list[tuple[Tensor, Tensor]]
"""Per block, the keys and values of the positions seen so far, each (n, heads, t, head_dim)."""


class CausalSelfAttention(SelfAttention):
    """Multi-head self-attention where position i attends to positions <= i only."""

    def forward(  # type: ignore[override]
        self, x: Tensor, past: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """`x` (..., L, dim) for the L newest positions, `past` the keys/values before them;
        returns the output and the keys/values of all positions."""
        length = x.shape[-2]
        q, k, v = self.project(x)
        if past is not None:
            k = torch.cat([past[0], k], dim=-2)
            v = torch.cat([past[1], v], dim=-2)
        total = k.shape[-2]
        rows = torch.arange(total - length, total, device=x.device)[:, None]
        cols = torch.arange(total, device=x.device)[None, :]
        return self.attend(q, k, v, cols > rows), (k, v)


class CausalBlock(nn.Module):
    """Pre-LN decoder block: x + attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = CausalSelfAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, past: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        attended, present = self.attention(self.norm1(x), past)
        x = x + self.dropout(attended)
        return x + self.dropout(self.mlp(self.norm2(x))), present


class CausalLM(nn.Module):
    """Next-token logits for every position: input (n, L) int64 ids with L <= max_len, output
    (n, L, vocab_size); output[:, t] is the distribution of token t + 1 given tokens <= t."""

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        dim: int = 128,
        heads: int = 4,
        blocks: int = 2,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(max_len, dim)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            CausalBlock(dim, heads, mlp_ratio, dropout) for _ in range(blocks)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens: Tensor) -> Tensor:
        logits, _ = self.step(tokens)
        return logits

    def step(self, tokens: Tensor, cache: Cache | None = None) -> tuple[Tensor, Cache]:
        """Logits for `tokens` (n, l), the positions right after those held in `cache` (None:
        the sequence starts here), and the cache extended by them."""
        start = 0 if cache is None else int(cache[0][0].shape[-2])
        length = tokens.shape[-1]
        if start + length > self.max_len:
            raise ModelError(
                f"gpt: sequence length {start + length} exceeds max_len {self.max_len}"
            )
        positions = torch.arange(start, start + length, device=tokens.device).expand(tokens.shape)
        x = self.dropout(self.tokens(tokens) + self.positions(positions))
        present: Cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if cache is None else cache[i])
            present.append(kv)
        return self.head(self.norm(x)), present


@register_model("gpt")
def gpt(
    input_shape: tuple[int, ...],
    num_classes: int,
    dim: int = 128,
    heads: int = 4,
    blocks: int = 2,
    mlp_ratio: int = 4,
    dropout: float = 0.0,
) -> nn.Module:
    """A `CausalLM` with context `input_shape == (L,)` and vocabulary `num_classes` (the
    "classes" of a language model are its next tokens)."""
    if len(input_shape) != 1:
        raise ModelError(f"gpt needs token inputs of shape (L,), got {input_shape}")
    context = _checks.positive_int("context", input_shape[0], "gpt")
    width = _checks.positive_int("dim", dim, "gpt")
    n_heads = _checks.positive_int("heads", heads, "gpt")
    if width % n_heads:
        raise ModelError(f"gpt: dim {width} must be divisible by heads {n_heads}")
    return CausalLM(
        vocab_size=_checks.positive_int("vocabulary", num_classes, "gpt"),
        max_len=context,
        dim=width,
        heads=n_heads,
        blocks=_checks.positive_int("blocks", blocks, "gpt"),
        mlp_ratio=_checks.positive_int("mlp_ratio", mlp_ratio, "gpt"),
        dropout=_checks.dropout(dropout, "gpt"),
    )
