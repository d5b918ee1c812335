"""The parameters of a model as one flat vector, in `model.parameters()` order: the memory a
white-box memorization encoding writes in (Song, Ristenpart & Shmatikov, CCS 2017, Sec. 4) and
the vector the checks on released weights scan, in one fixed order for both."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from privacylab.models.errors import ModelError

__all__ = ["load_parameter_vector", "parameter_count", "parameter_vector"]


def parameter_vector(model: nn.Module) -> Tensor:
    """All parameters of `model`, in `model.parameters()` order, as one detached float32
    vector on the CPU: the memory every white-box encoding writes in, in one fixed order."""
    params = list(model.parameters())
    if not params:
        raise ModelError("the model has no parameters")
    return torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in params])


def load_parameter_vector(model: nn.Module, vector: Tensor) -> None:
    """Write `vector` (as from `parameter_vector`) back into `model`'s parameters, in place."""
    flat = torch.as_tensor(vector).reshape(-1)
    total = parameter_count(model)
    if flat.numel() != total:
        raise ModelError(f"a parameter vector of {flat.numel()} values for {total} parameters")
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(flat[offset : offset + n].reshape(p.shape).to(p.device, p.dtype))
            offset += n


def parameter_count(model: nn.Module) -> int:
    """Number of parameters of `model`."""
    return int(sum(p.numel() for p in model.parameters()))
