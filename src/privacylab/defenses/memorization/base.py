"""Checks on released weights against white-box memorization (Song, Ristenpart & Shmatikov,
"Machine Learning Models that Remember Too Much", CCS 2017, Sec. 4; seed 004, Exercise 4).

A `WeightCheck` scans the model's parameters in the one order every white-box encoding uses
(`privacylab.models.parameters.parameter_vector`) for the trace its encoding leaves,
computes one `statistic` (larger: more anomalous) and flags the model when it exceeds
`threshold`, a constant calibrated on honestly trained models of the victim recipe (each
check's docstring gives the command and the numbers). The data holder runs it: it may use its
own training rows (`data`), never the attacker's secret or layout beyond what the check states.

Held-out check of the calibrated thresholds (not used to set them): on the 20 honest models of
seeds 0..19 of benchmarks/memorization_checks.py's store (/work/bench18/h6/models; script
/work/bench18/h4/validate.py) no check flags any model — largest statistics correlation 40.4
(threshold 63), lsb-entropy 139.6 (188), sign-pattern 124.7 (143); a DP-SGD model (ε = 1)
scores ≈ 0 on all three. Encoded models of seed 0 score lsb-entropy 1.5e5-1.8e5 (LSB, b = 8,
16, 20), correlation 1.3e4-1.6e4 (correlated value encoding, 50 images, λ_c = 0.3, 1, 3; their
sign-pattern 533-537 flags too) and sign-pattern 575-692 (sign encoding, 40 images at 4 bits,
λ_s = 3, 10, 30; script /work/bench18/h4/validate2.py).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from torch import nn

from privacylab.data import Dataset
from privacylab.errors import PrivacylabError
from privacylab.models.parameters import parameter_vector
from privacylab.registry import Registry

__all__ = [
    "WEIGHT_CHECKS",
    "CheckResult",
    "MemorizationDefenseError",
    "WeightCheck",
    "make_weight_check",
    "register_weight_check",
    "run_weight_checks",
    "weight_check_names",
]


class MemorizationDefenseError(PrivacylabError, ValueError):
    """Bad input to a memorization check or sanitiser: one line."""


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict on one model: `flagged` when `statistic` > `threshold`; `detail`
    says where (window, block, row) and the raw numbers behind the statistic."""

    name: str
    statistic: float
    threshold: float
    flagged: bool
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "statistic": self.statistic,
            "threshold": self.threshold,
            "flagged": self.flagged,
            "detail": self.detail,
        }


def positive_number(check: str, name: str, value: object) -> float:
    """`value` as a finite number > 0, else one line."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise MemorizationDefenseError(f"{check}: {name} must be a number, got {value!r}")
    if not math.isfinite(float(value)) or float(value) <= 0:
        raise MemorizationDefenseError(f"{check}: {name} must be finite and > 0, got {value!r}")
    return float(value)


def whole_number(
    check: str, name: str, value: object, low: int = 1, high: int | None = None
) -> int:
    """`value` as a whole number in [low, high], else one line."""
    ok = not isinstance(value, bool) and isinstance(value, int | np.integer)
    if not ok or value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise MemorizationDefenseError(
            f"{check}: {name} must be a whole number {bound}, got {value!r}"
        )
    return int(value)


class WeightCheck(ABC):
    """A test of a released model's parameters: `statistic(model, data)`, `threshold`
    (calibrated default `default_threshold`, or the constructor's), `check` -> CheckResult."""

    name: ClassVar[str]
    default_threshold: ClassVar[float]
    needs_data: ClassVar[bool] = False

    def __init__(self, *, threshold: float | None = None) -> None:
        self.threshold = float(
            self.default_threshold
            if threshold is None
            else positive_number(self.name, "threshold", threshold)
        )

    @abstractmethod
    def scan(self, vector: np.ndarray, data: Dataset | None) -> tuple[float, dict[str, Any]]:
        """(statistic, detail) of the float32 parameter vector `vector`."""

    def statistic(self, model: nn.Module, data: Dataset | None = None) -> float:
        """The check's statistic of `model` (larger: more anomalous)."""
        return self.scan(self._vector(model, data), data)[0]

    def check(self, model: nn.Module, data: Dataset | None = None) -> CheckResult:
        """The verdict on `model`: flagged when the statistic exceeds the threshold."""
        value, detail = self.scan(self._vector(model, data), data)
        return CheckResult(
            self.name, float(value), self.threshold, bool(value > self.threshold), detail
        )

    def _vector(self, model: nn.Module, data: Dataset | None) -> np.ndarray:
        if self.needs_data and data is None:
            raise MemorizationDefenseError(
                f"{self.name}: the check needs the holder's training rows"
            )
        return parameter_vector(model).numpy()

    def to_dict(self) -> dict[str, Any]:
        """The check's name and options, JSON-ready."""
        return {"name": self.name, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}


WEIGHT_CHECKS: Registry[type[WeightCheck]] = Registry(
    "weight check", error=MemorizationDefenseError
)
"""Every weight check class by name: lsb-entropy, correlation, sign-pattern."""


def register_weight_check(cls: type[WeightCheck]) -> type[WeightCheck]:
    """Class decorator: register `cls` under its `name`."""
    return WEIGHT_CHECKS.register(cls.name, cls)


def weight_check_names() -> list[str]:
    """The registered weight check names."""
    return WEIGHT_CHECKS.names()


def make_weight_check(name: str, **options: Any) -> WeightCheck:
    """The check registered as `name` built with `options` (unknown name or option: one line)."""
    cls = WEIGHT_CHECKS.get(name)
    try:
        return cls(**options)
    except TypeError as error:
        raise MemorizationDefenseError(f"{name}: {error}") from None


def run_weight_checks(
    model: nn.Module, data: Dataset | None = None, names: list[str] | None = None
) -> dict[str, CheckResult]:
    """Every registered check (or `names`) with its default threshold on `model`; checks that
    need the holder's rows are skipped when `data` is None."""
    out: dict[str, CheckResult] = {}
    for name in names if names is not None else weight_check_names():
        check = make_weight_check(name)
        if check.needs_data and data is None:
            continue
        out[check.name] = check.check(model, data)
    return out
