"""The gradient-inversion job, `privacylab attack gradients`: a federated client's training
examples recovered from the update it sends, under the update defences of Zhu et al. 2019
("Deep Leakage from Gradients", Sec. 5: Gaussian/Laplace noise, pruning, half precision) and
the others of issue 14 (int8, DP-SGD inside the client, more local steps, larger batches,
secure aggregation over several clients).

What each party holds (Zhu et al. 2019, Alg. 1; Geiping et al. 2020, Sec. 3; the server is
honest-but-curious):
- each client: B rows of the dataset's training part and the parameters the server sent; it
  trains locally (`LocalTraining`: FedSGD sends one gradient, FedAvg `local_steps` epochs of SGD
  and sends w_0 - w_T) and applies its update defence before sending;
- the server (the attacker): the model it sent, every update it observed (or, with secure
  aggregation over k > 1 clients, only their example-weighted mean, Bonawitz et al. 2017), the
  clients' local procedure and, when `labels_known`, their labels: a `Target` at `updates`
  access and a `GradientTask`, narrowed to the side information the attack declares;
- the evaluator: the rows behind the update (`GradientTruth`), shown to nobody, used only by
  `run_reconstruction` to score the reconstruction in [0, 1] pixel space.

The model is DLG's sigmoid LeNet with U(-0.5, 0.5) weights freshly drawn from the seed (Zhu et
al. 2019's setting, `lenet-sigmoid`), a small ReLU MLP (`mlp`), the ReLU CNN of Papernot et al.
2021 (`cnn`, 14x14 inputs or larger), or a model privacylab saved (`target`). A grid of runs
(`defense_grid`, several defences or settings) writes each finished run to the result store,
keyed by its settings, so a killed grid resumes and a second run is served from the store.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.attacks.inversion import (
    GradientAttack,
    GradientTask,
    GradientTruth,
    InversionError,
    ReconstructionResult,
    inversion_class,
    inversion_names,
    run_reconstruction,
)
from privacylab.data import Dataset, load_dataset
from privacylab.data.dataset import train_test_indices
from privacylab.execution import ResultStore, config_key
from privacylab.federated import ClientDefense, LocalTraining, observe
from privacylab.federated.protocol import whole_number
from privacylab.models import build_model, load_model
from privacylab.report.jsonable import json_ready
from privacylab.target import Target

__all__ = [
    "DATASETS",
    "MODELS",
    "RECONSTRUCTIONS",
    "GradientCase",
    "GradientConfig",
    "attack_gradients",
    "defense_configs",
    "defense_grid",
    "prepare",
    "result_row",
    "run_gradients",
]

DATASETS = ("digits", "mnist5k")
"""Datasets a fresh model is attacked on (a saved `target` brings its own)."""

MODELS = ("lenet-sigmoid", "mlp", "cnn")
"""Models built fresh from the seed: DLG's sigmoid LeNet, a small ReLU MLP, the ReLU CNN."""

MLP_WIDTHS: dict[str, tuple[int, ...]] = {"digits": (32,), "mnist5k": (128,)}
"""Hidden widths of the `mlp` model per dataset (one hidden ReLU layer)."""

CNN_MIN_SIDE = 14
"""Smallest image side the `cnn` model takes."""

RECONSTRUCTIONS = "gradient-reconstructions"
"""Result-store namespace of one finished run."""

STORE_VERSION = 1
"""Part of every store key: bump when a stored row's meaning changes."""

MAX_CLIENTS = 1024
"""Most clients one simulated round may have."""

PIXEL_DIGITS = 5
"""Decimals kept of the stored pixels (for pictures only; the scores are computed before)."""

Progress = Callable[[str, float, float], None]


