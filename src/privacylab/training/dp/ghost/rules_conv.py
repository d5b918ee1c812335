"""Ghost-clipping rules for every convolution: Conv1d/2d/3d and ConvTranspose1d/2d/3d, any groups.

A convolution with G groups is G independent Linear maps applied at T output positions
(im2col): for group γ, with patches a_γ ∈ R^{T×d} (d = C_in/G · Π k) and output gradients
g_γ ∈ R^{T×p} (p = C_out/G), example i's weight gradient of that group is g_γ,iᵀ a_γ,i, and

    ‖∇_W L_i‖²_F = Σ_γ Σ_{t,t'} (a_γ,t · a_γ,t')(g_γ,t · g_γ,t')

the ghost norm of Li et al. 2022 ("Large language models can be strong differentially private
learners", Sec. 4: ‖g_iᵀ a_i‖²_F = vec(a_i a_iᵀ)ᵀ vec(g_i g_iᵀ)), applied to the im2col form of
a convolution as in the mixed ghost clipping of Bu et al. 2022 ("Scalable and efficient training
of large convolutional neural networks with differential privacy"), once per group.  Per layer
we pick the cheaper of the ghost norm (time T²(d+p) per group and example) and instantiating
g_γ,iᵀ a_γ,i (time Tpd) — the layer-wise choice of Bu et al.'s mixed ghost clipping, with the
criterion of :func:`~privacylab.training.dp.ghost.rules.instantiate` (pd ≤ T(d+p)), per group:
a depthwise convolution (d = Π k, p = channel multiplier) is always instantiated, cheaply —
one kernel offset at a time by elementwise products of strided views (no im2col copy), since
its per-group GEMMs would be matrix-vector products.

A transposed convolution y = conv_transposeᵀ(x; W) is the adjoint of the convolution z =
conv(y; W) with the same stride, padding, dilation and groups, so its weight gradient is that
convolution's weight gradient with the roles swapped: the patches are taken from the output
gradient ∂L/∂y (zero padded), and x plays the part of the output gradient (``output_padding``
only adds rows at the end that no patch covers).  Bias gradients are Σ_t g_t in both cases.

The clipped sum of the ghost-norm branch is the book-keeping product of Bu et al. 2023
("Differentially private optimization on large model at small cost", book-keeping algorithm):
Σ_i c_i ∇_W L_i is the weight gradient of the layer for output gradients c_i g_i, one
weight-gradient convolution on c-scaled output gradients, so patches never exist for the whole
batch; the instantiated branch is a weighted reduction of the kept per-example gradients.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.training.dp.errors import GhostClippingError
from privacylab.training.dp.ghost.registry import LayerCall, LayerGradients, register_rule
from privacylab.training.dp.ghost.rules import (
    SCALE_CHUNK_ELEMENTS,
    Conv2dGradients,
    _chunks,
    _rows,
    _sq,
    gram_sq_norms,
    instantiate,
)

_WEIGHT_GRAD = {
    1: torch.nn.grad.conv1d_weight,
    2: torch.nn.grad.conv2d_weight,
    3: torch.nn.grad.conv3d_weight,
}

_ConvTranspose = nn.ConvTranspose1d | nn.ConvTranspose2d | nn.ConvTranspose3d


def _pad_pairs(padding: Sequence[int]) -> list[int]:
    """Symmetric per-dimension padding in ``F.pad`` order (last dimension first)."""
    return [p for size in reversed(padding) for p in (size, size)]


def patches(
    x: Tensor,
    padding: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    out_size: Sequence[int],
    groups: int,
) -> Tensor:
    """N-d im2col of (b, C, *S) ``x`` as (b·G, C/G · Π k, T), rows ordered (C/G, k…).

    A strided view of the (zero padded) input, copied once; T = Π ``out_size``.  The rows are
    in the order of the weight's (C/G, k…) dimensions, so per-example gradients need no
    permutation, and the output-gradient side is a view of the (b, C_out, *O) tensor.
    """
    if any(padding):
        x = F.pad(x, _pad_pairs(padding))
    x = x.contiguous()
    b, c = x.shape[:2]
    spatial = x.stride()[2:]
    view = x.as_strided(
        (b, c, *kernel, *out_size),
        (
            x.stride(0),
            x.stride(1),
            *(s * dl for s, dl in zip(spatial, dilation, strict=True)),
            *(s * st for s, st in zip(spatial, stride, strict=True)),
        ),
    )
    return view.reshape(b * groups, (c // groups) * math.prod(kernel), math.prod(out_size))


def _grouped_rows(y: Tensor, groups: int) -> Tensor:
    """(b, P, *O) -> (b·G, P/G, T): the "output gradient" side of each group (a view)."""
    b, p = y.shape[:2]
    return y.reshape(b * groups, p // groups, -1)


SMALL_GROUP = 4
"""Instantiated groups with (C/G)·p ≤ this (depthwise convolutions) are formed one kernel offset
at a time by elementwise products: there the batched GEMMs would be matrix-vector products."""


def _offset_products(
    u: _Unfolded,
    s: slice,
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Tensor:
    """(b, G, C/G, Π k, p) per-example weight gradients of one call for examples ``s``.

    For each kernel offset, the input positions it meets are a strided view of the padded
    source; the gradient of that offset is Σ_t source_view[t] · other[t], with no im2col copy.
    """
    x = u.source[s]
    if any(u.padding):
        x = F.pad(x, _pad_pairs(u.padding))
    x = x.contiguous()
    other = u.other[s]
    b, c = x.shape[:2]
    out_size = other.shape[2:]
    p = other.shape[1] // groups
    other = other.reshape(b, groups, 1, p, *out_size)
    spatial = x.stride()[2:]
    dims = tuple(range(4, 4 + len(out_size)))
    out = x.new_empty(b, groups, c // groups, math.prod(kernel), p)
    for index, offset in enumerate(itertools.product(*(range(k) for k in kernel))):
        start = x.storage_offset() + sum(
            o * dl * sp for o, dl, sp in zip(offset, dilation, spatial, strict=True)
        )
        view = x.as_strided(
            (b, c, *out_size),
            (x.stride(0), x.stride(1), *(sp * st for sp, st in zip(spatial, stride, strict=True))),
            start,
        )
        out[:, :, :, index] = (view.unflatten(1, (groups, c // groups)).unsqueeze(3) * other).sum(
            dims
        )
    return out


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _correlated(
    u: _Unfolded,
    s: slice,
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Tensor:
    """(b, G, 1, Π k, p) per-example weight gradients of one call with one input channel per
    group (depthwise), by one grouped convolution over all examples and channels at once.

    Example i's gradient of channel c is the correlation of its source channel with its
    other-side rows — a convolution whose kernel is ``other`` (stride and dilation swapped), the
    way back-propagation forms a convolution's weight gradient — so the b·G channels become
    the groups of one convolution: no im2col and no Python loop over kernel offsets.
    """
    x = u.source[s]
    other = u.other[s]
    b = x.shape[0]
    p = other.shape[1] // groups
    out_size = other.shape[2:]
    grads = _CONV[len(kernel)](
        x.reshape(1, b * groups, *x.shape[2:]),
        other.reshape(b * groups * p, 1, *out_size),
        stride=tuple(dilation),
        padding=tuple(u.padding),
        dilation=tuple(stride),
        groups=b * groups,
    )
    crop = tuple(slice(0, k) for k in kernel)
    grads = grads[(0, slice(None), *crop)]  # the trailing positions past the kernel are unused
    return grads.reshape(b, groups, p, math.prod(kernel)).transpose(2, 3).unsqueeze(2)


class _Unfolded:
    """One call of a convolution, seen as the weight gradient of a convolution.

    ``source`` is what patches are taken from (the input of a Conv, the output gradient of a
    ConvTranspose), ``other`` the (b, C, *O) tensor with one row per patch position (the output
    gradient of a Conv, the input of a ConvTranspose), ``padding`` the zero padding still to
    apply to ``source``.
    """

    def __init__(self, source: Tensor, other: Tensor, padding: tuple[int, ...]) -> None:
        self.source = source
        self.other = other
        self.padding = padding


class ConvGradients(LayerGradients):
    """Any convolution (N = 1, 2, 3; any groups; transposed or not): ghost norm or instantiation.

    Args:
        layer: the convolution.
        calls: its recorded calls.
        trainable: local names of the trainable parameters.
    """

    def __init__(
        self, layer: nn.Module, calls: Sequence[LayerCall], trainable: Collection[str]
    ) -> None:
        self.layer = layer
        self.trainable = trainable
        self.transposed = isinstance(layer, _ConvTranspose)
        self.groups = layer.groups
        self.weight_shape = layer.weight.shape
        self.kernel = tuple(layer.kernel_size)
        self.n = len(self.kernel)
        for call in calls:
            if call.activation.dim() != self.n + 2:
                raise GhostClippingError(
                    f"{type(layer).__name__} was called on unbatched input of shape "
                    f"{tuple(call.activation.shape)}; give it a batch dimension"
                )
        self.grads = [call.backprop for call in calls]
        self.parts = [self._unfolded(call) for call in calls]
        self.t = sum(math.prod(u.other.shape[2:]) for u in self.parts)
        # weight (rows, cols/G, *k): rows = C_out of a Conv, C_in of a ConvTranspose
        self.p = self.weight_shape[0] // self.groups
        self.cg = self.weight_shape[1]
        self.d = self.cg * math.prod(self.kernel)
        self.instantiated = instantiate(self.p, self.d, self.t)
        self.per_example: dict[str, Tensor] = {}

    def _unfolded(self, call: LayerCall) -> _Unfolded:
        layer, g = self.layer, call.backprop
        x = call.activation.to(g.dtype)
        if self.transposed:
            return _Unfolded(g, x, tuple(layer.padding))
        if layer.padding_mode != "zeros":
            x = F.pad(x, layer._reversed_padding_repeated_twice, mode=layer.padding_mode)
            return _Unfolded(x, g, (0,) * self.n)
        if isinstance(layer.padding, str):
            x = F.pad(x, layer._reversed_padding_repeated_twice)
            return _Unfolded(x, g, (0,) * self.n)
        return _Unfolded(x, g, tuple(layer.padding))

    def _unfold(self, s: slice) -> tuple[Tensor, Tensor]:
        """(b·G, d, T) patches and (b·G, p, T) columns of the other side for examples ``s``."""
        layer = self.layer
        cols, rows = [], []
        for u in self.parts:
            cols.append(
                patches(
                    u.source[s],
                    u.padding,
                    self.kernel,
                    layer.stride,
                    layer.dilation,
                    u.other.shape[2:],
                    self.groups,
                )
            )
            rows.append(_grouped_rows(u.other[s], self.groups))
        a = cols[0] if len(cols) == 1 else torch.cat(cols, 2)
        g = rows[0] if len(rows) == 1 else torch.cat(rows, 2)
        return a, g

    def sq_norms(self) -> dict[str, Tensor]:
        g0 = self.grads[0]
        batch, dtype, device = g0.shape[0], g0.dtype, g0.device
        out = {}
        if "bias" in self.trainable:
            self.per_example["bias"] = sum(g.flatten(2).sum(2) for g in self.grads)
            out["bias"] = _sq(self.per_example["bias"])
        self.grads = []
        if "weight" not in self.trainable:
            self.parts = []
            return out
        groups = self.groups
        sq = torch.empty(batch, dtype=dtype, device=device)
        per_example = self.t * (self.d + self.p) * groups
        if self.instantiated:
            # kept as (B, G, d, p): the faster batched GEMM orientation on CPU
            grads = torch.empty(batch, groups, self.d, self.p, dtype=dtype, device=device)
            if self.cg == 1 and groups > 1:
                form = _correlated
            elif self.cg * self.p <= SMALL_GROUP:
                form = _offset_products
            else:
                form = None
            stride, dilation = self.layer.stride, self.layer.dilation
            for s in _chunks(batch, per_example):
                if form is not None:
                    grads[s] = sum(
                        form(u, s, self.kernel, stride, dilation, groups).flatten(2, 3)
                        for u in self.parts
                    )
                else:
                    a, g = self._unfold(s)
                    torch.bmm(a, g.transpose(1, 2), out=grads[s].view(-1, self.d, self.p))
                sq[s] = _sq(grads[s])
            self.per_example["weight"] = grads
            self.parts = []
        else:
            for s in _chunks(batch, max(per_example, 2 * self.t * self.t * groups)):
                a, g = self._unfold(s)
                sq[s] = gram_sq_norms(a.transpose(1, 2), g.transpose(1, 2)).view(-1, groups).sum(1)
        out["weight"] = sq
        return out

    def clipped_sum(self, coef: Mapping[str, Tensor], out: Mapping[str, Tensor]) -> None:
        if "bias" in self.per_example:
            c = coef["bias"].to(self.per_example["bias"].dtype)
            out["bias"].add_(c @ self.per_example["bias"])
        if "weight" in self.per_example:
            grads = self.per_example["weight"]
            total = coef["weight"].to(grads.dtype) @ grads.view(grads.shape[0], -1)
            total = total.view(self.groups, self.d, self.p).transpose(1, 2)
            out["weight"].add_(total.reshape(self.weight_shape))
        weight_grad = _WEIGHT_GRAD[self.n]
        for u in self.parts:
            c = coef["weight"].to(u.other.dtype).view(-1, *(1,) * (u.other.dim() - 1))
            for s in _rows(u.other.shape[0], u.other[0].numel(), 4 * SCALE_CHUNK_ELEMENTS):
                out["weight"].add_(
                    weight_grad(
                        u.source[s],
                        self.weight_shape,
                        u.other[s] * c[s],
                        self.layer.stride,
                        u.padding,
                        self.layer.dilation,
                        self.groups,
                    )
                )
        self.parts = []
        self.per_example = {}


@register_rule(
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d
)
def conv_rule(
    layer: nn.Module, calls: Sequence[LayerCall], trainable: Collection[str]
) -> LayerGradients:
    """Convolutions: the Conv2d groups=1 fast path of ``rules.py``, :class:`ConvGradients`
    otherwise (N-d im2col per group, or the swapped roles of a transposed convolution)."""
    if type(layer) is nn.Conv2d and layer.groups == 1:
        return Conv2dGradients(layer, calls, trainable)  # type: ignore[arg-type]
    return ConvGradients(layer, calls, trainable)
