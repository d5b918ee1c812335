"""Ghost-clipping rules for Linear, Conv2d (groups=1), Embedding, LayerNorm, GroupNorm, RMSNorm.

Further rules live in ``rules_conv.py`` (Conv1d/2d/3d with any groups, ConvTranspose1d/2d/3d),
``rules_embedding.py`` (EmbeddingBag) and ``rules_norm.py`` (InstanceNorm1d/2d/3d); they are
imported at the end of this module, so importing it registers every built-in rule.

Notation for one layer and one batch: a ∈ R^{B×T×d} are the layer inputs, g ∈ R^{B×T×p} the
gradients of Σ_i L_i with respect to the layer outputs (row i depends on example i only), and
∇_W L_i = g_iᵀ a_i ∈ R^{p×d}.

* Linear without a sequence dimension (T = 1): ‖∇_W L_i‖² = ‖a_i‖²‖g_i‖², ‖∇_b L_i‖² = ‖g_i‖²
  (Goodfellow 2015, "Efficient per-example gradient computations"); the clipped sum is the
  book-keeping product Σ_i c_i g_iᵀ a_i = (c ⊙ g)ᵀ a (Bu et al. 2023, "Differentially private
  optimization on large model at small cost", book-keeping algorithm) — one GEMM, the cost of
  the weight gradient of ordinary back-propagation.
* Linear with a sequence dimension, per layer one of:
  - ghost norm (Li et al. 2022, "Large language models can be strong differentially private
    learners", ghost clipping): ‖∇_W L_i‖²_F = vec(a_i a_iᵀ)ᵀ vec(g_i g_iᵀ)
    = Σ_{t,t'} (a_t·a_t')(g_t·g_t'), time O(T²(d+p)) per example, then the book-keeping GEMM
    above for the sum (time O(Tpd));
  - instantiation: ∇_W L_i = g_iᵀ a_i by batched GEMM, time O(Tpd), kept, so that the clipped
    sum is a weighted reduction of them (time O(pd)) and a_i, g_i can be released at once.
  Bu et al. 2023 (hybrid book-keeping) pick per layer by memory, ghost norm iff 2T² < pd.  We
  instantiate iff p·d ≤ T·(d + p): then instantiation is the faster branch (ghost norm time
  T²(d+p) ≥ instantiation time Tpd) and the B·p·d numbers kept are no more than the B·T·(d+p)
  activations and output gradients they replace (released unless another layer shares them).
  The Gram matrices are formed a chunk of examples at a time.
* Conv2d (groups = 1, any stride, padding, dilation, padding mode; the fast path of the
  convolution rule of ``rules_conv.py``, which handles the other convolutions): im2col makes
  the layer a Linear with T = output positions and d = C_in·k_h·k_w (Bu et al. 2022,
  "Scalable and efficient training of large convolutional neural networks with differential
  privacy", mixed ghost clipping); same per-layer choice.  The patches are a strided view of
  the channels-last input copied one chunk of examples at a time (several times faster on CPU
  than ``F.unfold``), and the clipped sum of the ghost-norm branch is one ``conv2d_weight``
  call on c-scaled output gradients, so patches never exist for the whole batch.
* Embedding: ‖∇_E L_i‖² = Σ_{t,t'} 1[tok_t = tok_t'] g_t·g_t' (Li et al. 2022), evaluated as
  Σ_v ‖Σ_{t: tok_t = v} g_t‖² by grouping equal tokens — O(Td) rather than O(T²d).  Tokens at
  ``padding_idx`` get no gradient and are dropped; ``sparse=True`` is exact (only the kind of
  gradient autograd would form differs, and ghost clipping forms none); ``max_norm`` is refused
  (it renormalises the weight in place during forward), as is ``scale_grad_by_freq`` (its
  counts are over the batch).
* LayerNorm, GroupNorm, RMSNorm: the per-example weight/bias gradients (Σ over positions of
  g ⊙ x̂ and of g, x̂ the normalised input) are small and instantiated directly.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.training.dp.ghost.registry import LayerCall, LayerGradients, register_rule

CHUNK_ELEMENTS = 1 << 19
"""Temporary elements (im2col patches, Gram matrices) a rule materialises at once: 2 MiB in
float32, so a chunk of examples stays in cache while it is multiplied and reduced."""


SCALE_CHUNK_ELEMENTS = 1 << 16
"""Size of the c-scaled copy of output gradients formed at once by the book-keeping sums."""


SINGLE_GEMM_ELEMENTS = 1 << 20
"""Up to this many output-gradient numbers, the c-scaled copy is formed whole and the book-keeping
sum is one GEMM (measured 7% faster on the benchmark MLP than chunking: fewer, larger GEMMs)."""


def _rows(total: int, per_row: int, budget: int = SCALE_CHUNK_ELEMENTS) -> Iterator[slice]:
    """Slices of ``range(total)`` holding at most ``budget // per_row`` rows (at least one)."""
    step = max(1, budget // max(1, per_row))
    for start in range(0, total, step):
        yield slice(start, min(total, start + step))


def _chunks(batch: int, elements_per_example: int) -> Iterator[slice]:
    """Example slices whose temporaries stay within ``CHUNK_ELEMENTS``."""
    return _rows(batch, elements_per_example, CHUNK_ELEMENTS)


def _bookkeeping_sum(out: Tensor, coef: Tensor, g: Tensor, a: Tensor) -> None:
    """out += (c ⊙ g)ᵀ a for (N, p) ``g`` and (N, d) ``a``, a chunk of rows of c ⊙ g at a time."""
    c = coef.to(g.dtype)[:, None]
    if g.numel() <= SINGLE_GEMM_ELEMENTS:
        out.addmm_((g * c).T, a)
        return
    for s in _rows(g.shape[0], g.shape[1]):
        out.addmm_((g[s] * c[s]).T, a[s])


def _sq(x: Tensor) -> Tensor:
    """(B, ...) -> (B,) squared L2 norm of each row."""
    return torch.linalg.vector_norm(x.reshape(x.shape[0], -1), dim=1).square()


def add_weighted_sum(out: Tensor, coef: Tensor, per_example: Tensor) -> None:
    """out += Σ_i coef_i per_example_i, one matrix-vector product over the batch.

    Contiguous ``per_example`` tensors and (B, m, n) transposes of contiguous (B, n, m) ones
    are reduced without a copy.
    """
    coef = coef.to(per_example.dtype)
    batch = per_example.shape[0]
    if per_example.is_contiguous():
        flat = per_example.view(batch, -1)
        if out.is_contiguous():
            out.view(-1).addmv_(flat.T, coef)
        else:
            out.add_((coef @ flat).view(out.shape))
        return
    if per_example.dim() == 3 and per_example.transpose(1, 2).is_contiguous():
        flipped = per_example.transpose(1, 2)
        out.add_((coef @ flipped.reshape(batch, -1)).view(flipped.shape[1:]).T)
        return
    out.add_(torch.tensordot(coef, per_example, dims=1))


def instantiate(p: int, d: int, t: int) -> bool:
    """Per-layer choice of the module docstring: instantiate per-example grads iff pd ≤ T(d+p)."""
    return p * d <= t * (d + p)


class PerExampleGradients(LayerGradients):
    """Instantiated per-example gradients, (B, *parameter shape) per parameter."""

    def __init__(self, grads: dict[str, Tensor]) -> None:
        self.grads = grads

    def sq_norms(self) -> dict[str, Tensor]:
        return {name: _sq(g) for name, g in self.grads.items()}

    def clipped_sum(self, coef: Mapping[str, Tensor], out: Mapping[str, Tensor]) -> None:
        for name, g in self.grads.items():
            add_weighted_sum(out[name], coef[name], g)
        self.grads = {}


class LinearGradients(LayerGradients):
    """nn.Linear on (B, d) inputs: norms from ‖a_i‖²‖g_i‖², sum from (c ⊙ g)ᵀ a."""

    def __init__(self, a: Tensor, g: Tensor, trainable: Collection[str]) -> None:
        self.a = a.to(g.dtype)
        self.g = g
        self.trainable = trainable

    def sq_norms(self) -> dict[str, Tensor]:
        g_sq = _sq(self.g)
        out = {}
        if "weight" in self.trainable:
            out["weight"] = _sq(self.a) * g_sq
        if "bias" in self.trainable:
            out["bias"] = g_sq
        return out

    def clipped_sum(self, coef: Mapping[str, Tensor], out: Mapping[str, Tensor]) -> None:
        if "weight" in self.trainable:
            _bookkeeping_sum(out["weight"], coef["weight"], self.g, self.a)
        if "bias" in self.trainable:
            out["bias"].addmv_(self.g.T, coef["bias"].to(self.g.dtype))
        self.a = self.g = None  # type: ignore[assignment]


class SequenceLinearGradients(LayerGradients):
    """nn.Linear on (B, T, d) inputs: Gram-form norms or instantiation, per Bu et al. 2023."""

    def __init__(self, a: Tensor, g: Tensor, trainable: Collection[str]) -> None:
        self.a = a.to(g.dtype)
        self.g = g
        self.trainable = trainable
        _, t, d = a.shape
        self.instantiated = instantiate(g.shape[2], d, t)
        self.per_example: dict[str, Tensor] = {}

    def sq_norms(self) -> dict[str, Tensor]:
        a, g = self.a, self.g
        out = {}
        if "bias" in self.trainable:
            self.per_example["bias"] = g.sum(1)
            out["bias"] = _sq(self.per_example["bias"])
        if "weight" in self.trainable:
            if self.instantiated:
                self.per_example["weight"], out["weight"] = instantiated_sq_norms(a, g)
            else:
                out["weight"] = gram_sq_norms(a, g)
        if "weight" not in self.trainable or self.instantiated:
            self.a = self.g = None  # type: ignore[assignment]
        return out

    def clipped_sum(self, coef: Mapping[str, Tensor], out: Mapping[str, Tensor]) -> None:
        for name, per_example in self.per_example.items():
            add_weighted_sum(out[name], coef[name], per_example)
        if self.a is not None:
            t = self.g.shape[1]
            g = self.g.reshape(-1, self.g.shape[2])
            a = self.a.reshape(-1, self.a.shape[2])
            _bookkeeping_sum(out["weight"], coef["weight"].repeat_interleave(t), g, a)
        self.a = self.g = None  # type: ignore[assignment]
        self.per_example = {}


def instantiated_sq_norms(a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Per-example ∇_W L_i = g_iᵀ a_i, (B, p, d), and their squared norms.

    When d > p the transposes a_iᵀ g_i are formed instead (the faster shape for CPU batched
    GEMM) and a transposed view is returned.
    """
    if a.shape[2] > g.shape[2]:
        transposed = torch.bmm(a.transpose(1, 2), g)
        return transposed.transpose(1, 2), _sq(transposed)
    grads = torch.bmm(g.transpose(1, 2), a)
    return grads, _sq(grads)


def gram_sq_norms(a: Tensor, g: Tensor) -> Tensor:
    """Σ_{t,t'} (a_t·a_t')(g_t·g_t') per example (Li et al. 2022 ghost norm), in batch chunks.

    Args:
        a: (B, T, d) layer inputs.
        g: (B, T, p) output gradients.
    """
    batch, t, _ = a.shape
    out = torch.empty(batch, dtype=g.dtype, device=g.device)
    for s in _chunks(batch, 2 * t * t):
        aa = torch.bmm(a[s], a[s].transpose(1, 2))
        gg = torch.bmm(g[s], g[s].transpose(1, 2))
        out[s] = (aa * gg).sum((1, 2))
    return out


def _batch_calls(calls: Sequence[LayerCall], feature: int) -> tuple[Tensor, Tensor]:
    """Concatenate the calls of one layer along a sequence axis: (B, T_total, ·)."""
    batch = calls[0].activation.shape[0]
    if len(calls) == 1 and calls[0].activation.dim() == 3:
        return calls[0].activation, calls[0].backprop
    a = torch.cat([c.activation.reshape(batch, -1, feature) for c in calls], 1)
    g = torch.cat([c.backprop.reshape(batch, -1, c.backprop.shape[-1]) for c in calls], 1)
    return a, g


@register_rule(nn.Linear)
def linear_rule(
    layer: nn.Module, calls: Sequence[LayerCall], trainable: Collection[str]
) -> LayerGradients:
    """nn.Linear: Goodfellow's outer-product trick for 2-D inputs, Bu et al. 2023 otherwise."""
    if len(calls) == 1 and calls[0].activation.dim() == 2:
        return LinearGradients(calls[0].activation, calls[0].backprop, trainable)
    a, g = _batch_calls(calls, layer.in_features)
    return SequenceLinearGradients(a, g, trainable)


def _conv_input(layer: nn.Conv2d, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
    """The input the convolution really sees, and the zero padding still to apply."""
    if layer.padding_mode != "zeros":
        return F.pad(x, layer._reversed_padding_repeated_twice, mode=layer.padding_mode), (0, 0)
    if isinstance(layer.padding, str):
        return F.pad(x, layer._reversed_padding_repeated_twice), (0, 0)
    return x, tuple(layer.padding)  # type: ignore[return-value]


def conv_patches(layer: nn.Conv2d, x: Tensor, padding: tuple[int, int], out: Tensor) -> Tensor:
    """im2col of ``x`` as (b, T, k_h·k_w·C_in), features ordered (k_h, k_w, C_in).

    A strided view of the channels-last input copied once — several times faster on CPU than
    ``F.unfold``; the (k_h, k_w, C_in) order only matters for instantiated gradients, which are
    permuted back.  ``out`` is the layer output (or its gradient), for the output size.
    """
    if padding != (0, 0):
        x = F.pad(x, (padding[1], padding[1], padding[0], padding[0]))
    x = x.permute(0, 2, 3, 1).contiguous()
    b, _, _, c = x.shape
    kh, kw = layer.kernel_size
    sb, sh, sw, sc = x.stride()
    ho, wo = out.shape[2], out.shape[3]
    patches = x.as_strided(
        (b, ho, wo, kh, kw, c),
        (
            sb,
            sh * layer.stride[0],
            sw * layer.stride[1],
            sh * layer.dilation[0],
            sw * layer.dilation[1],
            sc,
        ),
    )
    return patches.reshape(b, ho * wo, kh * kw * c)


class Conv2dGradients(LayerGradients):
    """nn.Conv2d via im2col (Li et al. 2022, App. F; Bu et al. 2023, Sec. 3.2)."""

    def __init__(self, layer: nn.Conv2d, calls: Sequence[LayerCall], trainable: Collection[str]):
        self.layer = layer
        self.trainable = trainable
        self.inputs = []
        for call in calls:
            x, padding = _conv_input(layer, call.activation.to(call.backprop.dtype))
            self.inputs.append((x, padding, call.backprop))
        self.t = sum(g.shape[2] * g.shape[3] for _, _, g in self.inputs)
        self.d = layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
        self.instantiated = instantiate(layer.out_channels, self.d, self.t)
        self.per_example: dict[str, Tensor] = {}

    def _unfold(self, s: slice) -> tuple[Tensor, Tensor]:
        """(b, T, d) patches and (b, T, p) output gradients for examples ``s``."""
        cols, grads = [], []
        for x, padding, g in self.inputs:
            cols.append(conv_patches(self.layer, x[s], padding, g))
            grads.append(g[s].flatten(2))
        a = cols[0] if len(cols) == 1 else torch.cat(cols, 1)
        g = grads[0] if len(grads) == 1 else torch.cat(grads, 2)
        return a, g.transpose(1, 2)

    def sq_norms(self) -> dict[str, Tensor]:
        g0 = self.inputs[0][2]
        batch = g0.shape[0]
        out = {}
        if "bias" in self.trainable:
            self.per_example["bias"] = sum(g.sum((2, 3)) for _, _, g in self.inputs)
            out["bias"] = _sq(self.per_example["bias"])
        if "weight" not in self.trainable:
            self.inputs = []
            return out
        p = self.layer.out_channels
        sq = torch.empty(batch, dtype=g0.dtype, device=g0.device)
        if self.instantiated:
            grads = torch.empty(batch, p, self.d, dtype=g0.dtype, device=g0.device)
            for s in _chunks(batch, self.t * self.d):
                a, g = self._unfold(s)
                torch.bmm(g.transpose(1, 2), a, out=grads[s])
                sq[s] = _sq(grads[s])
            self.per_example["weight"] = grads
            self.inputs = []
        else:
            for s in _chunks(batch, self.t * self.d):
                a, g = self._unfold(s)
                sq[s] = gram_sq_norms(a, g)
        out["weight"] = sq
        return out

    def clipped_sum(self, coef: Mapping[str, Tensor], out: Mapping[str, Tensor]) -> None:
        layer = self.layer
        if "bias" in self.per_example:
            add_weighted_sum(out["bias"], coef["bias"], self.per_example["bias"])
        if "weight" in self.per_example:
            grads = self.per_example["weight"]
            p, (kh, kw), c = layer.out_channels, layer.kernel_size, layer.in_channels
            total = coef["weight"].to(grads.dtype) @ grads.view(grads.shape[0], -1)
            out["weight"].add_(total.view(p, kh, kw, c).permute(0, 3, 1, 2))
        for x, padding, g in self.inputs:
            c = coef["weight"].to(g.dtype)[:, None, None, None]
            for s in _rows(g.shape[0], g[0].numel(), 4 * SCALE_CHUNK_ELEMENTS):
                out["weight"].add_(
                    torch.nn.grad.conv2d_weight(
                        x[s],
                        layer.weight.shape,
                        g[s] * c[s],
                        layer.stride,
                        padding,
                        layer.dilation,
                    )
                )
        self.inputs = []
        self.per_example = {}


def _embedding_check(layer: nn.Module) -> str | None:
    if layer.max_norm is not None:
        return "max_norm renormalises the weight in place during forward"
    if layer.scale_grad_by_freq:
        return "scale_grad_by_freq=True mixes examples (counts are over the batch)"
    return None


class EmbeddingGradients(LayerGradients):
    """nn.Embedding: ‖∇_E L_i‖² = Σ_v ‖Σ_{t: tok_t = v} g_t‖² (Li et al. 2022, App. F)."""

    def __init__(self, layer: nn.Embedding, tokens: Tensor, g: Tensor) -> None:
        batch, t = tokens.shape
        self.num_embeddings = layer.num_embeddings
        self.rows = torch.arange(batch, device=tokens.device).repeat_interleave(t)
        self.tokens = tokens.reshape(-1)
        self.g = g.reshape(batch * t, -1)
        if layer.padding_idx is not None:
            keep = self.tokens != layer.padding_idx
            self.rows, self.tokens, self.g = self.rows[keep], self.tokens[keep], self.g[keep]
        self.batch = batch

    def sq_norms(self) -> dict[str, Tensor]:
        g = self.g
        keys, inverse = torch.unique(
            self.rows * self.num_embeddings + self.tokens, return_inverse=True
        )
        grouped = torch.zeros(keys.shape[0], g.shape[1], dtype=g.dtype, device=g.device)
        grouped.index_add_(0, inverse, g)
        sq = torch.zeros(self.batch, dtype=g.dtype, device=g.device)
        sq.index_add_(0, keys // self.num_embeddings, _sq(grouped))
        return {"weight": sq}

    def clipped_sum(self, coef: Mapping[str, Tensor], out: Mapping[str, Tensor]) -> None:
        c = coef["weight"].to(self.g.dtype)
        for s in _rows(self.g.shape[0], self.g.shape[1]):
            out["weight"].index_add_(0, self.tokens[s], self.g[s] * c[self.rows[s], None])
        self.g = self.tokens = self.rows = None  # type: ignore[assignment]


@register_rule(nn.Embedding, check=_embedding_check)
def embedding_rule(
    layer: nn.Module, calls: Sequence[LayerCall], trainable: Collection[str]
) -> LayerGradients:
    """nn.Embedding: group equal tokens of each example."""
    batch = calls[0].activation.shape[0]
    tokens = torch.cat([c.activation.reshape(batch, -1) for c in calls], 1)
    g = torch.cat([c.backprop.reshape(batch, -1, layer.embedding_dim) for c in calls], 1)
    return EmbeddingGradients(layer, tokens, g)  # type: ignore[arg-type]


def _affine_per_example(
    calls: Sequence[LayerCall], trainable: Collection[str], feature_dims: int, normalise
) -> LayerGradients:
    """Per-example grads of an elementwise affine after normalisation, summed over calls.

    ``feature_dims`` counts the trailing dimensions that the affine parameters cover when the
    feature axis is last (LayerNorm, RMSNorm); ``-1`` means the channel axis 1 (GroupNorm).
    """
    grads: dict[str, Tensor] = {}
    for call in calls:
        x, g = call.activation.to(call.backprop.dtype), call.backprop
        if feature_dims < 0:
            dims = tuple(range(2, g.dim()))
        else:
            dims = tuple(range(1, g.dim() - feature_dims))
        parts = {}
        if "weight" in trainable:
            prod = normalise(x).mul_(g)
            parts["weight"] = prod.sum(dims) if dims else prod
        if "bias" in trainable:
            parts["bias"] = g.sum(dims) if dims else g
        for name, value in parts.items():
            grads[name] = grads[name] + value if name in grads else value
    return PerExampleGradients(grads)


def _normalized_shape_rule(normalise):
    """Rule for a norm layer whose affine covers its trailing ``normalized_shape`` dimensions;
    ``normalise(x, shape, eps)`` is the layer without its affine."""

    def rule(
        layer: nn.Module, calls: Sequence[LayerCall], trainable: Collection[str]
    ) -> LayerGradients:
        shape = tuple(layer.normalized_shape)
        return _affine_per_example(
            calls, trainable, len(shape), lambda x: normalise(x, shape, layer.eps)
        )

    return rule


layer_norm_rule = register_rule(nn.LayerNorm)(
    _normalized_shape_rule(lambda x, shape, eps: F.layer_norm(x, shape, None, None, eps))
)
"""nn.LayerNorm: ∇_γ L_i = Σ_t g_t ⊙ x̂_t, ∇_β L_i = Σ_t g_t (instantiated)."""


@register_rule(nn.GroupNorm)
def group_norm_rule(
    layer: nn.Module, calls: Sequence[LayerCall], trainable: Collection[str]
) -> LayerGradients:
    """nn.GroupNorm: ∇_γ L_i[c] = Σ_positions g ⊙ x̂, ∇_β L_i[c] = Σ_positions g."""
    return _affine_per_example(
        calls, trainable, -1, lambda x: F.group_norm(x, layer.num_groups, None, None, layer.eps)
    )


if hasattr(nn, "RMSNorm"):  # torch >= 2.4
    rms_norm_rule = register_rule(nn.RMSNorm)(
        _normalized_shape_rule(lambda x, shape, eps: F.rms_norm(x, shape, None, eps))
    )
    """nn.RMSNorm: ∇_γ L_i = Σ_t g_t ⊙ x_t / rms(x_t)."""


# Rules of further layer types, registered on import.
from privacylab.training.dp.ghost import (  # noqa: E402, F401
    rules_conv,
    rules_embedding,
    rules_norm,
)
