"""Configuration of the one trainer: optimisation, regularisation and privacy are options."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from privacylab.errors import PrivacylabError

OPTIMIZERS = ("sgd", "momentum", "adam")
SCHEDULES = ("constant", "cosine", "step")
SAMPLINGS = ("poisson", "shuffle")
CLIPPINGS = ("ghost", "per_sample", "auto")


class TrainingError(PrivacylabError, ValueError):
    """A training option is invalid; the message is one line for the user."""


MAX_LR = 1e3
"""Largest learning rate accepted: anything above diverges at once (the CLI's bound too)."""


def _number(name: str, value: object, *, low: float, strict: bool = True) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TrainingError(f"{name} must be a number, got {value!r}") from None
    if (
        isinstance(value, bool)
        or not math.isfinite(number)
        or number < low
        or (strict and number == low)
    ):
        sign = ">" if strict else ">="
        raise TrainingError(f"{name} must be a finite number {sign} {low:g}, got {value!r}")
    return number


def _whole(name: str, value: object, *, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TrainingError(f"{name} must be a whole number >= {low}, got {value!r}")
    return value


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise TrainingError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


@dataclass
class PrivacyConfig:
    """DP-SGD options (Abadi et al. 2016, Alg. 1).

    Give `epsilon` (σ is calibrated for the planned steps) or `noise_multiplier`; with both,
    σ is used as given and training stops once ε reaches `epsilon` (a privacy budget).
    """

    epsilon: float | None = None
    noise_multiplier: float | None = None
    delta: float = 1e-5
    max_grad_norm: float = 1.0
    clipping: str = "ghost"
    per_layer: bool = False
    sampling: str = "poisson"
    accountant: str = "pld"
    secure_noise: bool = False
    physical_batch_size: int | None = None

    def validate(self) -> PrivacyConfig:
        """Check every option; raise TrainingError with one line for the first bad one."""
        if self.epsilon is None and self.noise_multiplier is None:
            raise TrainingError("private training needs a target epsilon or a noise multiplier")
        if self.epsilon is not None:
            _number("epsilon", self.epsilon, low=0.0)
        if self.noise_multiplier is not None:
            _number("noise multiplier", self.noise_multiplier, low=0.0)
        delta = _number("delta", self.delta, low=0.0)
        if delta >= 1.0:
            raise TrainingError(f"delta must be in (0, 1), got {self.delta!r}")
        _number("max grad norm", self.max_grad_norm, low=0.0)
        _choice("clipping", self.clipping, CLIPPINGS)
        _choice("sampling", self.sampling, SAMPLINGS)
        if self.physical_batch_size is not None:
            _whole("physical batch size", self.physical_batch_size)
        return self


@dataclass
class TrainConfig:
    """Everything `train` needs besides the model and the data."""

    epochs: int = 30
    batch_size: int = 256
    lr: float = 0.1
    optimizer: str = "momentum"
    momentum: float = 0.9
    weight_decay: float = 0.0
    schedule: str = "constant"
    label_smoothing: float = 0.0
    early_stopping: int | None = None
    augmentation: bool = False
    rotation: float = 10.0
    translation: int = 2
    seed: int = 0
    device: str = "cpu"
    privacy: PrivacyConfig | None = field(default=None)

    def validate(self) -> TrainConfig:
        """Check every option; raise TrainingError with one line for the first bad one."""
        _whole("epochs", self.epochs)
        _whole("batch size", self.batch_size)
        if _number("learning rate", self.lr, low=0.0) > MAX_LR:
            raise TrainingError(f"learning rate must be at most {MAX_LR:g}, got {self.lr!r}")
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _number("momentum", self.momentum, low=0.0, strict=False)
        _number("weight decay", self.weight_decay, low=0.0, strict=False)
        _choice("schedule", self.schedule, SCHEDULES)
        smoothing = _number("label smoothing", self.label_smoothing, low=0.0, strict=False)
        if smoothing >= 1.0:
            raise TrainingError(f"label smoothing must be in [0, 1), got {self.label_smoothing!r}")
        if self.early_stopping is not None:
            _whole("early stopping patience", self.early_stopping)
        _number("rotation", self.rotation, low=0.0, strict=False)
        _whole("translation", self.translation, low=0)
        _whole("seed", self.seed, low=0)
        if self.privacy is not None:
            self.privacy.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (for model sidecars and checkpoints)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Inverse of `to_dict`."""
        values = dict(data)
        privacy = values.pop("privacy", None)
        return cls(**values, privacy=PrivacyConfig(**privacy) if privacy else None)
