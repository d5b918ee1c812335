"""DP-SGD engine: per-example clipping (vmap or ghost), Poisson sampling, Gaussian noise.

Abadi et al. 2016, Alg. 1, with ghost clipping (Li et al. 2022) and book-keeping (Bu et al.
2023) for the per-example norms and clipped sums, and per-layer clipping (McMahan et al. 2018).
"""

from privacylab.training.dp.clipping import (
    ClippedBatch,
    ClipThresholds,
    GradientBuffers,
    split_threshold,
)
from privacylab.training.dp.distributed import (
    DistributedDPSGD,
    DistributedStepResult,
    model_fingerprint,
)
from privacylab.training.dp.engine import (
    DPSGD,
    STRATEGIES,
    StepInfo,
    StepResult,
    check_no_batch_norm,
)
from privacylab.training.dp.errors import DPSGDError, GhostClippingError
from privacylab.training.dp.ghost import (
    GhostClipping,
    LayerCall,
    LayerGradients,
    PerExampleGradients,
    register_rule,
    registered_layer_types,
)
from privacylab.training.dp.modules import DPGRU, DPLSTM, DPRNN, DPMultiheadAttention
from privacylab.training.dp.noise import GaussianNoise, secure_standard_normal
from privacylab.training.dp.per_sample import PerSampleClipping
from privacylab.training.dp.sampling import PoissonSampler, ShuffleSampler
from privacylab.training.dp.validate import Finding
from privacylab.training.dp.validate import describe as describe_findings
from privacylab.training.dp.validate import fix as fix_model
from privacylab.training.dp.validate import validate as validate_model

__all__ = [
    "DPGRU",
    "DPLSTM",
    "DPRNN",
    "DPSGD",
    "STRATEGIES",
    "ClipThresholds",
    "ClippedBatch",
    "DPMultiheadAttention",
    "DPSGDError",
    "DistributedDPSGD",
    "DistributedStepResult",
    "Finding",
    "GaussianNoise",
    "GhostClipping",
    "GhostClippingError",
    "GradientBuffers",
    "LayerCall",
    "LayerGradients",
    "PerExampleGradients",
    "PerSampleClipping",
    "PoissonSampler",
    "ShuffleSampler",
    "StepInfo",
    "StepResult",
    "check_no_batch_norm",
    "describe_findings",
    "fix_model",
    "model_fingerprint",
    "register_rule",
    "registered_layer_types",
    "secure_standard_normal",
    "split_threshold",
    "validate_model",
]
