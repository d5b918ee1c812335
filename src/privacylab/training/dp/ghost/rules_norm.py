"""Ghost-clipping rule for nn.InstanceNorm1d/2d/3d with ``affine=True``.

InstanceNorm normalises each example and channel over its positions, so it mixes no examples;
its affine parameters act elementwise per channel, y = γ_c x̂ + β_c, and example i's gradients
∇_γ L_i[c] = Σ_positions g_i ⊙ x̂_i and ∇_β L_i[c] = Σ_positions g_i (the chain rule through
the affine map) are only C numbers each, so they are instantiated directly — Goodfellow's
naive per-example gradient (2015, "Efficient per-example gradient computations"), as the
book-keeping algorithm of Bu et al. 2023 ("Differentially private optimization on large model
at small cost") does for layers whose per-example gradients are small.  x̂ is recomputed from
the recorded input with the statistics the forward used: the input's own, or the running ones
in eval mode with ``track_running_stats=True``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.training.dp.errors import GhostClippingError
from privacylab.training.dp.ghost.registry import LayerCall, LayerGradients, register_rule
from privacylab.training.dp.ghost.rules import _affine_per_example


@register_rule(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def instance_norm_rule(
    layer: nn.Module, calls: Sequence[LayerCall], trainable: Collection[str]
) -> LayerGradients:
    """nn.InstanceNorm*d: ∇_γ L_i = Σ_positions g_i ⊙ x̂_i, ∇_β L_i = Σ_positions g_i."""
    for call in calls:
        if call.activation.dim() == layer._get_no_batch_dim():
            raise GhostClippingError(
                f"{type(layer).__name__} was called on unbatched input of shape "
                f"{tuple(call.activation.shape)}; give it a batch dimension"
            )
    own_stats = layer.training or not layer.track_running_stats

    def normalise(x: Tensor) -> Tensor:
        return F.instance_norm(
            x,
            None if own_stats else layer.running_mean,
            None if own_stats else layer.running_var,
            use_input_stats=own_stats,
            eps=layer.eps,
        )

    return _affine_per_example(calls, trainable, -1, normalise)
