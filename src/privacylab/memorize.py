"""The memorization job: `privacylab attack memorization` (issue 18).

Song, Ristenpart & Shmatikov, "Machine Learning Models that Remember Too Much" (CCS 2017):
the data holder trains on its own rows with training code written by an adversary, and
releases the model; the adversary decodes a chosen part of the training data from it.
`run_memorization_job(config, out)` plays that game once on an embedded dataset and writes the
folder `out`:

- the rows are split once by the seed into disjoint parts (`split_rows`): the test rows, the
  holder's training rows X, and up to `HOLDOUT` clean held-out rows (where the query anomaly
  detector's threshold is set for capacity abuse); the indices are kept in `splits.json`;
- the secret is the first `items` rows of a seeded permutation of X (`secret_rows`), images
  quantised to `pixel_bits` bits per pixel (tabular rows: their float32 bits);
- the honest model (`train_honest`) and the released model of the attack's malicious training
  (`train_encoded`: the same recipe, initialisation and seed) are trained, each checkpointed
  while it trains and saved as a model folder (safetensors + JSON sidecar) once finished, so
  a killed run resumes and a re-run reuses them; with `epsilon` both train with DP-SGD
  (Abadi et al. 2016, Alg. 1), the defence that bounds what any training code can encode;
- the decoder receives only a `Target` of the released model at the attack's declared access
  and the secret's public layout (`MemorizationTask`, key = seed), and `run_memorization`
  scores it against the truth afterwards (the training set as the candidates an item must be
  told apart from);
- the weight checks of `privacylab.defenses.memorization` (`WEIGHT_CHECKS`) run on the
  released model and, for their false-positive side, on the honest one; for `lsb` the
  re-quantised model (`requantize`) is decoded again with its accuracy; for `capacity` the
  query anomaly detector (`QueryAnomalyDetector`, fitted on X, thresholded on the held-out
  rows) scores the decoder's synthetic queries.

Folder: `config.json`, `splits.json`, `honest/` and `model/` (model folders with sidecar
metadata ``{"memorization": {"config", "method", "role"}, "summary"}``), `checkpoints/` while
training, `result.json`, and the report (`results.json`, `index.html`, PNG pictures) through
`privacylab.report.memorization.add_memorization_run`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.data import Dataset, load_dataset
from privacylab.errors import PrivacylabError
from privacylab.jobfiles import (
    config_from_dict,
    model_saved,
    positive,
    read_json,
    tick,
    trainer_summary,
    victim_recipe,
    whole,
    write_json,
)

__all__ = [
    "DEFAULTS",
    "HOLDOUT",
    "MAX_IMAGES",
    "MemorizationConfig",
    "MemorizationJobError",
    "Prepared",
    "check_memorization_config",
    "method_defaults",
    "run_memorization_job",
    "secret_rows",
    "split_rows",
]

DEFAULTS: dict[str, tuple[int, int]] = {
    "lsb": (100, 8),
    "correlation": (100, 8),
    "sign": (40, 4),
    "capacity": (4, 4),
}
"""(items, pixel bits) of each method's default secret on an image dataset (an attack class's
own `default_items` / `default_value_bits` take precedence, `method_defaults`): sized so that
the default run (mnist5k, 3,500 training and 1,000 test rows, the victim MLP, seed 0) fits the
method's capacity and takes well under a minute of CPU. Measured with `OMP_NUM_THREADS=1
privacylab attack memorization --method M --json` (CPU seconds on the shared 2-core machine;
accuracy released / honest 0.925):

- lsb: 100/100 items recovered, bit accuracy 1.000, accuracy 0.925 (unchanged); lsb-entropy
  flags it (statistic 158,807 against 188; honest 84); re-quantised (7 mantissa bits): bit
  accuracy 0.50, 0 recovered, accuracy 0.925; 33 s before the honest-plan shortcut;
- correlation (100 8-bit images, `CorrelationEncoding.default_items`; its docstring has the
  encoder's measurement on this setting: 100/100 recovered at λ_c = 1..1000): at the earlier
  default of 50 images, 45/50 recovered, bit accuracy 0.986, PSNR 81 dB, accuracy 0.942; the
  correlation and sign-pattern checks flag it, none flags the honest model; 36 s (the job's
  run at 100 images not re-measured);
- sign (4-bit pixels): 40/40 recovered, bit accuracy 0.99997, accuracy 0.939; sign-pattern
  flags it; 38 s;
- capacity (4-bit pixels, ratio 2, the one-pixel generator): 4/4 recovered, bit accuracy
  1.000 from 4,182 label queries (3.0 bits per query), accuracy 0.942; no weight check flags
  it; the query detector flags every synthetic query (FPR 0.009 on the test rows) and its
  blocking monitor refuses the decoder; 40 s (with uniform-noise inputs: bit accuracy 0.884,
  0/4 recognisable).

With the shortcut (`_encoded`) the lsb run takes 23 CPU seconds, and its released weights are
bit-identical to those `train_encoded` trains (same result.json, same safetensors).

A method not listed hides 10 8-bit images by default."""

FALLBACK_DEFAULT = (10, 8)

HOLDOUT = 300
"""Clean held-out rows kept out of training (as many as are left, up to this): where the
query anomaly detector's threshold is set."""

MAX_IMAGES = 8
"""Items drawn in the report, original beside decoded (the first ones)."""

IMAGE_DECIMALS = 4

CONFIG_FILE = "config.json"
SPLITS_FILE = "splits.json"
RESULT_FILE = "result.json"
HONEST_DIR = "honest"
MODEL_DIR = "model"
CHECKPOINTS_DIR = "checkpoints"

STAGES = {HONEST_DIR: "honest model", MODEL_DIR: "released model"}

Progress = Callable[[str, float, float], None]


class MemorizationJobError(PrivacylabError, ValueError):
    """A memorization job cannot run with this configuration or folder; one line."""


# ----------------------------------------------------------------------------- configuration


def _device(name: object) -> torch.device:
    """`name` as a torch device this machine has (cpu, cuda, cuda:N), else one line."""
    try:
        device = torch.device(name) if isinstance(name, str) and name else None
    except (RuntimeError, TypeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise MemorizationJobError(f"unknown device {name!r}; use cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise MemorizationJobError(
                f"device {name} was asked for but no CUDA device is available"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise MemorizationJobError(f"no CUDA device {device.index} on this machine")
    return device


@dataclass
class MemorizationConfig:
    """One memorization game: `dataset` (an embedded image or tabular dataset), `method` (a
    registered memorization attack), the secret's size as `bits` (None: the method's default
    item count, `DEFAULTS`; else the whole items that fit in `bits`), `pixel_bits` (bits per
    image pixel; None: the method's default; tabular rows are float32: 32), `epsilon` (None:
    non-private; else both models train with DP-SGD at (ε, `delta`)), the row counts, `seed`
    (split, secret rows, initialisation and the capacity generator's key), `device`,
    `recipe` (overrides of `VictimRecipe`'s fields) and `attack_options` (keyword options of
    the attack's constructor)."""

    dataset: str = "mnist5k"
    method: str = "lsb"
    bits: int | None = None
    pixel_bits: int | None = None
    epsilon: float | None = None
    delta: float = 1e-5
    train_size: int = 3500
    test_size: int = 1000
    seed: int = 0
    device: str = "cpu"
    recipe: dict[str, Any] | None = None
    attack_options: dict[str, Any] | None = None

    def validate(self) -> MemorizationConfig:
        """Check every field that needs no data (the method among the registered attacks,
        numbers in range, the recipe); returns self, or one MemorizationJobError line."""
        from privacylab.attacks.memorization import memorization_class, memorization_names

        names = memorization_names()
        if not isinstance(self.method, str) or self.method not in names:
            raise MemorizationJobError(
                f"unknown memorization method {self.method!r}; choose one of "
                f"{', '.join(names) or '(none installed)'}"
            )
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise MemorizationJobError(f"dataset must be a dataset name, got {self.dataset!r}")
        if self.bits is not None:
            whole(MemorizationJobError, "--bits", self.bits, 1)
        if self.pixel_bits is not None:
            whole(MemorizationJobError, "--pixel-bits", self.pixel_bits, 1)
            if self.pixel_bits > 16:
                raise MemorizationJobError(f"--pixel-bits must be in 1..16, got {self.pixel_bits}")
        if self.epsilon is not None:
            positive(MemorizationJobError, "--epsilon", self.epsilon)
            if not memorization_class(self.method).private_ok:
                raise MemorizationJobError(
                    f"{self.method} writes the weights after training; DP-SGD cannot apply to it"
                )
        delta = positive(MemorizationJobError, "--delta", self.delta)
        if not delta < 1:
            raise MemorizationJobError(f"--delta must be in (0, 1), got {self.delta!r}")
        whole(MemorizationJobError, "--train-size", self.train_size, 1)
        whole(MemorizationJobError, "--test-size", self.test_size, 1)
        whole(MemorizationJobError, "--seed", self.seed, 0)
        _device(self.device)
        if self.recipe is not None and not isinstance(self.recipe, dict):
            raise MemorizationJobError(
                f"recipe must be an object of VictimRecipe fields, got {self.recipe!r}"
            )
        if self.attack_options is not None and not isinstance(self.attack_options, dict):
            raise MemorizationJobError(
                f"attack options must be an object, got {self.attack_options!r}"
            )
        self.victim_recipe()
        return self

    def victim_recipe(self) -> Any:
        """The holder's `VictimRecipe`: the defaults, `recipe`'s overrides, at (`epsilon`,
        `delta`); its trainer configuration checked here (one line), before any work."""
        return victim_recipe(
            MemorizationJobError, self.recipe, self.epsilon, self.delta, self.seed, "holder"
        )

    def identity(self) -> dict[str, Any]:
        """The fields that decide the folder's models and numbers: all but the device, with
        the recipe written out in full."""
        data = self.to_dict()
        data.pop("device")
        data["recipe"] = self.victim_recipe().to_dict()
        data["attack_options"] = dict(self.attack_options or {})
        return data

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemorizationConfig:
        """Inverse of `to_dict`; one MemorizationJobError line on unknown keys."""
        return config_from_dict(cls, data, MemorizationJobError, "memorization")


@dataclass
class Prepared:
    """What `check_memorization_config` found: the loaded `data`, the row `parts`, the
    `attack` built with its options, the secret's `layout`, the holder's `recipe`."""

    data: Dataset
    parts: dict[str, np.ndarray]
    attack: Any
    layout: Any
    recipe: Any


def split_rows(rows: int, config: MemorizationConfig) -> dict[str, np.ndarray]:
    """Disjoint index sets of one seeded permutation of `rows`: "test" (first `test_size`),
    "train" (the holder's X, next `train_size`) and "holdout" (up to `HOLDOUT` of the rest)."""
    needed = config.train_size + config.test_size
    if needed > rows:
        raise MemorizationJobError(
            f"{config.dataset} has {rows} rows: --train-size {config.train_size} + --test-size "
            f"{config.test_size} do not fit"
        )
    order = np.random.default_rng(config.seed).permutation(rows)
    cut = config.test_size + config.train_size
    return {
        "test": order[: config.test_size],
        "train": order[config.test_size : cut],
        "holdout": order[cut : cut + HOLDOUT],
    }


def secret_rows(train_rows: int, items: int, seed: int) -> np.ndarray:
    """The secret's rows of X: the first `items` of a permutation of X seeded by `seed`."""
    if items > train_rows:
        raise MemorizationJobError(
            f"the secret's {items} items exceed the {train_rows} training rows"
        )
    return np.random.default_rng(seed).permutation(train_rows)[:items]


def _known_keywords(cls: Any, options: Mapping[str, Any], what: str) -> None:
    parameters = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(options) - set(parameters))
    if unknown:
        takes = ", ".join(n for n in parameters if n != "self") or "no options"
        raise MemorizationJobError(f"{what} takes no option {', '.join(unknown)}; it takes {takes}")


def method_defaults(method: str) -> tuple[int, int]:
    """(items, pixel bits) of `method`'s default secret: the attack class's own
    `default_items` / `default_value_bits` where it declares them, else `DEFAULTS`."""
    from privacylab.attacks.memorization import memorization_class

    items, bits = DEFAULTS.get(method, FALLBACK_DEFAULT)
    cls = memorization_class(method)
    return int(getattr(cls, "default_items", items)), int(getattr(cls, "default_value_bits", bits))


def _layout(config: MemorizationConfig, data: Dataset) -> Any:
    from privacylab.attacks.memorization import SecretLayout

    items, default_bits = method_defaults(config.method)
    if data.kind == "image":
        value_bits = config.pixel_bits if config.pixel_bits is not None else default_bits
        kind = "image"
    elif data.kind == "tabular":
        if config.pixel_bits not in (None, 32):
            raise MemorizationJobError(
                f"--pixel-bits applies to images; {config.dataset} rows are kept as float32 "
                "values (32 bits)"
            )
        value_bits, kind = 32, "tabular"
    else:
        raise MemorizationJobError(
            f"memorization hides images or tabular rows; {config.dataset} holds {data.kind} "
            "data: use mnist5k, digits or breast_cancer"
        )
    per_item = int(np.prod(data.input_shape)) * value_bits
    if config.bits is not None:
        items = config.bits // per_item
        if items < 1:
            raise MemorizationJobError(f"{config.bits} bits hold no whole item of {per_item} bits")
    items = min(items, config.train_size) if config.bits is None else items
    return SecretLayout(items, tuple(data.input_shape), value_bits, kind)


def check_memorization_config(config: MemorizationConfig) -> Prepared:
    """Validate `config` against its dataset before any training: an image or tabular
    dataset with rows for the split, the secret (`--bits`, `--pixel-bits`) of whole items
    within the training rows, the attack's options, and the secret within the attack's
    capacity on the recipe's model (`MemorizationAttack.check_capacity`: one line stating the
    capacity). Returns what the run needs (`Prepared`)."""
    from privacylab.attacks.memorization import MemorizationError, make_memorization
    from privacylab.attacks.memorization.base import memorization_class

    if not isinstance(config, MemorizationConfig):
        raise MemorizationJobError(f"a MemorizationConfig is needed, got {type(config).__name__}")
    config.validate()
    data = load_dataset(config.dataset)
    parts = split_rows(len(data), config)
    layout = _layout(config, data)
    options = dict(config.attack_options or {})
    _known_keywords(memorization_class(config.method), options, config.method)
    try:
        attack = make_memorization(config.method, **options)
    except MemorizationError as error:
        raise MemorizationJobError(str(error)) from None
    recipe = config.victim_recipe()
    try:
        model = recipe.spec(data).build(seed=config.seed)
    except PrivacylabError as error:
        raise MemorizationJobError(f"bad victim recipe: {error}") from None
    try:
        attack.check_capacity(layout, model, data.num_classes, config.train_size)
    except MemorizationError as error:
        raise MemorizationJobError(str(error)) from None
    secret_rows(config.train_size, layout.items, config.seed)
    return Prepared(data, parts, attack, layout, recipe)


# -------------------------------------------------------------------------------- files


def _claim(folder: Path, config: MemorizationConfig) -> None:
    """Write config.json, or check that the folder's own is the same game (one line if not)."""
    path = folder / CONFIG_FILE
    if path.exists():
        saved = MemorizationConfig.from_dict(read_json(path, MemorizationJobError))
        if saved.identity() != config.identity():
            other = saved.identity()
            changed = sorted(k for k, v in config.identity().items() if other.get(k) != v)
            raise MemorizationJobError(
                f"{folder} holds a memorization run with other settings ({', '.join(changed)});"
                " use another --out"
            )
    folder.mkdir(parents=True, exist_ok=True)
    write_json(path, replace(config, recipe=config.victim_recipe().to_dict()).to_dict())


def _trained(
    folder: Path,
    role: str,
    config: MemorizationConfig,
    spec: Any,
    train: Callable[[Path], tuple[nn.Module, dict[str, Any]]],
    epochs: int,
    progress: Progress | None,
) -> tuple[nn.Module, dict[str, Any]]:
    """The model saved in `folder / role` (reused), or `train(checkpoints)` now (resuming
    from `folder/checkpoints/role`) and saved there."""
    from privacylab.models import load_model, save_model

    where = folder / role
    stage = STAGES.get(role, role)
    if model_saved(where):
        model, _, meta = load_model(where, device=config.device)
        tick(progress, f"{stage} (reused)", 1, 1)
        return model.eval(), dict(meta.get("summary") or {})
    checkpoints = folder / CHECKPOINTS_DIR / role
    tick(progress, stage, 0, epochs)
    model, summary = train(checkpoints)
    kept = trainer_summary(summary)
    meta = {
        "memorization": {"config": config.to_dict(), "method": config.method, "role": role},
        "summary": kept,
    }
    save_model(model, where, spec, meta)
    shutil.rmtree(checkpoints, ignore_errors=True)
    with contextlib.suppress(OSError):
        checkpoints.parent.rmdir()
    tick(progress, stage, epochs, epochs)
    return model.eval(), kept


# ------------------------------------------------------------------------------ the checks


def _accuracy(model: nn.Module, data: Dataset) -> float:
    from privacylab.defenses.base import accuracy

    return float(accuracy(model, data))


def _check_record(result: Any) -> dict[str, Any]:
    return {"statistic": result.statistic, "threshold": result.threshold, "flagged": result.flagged}


def weight_checks(
    released: nn.Module, honest: nn.Module, train: Dataset
) -> dict[str, dict[str, Any]]:
    """Each registered weight check (`privacylab.defenses.memorization.WEIGHT_CHECKS`) on the
    released model — statistic, threshold, flagged — and, beside it, on the honest model of
    the same recipe and seed ("honest_statistic", "honest_flagged": a false positive when
    true)."""
    from privacylab.defenses.memorization import WEIGHT_CHECKS

    out: dict[str, dict[str, Any]] = {}
    for name in WEIGHT_CHECKS.names():
        check = WEIGHT_CHECKS.get(name)()
        record = _check_record(check.check(released, train))
        baseline = _check_record(check.check(honest, train))
        record["honest_statistic"] = baseline["statistic"]
        record["honest_flagged"] = baseline["flagged"]
        out[name] = record
    return out


# ------------------------------------------------------------------------------ the game


def _images(result: Any, extra: Any = None) -> dict[str, Any]:
    """The first `MAX_IMAGES` originals and decodings (and the re-quantised model's decodings),
    as nested lists in [0, 1]; {} for tabular secrets."""
    if result.original is None or result.decoded is None or result.original.ndim < 3:
        return {}

    def rows(array: np.ndarray) -> list[Any]:
        return [np.round(np.clip(a, 0, 1), IMAGE_DECIMALS).tolist() for a in array[:MAX_IMAGES]]

    images = {"original": rows(result.original), "decoded": rows(result.decoded)}
    if extra is not None and extra.decoded is not None:
        images["requantized"] = rows(extra.decoded)
    return images


def _decode(
    prepared: Prepared,
    config: MemorizationConfig,
    model: nn.Module,
    secret: Any,
    train: Dataset,
    clean: float,
    honest: float,
    monitor: Any = None,
) -> Any:
    """The provider's decoding of `model`, then scored: a fresh attack of the config's method
    and options (nothing the encoding instance kept reaches it), a `Target` at the attack's
    access, and the public `MemorizationTask`; the truth (`secret`, the training rows as
    candidates) reaches only `run_memorization`'s scoring."""
    from privacylab.attacks.memorization import (
        MemorizationTask,
        make_memorization,
        run_memorization,
    )
    from privacylab.target import Target

    data = prepared.data
    decoder = make_memorization(config.method, **(config.attack_options or {}))
    target = Target(
        model, prepared.attack.threat_model.access, data.num_classes, device=config.device
    )
    if monitor is not None:
        target = target.with_monitor(monitor)
    task = MemorizationTask(
        prepared.layout, tuple(data.input_shape), data.num_classes, key=config.seed
    )
    return run_memorization(
        decoder,
        target,
        task,
        secret,
        clean_accuracy=clean,
        honest_accuracy=honest,
        candidates=train.features.detach().cpu().numpy(),
    )


def _requantized(
    prepared: Prepared,
    config: MemorizationConfig,
    released: nn.Module,
    secret: Any,
    train: Dataset,
    test: Dataset,
    honest: float,
) -> tuple[dict[str, Any] | None, Any]:
    """LSB only: the released model re-quantised by the defences' `requantize` (its default
    mantissa), decoded again, with its accuracy."""
    from privacylab.defenses.memorization import requantize

    sanitized = requantize(released)
    accuracy = _accuracy(sanitized, test)
    again = _decode(prepared, config, sanitized, secret, train, accuracy, honest)
    return {
        "accuracy": accuracy,
        "bit_accuracy": again.bit_accuracy,
        "recovered": again.recovered,
        "exact_match": again.exact_match,
        "psnr": again.psnr,
    }, again


def _query_check(
    prepared: Prepared,
    config: MemorizationConfig,
    released: nn.Module,
    secret: Any,
    train: Dataset,
    holdout: Dataset,
    test: Dataset,
    clean: float,
    honest: float,
    queries: torch.Tensor,
) -> dict[str, Any] | None:
    """Capacity abuse only: the query anomaly detector fitted on the holder's training inputs
    (threshold at its FPR on the held-out rows) flags the decoder's queries, and the test rows
    (clean rows it never saw: its false-positive rate) — `queries` are the decoder's, recorded
    on the job's own decode; then the decoder runs again through the detector's blocking
    monitor. None where no rows are held out."""
    from privacylab.defenses.memorization import QueryAnomalyDetector

    if len(holdout) < 2:
        return None
    detector = QueryAnomalyDetector().fit(train.features, holdout.features)
    flags = np.asarray(detector.flags(queries)) if len(queries) else np.zeros(0, bool)
    clean_flags = np.asarray(detector.flags(test.features))
    threshold = float(detector.threshold)
    blocked: dict[str, Any] = {"refused": False}
    try:
        outcome = _decode(
            prepared, config, released, secret, train, clean, honest,
            monitor=detector.monitor(block=True),
        )  # fmt: skip
        blocked.update(bit_accuracy=outcome.bit_accuracy, recovered=outcome.recovered)
    except PrivacylabError as error:
        blocked.update(refused=True, error=str(error))
    return {
        "threshold": threshold,
        "queries": len(queries),
        "flagged_queries": float(np.mean(flags)) if len(flags) else None,
        "test_fpr": float(np.mean(clean_flags)),
        "monitored": blocked,
    }


def _encoded(
    prepared: Prepared,
    config: MemorizationConfig,
    secret: Any,
    train: Dataset,
    honest: nn.Module,
    checkpoints: Path,
) -> tuple[nn.Module, dict[str, Any]]:
    """The released model of the attack's malicious training (`train_encoded`). A training
    plan that is the honest one — the recipe's model itself on the holder's rows with no
    hook, as LSB encoding's (Song et al. 2017, Sec. 4.1: it writes the weights after honest
    training) — would train the honest model again to the same weights (same recipe,
    initialisation and seed), so its `release` is applied to a copy of the honest model."""
    from privacylab.attacks.memorization import train_encoded

    recipe, attack = prepared.recipe, prepared.attack
    if recipe.epsilon is None:
        model = recipe.spec(train).build(seed=config.seed)
        plan = attack.encode(secret, model, train, key=config.seed, private=False)
        honest_plan = (
            plan.model is model
            and plan.data is train
            and plan.regularizer is None
            and plan.loss_fn is None
            and not plan.extra_rows
        )
        if honest_plan:
            model.load_state_dict(honest.state_dict())
            return plan.release(model.to(config.device)).eval(), {"privacy": None}
    return train_encoded(
        attack,
        secret,
        recipe,
        train,
        seed=config.seed,
        key=config.seed,
        device=config.device,
        checkpoint_dir=checkpoints,
    )


def _label(config: MemorizationConfig, layout: Any) -> str:
    parts = [config.method, f"{layout.items} × {layout.bits_per_item} bits"]
    parts.append("non-private" if config.epsilon is None else f"DP-SGD ε={config.epsilon:g}")
    return ", ".join(parts)


def _add_to_report(folder: Path, entry: dict[str, Any], progress: Progress | None) -> None:
    from privacylab.report.memorization import add_memorization_run

    tick(progress, "report", 0, 1)
    add_memorization_run(folder, {"attack": entry})
    tick(progress, "report", 1, 1)


def run_memorization_job(
    config: MemorizationConfig, out: str | Path, *, progress: Progress | None = None
) -> dict[str, Any]:
    """Play the game `config` names (module docstring) and write the folder `out`; returns
    `MemorizationResult.to_dict()` plus "folder", "dataset", "train_size", "test_size",
    "seed", "epsilon" (None: non-private), "delta", "privacy" (what DP-SGD spent on the
    released model), "items", "pixel_bits" (value bits per item value), "layout", "checks"
    (weight check name -> statistic, threshold, flagged, and the same on the honest model),
    "requantized" (lsb: the re-quantised model's accuracy and decoding) and "query_detector"
    (capacity: the share of the decoder's queries the detector flags, its FPR on held-out
    rows, and what the decoder gets through the blocking monitor). All input checks run before
    any training; a killed run resumes from its checkpoints, finished models and a finished
    result are reused (result.json is written last, after the report, so a run killed before
    it decodes and reports again from the saved models); a folder holding another game is
    refused."""
    from privacylab.attacks.memorization import choose_secret, train_honest

    prepared = check_memorization_config(config)
    folder = Path(out).resolve()
    if folder.exists() and not folder.is_dir():
        raise MemorizationJobError(f"{folder} exists and is not a folder")
    _claim(folder, config)
    done_path = folder / RESULT_FILE
    if done_path.is_file():
        finished = read_json(done_path, MemorizationJobError)
        if isinstance(finished, dict):
            tick(progress, "result (reused)", 1, 1)
            return finished
    tick(progress, "data", 0, 1)
    data, parts, layout, recipe = prepared.data, prepared.parts, prepared.layout, prepared.recipe
    write_json(folder / SPLITS_FILE, {"dataset": config.dataset, "rows": len(data), **parts})
    train, test, holdout = (data.subset(parts[k]) for k in ("train", "test", "holdout"))
    rows = secret_rows(len(train), layout.items, config.seed)
    secret = choose_secret(train, rows, None if layout.kind == "tabular" else layout.value_bits)
    tick(progress, "data", 1, 1)
    spec = recipe.spec(train)
    honest_model, _ = _trained(
        folder,
        HONEST_DIR,
        config,
        spec,
        lambda where: train_honest(
            recipe, train, seed=config.seed, device=config.device, checkpoint_dir=where
        ),
        recipe.epochs,
        progress,
    )
    released, summary = _trained(
        folder,
        MODEL_DIR,
        config,
        spec,
        lambda where: _encoded(prepared, config, secret, train, honest_model, where),
        recipe.epochs,
        progress,
    )
    tick(progress, "decode", 0, 1)
    clean = _accuracy(released, test)
    honest = _accuracy(honest_model, test)
    seen: list[torch.Tensor] = []
    label_only = prepared.attack.threat_model.access.value == "label"
    outcome = _decode(
        prepared, config, released, secret, train, clean, honest,
        monitor=(lambda x: seen.append(x.detach().cpu())) if label_only else None,
    )  # fmt: skip
    tick(progress, "decode", 1, 1)
    tick(progress, "checks", 0, 1)
    checks = weight_checks(released, honest_model, train)
    requantized, again = (None, None)
    if config.method == "lsb":
        requantized, again = _requantized(prepared, config, released, secret, train, test, honest)
    detector = None
    if label_only:
        queries = torch.cat(seen) if seen else torch.zeros(0, *prepared.data.input_shape)
        detector = _query_check(
            prepared, config, released, secret, train, holdout, test, clean, honest, queries
        )
    tick(progress, "checks", 1, 1)
    result = {
        **outcome.to_dict(),
        "folder": str(folder),
        "dataset": config.dataset,
        "train_size": config.train_size,
        "test_size": config.test_size,
        "seed": config.seed,
        "epsilon": config.epsilon,
        "delta": config.delta if config.epsilon is not None else None,
        "privacy": summary.get("privacy"),
        "items": layout.items,
        "pixel_bits": layout.value_bits,
        "layout": layout.to_dict(),
        "secret_rows": [int(r) for r in parts["train"][rows]],
        "checks": checks,
        "requantized": requantized,
        "query_detector": detector,
    }
    from privacylab.report.jsonable import json_ready

    finished = json.loads(json.dumps(json_ready(result), allow_nan=False))
    entry = {**finished, "label": _label(config, layout), "images": _images(outcome, again)}
    _add_to_report(folder, entry, progress)
    write_json(done_path, finished)
    return finished
