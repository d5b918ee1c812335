"""SELENA (Tang et al. 2022, "Mitigating Membership Inference Attacks by Self-Distillation
Through a Novel Ensemble Architecture", USENIX Security, Sec. 4).

- *Split-AI* (Sec. 4.1): K sub-models; every training example is left out of L of them,
  chosen at random per example (so each sub-model trains on about (K−L)/K of the data). The
  soft label of a training example is the average of the prediction vectors of the L
  sub-models that did *not* train on it — an output computed as if the example were a
  non-member.
- *Self-Distillation* (Sec. 4.2): a fresh network of the same architecture is trained on the
  training data with those soft labels (`_distill.train_soft`, T = 1); it alone is deployed,
  so the default save/load apply.

The paper uses K = 25, L = 10; the default here is K = 10 with the paper's ratio L/K = 10/25
(L = 4), which costs K + 1 trainings. Every sub-model checkpoints on its own, so a killed run
resumes after the last finished one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

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
from privacylab.defenses.training._distill import derived_seed, probabilities, train_soft
from privacylab.defenses.training.stacking import accuracy_on
from privacylab.training import TrainConfig, train

__all__ = ["SELENA", "exclusion_matrix", "split_soft_labels"]

PAPER_RATIO = (10, 25)
"""L / K of the paper's experiments (Tang et al. 2022, Sec. 5.1)."""


def exclusion_matrix(n: int, K: int, L: int, seed: int) -> np.ndarray:
    """Bool (n, K): row i marks the L sub-models that do *not* train on example i, chosen
    uniformly at random per example from a generator seeded `seed` (Split-AI, Tang et al.
    2022, Sec. 4.1). Every row has exactly L True entries; every sub-model gets at least one
    training example, or DefenseError."""
    if not K > L >= 1:
        raise DefenseError(f"selena: need K > L >= 1, got K={K}, L={L}")
    if n < 1:
        raise DefenseError("selena: the training data is empty")
    ranks = np.random.default_rng(seed).random((n, K)).argsort(1).argsort(1)
    excluded = ranks < L
    empty = np.flatnonzero(excluded.all(0))
    if len(empty):
        raise DefenseError(
            f"selena: sub-model {int(empty[0])} has no training example ({n} examples, K={K}, "
            f"L={L}); use more data or a smaller L"
        )
    return excluded


def split_soft_labels(predictions: Tensor, excluded: np.ndarray) -> Tensor:
    """Split-AI's soft labels (Tang et al. 2022, Sec. 4.1): for each training example i, the
    mean of `predictions[k, i]` over the sub-models k with `excluded[i, k]`. `predictions` is
    (K, n, classes); returns (n, classes)."""
    mask = torch.as_tensor(excluded, dtype=predictions.dtype).T  # (K, n)
    if predictions.shape[:2] != mask.shape:
        raise DefenseError(
            f"selena: predictions of shape {tuple(predictions.shape)} do not match the "
            f"exclusion matrix {excluded.shape}"
        )
    return (predictions * mask[..., None]).sum(0) / mask.sum(0)[:, None]


@register_defense
class SELENA(TrainingDefense):
    """Split-AI (K sub-models, each example left out of L) then self-distillation on the
    left-out models' averaged predictions."""

    name = "selena"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("K", int, 10, "number of Split-AI sub-models (the paper: 25)", low=2),
        Parameter(
            "L",
            int,
            0,
            "sub-models each example is left out of; 0: the paper's ratio, round(K·10/25)",
            low=0,
        ),
    )
    paper = (
        "Tang et al. 2022, Mitigating Membership Inference Attacks by Self-Distillation Through "
        "a Novel Ensemble Architecture (SELENA), USENIX Security, Sec. 4"
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        K, L = self.params["K"], self.left_out
        if not K > L >= 1:
            raise DefenseError(f"selena: need K > L >= 1, got K={K}, L={L}")

    @property
    def left_out(self) -> int:
        """L as used: the given value, or the paper's ratio of K (at least 1, below K)."""
        if self.params["L"]:
            return int(self.params["L"])
        K = int(self.params["K"])
        return min(K - 1, max(1, round(K * PAPER_RATIO[0] / PAPER_RATIO[1])))

    def split_ai(
        self,
        build: ModelBuilder,
        data: Dataset,
        config: TrainConfig,
        *,
        seed: int,
        folder: Path | None = None,
    ) -> tuple[Tensor, np.ndarray, list[float]]:
        """Split-AI on `data`: the soft labels (n, classes), the exclusion matrix (n, K) and
        each sub-model's accuracy on the examples it trained on. Sub-model k is
        `build(derived_seed(seed, k))`, trained on the rows with `excluded[:, k]` False."""
        K, L = int(self.params["K"]), self.left_out
        excluded = exclusion_matrix(len(data), K, L, derived_seed(seed, K, L))
        soft = torch.zeros(len(data), data.num_classes, dtype=torch.float64)
        member_accuracy = []
        for k in range(K):
            sub_seed = derived_seed(seed, k)
            rows = np.flatnonzero(~excluded[:, k])
            model = train(
                build(sub_seed),
                data.subset(rows),
                dataclasses.replace(config, seed=sub_seed, early_stopping=None),
                checkpoint_dir=folder / f"split-{k}" if folder is not None else None,
            ).model
            member_accuracy.append(accuracy_on(model, data.subset(rows)))
            out_rows = np.flatnonzero(excluded[:, k])
            probs = probabilities(model, data.features[torch.from_numpy(out_rows)])
            soft[torch.from_numpy(out_rows)] += probs.double()
        return (soft / L).float(), excluded, member_accuracy

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
        """Split-AI, then the deployed model `build(seed)` self-distilled on the soft labels;
        every training checkpoints under `folder/checkpoint`."""
        self.require(extra)
        soft, _, member_accuracy = self.split_ai(
            build, data, config, seed=seed, folder=folder / "checkpoint"
        )
        model = train_soft(
            build(seed), data.features, soft, config, folder=folder / "checkpoint" / "student"
        )
        return Fitted(
            model=model,
            train_accuracy=accuracy_on(model, data),
            notes={
                "K": int(self.params["K"]),
                "L": self.left_out,
                "soft_label_accuracy": float((soft.argmax(1) == data.labels).float().mean()),
                "sub_model_train_accuracy": float(np.mean(member_accuracy)),
            },
        )
