"""Registry of ghost-clipping rules: one function per layer type, registered by decorator.

A rule turns what the forward and backward passes of one layer saw — the layer inputs a and the
gradients g of the per-example-loss sum with respect to the layer outputs, once per call — into
a :class:`LayerGradients` object.  That object is the layer's explicit per-batch state: it gives
the per-example squared gradient norms of each trainable parameter, and later the sum of the
per-example gradients scaled by the clipping factors.  Nothing is stored on tensors or modules.

The registry follows Opacus' ``register_grad_sampler`` design (exact type match, so a subclass
with a different ``forward`` is never silently treated as its parent).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn


@dataclass(frozen=True)
class LayerCall:
    """One call of a layer in the forward pass.

    Attributes:
        activation: the layer input (detached), batch first.
        backprop: ∂(Σ_i L_i)/∂(layer output), same shape as the output.  Because the loss is a
            sum of per-example losses and the model has no cross-example operation, row i is
            the gradient of L_i alone.
        args: every positional argument of the call (tensors detached; ``args[0]`` is
            ``activation``), for rules of layers with several inputs (EmbeddingBag offsets,
            attention keys and values).
        kwargs: the keyword arguments of the call (tensors detached).
        batched: indices, in ``torch.utils._pytree.tree_flatten((args, kwargs))`` order, of the
            tensor leaves that carry the batch in dimension 0 (told by provenance: their size
            follows the batch size); the others do not depend on the batch size.  Filled for
            layers handled by the per-layer fallback.
        output: the layer output as recorded (a detached copy), for the fallback's check that
            recomputing the layer one example at a time reproduces it; ``None`` otherwise.
    """

    activation: Tensor
    backprop: Tensor
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    batched: frozenset[int] = frozenset()
    output: Tensor | None = None


class LayerGradients(ABC):
    """Per-example gradient information of one layer for one batch.

    Call :meth:`sq_norms` once, then :meth:`clipped_sum` once; an implementation may free its
    activations in between (for instance once per-example gradients are instantiated).
    """

    @abstractmethod
    def sq_norms(self) -> dict[str, Tensor]:
        """Local parameter name -> (B,) squared L2 norm of each example's gradient."""

    @abstractmethod
    def clipped_sum(self, coef: Mapping[str, Tensor], out: Mapping[str, Tensor]) -> None:
        """Add Σ_i coef_i ∇L_i to ``out[name]`` for each trainable local parameter name.

        Adding into caller-owned buffers (which may already hold the DP noise) avoids a
        second gradient-sized buffer per parameter.
        """


Rule = Callable[[nn.Module, Sequence[LayerCall], frozenset[str]], LayerGradients]
"""``rule(layer, calls, trainable_parameter_names) -> LayerGradients``."""

Check = Callable[[nn.Module], "str | None"]
"""``check(layer)`` returns why ghost clipping cannot handle this instance, or ``None``."""


@dataclass(frozen=True)
class RegisteredRule:
    """A rule and the check of the layer configurations it supports."""

    rule: Rule
    check: Check | None = None


_RULES: dict[type[nn.Module], RegisteredRule] = {}


def register_rule(
    *layer_types: type[nn.Module], check: Check | None = None
) -> Callable[[Rule], Rule]:
    """Register ``rule`` for exactly these layer types (``@register_rule(nn.Linear)``).

    Args:
        layer_types: the module classes the rule handles (exact type match).
        check: optional ``check(layer) -> reason | None`` rejecting unsupported configurations
            (for example grouped convolutions) before training starts.
    """
    if not layer_types:
        raise TypeError("register_rule needs at least one layer type")

    def decorate(rule: Rule) -> Rule:
        for layer_type in layer_types:
            _RULES[layer_type] = RegisteredRule(rule, check)
        return rule

    return decorate


def rule_for(layer: nn.Module) -> RegisteredRule | None:
    """The rule registered for ``type(layer)``, or ``None``."""
    return _RULES.get(type(layer))


def registered_layer_types() -> tuple[type[nn.Module], ...]:
    """Layer types that have a ghost-clipping rule."""
    return tuple(_RULES)
