"""Ghost-clipping rule for nn.EmbeddingBag (modes sum, mean and max).

Example i's gradient of an embedding table E ∈ R^{V×d} is sparse: only the rows of the tokens
of its bag(s) are non-zero.  With g_i = ∂L_i/∂out_i (the bag output of example i, row i of the
output gradient) and one call,

* sum / mean: out_i = Σ_{t ∈ bag i} s_t E[tok_t], where s_t is the per-sample weight (sum mode,
  1 without), or 1/n_i (mean, n_i the non-padding tokens of the bag), so
  ∇_E L_i[v] = (Σ_{t: tok_t = v} s_t) g_i, and
  ‖∇_E L_i‖² = Σ_v (Σ_{t: tok_t = v} s_t)² ‖g_i‖² — the ghost norm of an embedding layer in
  Li et al. 2022 ("Large language models can be strong differentially private learners",
  ghost clipping: ‖∇_E L_i‖² = Σ_{t,t'} 1[tok_t = tok_t'] g_t·g_t', with one-hot inputs), here
  with g_t = s_t g_i;
* max: out_i[j] = E[m_ij, j] with m_ij the row that attains the maximum of feature j (the
  indices torch's backward uses), so ∇_E L_i[v, j] = g_i[j] 1[m_ij = v].

Entries at ``padding_idx`` are excluded from the bag (and from n_i), as in torch.  Several calls
of the layer add their sparse contributions before norms are taken: every contribution is
keyed by (example, row) and equal keys are summed, which is the per-example analogue of
Σ_v ‖Σ_{t: tok_t = v} ·‖² and costs O(N·d) for N looked-up tokens.  The clipped sum
Σ_i c_i ∇_E L_i is an ``index_add_`` of the c-scaled contributions (the book-keeping algorithm
of Bu et al. 2023, "Differentially private optimization on large model at small cost").

A bag belongs to the example of its output row: the clipper checks by provenance that the
output is batch-first, and row i of the output gradient is ∂L_i/∂out_i, so 1-D input with
``offsets`` (one bag per example, in batch order) is exact too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import torch
from torch import Tensor, nn

from privacylab.training.dp.errors import GhostClippingError
from privacylab.training.dp.ghost.registry import LayerCall, LayerGradients, register_rule
from privacylab.training.dp.ghost.rules import _embedding_check, _rows, _sq

_MODES = {"sum": 0, "mean": 1, "max": 2}


class KeyedRowGradients(LayerGradients):
    """Per-example gradients that are sums of rows of a table: (example, key, value) triples.

    ∇L_i viewed as a (K, w) table is Σ_{n: rows_n = i} e_{keys_n} values_nᵀ; equal
    (example, key) pairs are summed before squaring.  The table is the (V, d) weight itself
    (w = d, keys are rows) or its entries (w = 1, key v·d + j for entry (v, j)).

    Args:
        rows: (N,) example of each contribution.
        keys: (N,) row of the (K, w) view of the weight it goes to.
        values: (N, w) contributions.
        num_keys: K.
        batch: B.
    """

    def __init__(
        self, rows: Tensor, keys: Tensor, values: Tensor, num_keys: int, batch: int
    ) -> None:
        self.rows, self.keys, self.values = rows, keys, values
        self.num_keys = num_keys
        self.batch = batch

    def sq_norms(self) -> dict[str, Tensor]:
        v = self.values
        unique, inverse = torch.unique(self.rows * self.num_keys + self.keys, return_inverse=True)
        grouped = torch.zeros(unique.shape[0], v.shape[1], dtype=v.dtype, device=v.device)
        grouped.index_add_(0, inverse, v)
        sq = torch.zeros(self.batch, dtype=v.dtype, device=v.device)
        sq.index_add_(0, unique // self.num_keys, _sq(grouped))
        return {"weight": sq}

    def clipped_sum(self, coef: Mapping[str, Tensor], out: Mapping[str, Tensor]) -> None:
        c = coef["weight"].to(self.values.dtype)
        weight = out["weight"]
        width = self.values.shape[1]
        for s in _rows(self.values.shape[0], width):
            scaled = self.values[s] * c[self.rows[s], None]
            if width == weight.shape[-1]:
                weight.index_add_(0, self.keys[s], scaled)
            else:  # entries of a (V, d) weight keyed by v·d + j
                d = weight.shape[-1]
                keys = self.keys[s]
                weight.index_put_((keys // d, keys % d), scaled[:, 0], accumulate=True)
        self.rows = self.keys = self.values = None  # type: ignore[assignment]


def _bags(layer: nn.EmbeddingBag, call: LayerCall) -> tuple[Tensor, Tensor, Tensor | None]:
    """Flat tokens, the bag (= example) of each, and per-sample weights, of one call."""
    bound = dict(zip(("input", "offsets", "per_sample_weights"), call.args, strict=False))
    bound.update(call.kwargs)
    tokens, offsets = bound["input"], bound.get("offsets")
    weights = bound.get("per_sample_weights")
    batch = call.backprop.shape[0]
    if tokens.dim() == 2:
        bags = torch.arange(batch, device=tokens.device).repeat_interleave(tokens.shape[1])
        return tokens.reshape(-1), bags, None if weights is None else weights.reshape(-1)
    if tokens.dim() != 1 or offsets is None:
        raise GhostClippingError(
            f"EmbeddingBag called on input of shape {tuple(tokens.shape)} without offsets; "
            "ghost clipping needs 2-D (batch, bag) input or 1-D input with one offset per example"
        )
    starts = offsets[:-1] if layer.include_last_offset else offsets
    if starts.shape[0] != batch:
        raise GhostClippingError(
            f"EmbeddingBag has {starts.shape[0]} bags for {batch} examples: the bag dimension "
            "is not the batch, so per-example gradients cannot be told apart; give one bag per "
            "example or use clipping='per_sample'"
        )
    positions = torch.arange(tokens.shape[0], device=tokens.device)
    bags = torch.bucketize(positions, starts, right=True) - 1
    if layer.include_last_offset:
        bags = torch.where(positions < offsets[-1], bags, -1)
    keep = bags >= 0
    tokens, bags = tokens[keep], bags[keep]
    return tokens, bags, None if weights is None else weights[keep]


def _contributions(layer: nn.EmbeddingBag, call: LayerCall) -> tuple[Tensor, Tensor, Tensor]:
    """(rows, keys, values) of one call in the (V, d) view (sum, mean) or (V·d, 1) view (max)."""
    g = call.backprop
    batch, d = g.shape[0], layer.embedding_dim
    tokens, bags, weights = _bags(layer, call)
    if layer.padding_idx is not None:
        keep = tokens != layer.padding_idx
        tokens, bags = tokens[keep], bags[keep]
        weights = None if weights is None else weights[keep]
    if layer.mode == "max":
        starts = torch.searchsorted(bags, torch.arange(batch, device=bags.device))
        _, _, sizes, argmax = torch.embedding_bag(
            layer.weight.detach(),
            tokens,
            starts,
            False,
            _MODES["max"],
            False,
            None,
            False,
            None,
        )
        rows = torch.arange(batch, device=g.device)[:, None].expand(batch, d)
        keys = argmax * d + torch.arange(d, device=g.device)
        filled = (sizes > 0)[:, None].expand(batch, d)
        return rows[filled], keys[filled], g[filled][:, None]
    if layer.mode == "mean":
        counts = torch.zeros(batch, dtype=g.dtype, device=g.device)
        counts.index_add_(0, bags, torch.ones_like(bags, dtype=g.dtype))
        scale = counts.reciprocal()[bags]
    elif weights is not None:
        scale = weights.to(g.dtype)
    else:
        scale = None
    values = g[bags] if scale is None else g[bags] * scale[:, None]
    return bags, tokens, values


@register_rule(nn.EmbeddingBag, check=_embedding_check)
def embedding_bag_rule(
    layer: nn.Module, calls: Sequence[LayerCall], trainable: Collection[str]
) -> LayerGradients:
    """nn.EmbeddingBag: sparse per-example contributions, summed per (example, row)."""
    parts = [_contributions(layer, call) for call in calls]  # type: ignore[arg-type]
    rows, keys, values = (
        torch.cat(x) if len(parts) > 1 else x[0] for x in zip(*parts, strict=True)
    )
    width = values.shape[1]
    return KeyedRowGradients(
        rows, keys, values, layer.weight.numel() // width, calls[0].backprop.shape[0]
    )
