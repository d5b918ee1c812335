"""Reference (shadow) models trained like the target, durable and in parallel.

Reference j trains on the attacker's universe rows where `keep[j]` is True. Following Carlini et
al. 2022 (LiRA code, "keep" masks), every example is IN for the same number of references —
round(f·R) of R, f being the target's share of training data — so every example has both IN and
OUT models. Each model is trained by the project's trainer in a worker process, saved as
safetensors, and recorded in the result store when it finishes; a second run with the same recipe
loads them and a killed run trains only the missing ones (each model also resumes from its
per-epoch checkpoint).
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.membership.result import AttackError
from privacylab.data import Dataset, load_dataset
from privacylab.execution import Executor, ResultStore, SerialExecutor, config_key, durable_map
from privacylab.models import ModelSpec, build_model, load_model, save_model
from privacylab.training import TrainConfig, train

NAMESPACE = "references"


@dataclass(frozen=True)
class Recipe:
    """How the target was trained: dataset (by name), model (by name and options) and the
    trainer's configuration (`TrainConfig.to_dict()`)."""

    dataset: str
    model: str
    train: dict[str, Any]
    model_options: dict[str, Any] = field(default_factory=dict)
    root: str | None = None
    defense: str | None = None
    """The canonical spec of the training-time defence the model is trained under
    (`privacylab.defenses`), or None; the attacker who knows the recipe trains its references
    with it too."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form (also what the store key hashes; `defense` only when set, so undefended
        recipes keep their keys)."""
        out = {
            "dataset": self.dataset,
            "model": self.model,
            "train": self.train,
            "model_options": self.model_options,
            "root": self.root,
        }
        if self.defense is not None:
            out["defense"] = self.defense
        return out


def reference_keep(count: int, universe: int, train_size: int, seed: int) -> np.ndarray:
    """Bool (count, universe): each column has round(count·train_size/universe) True entries,
    placed by a seeded random permutation per column (Carlini et al. 2022, Sec. VI)."""
    if count < 1 or universe < 1 or not 0 < train_size <= universe:
        raise AttackError(
            f"need >= 1 reference and 0 < train size <= universe, got {count}, "
            f"{train_size}, {universe}"
        )
    inside = max(1, min(count - 1 if count > 1 else 1, round(count * train_size / universe)))
    ranks = np.random.default_rng(seed).random((count, universe)).argsort(0).argsort(0)
    return ranks < inside


@functools.lru_cache(maxsize=4)
def _dataset(name: str, root: str | None) -> Dataset:
    return load_dataset(name, root)


TrainFn = Callable[[nn.Module, Tensor, Tensor], Any]
"""A user's training loop: `train_fn(model, x, y)` trains `model` in place on (x, y)."""


def train_one(job: dict[str, Any]) -> dict[str, Any]:
    """Train and save one reference model (runs in a worker process); returns its record.

    With `job["train_fn"]` the model is trained by that function (the user's own loop) instead
    of the project's trainer with the recipe's configuration."""
    recipe = job["recipe"]
    data = _dataset(recipe["dataset"], recipe["root"])
    folder = Path(job["folder"])
    if job.get("train_fn") is not None:
        return _train_with(job["train_fn"], recipe, data, folder, job)
    config = TrainConfig.from_dict({**recipe["train"], "seed": job["seed"]})
    model = build_model(
        recipe["model"],
        data.input_shape,
        data.num_classes,
        seed=job["seed"],
        **recipe["model_options"],
    )
    result = train(
        model,
        data.subset(np.asarray(job["indices"])),
        config,
        checkpoint_dir=folder / "checkpoint",
    )
    spec = ModelSpec(recipe["model"], data.input_shape, data.num_classes, recipe["model_options"])
    last = result.history[-1]
    record = {
        "folder": str(folder),
        "train_size": len(job["indices"]),
        "train_accuracy": last.train_accuracy,
        "epsilon": result.privacy.epsilon if result.privacy else None,
        "seed": job["seed"],
    }
    save_model(model, folder, spec, {"reference": record, "training": config.to_dict()})
    shutil.rmtree(folder / "checkpoint", ignore_errors=True)
    return record


