"""Quantised updates: the precision defences of Zhu et al. 2019 (Deep Leakage from Gradients,
Sec. 5, Fig. 8: half precision did not stop the attack; int8 did).

`fp16` rounds every coordinate to IEEE half precision and back (values beyond ±65504 become
±inf, as on the wire). `int8` is symmetric per-tensor linear quantisation (Jacob et al. 2018,
"Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference",
Sec. 2.1, zero point 0): scale s = max|v| / 127, q = clamp(round(v / s), -127, 127), sent as
q · s; each coordinate moves by at most s / 2.
"""

from __future__ import annotations

import torch
from torch import Tensor

from privacylab.defenses.update.base import UpdateDefense, register_update_defense

__all__ = ["Float16Update", "Int8Update"]


@register_update_defense
class Float16Update(UpdateDefense):
    """Every coordinate rounded to float16 and back (Zhu et al. 2019, Sec. 5)."""

    name = "fp16"
    paper = "Zhu et al. 2019, Deep Leakage from Gradients, Sec. 5 (half precision)"

    def transform(self, tensor: Tensor, generator: torch.Generator) -> Tensor:
        """`tensor` through float16."""
        return tensor.to(torch.float16).to(tensor.dtype)


@register_update_defense
class Int8Update(UpdateDefense):
    """Symmetric per-tensor int8 quantisation, dequantised (scale max|v| / 127)."""

    name = "int8"
    paper = "Zhu et al. 2019, Deep Leakage from Gradients, Sec. 5; Jacob et al. 2018, Sec. 2.1"

    def transform(self, tensor: Tensor, generator: torch.Generator) -> Tensor:
        """clamp(round(v / s), -127, 127) · s with s = max|v| / 127 over the finite entries
        (±inf saturates at ±127 s, NaN stays NaN; an all-zero tensor stays zero)."""
        finite = tensor[torch.isfinite(tensor)]
        scale = finite.abs().max() / 127.0 if finite.numel() else None
        if scale is None or not bool(scale > 0):
            return torch.where(torch.isnan(tensor), tensor, torch.zeros_like(tensor))
        return torch.clamp(torch.round(tensor / scale), -127, 127) * scale
