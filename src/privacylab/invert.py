"""The model-inversion job, `privacylab attack inversion`: invert each class of a model saved by
`privacylab train` with MI-Face (Fredrikson, Jha & Ristenpart 2015, Alg. 1;
`privacylab.attacks.inversion.miface`) and judge the inversions with an independent classifier.

What each party holds:
- the attacker: the model behind a `Target` at the method's access (`miface`: scores, its
  gradients estimated from queries; `miface-whitebox`: the model itself) and a
  `ModelInversionTask` (input shape, class count, the pixel box, which classes, a seed);
- the evaluator: the rows of the dataset's *test* part (the rows the target did not train on,
  `train_test_indices` with the target's own training seed). On them it trains an independent
  classifier of another architecture and another seed (`evaluator_architecture`: a CNN for
  images of side >= 14 unless the target is a CNN, else an MLP, else softmax regression) and
  takes the class means. Fredrikson et al. asked people to recognise the inverted faces; a
  classifier that never saw the target's data stands in for them. Its accuracy on the target's
  own training rows (which it never saw) is reported with it.

Every class's result (scores and image) is written to the result store as it finishes, keyed
by the target's weights digest, the method and its options, the class, the seed and the
evaluator; a second run serves it from the store, and a killed run resumes at the next class.
The evaluator is saved beside the store (safetensors and its sidecar) once trained, and
loaded, not trained again, by every later run that needs it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.attacks.inversion import (
    InversionError,
    inversion_class,
    make_inversion,
)
from privacylab.attacks.inversion.miface import (
    InversionTruth,
    ModelInversionTask,
    run_model_inversion,
)
from privacylab.data import Dataset, train_test_indices
from privacylab.execution import ResultStore, config_key
from privacylab.extract import Progress, Victim, load_victim
from privacylab.models import ModelSpec, build_model, load_model, save_model
from privacylab.report.jsonable import json_ready
from privacylab.target import Target
from privacylab.training import TrainConfig, train

__all__ = [
    "EVALUATORS",
    "INVERSIONS",
    "Evaluator",
    "InversionTarget",
    "evaluator_architecture",
    "inversion_rows",
    "load_target",
    "run_inversion",
    "train_evaluator",
]

INVERSIONS = "model-inversion"
"""Result-store namespace of one inverted class."""

EVALUATORS = "model-inversion-evaluator"
"""Result-store namespace of the evaluator's facts (architecture, seed, accuracy)."""

STORE_VERSION = 1
"""Part of every store key: bump when a stored row's meaning changes."""

EVALUATOR_TRAINING = {"epochs": 30, "batch_size": 64, "lr": 0.05, "weight_decay": 1e-4}
"""How the evaluation classifier is trained (momentum SGD, `privacylab.training.train`)."""

EXTRACTION_ROWS = ("pool_rows", "eval_rows")
"""`Victim.facts` keys of the extraction split, which the inversion job does not use."""


@dataclass(eq=False)
class InversionTarget:
    """The saved model as `privacylab.extract.load_victim` loads it (model, spec, dataset,
    pixel box, weights digest), with its training `seed`, the rows it trained on and the test
    rows the evaluator holds (`train_test_indices` under that seed)."""

    victim: Victim
    seed: int
    train_rows: np.ndarray
    test_rows: np.ndarray

    def facts(self) -> dict[str, Any]:
        """JSON-ready facts for the result and the report (the victim's, with the target's
        train/test row counts in place of the extraction split's)."""
        facts = {k: v for k, v in self.victim.facts().items() if k not in EXTRACTION_ROWS}
        return {**facts, "train_rows": len(self.train_rows), "test_rows": len(self.test_rows)}


def load_target(
    folder: str | Path, root: str | None = None, device: str = "cpu"
) -> InversionTarget:
    """The model saved at `folder` by privacylab (`privacylab.extract.load_victim`: one-line
    PrivacylabError for a folder that is not a privacylab model) and its train/test rows
    under its own training seed."""
    victim = load_victim(folder, root, device)
    training = victim.metadata.get("training")
    seed = int(training.get("seed", 0)) if isinstance(training, dict) else 0
    train_rows, test_rows = (
        np.asarray(r, dtype=np.int64) for r in train_test_indices(victim.data, seed=seed)
    )
    return InversionTarget(victim, seed, train_rows, test_rows)


def evaluator_architecture(target_model: str, input_shape: Sequence[int]) -> str:
    """The evaluator's architecture, never the target's: "cnn" for images of side >= 14 (the
    zoo's CNN needs it) unless the target is a CNN, else "mlp", else "logreg"."""
    shape = tuple(int(s) for s in input_shape)
    if target_model != "cnn" and len(shape) == 3 and min(shape[1:]) >= 14:
        return "cnn"
    return "mlp" if target_model != "mlp" else "logreg"