def _train_with(
    train_fn: TrainFn, recipe: dict[str, Any], data: Dataset, folder: Path, job: dict[str, Any]
) -> dict[str, Any]:
    model = build_model(
        recipe["model"],
        data.input_shape,
        data.num_classes,
        seed=job["seed"],
        **recipe["model_options"],
    )
    part = data.subset(np.asarray(job["indices"]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(job["seed"])
        model.train()
        returned = train_fn(model, part.features, part.labels)
    if isinstance(returned, nn.Module):
        model = returned
    model.eval()
    with torch.no_grad():
        predicted = torch.cat(
            [model(part.features[i : i + 2048]).argmax(1) for i in range(0, len(part), 2048)]
        )
    record = {
        "folder": str(folder),
        "train_size": len(job["indices"]),
        "train_accuracy": float((predicted == part.labels).float().mean()),
        "epsilon": None,
        "seed": job["seed"],
    }
    spec = ModelSpec(recipe["model"], data.input_shape, data.num_classes, recipe["model_options"])
    save_model(model, folder, spec, {"reference": record, "training": recipe["train"]})
    return record


@dataclass(eq=False)
class ReferencePool:
    """Trained references, their keep mask over the universe and their training records."""

    models: list[nn.Module]
    keep: np.ndarray
    universe: np.ndarray
    records: list[dict[str, Any]]

    def task_keep(self, extra: int) -> np.ndarray:
        """The keep mask for a MembershipTask whose candidates are the universe, followed by
        `extra` population rows no reference trained on."""
        return np.concatenate([self.keep, np.zeros((len(self.models), extra), bool)], 1)


def train_references(
    recipe: Recipe,
    universe: np.ndarray,
    count: int,
    train_size: int,
    folder: str | Path,
    *,
    store: ResultStore,
    executor: Executor | None = None,
    seed: int = 0,
    on_done: Callable[[str, dict[str, Any], bool], None] | None = None,
    train_fn: TrainFn | None = None,
    worker: Callable[[dict[str, Any]], dict[str, Any]] = train_one,
    loader: Callable[[str], nn.Module] | None = None,
    job_extra: dict[str, Any] | None = None,
) -> ReferencePool:
    """Train (or load) `count` references on subsets of the dataset rows `universe`, each of
    about `train_size` rows, keyed in `store` by the recipe, the universe and the seed.

    `train_fn(model, x, y)`, when given, trains each reference instead of the project's trainer
    (a module-level function, so worker processes can import it); the recipe's `train` entry
    should then name it (e.g. `{"train_fn": "pkg.module:fit"}`), as it keys the store.
    `worker(job)` trains one reference (default `train_one`; a defence's trainer for recipes
    with a `defense`), `loader(folder)` loads a trained one (default: `load_model`), and
    `job_extra` is merged into every job (e.g. the rows of the attacker's own holdout data)."""
    universe = np.asarray(universe, dtype=np.int64)
    keep = reference_keep(count, len(universe), train_size, seed)
    identity: dict[str, Any] = {
        "recipe": recipe.to_dict(),
        "universe": config_key({"rows": universe.tolist()}),
        "count": count,
        "train_size": train_size,
        "seed": seed,
    }
    if job_extra:
        identity["extra"] = config_key(job_extra)
    pool_key = config_key(identity)[:16]
    root = Path(folder) / pool_key
    jobs = {
        f"{pool_key}/{j}": {
            "recipe": recipe.to_dict(),
            "indices": universe[keep[j]].tolist(),
            "seed": 1000 + seed * 1000 + j,
            "folder": str(root / f"ref-{j:03d}"),
            "train_fn": train_fn,
            **(job_extra or {}),
        }
        for j in range(count)
    }
    results = durable_map(
        worker, jobs, store, NAMESPACE, executor or SerialExecutor(), on_done=on_done
    )
    records = [results[f"{pool_key}/{j}"] for j in range(count)]
    models = [
        loader(r["folder"]) if loader is not None else load_model(r["folder"])[0] for r in records
    ]
    return ReferencePool(models=models, keep=keep, universe=universe, records=records)
