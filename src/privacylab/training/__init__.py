"""Training: one trainer; privacy (DP-SGD) and regularisation are options of it."""

from privacylab.training.dp import (
    DPSGD,
    ClippedBatch,
    DPSGDError,
    GhostClippingError,
    PoissonSampler,
    ShuffleSampler,
    StepInfo,
    StepResult,
    register_rule,
    split_threshold,
)

__all__ = [
    "DPSGD",
    "ClippedBatch",
    "DPSGDError",
    "GhostClippingError",
    "PoissonSampler",
    "ShuffleSampler",
    "StepInfo",
    "StepResult",
    "register_rule",
    "split_threshold",
]
