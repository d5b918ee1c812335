"""Training: one trainer; privacy (DP-SGD) and regularisation are options of it."""

from privacylab.training.config import PrivacyConfig, TrainConfig, TrainingError
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
from privacylab.training.job import train_job
from privacylab.training.trainer import EpochRecord, PrivacySpent, TrainResult, train

__all__ = [
    "DPSGD",
    "ClippedBatch",
    "DPSGDError",
    "EpochRecord",
    "GhostClippingError",
    "PoissonSampler",
    "PrivacyConfig",
    "PrivacySpent",
    "ShuffleSampler",
    "StepInfo",
    "StepResult",
    "TrainConfig",
    "TrainResult",
    "TrainingError",
    "register_rule",
    "split_threshold",
    "train",
    "train_job",
]