@dataclass(eq=False)
class Evaluator:
    """The independent classifier and what it was trained on."""

    model: nn.Module
    architecture: str
    seed: int
    rows: int
    accuracy_on_target_train: float
    seconds: float

    def facts(self) -> dict[str, Any]:
        """JSON-ready facts."""
        return {
            "architecture": self.architecture,
            "seed": self.seed,
            "trained_on": "the dataset's test part (rows the target did not train on)",
            "rows": self.rows,
            "accuracy_on_target_train_rows": self.accuracy_on_target_train,
            "training": dict(EVALUATOR_TRAINING),
            "seconds": self.seconds,
        }


def train_evaluator(
    data: Dataset,
    rows: np.ndarray,
    architecture: str,
    seed: int,
    *,
    held_out: np.ndarray | None = None,
    device: str = "cpu",
) -> Evaluator:
    """An `architecture` classifier trained with `seed` on `data`'s `rows` only (momentum SGD,
    `EVALUATOR_TRAINING`), and its accuracy on `held_out` rows (NaN without)."""
    start = time.perf_counter()
    net = build_model(architecture, data.input_shape, data.num_classes, seed=seed)
    config = TrainConfig(optimizer="momentum", seed=seed, device=device, **EVALUATOR_TRAINING)
    model = train(net, data.subset(rows), config).model.eval()
    accuracy = float("nan")
    if held_out is not None and len(held_out):
        x = data.features[held_out].to(device)
        with torch.no_grad():
            predicted = torch.cat(
                [model(x[i : i + 1024]).argmax(1) for i in range(0, len(x), 1024)]
            )
        accuracy = float((predicted.cpu() == data.labels[held_out]).float().mean())
    return Evaluator(model, architecture, seed, len(rows), accuracy, time.perf_counter() - start)


def _class_means(data: Dataset, rows: np.ndarray) -> torch.Tensor:
    x, y = data.features[rows], data.labels[rows]
    means = torch.full((data.num_classes, *data.input_shape), float("nan"))
    for c in range(data.num_classes):
        if bool((y == c).any()):
            means[c] = x[y == c].float().mean(0)
    return means


