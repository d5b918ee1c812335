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
from privacylab.training.dp.noise import GaussianNoise, secure_standard_normal
from privacylab.training.dp.per_sample import PerSampleClipping
from privacylab.training.dp.sampling import PoissonSampler, ShuffleSampler

__all__ = [
    "DPSGD",
    "STRATEGIES",
    "ClipThresholds",
    "ClippedBatch",
    "DPSGDError",
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
    "register_rule",
    "registered_layer_types",
    "secure_standard_normal",
    "split_threshold",
]
