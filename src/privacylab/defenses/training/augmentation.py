"""Data augmentation (seed 004, "Mitigating MIA": "add additional training samples obtained
through various transformations, so that the model is forced not to learn from certain
features"; Shokri et al. 2017 and Salem et al. 2019 list it among the regularisers; Kaya & Dumitras
2021, When Does Data Augmentation Help With Membership Inference Attacks?).

- **Images** (`kind == "image"`, (n, C, H, W)): the trainer's own augmentation — a fresh
  random rotation (±`rotation`°) and translation (±`translation` px) of every image at every
  step (`TrainConfig.augmentation`; the angles are the recipe's `rotation`/`translation`).
- **Tabular** float features: the trainer transforms only image batches and has no per-batch
  hook for other data, so (without editing it) the training set is enlarged once, before
  training, with `copies` perturbed copies of every row, drawn from a seeded generator:
  binary features (every value 0 or 1, as Purchase-100's 600 purchase indicators) have each
  bit flipped with probability `flip`; other features get Gaussian noise of standard deviation
  `noise` times that feature's standard deviation over the training set. Each epoch then
  passes over the (copies+1)·n rows. A fixed set of copies is weaker than fresh noise at every
  step, but it is reproducible and resumable with the trainer's checkpoints as they are.
- Text (token ids) has no augmentation here: DefenseError.

Copies of one example are k+1 examples to DP-SGD, which would protect none of them at the
accounted ε, so tabular augmentation under a private recipe is refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import torch

from privacylab.data import Dataset
from privacylab.defenses.base import (
    DefenseData,
    DefenseError,
    Fitted,
    ModelBuilder,
    Parameter,
    TrainingDefense,
    register_defense,
    seeded_generator,
)
from privacylab.defenses.training.stacking import accuracy_on
from privacylab.training import TrainConfig


@register_defense
class Augmentation(TrainingDefense):
    """Images: random rotation/translation per step. Tabular: `copies` perturbed copies of
    every row (bit flips for binary features, Gaussian noise for continuous ones)."""

    name = "augmentation"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("copies", int, 2, "perturbed copies of every tabular row", low=1),
        Parameter(
            "flip",
            float,
            0.02,
            "probability that a binary feature of a copy is flipped",
            low=0.0,
            high=0.5,
            low_open=True,
        ),
        Parameter(
            "noise",
            float,
            0.1,
            "Gaussian noise on continuous features, in units of each feature's std",
            low=0.0,
            low_open=True,
        ),
    )
    paper = (
        "Kaya & Dumitras 2021, When Does Data Augmentation Help With Membership Inference "
        "Attacks?; seed 004"
    )

    def configure(self, config: TrainConfig) -> TrainConfig:
        """`config` with the trainer's augmentation on (the trainer applies it to image
        batches only; for tabular data it is a no-op and `fit` enlarges the data instead)."""
        return replace(config, augmentation=True)

    def augmented(self, data: Dataset, seed: int) -> Dataset:
        """`data` followed by `copies` perturbed copies of it (tabular float features)."""
        x = data.features
        if not x.is_floating_point():
            raise DefenseError(f"{self.label} has no transformation for {data.kind} data")
        generator = seeded_generator(seed)
        copies = int(self.params["copies"])
        binary = bool(((x == 0) | (x == 1)).all())
        rows = [x]
        if binary:
            flip = float(self.params["flip"])
            for _ in range(copies):
                mask = torch.rand(x.shape, generator=generator) < flip
                rows.append(torch.where(mask, 1 - x, x))
        else:
            scale = float(self.params["noise"]) * x.std(dim=0, keepdim=True).nan_to_num(0.0)
            for _ in range(copies):
                rows.append(x + torch.randn(x.shape, generator=generator) * scale)
        return replace(
            data,
            features=torch.cat(rows),
            labels=data.labels.repeat(copies + 1),
            train_size=None,
        )

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
        """Images: the base training with the trainer's augmentation. Tabular: the base
        training on `augmented(data)`; the reported train accuracy is on the
        original rows."""
        if data.kind == "image" and data.features.dim() == 4:
            return super().fit(build, data, config, extra, seed=seed, folder=folder)
        if config.privacy is not None:
            raise DefenseError(
                f"{self.label}: copies of an example break DP-SGD's per-example guarantee"
            )
        enlarged = self.augmented(data, seed)
        fitted = super().fit(build, enlarged, config, extra, seed=seed, folder=folder)
        fitted.train_accuracy = accuracy_on(fitted.model, data)
        fitted.notes["rows"] = len(enlarged)
        return fitted
