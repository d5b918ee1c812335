"""Models by name, their JSON spec, and safetensors storage.

Every model's parameters live only in nn.Linear, nn.Conv2d, nn.Embedding, nn.LayerNorm and
nn.GroupNorm modules (`PARAMETER_MODULES`); the DP engine's per-layer norm rules rely on it and
`build_model` checks it.
"""

from privacylab.models import conv, dense, gpt, scattering, transformer  # noqa: F401  (registers)
from privacylab.models.errors import ModelError
from privacylab.models.registry import (
    PARAMETER_MODULES,
    build_model,
    model_names,
    model_options,
    register_model,
    unsupported_parameter_modules,
)
from privacylab.models.scattering import Scattering2D
from privacylab.models.spec import ModelSpec
from privacylab.models.storage import FORMAT, load_model, save_model
from privacylab.models.transformer import TransformerClassifier

__all__ = [
    "FORMAT",
    "PARAMETER_MODULES",
    "ModelError",
    "ModelSpec",
    "Scattering2D",
    "TransformerClassifier",
    "build_model",
    "load_model",
    "model_names",
    "model_options",
    "register_model",
    "save_model",
    "unsupported_parameter_modules",
]
