"""The property-inference job, `privacylab attack property`: train shadow models and
evaluation targets in two worlds, durably, then run the registered property-inference attacks
(`privacylab.attacks.inversion.property`, Ganju et al. 2018) and measure them.

Who holds what (Ganju et al. 2018, Sec. 3):
- the dataset's rows are split once, by the seed, into two disjoint halves
  (`split_pools`): the attacker's pool and the pool the targets' owners draw from, so no
  shadow shares a training row with a target;
- the attacker: its pool, the architecture and the training recipe (Kerckhoffs), the
  property, and `shadows` shadow models per world it trains on sets drawn from its pool;
- the evaluator: `targets` models (half per world) trained the same way on sets drawn from
  the owners' pool, and their true worlds, shown to no attack.

Every model is trained by the membership attacks' reference worker
(`privacylab.attacks.membership.references.train_one`: the project's trainer, per-epoch
checkpoints, safetensors with a JSON sidecar, nothing pickled) in `CACHE/models/KEY/` and
recorded in the result store `CACHE/store.sqlite` the moment it finishes (`durable_map`): a
second run loads them, and a killed run trains only the missing ones. The meta-classifiers
are fitted afresh on every run (seconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.attacks.inversion import (
    InversionError,
    inversion_class,
    inversion_names,
    make_inversion,
)
from privacylab.attacks.inversion.property import (
    Property,
    PropertyAttack,
    PropertyTask,
    dense_layers,
    draw_training_sets,
    parse_property,
    run_property_inference,
    shadow_positions,
    split_pools,
)
from privacylab.attacks.membership.references import Recipe, train_one
from privacylab.data import Dataset, load_dataset
from privacylab.execution import (
    ResultStore,
    SerialExecutor,
    config_key,
    durable_map,
    make_executor,
    progress_counter,
)
from privacylab.models import ModelSpec, load_model
from privacylab.target import Access, Target
from privacylab.training import TrainConfig

__all__ = [
    "NAMESPACE",
    "PropertyConfig",
    "PropertyModels",
    "cache_folder",
    "default_train_size",
    "property_models",
    "run_property",
]

NAMESPACE = "property-models"
"""Result-store namespace of one trained shadow or evaluation model."""

STORE_VERSION = 1
"""Part of every store key: bump when a stored model's meaning changes."""

MAX_MODELS = 10_000
"""Largest number of shadows per world or of evaluation targets accepted."""

Progress = Callable[[str, float, float], None]


