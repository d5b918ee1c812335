"""Exact per-example gradients of a layer without a ghost rule: the per-layer fallback.

A layer with trainable parameters of its own and no registered rule (a ``Bilinear``, a
``PReLU``, a user's module) is not a reason to leave ghost clipping for the whole model: its
per-example parameter gradients are formed from what the forward and backward passes already
recorded for it — the arguments of each call and the gradient g of Σ_i L_i with respect to the
call's output.  Row i of g is ∂L_i/∂out_i (no operation mixes examples), so

    ∇_θ L_i = (∂ out_i / ∂θ)ᵀ g_i = vjp(θ ↦ layer_θ(args_i))(g_i),

the vector-Jacobian product of the layer alone, evaluated for every example at once with
``torch.func.vmap`` over the batch (in chunks) of ``torch.func.vjp`` of
``torch.func.functional_call`` — torch.func's per-sample-gradient recipe ("Per-sample-gradients"
tutorial: vmap of a vjp/grad transform), here applied to one layer and its recorded output
gradient instead of the whole model and its loss.  It is the same idea as Opacus's functorch
fallback for layers without a grad sampler; the code is our own.  Each call of the layer adds
its term; the result is instantiated per-example gradients (Goodfellow 2015's "naive"
per-example gradient, one layer at a time), which the clipper clips with the book-keeping sum
of Bu et al. 2023 like any other rule.  Memory: B × (the layer's parameter count) for the
step, as for ``per_sample``; time: one vmapped forward and vjp of the layer.

Exactness is checked, not assumed (a refused case raises one :class:`GhostClippingError` line):

* statically (:func:`fallback_check`): modules known to return tuples (stock RNN/LSTM/GRU,
  ``MultiheadAttention``), or to write to their parameters in forward (``Embedding`` with
  ``max_norm``), or sparse gradients;
* while recording (:mod:`~privacylab.training.dp.ghost.clipper`): a Tensor output, batch-first
  by provenance, every tensor argument either batch-first or independent of the batch size,
  and no buffer written or replaced during the forward;
* when evaluated: ``vmap(randomness="error")`` refuses random operations inside the layer, the
  recomputed per-example outputs must equal the recorded output (a layer that mixes examples,
  or depends on hidden state, fails this), and Σ_i ∇_θ L_i must equal the parameter gradient
  of the ordinary backward pass, which the clipper asks autograd for (a use of θ that the
  recomputation cannot see — a cache, a functional call elsewhere — fails this).
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from privacylab.training.dp.errors import GhostClippingError
from privacylab.training.dp.ghost.registry import LayerCall, LayerGradients, RegisteredRule
from privacylab.training.dp.ghost.rules import PerExampleGradients

VMAP_CHUNK_ELEMENTS = 1 << 22
"""Elements of inputs, outputs and per-example gradients one vmap chunk handles at once."""


def fallback_check(layer: nn.Module) -> str | None:
    """Why the per-layer fallback cannot be exact for this layer instance, or ``None``."""
    if isinstance(layer, nn.RNNBase):
        return (
            "stock recurrent layers return a tuple and keep their weights fused; use the "
            "drop-in DPLSTM/DPGRU/DPRNN of privacylab.training.dp.modules"
        )
    if isinstance(layer, nn.MultiheadAttention):
        return "it returns a tuple (output, weights); use a drop-in built from nn.Linear layers"
    if isinstance(layer, (nn.Embedding, nn.EmbeddingBag)):
        if layer.max_norm is not None:
            return "max_norm renormalises the weight in place during forward"
        if layer.sparse:
            return "sparse=True gradients cannot be formed per example"
    return None


def describe_call_problem(
    output: object, batched: Sequence[bool] | None, mixed: bool, output_batched: bool
) -> str | None:
    """Why a recorded call cannot be recomputed per example, or ``None`` (see the clipper)."""
    if not isinstance(output, Tensor):
        return f"it returns a {type(output).__name__}, not a Tensor"
    if mixed:
        return (
            "one of its tensor arguments changes shape with the batch size but not as a "
            "batch-first dimension (sequence-first?)"
        )
    if not output_batched:
        return "its output is not batch-first (its dimension 0 does not follow the batch size)"
    if batched is not None and not any(batched):
        return "none of its tensor arguments is batch-first"
    return None


def _chunk_size(call: LayerCall, param_numel: int) -> int:
    leaves, _ = tree_flatten((call.args, call.kwargs))
    batch = call.backprop.shape[0]
    per_example = param_numel + call.backprop[0].numel()
    per_example += sum(leaves[i][0].numel() for i in call.batched)
    return max(1, min(batch, VMAP_CHUNK_ELEMENTS // max(1, per_example)))


def close(got: Tensor, want: Tensor, scale: Tensor | None = None, factor: float = 1.0) -> bool:
    """Equal up to rounding: |got − want| ≤ tol·(s + max s) elementwise, tol = factor·√eps.

    ``s`` is ``scale`` (the magnitudes the compared numbers were summed from, for a sum) or
    |want|; the ``max s`` term bounds the rounding of entries that cancel to near zero.
    """
    if got.shape != want.shape:
        return False
    if not want.dtype.is_floating_point:
        return bool(torch.equal(got, want))
    s = want.abs() if scale is None else scale
    tol = factor * torch.finfo(want.dtype).eps ** 0.5
    top = s.max() if s.numel() else s.new_zeros(())
    return bool(((got - want).abs() <= tol * (s + top)).all())


def per_example_gradients(
    layer: nn.Module, calls: Sequence[LayerCall], trainable: Collection[str], path: str = ""
) -> dict[str, Tensor]:
    """(B, *shape) per-example gradients of the trainable own parameters, summed over calls.

    Args:
        layer: the layer (its current parameters and buffers are those of the forward pass).
        calls: the recorded calls, each with ``batched`` (which argument leaves carry the
            batch in dimension 0) and ``output`` (the recorded output, for the check).
        trainable: local names of the parameters to differentiate.
        path: the layer's name in the model, for errors.

    Raises:
        GhostClippingError: random operations in the layer, or a recomputed output that differs
            from the recorded one.
    """
    params = {n: p.detach() for n, p in layer.named_parameters(recurse=False) if n in trainable}
    numel = sum(p.numel() for p in params.values())
    totals: dict[str, Tensor] = {}
    name = f"'{path or '<model>'}' ({type(layer).__name__})"
    for call in calls:
        grads = _call_gradients(layer, params, call, numel, name)
        for key, value in grads.items():
            totals[key] = totals[key] + value if key in totals else value
    return totals


def _call_gradients(
    layer: nn.Module, params: dict[str, Tensor], call: LayerCall, numel: int, name: str
) -> dict[str, Tensor]:
    """Per-example gradients of one call: vmap over the batch of the vjp of the layer."""
    leaves, spec = tree_flatten((call.args, call.kwargs))
    slots = sorted(call.batched)

    def one(theta: dict[str, Tensor], rows: tuple[Tensor, ...], g: Tensor):
        local = list(leaves)
        for slot, row in zip(slots, rows, strict=True):
            local[slot] = row.unsqueeze(0)
        args, kwargs = tree_unflatten(local, spec)

        def forward(p: dict[str, Tensor]) -> Tensor:
            return functional_call(layer, p, tuple(args), dict(kwargs))

        out, pullback = vjp(forward, theta)
        (grads,) = pullback(g.unsqueeze(0).to(out.dtype))
        return out.squeeze(0), grads

    chunk = _chunk_size(call, numel)
    try:
        with torch.enable_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="There is a performance drop")
            outs, grads = vmap(one, in_dims=(None, 0, 0), randomness="error", chunk_size=chunk)(
                params, tuple(leaves[i] for i in slots), call.backprop
            )
    except RuntimeError as error:
        if "random" in str(error).lower():
            raise GhostClippingError(
                f"layer {name} draws random numbers in forward (dropout?), so its per-example "
                "gradients cannot be recomputed exactly; put the randomness in a separate "
                "module, or use clipping='per_sample'"
            ) from error
        raise GhostClippingError(
            f"layer {name} cannot be recomputed one example at a time by torch.func.vmap "
            f"({str(error).splitlines()[0]}); use clipping='per_sample'"
        ) from error
    if call.output is not None and not close(outs, call.output.to(outs.dtype), factor=10.0):
        raise GhostClippingError(
            f"layer {name} gives other outputs one example at a time than on the batch (it "
            "mixes examples or keeps state between calls), so its per-example gradients "
            "cannot be formed exactly; use clipping='per_sample'"
        )
    return grads


def fallback_rule(
    layer: nn.Module, calls: Sequence[LayerCall], trainable: Collection[str]
) -> LayerGradients:
    """Rule of any layer without a registered one: instantiated per-example gradients."""
    return PerExampleGradients(per_example_gradients(layer, calls, trainable))


FALLBACK = RegisteredRule(fallback_rule, fallback_check)
"""The fallback as a registered rule (never in the registry: used for layers without one)."""
