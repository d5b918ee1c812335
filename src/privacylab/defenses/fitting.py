"""Training a model under a training-time defence as one durable unit of work: the defended
target and the attacker's references (trained with the same defence: the attacker knows the
recipe, Kerckhoffs) go through the same `train_defended`, in worker processes, recorded in the
result store as each finishes (`privacylab.execution.durable_map`).

A job is the reference trainer's job (`attacks.membership.references.train_one`) whose recipe
names a `defense` spec, plus the dataset rows of the defender's own data: `holdout` (labelled,
never trained on) and `public` (a pool a distillation defence may label). The folder gets the
defence's saved model and `defense.json` naming the spec, so `load_defended` can read any of
them back — an ensemble as well as a single network.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from privacylab.data import Dataset, load_dataset
from privacylab.defenses.base import DefenseData, DefenseError, TrainingDefense, parse_defense
from privacylab.models import ModelSpec, build_model
from privacylab.training import TrainConfig

DEFENSE_FILE = "defense.json"

__all__ = ["DEFENSE_FILE", "load_defended", "train_defended", "training_defense"]


def training_defense(spec: str) -> TrainingDefense:
    """The training-time defence of `spec`, or DefenseError if it is another kind."""
    defense = parse_defense(spec)
    if not isinstance(defense, TrainingDefense):
        raise DefenseError(f"{defense.label} is not a training-time defence")
    return defense


@functools.lru_cache(maxsize=4)
def _dataset(name: str, root: str | None) -> Dataset:
    return load_dataset(name, root)


def _rows(job: dict[str, Any], key: str) -> np.ndarray | None:
    rows = job.get(key)
    return None if rows is None or len(rows) == 0 else np.asarray(rows, dtype=np.int64)


def train_defended(job: dict[str, Any]) -> dict[str, Any]:
    """Train and save one model under the recipe's defence (runs in a worker process);
    returns its record (folder, train size and accuracy, ε if DP, the defence's notes)."""
    recipe = job["recipe"]
    defense = training_defense(recipe["defense"])
    data = _dataset(recipe["dataset"], recipe["root"])
    folder = Path(job["folder"])
    config = TrainConfig.from_dict({**recipe["train"], "seed": job["seed"]})
    options = defense.model_options(dict(recipe["model_options"]))

    def build(seed: int) -> nn.Module:
        return build_model(
            recipe["model"], data.input_shape, data.num_classes, seed=seed, **options
        )

    holdout, public = _rows(job, "holdout"), _rows(job, "public")
    extra = DefenseData(
        holdout=data.subset(holdout) if holdout is not None else None,
        public=data.subset(public) if public is not None else None,
    )
    fitted = defense.fit(
        build,
        data.subset(np.asarray(job["indices"], dtype=np.int64)),
        config,
        extra,
        seed=int(job["seed"]),
        folder=folder,
    )
    record = {
        "folder": str(folder),
        "train_size": len(job["indices"]),
        "train_accuracy": fitted.train_accuracy,
        "epsilon": fitted.epsilon,
        "seed": job["seed"],
        "defense": defense.spec,
        "notes": fitted.notes,
    }
    spec = ModelSpec(recipe["model"], data.input_shape, data.num_classes, options)
    metadata = {"reference": record, "training": config.to_dict(), "defense": defense.to_dict()}
    defense.save(fitted.model, folder, spec, metadata)
    (folder / DEFENSE_FILE).write_text(json.dumps({"spec": defense.spec}) + "\n")
    shutil.rmtree(folder / "checkpoint", ignore_errors=True)
    return record


def load_defended(folder: str | Path) -> nn.Module:
    """The model `train_defended` saved in `folder`, in eval mode."""
    folder = Path(folder)
    try:
        spec = json.loads((folder / DEFENSE_FILE).read_text())["spec"]
    except (OSError, ValueError, KeyError, TypeError):
        raise DefenseError(f"no defended model at {folder}: {DEFENSE_FILE} is missing") from None
    return training_defense(spec).load(folder).eval()
