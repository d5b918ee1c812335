"""Distillation for Membership Privacy, DMP (Shejwalkar & Houmansadr 2021, "Membership Privacy
for Machine Learning Models Through Knowledge Transfer", AAAI, Alg. 1).

1. An unprotected teacher θ_up is trained on the private data D_tr as usual.
2. From the defender's reference pool X_ref (`DefenseData.public`; its labels are never read)
   the examples the student will learn from are selected by the two criteria of the paper
   (Sec. 4.2; seed 004: "(1) be far away from the private training data; (2) have low
   entropy"):

   - *far*: the distance of a reference example to the private data is its Euclidean distance,
     in input space (features flattened), to its nearest private example; the `far` fraction
     of the pool farthest from the private data is kept (the paper bounds the leakage of a
     reference example by how much its soft label depends on any one private example, which
     is largest for near-duplicates of members);
   - *low entropy*: among those, the `size` examples whose teacher predictions
     softmax(θ_up(x)) have the lowest Shannon entropy are chosen (the paper's selection by
     prediction entropy).
3. The student, a fresh network of the same architecture, is trained only on the chosen
   reference examples and the teacher's soft labels softmax(θ_up(x)/T), with the
   temperature-scaled KL loss of knowledge distillation (`_distill.distillation_loss`).

The student is what is deployed: it never sees a private label, and sees private features only
through the teacher's soft labels on other data.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

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
from privacylab.defenses.training._distill import probabilities, train_soft
from privacylab.defenses.training.stacking import accuracy_on
from privacylab.training import TrainConfig, train

__all__ = ["DMP", "nearest_distance", "prediction_entropy", "select_reference"]


def nearest_distance(pool: Tensor, private: Tensor, chunk: int = 1024) -> Tensor:
    """For every row of `pool`, the Euclidean distance (features flattened) to its nearest row
    of `private`; shape (len(pool),). DMP's "far from the private data" measure."""
    if len(private) == 0:
        raise DefenseError("dmp: the private training data is empty")
    a = pool.reshape(len(pool), -1).double()
    b = private.reshape(len(private), -1).double()
    if a.shape[1] != b.shape[1]:
        raise DefenseError(
            f"dmp: the public pool's examples have {a.shape[1]} features, the private data's "
            f"{b.shape[1]}"
        )
    out = torch.empty(len(a), dtype=torch.float64)
    for i in range(0, len(a), chunk):
        nearest = torch.full((len(a[i : i + chunk]),), math.inf, dtype=torch.float64)
        for j in range(0, len(b), chunk):
            nearest = torch.minimum(
                nearest, torch.cdist(a[i : i + chunk], b[j : j + chunk]).min(1).values
            )
        out[i : i + chunk] = nearest
    return out


def prediction_entropy(probs: Tensor) -> Tensor:
    """Shannon entropy −Σ_c p_c log p_c (nats) of each probability row; shape (n,)."""
    return -torch.xlogy(probs, probs).sum(1)


def select_reference(distance: Tensor, entropy: Tensor, count: int, far: float) -> np.ndarray:
    """DMP's choice of reference examples (Shejwalkar & Houmansadr 2021, Sec. 4.2): keep the
    max(count, ⌈far·n⌉) examples farthest from the private data, then the `count` of those with
    the lowest teacher entropy. Returns their positions in the pool, sorted; ties are broken by
    position, so the choice is deterministic."""
    n = len(distance)
    if len(entropy) != n:
        raise DefenseError(f"dmp: {n} distances but {len(entropy)} entropies")
    if not 1 <= count <= n:
        raise DefenseError(f"dmp: cannot choose {count} of {n} reference examples")
    keep = max(count, math.ceil(far * n))
    positions = np.arange(n)
    by_distance = np.lexsort((positions, -distance.numpy()))[:keep]
    by_entropy = by_distance[np.lexsort((by_distance, entropy.numpy()[by_distance]))]
    return np.sort(by_entropy[:count])