@dataclass
class GradientConfig:
    """Everything `privacylab attack gradients` varies.

    `dataset`: "digits" or "mnist5k" (None: digits; with `target`, the saved model's dataset).
    `model`: "lenet-sigmoid", "mlp" or "cnn" (None: lenet-sigmoid; ignored with `target`).
    `method`: a registered gradient attack (`inversion_names("gradients")`). `batch_size`: the
    B rows each client holds. `examples`: indices into the dataset's training part (the
    canonical cut, `train_test_indices` with seed 0 for digits, which has none; a saved
    target's own training cut), B per client in client order (None: B * `clients` seeded
    random rows). `local_steps`: 1 is FedSGD
    (one gradient); S > 1 is FedAvg with S local epochs over the client's rows in local batches
    of `local_batch_size` (None: all B rows in one batch) with step `local_lr`. `defense`: the
    update defence each client applies (`noise:1e-2`, `prune:0.2`, `fp16`, `int8`, `dp:EPS`,
    `none`). `clients`: k > 1 clients under secure aggregation, each holding B rows: the
    attacked update is the mean over k*B rows. `labels_known`: the server is given the
    clients' labels (used only by attacks that declare the side information "labels").
    `target`: a model folder saved by privacylab (None: a fresh model from `seed`, DLG's
    setting). `options`: the attack's constructor options. `seed` seeds the model, the rows,
    the defence's randomness and the attack's dummy data.
    """

    dataset: str | None = None
    model: str | None = None
    method: str = "dlg"
    batch_size: int = 1
    examples: tuple[int, ...] | None = None
    local_steps: int = 1
    local_batch_size: int | None = None
    local_lr: float = 0.1
    defense: str = "none"
    clients: int = 1
    labels_known: bool = True
    target: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    device: str = "cpu"
    root: str | None = None

    def dataset_name(self) -> str:
        """The dataset of a fresh model (digits unless given)."""
        return self.dataset or "digits"

    def model_name(self) -> str:
        """The model of a fresh run (lenet-sigmoid unless given)."""
        return self.model or "lenet-sigmoid"

    def training(self) -> LocalTraining:
        """The clients' local procedure: FedSGD for one step on one local batch, else FedAvg."""
        if self.local_steps == 1 and self.local_batch_size is None:
            return LocalTraining()
        return LocalTraining(
            "fedavg", epochs=self.local_steps, batch_size=self.local_batch_size, lr=self.local_lr
        )

    def attack_class(self) -> type[GradientAttack]:
        """The registered gradient attack `method`, or InversionError naming the choices. On
        a FedAvg update an attack that does not declare the side information
        "local-training" is replaced by its registered `<method>-fedavg` variant when there is
        one (`dlg` -> `dlg-fedavg`): the server knows the clients' procedure here."""
        name = str(self.method).strip()
        if not name:
            raise InversionError(
                f"no method given; choose from {', '.join(inversion_names('gradients'))}"
            )
        cls = inversion_class(name, "gradients")
        multi_step = self.local_steps != 1 or self.local_batch_size is not None
        if multi_step and "local-training" not in cls.threat_model.side_information:
            variant = f"{cls.name}-fedavg"
            if variant in inversion_names("gradients"):
                cls = inversion_class(variant, "gradients")
        assert issubclass(cls, GradientAttack)
        return cls

    def attack(self) -> GradientAttack:
        """A fresh instance of the attack with `options` (InversionError for a bad option)."""
        cls = self.attack_class()
        if not isinstance(self.options, Mapping):
            raise InversionError('attack options must be a JSON object, e.g. {"iterations": 20}')
        try:
            return cls(**dict(self.options))
        except TypeError as error:
            raise InversionError(f"{cls.name}: bad options: {error}") from None

    def client_defense(self) -> ClientDefense | None:
        """The parsed update defence (None for `none`), or a one-line DefenseError."""
        from privacylab.defenses.update import parse_update_defense

        return parse_update_defense(str(self.defense).strip() or "none")

    def validate(self) -> GradientConfig:
        """One-line errors for the first bad option, before any data is loaded."""
        if self.target is None:
            if self.dataset_name() not in DATASETS:
                raise InversionError(
                    f"unknown dataset {self.dataset_name()!r}; choose one of {', '.join(DATASETS)}"
                )
            if self.model_name() not in MODELS:
                raise InversionError(
                    f"unknown model {self.model_name()!r}; choose one of {', '.join(MODELS)}"
                )
        whole_number("batch size", self.batch_size)
        whole_number("local steps", self.local_steps)
        if whole_number("clients", self.clients) > MAX_CLIENTS:
            raise InversionError(f"clients must be at most {MAX_CLIENTS:,}, got {self.clients}")
        whole_number("seed", self.seed, 0)
        if self.local_batch_size is not None:
            whole_number("local batch size", self.local_batch_size)
        lr = self.local_lr
        if (
            isinstance(lr, bool)
            or not isinstance(lr, (int, float))
            or not math.isfinite(lr)
            or lr <= 0
        ):
            raise InversionError(f"local lr must be a finite number > 0, got {lr!r}")
        if self.examples is not None:
            for i in self.examples:
                whole_number("an example index", i, 0)
            if len(self.examples) != self.batch_size * self.clients:
                raise InversionError(
                    f"--examples names {len(self.examples)} rows but {self.clients} client(s) "
                    f"of batch size {self.batch_size} hold {self.batch_size * self.clients}"
                )
            if len(set(self.examples)) != len(self.examples):
                raise InversionError("--examples names a row twice")
        self.training()
        self.attack()
        self.client_defense()
        return self


