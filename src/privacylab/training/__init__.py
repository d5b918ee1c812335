"""Training: one trainer; privacy (DP-SGD), regularisation and callbacks are options of it."""

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
from privacylab.training.hooks import Callback, Regularizer, TrainState
from privacylab.training.job import train_job
from privacylab.training.reaccount import reaccount
from privacylab.training.trainer import EpochRecord, PrivacySpent, TrainResult, train

__all__ = [
    "DPSGD",
    "Callback",
    "ClippedBatch",
    "DPSGDError",
    "EpochRecord",
    "GhostClippingError",
    "PoissonSampler",
    "PrivacyConfig",
    "PrivacySpent",
    "Regularizer",
    "ShuffleSampler",
    "StepInfo",
    "StepResult",
    "TrainConfig",
    "TrainResult",
    "TrainState",
    "TrainingError",
    "reaccount",
    "register_rule",
    "split_threshold",
    "train",
    "train_job",
]