@register_defense
class DMP(TrainingDefense):
    """Distillation for Membership Privacy: a student trained only on the teacher's soft labels
    of reference data chosen far from the private data and of low teacher entropy."""

    name = "dmp"
    needs: ClassVar[tuple[str, ...]] = ("public",)
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter(
            "size",
            float,
            0.5,
            "reference examples the student learns from: a count (> 1) or a fraction of the "
            "public pool (<= 1)",
            low=0.0,
            low_open=True,
        ),
        Parameter(
            "temperature",
            float,
            1.0,
            "softmax temperature T of the teacher's soft labels and of the student's loss",
            low=0.0,
            low_open=True,
        ),
        Parameter(
            "far",
            float,
            0.75,
            "fraction of the pool, farthest from the private data, the entropy ranking chooses "
            "from",
            low=0.0,
            high=1.0,
            low_open=True,
        ),
    )
    paper = (
        "Shejwalkar & Houmansadr 2021, Membership Privacy for Machine Learning Models Through "
        "Knowledge Transfer (DMP), AAAI, Alg. 1"
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        size = self.params["size"]
        if size > 1 and size != int(size):
            raise DefenseError(
                f"dmp: size must be a fraction in (0, 1] or a whole count, got {size:g}"
            )

    def count(self, pool: int) -> int:
        """The number of reference examples chosen from a pool of `pool`."""
        size = self.params["size"]
        count = max(1, round(size * pool)) if size <= 1 else int(size)
        if count > pool:
            raise DefenseError(
                f"dmp: size {int(size)} is larger than the public pool ({pool} examples)"
            )
        return count

    def choose(self, teacher: nn.Module, private: Tensor, pool: Tensor) -> np.ndarray:
        """Positions in `pool` of the reference examples the student learns from
        (`select_reference` on the nearest-private-example distance and the teacher's
        prediction entropy)."""
        distance = nearest_distance(pool, private)
        entropy = prediction_entropy(probabilities(teacher, pool))
        return select_reference(distance, entropy, self.count(len(pool)), self.params["far"])

    def student(
        self,
        teacher: nn.Module,
        build: ModelBuilder,
        data: Dataset,
        extra: DefenseData,
        config: TrainConfig,
        *,
        seed: int,
        folder: Path | None = None,
    ) -> tuple[nn.Module, np.ndarray]:
        """Steps 2–3 of DMP: the chosen reference positions and the student `build(seed)`
        trained on the teacher's soft labels for them. Reads only the private *features* (for
        the distance), never `data.labels`, nor the public pool's labels."""
        self.require(extra)
        assert extra.public is not None
        pool = extra.public.features
        chosen = self.choose(teacher, data.features, pool)
        inputs = pool[torch.from_numpy(chosen)]
        temperature = self.params["temperature"]
        soft = probabilities(teacher, inputs, temperature)
        model = train_soft(
            build(seed), inputs, soft, config, temperature=temperature, folder=folder
        )
        return model, chosen

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
        """Train the teacher on `data`, choose reference data from `extra.public`, distil the
        student (Alg. 1). Each stage checkpoints under `folder/checkpoint`."""
        self.require(extra)
        self.count(len(extra.public))  # type: ignore[arg-type]
        teacher = train(
            build(seed),
            data,
            config,
            eval_data=extra.holdout,
            checkpoint_dir=folder / "checkpoint" / "teacher",
        ).model
        model, chosen = self.student(
            teacher,
            build,
            data,
            extra,
            config,
            seed=seed,
            folder=folder / "checkpoint" / "student",
        )
        return Fitted(
            model=model,
            train_accuracy=accuracy_on(model, data),
            notes={
                "teacher_train_accuracy": accuracy_on(teacher, data),
                "reference_chosen": len(chosen),
                "reference_pool": len(extra.public),  # type: ignore[arg-type]
            },
        )