@dataclass(eq=False)
class GradientCase:
    """One attack, set up: the client rows, the server's `target` and `task`, the
    evaluator's `truth`, the defence and the facts a result row records."""

    config: GradientConfig
    target: Target
    task: GradientTask
    truth: GradientTruth
    defense: ClientDefense | None
    facts: dict[str, Any]


def _fresh_model(config: GradientConfig, data: Dataset) -> tuple[nn.Module, dict[str, Any]]:
    name = config.model_name()
    shape = tuple(data.input_shape)
    if name == "lenet-sigmoid":
        arch, options = "lenet", {"activation": "sigmoid", "init": "uniform"}
    elif name == "mlp":
        widths = MLP_WIDTHS.get(data.name, (128,))
        arch, options = "mlp", {"widths": list(widths), "activation": "relu"}
    else:
        if len(shape) != 3 or min(shape[1:]) < CNN_MIN_SIDE:
            raise InversionError(
                f"model cnn needs images of at least {CNN_MIN_SIDE}x{CNN_MIN_SIDE} pixels but "
                f"{data.name} has {'x'.join(str(s) for s in shape[1:])}; use --dataset mnist5k "
                "or --model lenet-sigmoid"
            )
        arch, options = "cnn", {"activation": "relu"}
    model = build_model(arch, shape, data.num_classes, seed=config.seed, **options)
    return model, {"name": arch, **options}


@dataclass(eq=False)
class _Source:
    """The data, the model (unset until built) and the facts identifying them."""

    data: Dataset
    train_rows: np.ndarray
    model_facts: dict[str, Any]
    model: nn.Module | None = None
    digest: str | None = None


def _source(config: GradientConfig, build: bool) -> _Source:
    """The dataset, its training part and (when `build`) the model of `config`."""
    if config.target is not None:
        return _saved(config)
    data = load_dataset(config.dataset_name(), config.root)
    train_rows, _ = train_test_indices(data, seed=0)
    model, facts = _fresh_model(config, data) if build else (None, {})
    return _Source(data, train_rows, facts, model)


def _saved(config: GradientConfig) -> _Source:
    """The model saved at `config.target` (safetensors + JSON sidecar, `load_model`), its
    dataset (the sidecar's `metadata.data.name`) and the training part it was trained on (cut
    with its own training seed), identified by the sidecar's digest (it holds the weights'
    sha256)."""
    path = Path(str(config.target)).expanduser()
    if not path.is_dir():
        raise InversionError(f"--target {config.target} is not a model folder")
    model, spec, meta = load_model(path, device=config.device)
    info = meta.get("data")
    if not isinstance(info, dict) or not isinstance(info.get("name"), str):
        raise InversionError(f"{path}: the sidecar's metadata.data.name is not a dataset name")
    if config.dataset is not None and config.dataset != info["name"]:
        raise InversionError(
            f"--target {config.target} was trained on {info['name']}, not {config.dataset}"
        )
    data = load_dataset(info["name"], config.root)
    if data.kind != "image" or tuple(data.input_shape) != tuple(spec.input_shape):
        raise InversionError(
            f"{path}: the model takes inputs of shape {tuple(spec.input_shape)}; gradient "
            f"inversion needs it to be the image shape of its dataset {data.name}"
        )
    training = meta.get("training")
    seed = training.get("seed", 0) if isinstance(training, dict) else 0
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InversionError(f"{path}: the sidecar's training.seed is not a whole number")
    train_rows, _ = train_test_indices(data, seed=seed)
    digest = hashlib.sha256((path / "model.json").read_bytes()).hexdigest()
    facts = {"name": spec.name, **dict(spec.options)}
    return _Source(data, train_rows, facts, model, digest)


def _examples(config: GradientConfig, n_train: int, dataset: str) -> tuple[int, ...]:
    """The training-part indices behind the update: `config.examples`, or B * k seeded rows."""
    needed = config.batch_size * config.clients
    if needed > n_train:
        raise InversionError(
            f"batch size {config.batch_size} x {config.clients} client(s) needs {needed} rows but "
            f"the training part of {dataset} has {n_train}"
        )
    if config.examples is None:
        rng = np.random.default_rng(config.seed)
        return tuple(int(i) for i in rng.choice(n_train, size=needed, replace=False))
    bad = [i for i in config.examples if not 0 <= i < n_train]
    if bad:
        raise InversionError(
            f"example {bad[0]} is out of range: the training part of {dataset} has rows "
            f"0..{n_train - 1}"
        )
    return tuple(int(i) for i in config.examples)