def _check_options(method: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise InversionError('attack options must be a JSON object, e.g. {"alpha": 300}')
    try:
        make_inversion(method, "model", **options)
    except TypeError as error:
        raise InversionError(f"{method}: bad options: {error}") from None
    return dict(options)


def inversion_rows(
    target: str | Path,
    method: str = "miface",
    classes: Sequence[int] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    seed: int = 0,
    root: str | None = None,
    device: str = "cpu",
    cache: str | Path | None = None,
    progress: Progress | None = None,
) -> tuple[
    InversionTarget, dict[str, Any], list[dict[str, Any]], dict[int, np.ndarray], torch.Tensor
]:
    """Invert each class (all when `classes` is None) of the model at `target`, one class at a
    time, each row (the `ModelInversionResult` class row with `queries`, `seconds` and the
    image) written to the store in `cache` as it finishes and served from it when present.
    The evaluator is trained (or loaded, once saved) only when a class has to be computed.
    Returns the target, the evaluator's facts, the rows, the images and the class means."""
    cls = inversion_class(method, "model")
    method = cls.name
    options = _check_options(method, options)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InversionError(f"seed must be a whole number >= 0, got {seed!r}")
    loaded = load_target(target, root, device)
    victim = loaded.victim
    task = ModelInversionTask(
        victim.spec.input_shape, victim.spec.num_classes, classes, victim.bounds, seed
    )
    chosen = task.chosen()
    architecture = evaluator_architecture(victim.spec.name, victim.spec.input_shape)
    evaluator_seed = loaded.seed + 1
    evaluator_key = config_key(
        {
            "version": STORE_VERSION,
            "target": victim.digest,
            "evaluator": [architecture, evaluator_seed, EVALUATOR_TRAINING],
        }
    )
    means = _class_means(victim.data, loaded.test_rows)
    folder = Path(cache if cache is not None else victim.folder / "inversion-cache").expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    images: dict[int, np.ndarray] = {}
    trained: list[InversionTruth] = []

    saved = folder / f"evaluator-{evaluator_key[:16]}"

    def truth(store: ResultStore) -> InversionTruth:
        """The evaluator, on first need (not at all when every class is stored): loaded from
        `saved` when an earlier run trained it, else trained and saved (weights first, then
        its facts, so that facts in the store mean the weights are complete)."""
        if not trained:
            if store.get(EVALUATORS, evaluator_key) is not None:
                model = load_model(saved, device=device)[0]
            else:
                if progress:
                    progress(f"inversion: training the evaluator ({architecture})", 0, len(chosen))
                evaluator = train_evaluator(
                    victim.data,
                    loaded.test_rows,
                    architecture,
                    evaluator_seed,
                    held_out=loaded.train_rows,
                    device=device,
                )
                spec = ModelSpec(architecture, victim.data.input_shape, victim.data.num_classes)
                facts = json_ready(evaluator.facts())
                save_model(evaluator.model, saved, spec, {"evaluator": facts})
                store.put(EVALUATORS, evaluator_key, facts)
                model = evaluator.model
            trained.append(InversionTruth(model, means))
        return trained[0]

    root_target = Target(
        victim.model, cls.threat_model.access, victim.spec.num_classes, device=device
    )
    with ResultStore(folder / "store.sqlite") as store:
        for i, label in enumerate(chosen):
            key = config_key(
                {
                    "version": STORE_VERSION,
                    "target": victim.digest,
                    "method": method,
                    "options": json_ready(options),
                    "class": label,
                    "seed": seed,
                    "evaluator": evaluator_key,
                }
            )
            stored = store.get(INVERSIONS, key)
            stage = f"inversion: {method} class {label}"
            if stored is None:
                if progress:
                    progress(stage, i, len(chosen))
                one = ModelInversionTask(
                    task.input_shape, task.num_classes, (label,), task.bounds, seed
                )
                torch.manual_seed(seed)
                result = run_model_inversion(
                    make_inversion(method, **options), root_target, one, truth(store)
                )
                row = {
                    **result.classes[0],
                    "queries": result.queries,
                    "seconds": result.seconds,
                    "access": result.access,
                    "params": result.params,
                    "image": result.images[label].numpy().astype(float).ravel().tolist(),
                }
                row = json_ready(row)
                store.put(INVERSIONS, key, row)
                from_store = False
            else:
                row, from_store = stored, True
                if progress:
                    progress(f"{stage} from the store", i + 1, len(chosen))
            image = np.asarray(row.pop("image"), dtype=np.float32).reshape(task.input_shape)
            images[label] = image
            rows.append({**row, "from_store": from_store})
        facts = store.get(EVALUATORS, evaluator_key)
    if progress:
        progress("inversion", len(chosen), len(chosen))
    return loaded, dict(facts or {}), rows, images, means


def run_inversion(
    target: str | Path,
    method: str = "miface",
    classes: Sequence[int] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    seed: int = 0,
    root: str | None = None,
    device: str = "cpu",
    cache: str | Path | None = None,
    out: str | Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """`privacylab attack inversion`: the payload (`model_inversion` holds the method, the
    evaluator's accuracy on the inversions, per class rows, the target's and evaluator's
    facts); with `out`, `results.json`, one PNG per class, the grid and `index.html` (the
    report's model-inversion section)."""
    start = time.perf_counter()
    loaded, evaluator, rows, images, means = inversion_rows(
        target,
        method,
        classes,
        options=options,
        seed=seed,
        root=root,
        device=device,
        cache=cache,
        progress=progress,
    )
    victim = loaded.victim
    cls = inversion_class(method, "model")
    name = cls.name
    correct = [bool(r.get("correct")) for r in rows]
    section: dict[str, Any] = {
        "method": name,
        "access": rows[0].get("access") if rows else None,
        "paper": cls.paper,
        "evaluator_accuracy": float(np.mean(correct)) if correct else None,
        "mean_confidence": float(np.mean([r.get("confidence") or 0.0 for r in rows])),
        "queries": int(sum(int(r.get("queries") or 0) for r in rows)),
        "attack_seconds": float(sum(float(r.get("seconds") or 0.0) for r in rows)),
        "target": loaded.facts(),
        "evaluator": evaluator,
        "classes": rows,
        "images": {},
    }
    png: dict[str, bytes] = {}
    if out is not None:
        from privacylab.report.model_inversion import image_png, inversion_grid_figure

        labels = [int(r["label"]) for r in rows]
        for label in labels:
            png[f"inversion_{label}.png"] = image_png(images[label], victim.bounds)
            section["images"][str(label)] = f"inversion_{label}.png"
        png["model_inversion.png"] = inversion_grid_figure(
            [images[c] for c in labels],
            [means[c].numpy() for c in labels],
            rows,
            victim.bounds,
        )
        section["images"]["grid"] = "model_inversion.png"
    payload: dict[str, Any] = {
        "title": f"privacylab model inversion report: {victim.folder.name}",
        "dataset": victim.data.name,
        "model": victim.spec.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": json_ready(
            {
                "target": str(target),
                "method": name,
                "classes": None if classes is None else list(classes),
                "options": dict(options or {}),
                "seed": seed,
            }
        ),
        "model_inversion": json_ready(section),
        "notes": [
            f"The evaluator ({evaluator.get('architecture')}, seed {evaluator.get('seed')}) was "
            f"trained on the {evaluator.get('rows')} test rows of {victim.data.name}, which the "
            "target never trained on; the class means are taken over the same rows. It labels "
            "the target's own training rows correctly "
            f"{float(evaluator.get('accuracy_on_target_train_rows') or float('nan')):.1%} of "
            "the time.",
        ],
    }
    payload["seconds"] = time.perf_counter() - start
    if out is not None:
        from privacylab.report.html import write_report

        write_report(out, payload, png)
    return payload
