"""Clipping thresholds and the result of one clipped batch.

Flat clipping (Abadi et al. 2016, Alg. 1, "clip gradient") scales example i by
``min(1, C / (‖g_i‖₂ + 1e-6))`` — exactly Opacus' convention
(``(max_grad_norm / (norm + 1e-6)).clamp(max=1.0)``), so both libraries clip identically.

Per-layer clipping (McMahan et al. 2018, "A general approach to adding differential privacy to
iterative training procedures", Sec. 3 "per-layer clipping") gives every parameter tensor k its
own threshold C_k and clips its per-example gradient to C_k separately.  Because the clipped
per-example gradient then has norm ≤ ‖(C_1, …, C_K)‖₂, the overall sensitivity (and the scale of
the Gaussian noise) is C = ‖(C_1, …, C_K)‖₂.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from privacylab.training.dp.errors import DPSGDError, check_number

CLIP_EPS = 1e-6
"""Added to the norm before dividing, as Opacus does (``optimizers/optimizer.py``)."""


@dataclass
class ClippedBatch:
    """Sum over a batch of clipped per-example gradients, before noise.

    Attributes:
        grad_sum: parameter name -> Σ_i c_i ∇_θ L_i for the trainable parameters.
        norms: (B,) per-example gradient norms ‖∇_θ L_i‖₂ before clipping (all parameters).
        loss: (B,) per-example losses, detached.
        batch_size: B, the realised number of examples (may be 0 under Poisson sampling).
    """

    grad_sum: dict[str, Tensor]
    norms: Tensor
    loss: Tensor
    batch_size: int


class GradientBuffers:
    """Per-parameter buffers that clipped gradient sums are added to, created on first use.

    Creating a buffer only when its layer's sum is formed keeps the peak memory of a step at
    that of ordinary back-propagation (gradients appear while activations are released).
    ``init(name, parameter)`` makes the buffer — zeros by default; the engine passes the DP
    noise, so that no second gradient-sized buffer is needed.
    """

    def __init__(
        self,
        params: Mapping[str, Tensor],
        init: Callable[[str, Tensor], Tensor] | None = None,
    ) -> None:
        self.params = params
        self.init = init or (lambda name, p: torch.zeros_like(p))
        self.buffers: dict[str, Tensor] = {}

    def __getitem__(self, name: str) -> Tensor:
        buffer = self.buffers.get(name)
        if buffer is None:
            buffer = self.buffers[name] = self.init(name, self.params[name])
        return buffer

    def tensors(self) -> dict[str, Tensor]:
        """Every parameter's buffer, in parameter order (creating any not used yet)."""
        return {name: self[name] for name in self.params}


class ClipThresholds:
    """Flat threshold C, or per-parameter thresholds C_k with ‖(C_k)‖₂ = C (McMahan et al. 2018).

    Args:
        max_grad_norm: C, the overall L2 sensitivity of one example's clipped gradient.
        parameter_names: names of the trainable parameters, in model order.
        per_layer: ``None`` for flat clipping; otherwise a mapping from every trainable
            parameter name to C_k, or a sequence of C_k in ``parameter_names`` order.
            ``sqrt(Σ C_k²)`` must equal ``max_grad_norm`` (relative tolerance 1e-6).
    """

    def __init__(
        self,
        max_grad_norm: float,
        parameter_names: Sequence[str],
        per_layer: Mapping[str, float] | Sequence[float] | None = None,
    ) -> None:
        self.max_grad_norm = check_number("max_grad_norm", max_grad_norm, positive=True)
        self.parameter_names = list(parameter_names)
        self.per_parameter: dict[str, float] | None = None
        if per_layer is None:
            return
        if isinstance(per_layer, Mapping):
            unknown = sorted(set(per_layer) - set(self.parameter_names))
            missing = [n for n in self.parameter_names if n not in per_layer]
            if unknown:
                raise DPSGDError(f"per_layer_thresholds names unknown parameters: {unknown}")
            if missing:
                raise DPSGDError(f"per_layer_thresholds has no threshold for {missing}")
            values = {
                n: check_number(f"threshold of {n}", per_layer[n], positive=True)
                for n in self.parameter_names
            }
        else:
            per_layer = list(per_layer)
            if len(per_layer) != len(self.parameter_names):
                raise DPSGDError(
                    f"per_layer_thresholds has {len(per_layer)} values for "
                    f"{len(self.parameter_names)} trainable parameters"
                )
            values = {
                n: check_number(f"threshold of {n}", c, positive=True)
                for n, c in zip(self.parameter_names, per_layer, strict=True)
            }
        overall = math.sqrt(sum(c * c for c in values.values()))
        if not math.isclose(overall, self.max_grad_norm, rel_tol=1e-6):
            raise DPSGDError(
                f"per-layer thresholds have L2 norm {overall:.6g} but max_grad_norm is "
                f"{self.max_grad_norm:.6g}; they must be equal (see split_threshold)"
            )
        self.per_parameter = values

    @property
    def per_layer(self) -> bool:
        """True when each parameter tensor has its own threshold."""
        return self.per_parameter is not None

    def coefficients(self, sq_norms: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Per-example scale factors from squared per-example gradient norms.

        Args:
            sq_norms: parameter name -> (B,) squared norm of that parameter's per-example grads.

        Returns:
            ``(norms, coef)``: the (B,) overall norms before clipping and, per parameter, the
            (B,) factors ``min(1, C / (norm + 1e-6))`` with the flat or per-parameter C.
        """
        total = torch.stack([sq_norms[n] for n in self.parameter_names]).sum(0)
        norms = total.sqrt()
        if self.per_parameter is None:
            flat = (self.max_grad_norm / (norms + CLIP_EPS)).clamp(max=1.0)
            return norms, dict.fromkeys(self.parameter_names, flat)
        coef = {
            n: (c / (sq_norms[n].sqrt() + CLIP_EPS)).clamp(max=1.0)
            for n, c in self.per_parameter.items()
        }
        return norms, coef


def split_threshold(parameter_names: Sequence[str], max_grad_norm: float) -> dict[str, float]:
    """Equal per-parameter thresholds C_k = C / √K, so that ‖(C_1, …, C_K)‖₂ = C.

    The simplest per-layer choice of McMahan et al. (2018, Sec. 3); pass the result as
    ``per_layer_thresholds`` (or rescale it to weight some layers more).
    """
    names = list(parameter_names)
    if not names:
        raise DPSGDError("there are no trainable parameters to give thresholds to")
    c = check_number("max_grad_norm", max_grad_norm, positive=True) / math.sqrt(len(names))
    return dict.fromkeys(names, c)
