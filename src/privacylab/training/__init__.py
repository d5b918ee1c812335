"""Training: one trainer; privacy (DP-SGD), regularisation and callbacks are options of it.

`train` takes privacylab datasets, arrays, tensors, torch Datasets and DataLoaders and any
per-example loss; `make_private` puts DP-SGD into a loop of your own (as Opacus does)."""

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
from privacylab.training.inputs import TrainingData, as_training_data
from privacylab.training.job import train_job
from privacylab.training.make_private import PrivateTraining, make_private
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
    "PrivateTraining",
    "Regularizer",
    "ShuffleSampler",
    "StepInfo",
    "StepResult",
    "TrainConfig",
    "TrainResult",
    "TrainState",
    "TrainingData",
    "TrainingError",
    "as_training_data",
    "make_private",
    "reaccount",
    "register_rule",
    "split_threshold",
    "train",
    "train_job",
]
