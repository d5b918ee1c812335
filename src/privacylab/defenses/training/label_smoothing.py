"""Label smoothing (seed 004, "Mitigating MIA"; Szegedy et al. 2016, Sec. 7): train on soft
targets, "replacing the hard 0 and 1 classification targets with targets of ε/(k−1) and 1−ε"
(the seed's definition, k classes), so the model is never pushed to full confidence on its
training examples.

The trainer's `label_smoothing` is PyTorch's: target (1−s)·onehot + s/k (the true class gets
1 − s + s/k, every other s/k). The seed's targets are that with s = ε·k/(k−1): s/k = ε/(k−1)
and 1 − s(k−1)/k = 1 − ε, exactly. ε must be below (k−1)/k (at (k−1)/k the target is uniform
and the label is gone).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from privacylab.data import Dataset
from privacylab.defenses.base import (
    DefenseData,
    DefenseError,
    Fitted,
    ModelBuilder,
    Parameter,
    TrainingDefense,
    register_defense,
)
from privacylab.training import TrainConfig


@register_defense
class LabelSmoothing(TrainingDefense):
    """Cross-entropy on targets 1−ε (true class) and ε/(k−1) (every other class)."""

    name = "label-smoothing"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter(
            "eps",
            float,
            0.1,
            "probability mass moved from the true class, spread over the k−1 others",
            low=0.0,
            high=1.0,
            high_open=True,
        ),
    )
    paper = "Szegedy et al. 2016, Rethinking the Inception Architecture, Sec. 7 (seed 004's form)"

    def smoothing(self, num_classes: int) -> float:
        """The trainer's (PyTorch's) smoothing s = ε·k/(k−1) giving the seed's targets, or
        DefenseError when ε ≥ (k−1)/k."""
        eps, k = float(self.params["eps"]), int(num_classes)
        if k < 2:
            raise DefenseError(f"{self.label} needs at least 2 classes, got {k}")
        if eps >= (k - 1) / k:
            raise DefenseError(
                f"{self.label}: eps must be < (k-1)/k = {(k - 1) / k:g} for {k} classes "
                "(at that value the target is uniform)"
            )
        return eps * k / (k - 1)

    def fit(
        self,
        build: ModelBuilder,
        data: Dataset,
        config: TrainConfig,
        extra: DefenseData,
        *,
        seed: int,
        folder: Path,
    ) -> Fitted:
        """The base training with `label_smoothing` set for `data`'s number of classes (the
        recipe's own smoothing is replaced)."""
        smoothed = replace(config, label_smoothing=self.smoothing(data.num_classes))
        return super().fit(build, data, smoothed, extra, seed=seed, folder=folder)