def prepare(config: GradientConfig) -> GradientCase:
    """Set up one attack: rows, model, the observed update (each client applies the
    defence; secure aggregation over k > 1 clients), the server's `Target` and `GradientTask`
    and the evaluator's `GradientTruth`. One-line errors for bad input."""
    config.validate()
    defense = config.client_defense()
    source = _source(config, build=True)
    data = source.data
    examples = _examples(config, len(source.train_rows), data.name)
    rows = torch.as_tensor(source.train_rows[list(examples)], dtype=torch.long)
    x, y = data.features[rows], data.labels[rows]
    model = source.model
    assert model is not None
    device = torch.device(config.device)
    model = model.to(device)
    training = config.training()
    observed = observe(
        model,
        x.to(device),
        y.to(device),
        training=training,
        defense=defense,
        clients=config.clients,
        secure_aggregation=config.clients > 1,
        seed=config.seed,
    )
    target = Target(model, "updates", data.num_classes, device=device, updates=observed)
    task = GradientTask(
        input_shape=tuple(data.input_shape),
        num_classes=data.num_classes,
        update=0,
        bounds=(0.0, 1.0),
        labels=y.to(device) if config.labels_known else None,
        local_training=training,
        seed=config.seed,
    )
    truth = GradientTruth(x.clone(), y.clone())
    facts = {
        "dataset": data.name,
        "model": config.model_name() if config.target is None else source.model_facts["name"],
        "architecture": source.model_facts.get("name"),
        "model_options": {k: v for k, v in source.model_facts.items() if k != "name"},
        "target": config.target,
        "examples": list(examples),
        "dataset_rows": [int(r) for r in rows],
        "clients": config.clients,
        "client_batch_size": config.batch_size,
        "secure_aggregation": config.clients > 1,
        "update_examples": int(x.shape[0]),
        "local_steps": config.local_steps,
        "local_batch_size": config.local_batch_size,
        "local_lr": config.local_lr if training.algorithm == "fedavg" else None,
        "training": training.to_dict(),
        "labels_known": bool(config.labels_known),
        "options": dict(config.options),
        "seed": config.seed,
        "input_shape": list(data.input_shape),
        "num_classes": data.num_classes,
        "bounds": [0.0, 1.0],
        "parameters": int(sum(p.numel() for p in model.parameters())),
    }
    return GradientCase(config, target, task, truth, defense, facts)


def _preflight(case: GradientCase) -> None:
    """The attack's refusal of the model, before any attack of a grid runs: an attack that
    differentiates through second derivatives refuses a piecewise-linear model (the check of
    `GradientAttack.run`, with its wording)."""
    case.config.attack_class().check_model(case.target.model)


def _spec(defense: ClientDefense | None) -> str:
    return "none" if defense is None else str(defense.spec)


def attack_gradients(config: GradientConfig) -> ReconstructionResult:
    """Run `config.method` on the update its clients send and score the reconstruction
    (`run_reconstruction`); `defense` of the result is the defence's spec ("none" if none)."""
    return _attack(prepare(config))


def _attack(case: GradientCase) -> ReconstructionResult:
    attack = case.config.attack()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.config.seed)
        result = run_reconstruction(attack, case.target, case.task, case.truth)
    result.defense = _spec(case.defense)
    return result


def _pixels(x: torch.Tensor | None) -> list[float]:
    if x is None:
        return []
    flat = x.detach().cpu().double().reshape(-1).numpy()
    return [round(float(v), PIXEL_DIGITS) for v in flat]


def result_row(case: GradientCase, result: ReconstructionResult) -> dict[str, Any]:
    """One run as a JSON-ready row: `ReconstructionResult.to_dict()` (the issue's keys at the
    top level), the setting's facts (dataset, model, examples, local_steps, clients, ...) and,
    under `images`, the true and reconstructed pixels (the reconstruction in the attack's
    order; `order` pairs them) with both label sets, for the report's pictures."""
    row = {**result.to_dict(), **case.facts}
    if case.defense is not None and hasattr(case.defense, "to_dict"):
        row["defense_facts"] = case.defense.to_dict()  # type: ignore[attr-defined]
    images = {
        "shape": [int(s) for s in (result.truth.shape if result.truth is not None else ())],
        "truth": _pixels(result.truth),
        "reconstruction": _pixels(result.x),
        "labels": None if result.labels is None else [int(v) for v in result.labels],
        "true_labels": None if result.true_labels is None else [int(v) for v in result.true_labels],
    }
    return json_ready({**row, "images": images})


