"""Sensitive-attribute inference from released embeddings.

Du et al. 2023 ("DP-Forward", CCS'23, Sec. 6.4): the adversary holds auxiliary sequences
labelled with the sensitive attribute, obtains their (clear or noisy) embeddings by querying
f(·), trains a classifier on them — a 3-layer neural network with a linear head, 90% of the
auxiliary data for training and 10% for validation — and applies it to the victims' released
embeddings f(X*) + Z to predict their attribute s* ∈ S.

Features: the released matrix (r, d) is summarised by its row mean (at the pooled output, the
d-vector itself), standardised with the auxiliary training statistics. The network is seeded
and trained with Adam and early stopping on the validation loss (the best epoch is kept).
"""

from __future__ import annotations

import copy
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.embedding.base import (
    AttributeOutput,
    EmbeddingAttack,
    EmbeddingError,
    EmbeddingTask,
    number_option,
    register_embedding,
    whole_option,
)
from privacylab.target import Access, Target

__all__ = ["AttributeInference", "features"]


def features(released: Tensor) -> Tensor:
    """The classifier's input of released embeddings (m, r, d): their row mean (m, d)."""
    return released.float().mean(1)


@register_embedding("attribute")
class AttributeInference(EmbeddingAttack):
    """Attribute inference with a 3-layer MLP on auxiliary embeddings (module docstring).
    `hidden`: width of its two hidden layers; `epochs` at most, stopping after `patience`
    epochs without a better validation loss; `validation`: the held-out share of the
    auxiliary data; `batch_size`, `lr`, `weight_decay`: Adam's."""

    kind: ClassVar[str] = "attribute"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.LOGITS, ("auxiliary-data",))
    paper: ClassVar[str] = "Du et al. 2023 (DP-Forward), Sec. 6.4"

    def __init__(
        self,
        hidden: int = 128,
        epochs: int = 200,
        patience: int = 20,
        validation: float = 0.1,
        batch_size: int = 64,
        lr: float = 1e-3,
        weight_decay: float = 1e-4,
    ) -> None:
        self.hidden = whole_option(self.name, "hidden", hidden)
        self.epochs = whole_option(self.name, "epochs", epochs)
        self.patience = whole_option(self.name, "patience", patience)
        self.validation = number_option(self.name, "validation", validation)
        if self.validation >= 1:
            raise EmbeddingError(f"{self.name}: validation must be in (0, 1), got {validation!r}")
        self.batch_size = whole_option(self.name, "batch_size", batch_size)
        self.lr = number_option(self.name, "lr", lr)
        self.weight_decay = number_option(self.name, "weight_decay", weight_decay, zero=True)

    def run(self, target: Target, task: EmbeddingTask) -> AttributeOutput:
        """Predicted attributes of the task's victims, from a classifier trained on the
        embeddings the target releases for the auxiliary sequences."""
        if task.auxiliary_ids is None or task.auxiliary_attributes is None:
            raise EmbeddingError(f"{self.name} needs auxiliary data (side information)")
        labels = np.asarray(task.auxiliary_attributes)
        classes = task.classes
        if len(labels) < 4 or classes < 2 or len(np.unique(labels)) < 2:
            raise EmbeddingError(
                f"{self.name} needs at least 4 auxiliary sequences of 2 or more attributes"
            )
        aux = features(target.embeddings(task.auxiliary_ids))  # type: ignore[attr-defined]
        victims = features(task.observed)
        if aux.shape[1] != victims.shape[1]:
            raise EmbeddingError(
                f"{self.name}: auxiliary embeddings of width {aux.shape[1]}, "
                f"observed ones of width {victims.shape[1]}"
            )
        generator = torch.Generator().manual_seed(task.seed)
        order = torch.randperm(len(labels), generator=generator)
        held = max(1, round(self.validation * len(labels)))
        fit, check = order[held:], order[:held]
        mean, std = aux[fit].mean(0), aux[fit].std(0).clamp_min(1e-6)
        x = (aux - mean) / std
        y = torch.as_tensor(labels, dtype=torch.int64)
        model, epochs = self._train(x[fit], y[fit], x[check], y[check], classes, generator)
        with torch.no_grad():
            probs = F.softmax(model((victims - mean) / std), -1).numpy()
        return AttributeOutput(
            predictions=probs.argmax(1).astype(np.int64),
            probabilities=probs,
            params={"epochs": epochs, "auxiliary": len(labels), "classes": classes},
        )

    def _train(
        self,
        x: Tensor,
        y: Tensor,
        x_val: Tensor,
        y_val: Tensor,
        classes: int,
        generator: torch.Generator,
    ) -> tuple[nn.Module, int]:
        width = self.hidden
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
            model = nn.Sequential(
                nn.Linear(x.shape[1], width),
                nn.ReLU(),
                nn.Linear(width, width),
                nn.ReLU(),
                nn.Linear(width, classes),
            )
        optimiser = torch.optim.Adam(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        best, best_loss, best_epoch, waited = copy.deepcopy(model.state_dict()), np.inf, 0, 0
        for epoch in range(1, self.epochs + 1):
            model.train()
            for rows in torch.randperm(len(y), generator=generator).split(self.batch_size):
                optimiser.zero_grad()
                F.cross_entropy(model(x[rows]), y[rows]).backward()
                optimiser.step()
            model.eval()
            with torch.no_grad():
                loss = float(F.cross_entropy(model(x_val), y_val))
            if loss < best_loss:
                best, best_loss, best_epoch, waited = (
                    copy.deepcopy(model.state_dict()),
                    loss,
                    epoch,
                    0,
                )
            else:
                waited += 1
                if waited >= self.patience:
                    break
        model.load_state_dict(best)
        return model.eval(), best_epoch