@dataclass
class PropertyConfig:
    """Everything `privacylab attack property` varies.

    `dataset`: a registered dataset. `property`: a property spec (`class-share:C:LOW:HIGH`,
    `row-parity`). `methods`: property-inference attacks (`property-whitebox`,
    `property-blackbox`). `shadows`: shadow models per world. `targets`: evaluation targets,
    half per world (even). `model`, `model_options`: the architecture. `train_size`: rows per
    training set (None: the largest of at most 200 both pools supply in both worlds).
    `epochs`, `batch_size`, `lr`, `optimizer`: the training recipe every model follows.
    `queries`: the black-box query set's size. `attack_options`: constructor options per
    method. `seed` seeds the pool split, the draws, the models and the attacks."""

    dataset: str = "digits"
    property: str = "class-share:0:0.1:0.5"
    methods: tuple[str, ...] = ("property-whitebox",)
    shadows: int = 8
    targets: int = 6
    model: str = "mlp"
    model_options: dict[str, Any] = field(default_factory=lambda: {"widths": [16]})
    train_size: int | None = None
    epochs: int = 10
    batch_size: int = 32
    lr: float = 0.05
    optimizer: str = "momentum"
    queries: int = 64
    attack_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed: int = 0
    root: str | None = None
    device: str = "cpu"

    def training(self) -> dict[str, Any]:
        """The recipe as `TrainConfig` fields (validated)."""
        recipe = {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "optimizer": self.optimizer,
        }
        TrainConfig.from_dict(recipe).validate()
        return recipe

    def chosen_methods(self) -> list[str]:
        """The methods, each once, canonical names; InversionError for an unknown one or one
        of another kind."""
        names = [str(m).strip() for m in self.methods if str(m).strip()]
        if not names:
            raise InversionError(
                f"no method given; choose from {', '.join(inversion_names('property'))}"
            )
        out: list[str] = []
        for name in names:
            canonical = inversion_class(name, "property").name
            if canonical not in out:
                out.append(canonical)
        return out

    def attack(self, name: str) -> PropertyAttack:
        """A fresh instance of attack `name` with its options, seeded by `seed`."""
        options = {"seed": self.seed, **dict(self.attack_options.get(name, {}))}
        try:
            attack = make_inversion(name, "property", **options)
        except TypeError as error:
            raise InversionError(f"{name}: bad options: {error}") from None
        assert isinstance(attack, PropertyAttack)
        return attack

    def validate(self) -> PropertyConfig:
        """One-line errors for the first bad option, before anything is trained."""
        for name, value, low in (
            ("shadows", self.shadows, 1),
            ("targets", self.targets, 2),
            ("queries", self.queries, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InversionError(f"--{name} must be a whole number, got {value!r}")
            if not low <= value <= MAX_MODELS:
                raise InversionError(
                    f"--{name} must be a whole number in [{low}, {MAX_MODELS:,}], got {value}"
                )
        if self.targets % 2:
            raise InversionError(f"--targets must be even (half per world), got {self.targets}")
        if self.train_size is not None and (
            isinstance(self.train_size, bool)
            or not isinstance(self.train_size, int)
            or self.train_size < 1
        ):
            raise InversionError(
                f"--train-size must be a whole number >= 1, got {self.train_size!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InversionError(f"--seed must be a whole number >= 0, got {self.seed!r}")
        parse_property(self.property)
        self.training()
        methods = self.chosen_methods()
        for name in methods:
            self.attack(name)
        for name in self.attack_options:
            if inversion_class(name, "property").name not in methods:
                raise InversionError(f"options given for {name}, which is not run")
        return self


def _fits(prop: Property, labels: np.ndarray, size: int) -> bool:
    try:
        for world in (0, 1):
            prop.draw(labels, size, world, np.random.default_rng(0))
    except InversionError:
        return False
    return True


def default_train_size(
    prop: Property, pools: Sequence[np.ndarray], labels: np.ndarray, cap: int = 200
) -> int:
    """The largest training-set size <= `cap` (a multiple of 10 when above 10) that every
    pool (dataset rows) supplies in both worlds; InversionError when none does."""
    sizes = [*range(cap - cap % 10, 10, -10), *range(min(cap, 10), 0, -1)]
    for size in sizes:
        if all(_fits(prop, labels[p], size) for p in pools):
            return size
    raise InversionError(f"{prop.spec}: the pools are too small for any training set")


@dataclass(eq=False)
class PropertyModels:
    """The trained models of one configuration: the attacker's task (shadows inside), the
    evaluation targets and their worlds, every model's record, and how many were loaded from
    the store."""

    task: PropertyTask
    targets: list[nn.Module]
    worlds: list[int]
    records: list[dict[str, Any]]
    from_store: int
    spec: ModelSpec
    data: Dataset
    attacker_rows: np.ndarray
    owner_rows: np.ndarray

    def facts(self) -> dict[str, Any]:
        """JSON-ready facts for the result and the report."""
        out: dict[str, Any] = {
            "dataset": self.data.name,
            "model": self.spec.name,
            "model_options": dict(self.spec.options),
            "parameters": int(sum(p.numel() for p in self.targets[0].parameters())),
            "property": self.task.prop.spec,
            "description": self.task.prop.description,
            "shadows_per_world": self.task.shadows,
            "targets": len(self.targets),
            "train_size": self.task.train_size,
            "attacker_pool": len(self.attacker_rows),
            "owner_pool": len(self.owner_rows),
            "models_trained": len(self.records) - self.from_store,
            "models_from_store": self.from_store,
        }
        for role in ("shadow", "target"):
            rows = [r for r in self.records if r["role"] == role]
            accuracies = [r["train_accuracy"] for r in rows if r["train_accuracy"] is not None]
            if accuracies:
                out[f"{role}_train_accuracy"] = float(np.mean(accuracies))
            for world in (0, 1):
                shares = [
                    r["share"] for r in rows if r["world"] == world and r["share"] is not None
                ]
                if shares:
                    out[f"{role}_share_world{world}"] = float(np.mean(shares))
        return out


def property_models(
    config: PropertyConfig,
    cache: str | Path,
    *,
    progress: Progress | None = None,
    workers: int = 1,
) -> PropertyModels:
    """Train (or load from the store in `cache`) the shadows and evaluation targets of
    `config`; each model is stored as it finishes. Every bad option is refused before the
    first model is trained."""
    config.validate()
    methods = config.chosen_methods()
    prop = parse_property(config.property)
    data = load_dataset(config.dataset, config.root)
    spec = ModelSpec(config.model, data.input_shape, data.num_classes, config.model_options)
    if "property-whitebox" in methods:
        dense_layers(spec.build(seed=0))
    labels = data.labels.numpy()
    prop.check(data.num_classes)
    attacker, owner = split_pools(len(labels), config.seed)
    shadow_rows = attacker[shadow_positions(len(attacker), config.queries, config.seed)]
    size = config.train_size or default_train_size(prop, [shadow_rows, owner], labels)
    training = config.training()
    task = PropertyTask(
        data.features[torch.as_tensor(attacker)],
        data.labels[torch.as_tensor(attacker)],
        spec,
        training,
        prop,
        shadows=config.shadows,
        train_size=size,
        queries=config.queries,
        seed=config.seed,
        device=config.device,
    )
    units = [("shadow", w, i, attacker[pos], seed) for w, i, pos, seed in task.plan()]
    units += [
        ("target", w, i, owner[pos], seed)
        for w, i, pos, seed in draw_training_sets(
            prop, labels[owner], size, config.targets // 2, config.seed, 1
        )
    ]
    folder = Path(cache).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    recipe = Recipe(
        config.dataset,
        config.model,
        {**training, "device": config.device},
        dict(spec.options),
        config.root,
    ).to_dict()
    jobs: dict[str, dict[str, Any]] = {}
    roles: dict[str, dict[str, Any]] = {}
    for role, world, index, rows, seed in units:
        indices = [int(r) for r in rows]
        identity = {
            "version": STORE_VERSION,
            "dataset": data.name,
            "root": config.root,
            "spec": spec.to_dict(),
            "training": training,
            "property": prop.spec,
            "role": role,
            "world": world,
            "seed": seed,
            "rows": config_key({"rows": indices}),
        }
        key = config_key(identity)
        jobs[key] = {
            "recipe": recipe,
            "indices": indices,
            "seed": seed,
            "folder": str(folder / "models" / key[:24]),
        }
        roles[key] = {
            "role": role,
            "world": world,
            "index": index,
            "share": prop.share(labels[rows]),
        }
    executor = SerialExecutor() if workers <= 1 else make_executor("local", workers)
    cached = [0]
    tick = progress_counter(progress, "property: train models", len(jobs))

    def on_done(key: str, value: dict[str, Any], from_store: bool) -> None:
        cached[0] += int(from_store)
        tick(key, value, from_store)

    with ResultStore(folder / "store.sqlite") as store:
        done = durable_map(train_one, jobs, store, NAMESPACE, executor, on_done=on_done)
    records = [{**done[key], **roles[key]} for key in jobs]
    shadows = [r for r in records if r["role"] == "shadow"]
    targets = [r for r in records if r["role"] == "target"]
    task.shadow_models = [load_model(r["folder"], device=config.device)[0] for r in shadows]
    task.shadow_worlds = [int(r["world"]) for r in shadows]
    models = [load_model(r["folder"], device=config.device)[0] for r in targets]
    return PropertyModels(
        task=task,
        targets=models,
        worlds=[int(r["world"]) for r in targets],
        records=records,
        from_store=cached[0],
        spec=spec,
        data=data,
        attacker_rows=attacker,
        owner_rows=owner,
    )


def cache_folder(cache: str | Path | None, out: str | Path | None) -> Path:
    """Where the models are stored: `cache`, else `out/property-cache`, else
    `./property-cache`."""
    if cache is not None:
        return Path(cache)
    return Path(out) / "property-cache" if out is not None else Path("property-cache")


def run_property(
    dataset: str = "digits",
    property: str = "class-share:0:0.1:0.5",
    method: str | Sequence[str] = "property-whitebox",
    shadows: int = 8,
    targets: int = 6,
    model: str = "mlp",
    *,
    model_options: dict[str, Any] | None = None,
    train_size: int | None = None,
    epochs: int = 10,
    batch_size: int = 32,
    lr: float = 0.05,
    optimizer: str = "momentum",
    queries: int = 64,
    attack_options: dict[str, dict[str, Any]] | None = None,
    seed: int = 0,
    root: str | None = None,
    device: str = "cpu",
    cache: str | Path | None = None,
    out: str | Path | None = None,
    progress: Progress | None = None,
    workers: int = 1,
) -> dict[str, Any]:
    """`privacylab attack property`: train (durably, in `cache`; default `out/property-cache`,
    else `./property-cache`) `shadows` shadow models per world and `targets` evaluation
    targets, run each method (comma-separated, or a sequence) and return the payload:
    `property_inference` holds the facts and one `PropertyResult.to_dict()` per method
    (`attacks`). With `out`, `out/results.json` and `out/index.html` (the report's
    property-inference section and its score figure) are written too."""
    start = time.perf_counter()
    methods = tuple(method.split(",")) if isinstance(method, str) else tuple(method)
    config = PropertyConfig(
        dataset=dataset,
        property=property,
        methods=methods,
        shadows=shadows,
        targets=targets,
        model=model,
        model_options=dict(model_options) if model_options is not None else {"widths": [16]},
        train_size=train_size,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        optimizer=optimizer,
        queries=queries,
        attack_options=dict(attack_options or {}),
        seed=seed,
        root=root,
        device=device,
    ).validate()
    trained = property_models(config, cache_folder(cache, out), progress=progress, workers=workers)
    rows = []
    for name in config.chosen_methods():
        if progress:
            progress(f"property: attack {name}", 0, 1)
        targets_ = [
            Target(m, Access.WHITEBOX, trained.spec.num_classes, device=device)
            for m in trained.targets
        ]
        result = run_property_inference(config.attack(name), targets_, trained.worlds, trained.task)
        rows.append(result.to_dict())
        if progress:
            progress(f"property: attack {name}", 1, 1)
    facts = trained.facts()
    section = {**facts, "attacks": rows, "images": {"scores": "property_scores.png"}}
    payload: dict[str, Any] = {
        "title": f"privacylab property inference: {facts['property']} on {facts['dataset']}",
        "dataset": facts["dataset"],
        "model": facts["model"],
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": asdict(config),
        "property_inference": section,
        "notes": [
            f"The attacker trains {config.shadows} shadow models per world on sets of "
            f"{facts['train_size']} rows drawn from its pool ({facts['attacker_pool']} rows); "
            f"the {config.targets} evaluation targets train on sets drawn from the other "
            f"{facts['owner_pool']} rows. Property: {facts['description']}.",
        ],
    }
    payload["seconds"] = time.perf_counter() - start
    if out is not None:
        from privacylab.report.html import write_report
        from privacylab.report.sections.property import property_scores_figure

        write_report(out, payload, {"property_scores.png": property_scores_figure(rows)})
    return payload