def _key_facts(config: GradientConfig, examples: Sequence[int], digest: str | None) -> str:
    return config_key(
        {
            "version": STORE_VERSION,
            "dataset": config.dataset_name() if config.target is None else None,
            "model": config.model_name() if config.target is None else None,
            "target": digest,
            "method": str(config.attack_class().name),
            "batch_size": config.batch_size,
            "examples": list(examples),
            "training": config.training().to_dict(),
            "defense": _spec(config.client_defense()),
            "clients": config.clients,
            "labels_known": bool(config.labels_known),
            "options": json_ready(dict(config.options)),
            "seed": config.seed,
        }
    )


def store_key(config: GradientConfig) -> str:
    """The result-store key of `config`: its settings with the rows resolved (the saved
    model's digest for a `target`), so equal runs share one key however they were spelled."""
    config.validate()
    source = _source(config, build=False)
    examples = _examples(config, len(source.train_rows), source.data.name)
    return _key_facts(config, examples, source.digest)


def defense_configs(base: GradientConfig, defenses: Sequence[str]) -> list[GradientConfig]:
    """`base` once per update defence spec (the grid over defences and strengths)."""
    return [replace(base, defense=str(d).strip()) for d in defenses]


def defense_grid(
    configs: Sequence[GradientConfig],
    store: str | Path | None = None,
    *,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Run every config (one `result_row` each, in order). With `store` (a SQLite file),
    each finished row is written there as it finishes and a config already stored is served
    from it (`from_store`), so a killed grid resumes where it stopped. Every config is
    checked before the first runs; `progress` hears of a run when it finishes (and when the
    next starts), so an attack that refuses its first update leaves only its one-line error."""
    for config in configs:
        config.validate()
    keys = [store_key(c) for c in configs]
    handle = None
    if store is not None:
        path = Path(store).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = ResultStore(path)
    rows: list[dict[str, Any]] = []
    try:
        stored = [handle.get(RECONSTRUCTIONS, k) if handle is not None else None for k in keys]
        cases = {i: prepare(c) for i, c in enumerate(configs) if stored[i] is None}
        for case in cases.values():
            _preflight(case)
        computed = 0
        for i, (config, key) in enumerate(zip(configs, keys, strict=True)):
            stage = f"gradients: attack {config.method} ({config.defense or 'none'})"
            found = stored[i]
            if found is not None:
                rows.append({**found, "from_store": True})
                if progress:
                    progress(f"{stage} from the store", i + 1, len(configs))
                continue
            if progress and computed:
                progress(stage, i, len(configs))
            case = cases.pop(i)
            row = result_row(case, _attack(case))
            if handle is not None:
                handle.put(RECONSTRUCTIONS, key, row)
            rows.append({**row, "from_store": False})
            computed += 1
            if progress:
                progress(stage, i + 1, len(configs))
    finally:
        if handle is not None:
            handle.close()
    return rows


def _notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    notes = [
        "Scores are in [0, 1] pixel space after matching each reconstruction to a true image "
        "(Hungarian assignment on MSE); the dummy-initialisation baseline is the PSNR of the "
        "attack's starting point, what an attacker who learned nothing from the update gets.",
    ]
    if any(r.get("secure_aggregation") for r in rows):
        notes.append(
            "With secure aggregation the server sees only the mean update of all clients of the "
            "round; the attack reconstructs all of their rows at once."
        )
    if any(r.get("labels_known") for r in rows):
        notes.append(
            "The server was offered the clients' labels; only attacks that declare the side "
            "information 'labels' used them (the others recovered labels themselves)."
        )
    return notes


def run_gradients(
    configs: Sequence[GradientConfig],
    *,
    out: str | Path | None = None,
    store: str | Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """`privacylab attack gradients`: the payload (`reconstruction.runs` holds one row per
    config); with `out`, `out/results.json`, the pictures and `out/index.html` (the report's
    gradient-inversion section) are written too."""
    if not configs:
        raise InversionError("no run to do: give at least one configuration")
    start = time.perf_counter()
    rows = defense_grid(configs, store, progress=progress)
    first = rows[0]
    methods = sorted({str(r.get("method")) for r in rows})
    payload: dict[str, Any] = {
        "title": f"privacylab gradient inversion: {', '.join(methods)} on {first.get('dataset')}",
        "dataset": first.get("dataset"),
        "model": first.get("model"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": [json_ready(asdict(c)) for c in configs],
        "reconstruction": {"runs": rows, "images": {}},
        "notes": _notes(rows),
    }
    payload["seconds"] = time.perf_counter() - start
    if out is not None:
        from privacylab.report.html import write_report
        from privacylab.report.reconstruction import reconstruction_images

        names, images = reconstruction_images(rows)
        payload["reconstruction"]["images"] = names
        write_report(out, payload, images)
    return payload
