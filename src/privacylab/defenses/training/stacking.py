"""Model stacking on disjoint parts of the training data (seed 004, "Mitigating MIA": "use
multiple models so that only features common in different models contribute"; Salem et al.
2019, ML-Leaks, Sec. VI "Model stacking").

The training set is cut by a seeded permutation into k disjoint parts; member i, a model of
the recipe's architecture, is trained on part i only, with the recipe's trainer. The deployed
model averages the members' probability vectors, p(x) = (1/k)·Σᵢ softmax(fᵢ(x)), and returns
log p(x) as its logits (softmax of those is p again). Every training example is seen by one
member only, so its own mark on the average is diluted by the k−1 members that never saw it.

This is the flat ensemble (an average), not ML-Leaks' two-level variant (a second-level model
trained on the first level's outputs on yet another disjoint part): the average needs no
further split of the data, has no trainable combiner that could itself memorise, and keeps
every member's output interpretable. Each member is saved as its own model (safetensors +
JSON sidecar) in `member-<i>/`; nothing is pickled.
"""

from __future__ import annotations

import math
from dataclasses import replace
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
    accuracy,
    register_defense,
)
from privacylab.models import ModelError, ModelSpec, load_model, save_model
from privacylab.training import TrainConfig, train


class AveragedEnsemble(nn.Module):
    """Logits log((1/k)·Σᵢ softmax(fᵢ(x))) of k member networks."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise DefenseError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)

    def forward(self, x: Tensor) -> Tensor:
        """The log of the members' averaged probabilities, shape (n, classes)."""
        logs = torch.stack([torch.log_softmax(m(x), dim=-1) for m in self.members])
        return torch.logsumexp(logs, dim=0) - math.log(len(self.members))


def member_seed(seed: int, index: int) -> int:
    """A seed for member `index` of a run seeded `seed`, derived so that runs with nearby seeds
    share no member seed."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0] >> 1)


def disjoint_parts(n: int, k: int, seed: int) -> list[np.ndarray]:
    """k disjoint sorted row sets covering range(n), sizes differing by at most one, by a
    seeded permutation; DefenseError when a part would be empty."""
    if k > n:
        raise DefenseError(f"stacking: k = {k} parts of {n} training examples leaves one empty")
    order = np.random.default_rng([int(seed), 0x57AC]).permutation(n)
    return [np.sort(part) for part in np.array_split(order, k)]


@register_defense
class Stacking(TrainingDefense):
    """k models on k disjoint parts of the training data; their probabilities averaged."""

    name = "stacking"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("k", int, 3, "number of members (disjoint parts of the training data)", low=2),
    )
    paper = "Salem et al. 2019, ML-Leaks, Sec. VI (model stacking); seed 004"

    def parts(self, n: int, seed: int) -> list[np.ndarray]:
        """The members' rows of a training set of `n` examples for a run seeded `seed`."""
        return disjoint_parts(n, int(self.params["k"]), seed)

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
        """Train member i on part i (`parts`) with the recipe's trainer (checkpointed under
        `folder/checkpoint/member-<i>`), then average them; notes: part sizes and each
        member's accuracy on its own part. Under DP-SGD each example is in one member's data only,
        so the ensemble's ε is the largest member's (parallel composition)."""
        members: list[nn.Module] = []
        own: list[float | None] = []
        spent: list[float] = []
        parts = self.parts(len(data), seed)
        for i, rows in enumerate(parts):
            derived = member_seed(seed, i)
            member_config = replace(config, seed=derived)
            result = train(
                build(derived),
                data.subset(rows),
                member_config,
                checkpoint_dir=folder / "checkpoint" / f"member-{i}",
            )
            members.append(result.model)
            own.append(result.history[-1].train_accuracy if result.history else None)
            if result.privacy is not None:
                spent.append(result.privacy.epsilon)
        ensemble = AveragedEnsemble(members).eval()
        return Fitted(
            model=ensemble,
            train_accuracy=accuracy_on(ensemble, data),
            epsilon=max(spent) if spent else None,
            notes={"member_sizes": [len(p) for p in parts], "member_accuracy": own},
        )

    def save(
        self, model: nn.Module, folder: Path, spec: ModelSpec, metadata: dict[str, Any]
    ) -> None:
        """Each member as its own saved model in `folder/member-<i>`."""
        if not isinstance(model, AveragedEnsemble) or len(model.members) != self.params["k"]:
            raise DefenseError(f"{self.label} saves an ensemble of {self.params['k']} members")
        for i, member in enumerate(model.members):
            save_model(member, folder / f"member-{i}", spec, {**metadata, "member": i})

    def load(self, folder: Path) -> nn.Module:
        """The ensemble `save` wrote (eval mode); DefenseError when a member is missing."""
        members = []
        for i in range(int(self.params["k"])):
            try:
                members.append(load_model(folder / f"member-{i}")[0])
            except ModelError as error:
                raise DefenseError(f"{self.label}: member {i} cannot be read: {error}") from None
        return AveragedEnsemble(members).eval()


@torch.no_grad()
def accuracy_on(model: nn.Module, data: Dataset, chunk: int = 4096) -> float:
    """Fraction of `data` that `model` labels correctly (`privacylab.defenses.base.accuracy`)."""
    return accuracy(model, data, chunk)
