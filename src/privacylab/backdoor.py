"""The backdoor job: `privacylab attack backdoor` and `privacylab defend backdoor` (issue 17).

`run_backdoor_attack(config, out)` plays one backdoor game on an embedded image dataset and
writes it to the folder `out`:

- the rows are split once by the seed into four disjoint parts: the victim's training rows X,
  the test rows, the attacker's own source rows (BadNets' clean rows to poison, the trojaning
  attack's public images) and the defender's clean held-out rows (`HOLDOUT`); the indices are
  kept in `splits.json`;
- `badnets` (Gu et al. 2017): the attacker crafts P from its source rows, the victim trains on
  X ∪ P with its recipe (`privacylab.attacks.poisoning.recipe.train_victim`), the clean model
  of the same recipe on X alone gives the baselines (`run_poisoning`); with `epsilon` the
  victim trains with DP-SGD, the poisoning defence whose group-privacy bound
  (Jagielski et al. 2020, Lemma 1: ASR <= min(1, e^{kε} p0 + δ_k) for k poisons) is reported
  beside the measured ASR;
- `trojan` (Liu et al. NDSS'18): the victim trains on X; the attacker receives that model
  white-box and returns a retrained copy (`run_trojan`); Ext+Tri is measured on images of
  another source (`external_images`);
- `clip-poison`, `clip-backdoor` (Carlini & Terzis ICLR'22, Secs. 4.1-4.2): a contrastive
  image–text model, trained and attacked by `attacks.poisoning.contrastive.run_contrastive`;
  its result carries the backdoor z-score. It is not a classifier folder: the defences do not
  apply to it.

Folder: `config.json`, `splits.json`, `poisons.safetensors` (P; the defender receives X ∪ P
shuffled by the seed, and the positions of P in it are known only to the evaluator),
`clean/` and `model/` (model folders, `privacylab.models.save_model`, sidecar metadata
``{"backdoor": {"config", "trigger", "target_class", "mode", "method", "role"}, "summary"}``),
`checkpoints/` while training (a killed run resumes; a finished model folder is reused),
`result.json`, `defenses/<method>.json`, and the report (`results.json`, `index.html`) through
`privacylab.report.backdoor.add_backdoor_run`.

`defend_backdoor(target, method)` rebuilds what the defender holds from that folder — the
held-out clean rows, the received training set X ∪ P, the victim's recipe to retrain — runs
the registered defence (`privacylab.defenses.backdoor`), and measures accuracy and ASR before
and after its mitigation with the one metric (`evaluate_mitigation`); for defences that flag
training rows, their precision and recall against the true poison rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

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
    "CONTRASTIVE_METHODS",
    "DEFAULT_TRIGGERS",
    "DEFENSE_METHODS",
    "HOLDOUT",
    "METHODS",
    "PROBE_SEED",
    "BackdoorConfig",
    "BackdoorError",
    "BackdoorRun",
    "check_backdoor_config",
    "defend_backdoor",
    "external_images",
    "load_backdoor_run",
    "row_precision_recall",
    "run_backdoor_attack",
    "run_folder",
    "split_rows",
]

METHODS = ("badnets", "trojan", "clip-poison", "clip-backdoor")
"""The attacks `privacylab attack backdoor --method` runs (registered names)."""

DEFENSE_METHODS = ("neural-cleanse", "strip", "activation-clustering", "spectral", "fine-pruning")
"""The defences `privacylab defend backdoor --method` runs (registered names)."""

CONTRASTIVE_METHODS = ("clip-poison", "clip-backdoor")
DATA_POISONING = ("badnets", *CONTRASTIVE_METHODS)

DEFAULT_TRIGGERS: dict[str, str | None] = {
    "badnets": "square:4@corner",
    "trojan": "square:7@corner",
    "clip-poison": None,
    "clip-backdoor": "pattern:4@corner",
}
"""The trigger each method uses when none is given (clip-poison targets one image: none).
The contrastive backdoor's patch sits in a fixed corner: at our scale (a small CNN, 4,000
pairs) a randomly placed patch does not take (benchmarks/contrastive_table.py: ASR 0.05 at 1%
poison, against 1.00 for the corner), the opposite of Carlini & Terzis's ablation; `--trigger
pattern:4@random` runs it."""

HOLDOUT = 300
"""Clean held-out rows the defender keeps (Neural Cleanse, STRIP, fine-pruning)."""

PROBE_SEED = 1
"""Seed of the random trigger placements on the test rows (the runners' `probe_seed`)."""

EXTERNAL = 200
"""Images of another source stamped for the trojaning attack's Ext+Tri."""

IMAGE_DECIMALS = 3
MAX_INVERTED = 10

CONFIG_FILE = "config.json"
SPLITS_FILE = "splits.json"
POISONS_FILE = "poisons.safetensors"
RESULT_FILE = "result.json"
CLEAN_DIR = "clean"
MODEL_DIR = "model"
CHECKPOINTS_DIR = "checkpoints"
DEFENSES_DIR = "defenses"

Progress = Callable[[str, float, float], None]


class BackdoorError(PrivacylabError, ValueError):
    """A backdoor job cannot run with this configuration or folder; one line."""


# ----------------------------------------------------------------------------- configuration


@dataclass
class BackdoorConfig:
    """One backdoor game: `dataset` (an embedded image dataset), `method` (one of `METHODS`),
    the poison budget as exactly one of `poison_rate` (P's share of X ∪ P, in (0, 1)) or
    `poisons` (a count) for the data-poisoning methods (the trojaning attack injects none),
    `trigger` in the spec grammar of `attacks.poisoning.trigger` (None: the method's own,
    `DEFAULT_TRIGGERS`), `target_class`, `mode` (all-to-one; all-to-all for badnets),
    `epsilon` (None: non-private victim; else DP-SGD at (ε, `delta`)), the row counts, `seed`,
    `device`, `recipe`: overrides of `VictimRecipe`'s fields (e.g. {"epochs": 5}), and
    `attack_options`: more keyword options of the attack's constructor (e.g. the trojan's
    {"selection": "random"}; for clip-*, of `run_contrastive`)."""

    dataset: str = "mnist5k"
    method: str = "badnets"
    poison_rate: float | None = 0.01
    poisons: int | None = None
    trigger: str | None = None
    target_class: int = 0
    mode: str = "all-to-one"
    epsilon: float | None = None
    delta: float = 1e-5
    train_size: int = 3500
    test_size: int = 1000
    seed: int = 0
    device: str = "cpu"
    recipe: dict[str, Any] | None = None
    attack_options: dict[str, Any] | None = None

    def validate(self) -> BackdoorConfig:
        """Check every field (not the dataset's own limits: `check_backdoor_config`); returns
        self, or one BackdoorError line."""
        from privacylab.attacks.poisoning import MODES, check_poison_rate, parse_trigger

        if self.method not in METHODS:
            raise BackdoorError(
                f"unknown backdoor method {self.method!r}; choose one of {', '.join(METHODS)}"
            )
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise BackdoorError(f"dataset must be a dataset name, got {self.dataset!r}")
        if self.method in DATA_POISONING:
            if (self.poison_rate is None) == (self.poisons is None):
                raise BackdoorError("give exactly one of --poison-rate or --poisons")
            if self.poison_rate is not None:
                check_poison_rate(self.poison_rate)
            if self.poisons is not None:
                whole(BackdoorError, "--poisons", self.poisons, 1)
        if self.trigger is not None:
            if not isinstance(self.trigger, str):
                raise BackdoorError(f"trigger must be a spec string, got {self.trigger!r}")
            parse_trigger(self.trigger)
        if self.method == "clip-poison" and self.trigger is not None:
            raise BackdoorError(
                "clip-poison poisons one target image and uses no trigger; drop --trigger"
            )
        if self.mode not in MODES:
            raise BackdoorError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.mode != "all-to-one" and self.method != "badnets":
            raise BackdoorError(f"--mode {self.mode} applies to badnets only")
        whole(BackdoorError, "--target-class", self.target_class, 0)
        if self.epsilon is not None:
            positive(BackdoorError, "--epsilon", self.epsilon)
            if self.method in CONTRASTIVE_METHODS:
                raise BackdoorError(
                    "--epsilon trains a DP-SGD classifier victim (badnets, trojan); the "
                    "contrastive model trains without it"
                )
        delta = positive(BackdoorError, "--delta", self.delta)
        if not delta < 1:
            raise BackdoorError(f"--delta must be in (0, 1), got {self.delta!r}")
        whole(BackdoorError, "--train-size", self.train_size, 1)
        whole(BackdoorError, "--test-size", self.test_size, 1)
        whole(BackdoorError, "--seed", self.seed, 0)
        if not isinstance(self.device, str) or not self.device:
            raise BackdoorError(f"device must be a name such as cpu or cuda, got {self.device!r}")
        if self.recipe is not None and not isinstance(self.recipe, dict):
            raise BackdoorError(
                f"recipe must be an object of VictimRecipe fields, got {self.recipe!r}"
            )
        if self.attack_options is not None and not isinstance(self.attack_options, dict):
            raise BackdoorError(f"attack options must be an object, got {self.attack_options!r}")
        reserved = sorted(set(self.attack_options or {}) & {"trigger", "mode", "seed"})
        if reserved:
            raise BackdoorError(
                f"attack options {', '.join(reserved)} have their own options (--trigger, "
                "--mode, --seed)"
            )
        self.victim_recipe()
        return self

    def trigger_spec(self) -> str | None:
        """The trigger used: the given one or the method's default."""
        return self.trigger if self.trigger is not None else DEFAULT_TRIGGERS[self.method]

    def victim_recipe(self) -> Any:
        """The victim's `VictimRecipe`: the defaults, `recipe`'s overrides, at `epsilon`."""
        return victim_recipe(BackdoorError, self.recipe, self.epsilon, self.delta, self.seed)

    def poison_budget(self, clean_rows: int) -> int:
        """How many rows the attacker injects into `clean_rows` victim rows: `poisons`, or
        the count making `poison_rate` of X ∪ P (`poison_count`); 0 for the trojan."""
        from privacylab.attacks.poisoning import poison_count

        if self.method not in DATA_POISONING:
            return 0
        if self.poisons is not None:
            return int(self.poisons)
        return poison_count(float(self.poison_rate), clean_rows)  # type: ignore[arg-type]

    def identity(self) -> dict[str, Any]:
        """The fields that decide the folder's models and numbers: not the device; the
        trigger as used; the victim's whole recipe (so a folder trained under other recipe
        defaults is not mixed with new models); no poison budget for the trojan."""
        data = self.to_dict()
        data.pop("device")
        data["trigger"] = self.trigger_spec()
        if self.method not in CONTRASTIVE_METHODS:
            data["recipe"] = self.victim_recipe().to_dict()
        if self.method not in DATA_POISONING:
            data["poison_rate"] = data["poisons"] = None
        return data

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BackdoorConfig:
        """Inverse of `to_dict`; one BackdoorError line on unknown keys."""
        return config_from_dict(cls, data, BackdoorError, "backdoor")


def check_backdoor_config(config: BackdoorConfig) -> Any:
    """Validate `config` against its dataset before any work: an image dataset, the target
    class among its classes, enough rows for the four disjoint parts, and the trigger fitting
    its images (the error names both sizes). Returns the dataset's `DatasetInfo`."""
    from privacylab.attacks.poisoning import parse_trigger
    from privacylab.data.info import dataset_info

    config.validate()
    info = dataset_info(config.dataset)
    if len(info.input_shape) != 3:
        raise BackdoorError(
            f"backdoors stamp (C, H, W) images; {config.dataset} has inputs of shape "
            f"{info.input_shape}: use an image dataset such as mnist5k or digits"
        )
    if config.target_class >= info.num_classes:
        raise BackdoorError(
            f"--target-class must be in [0, {info.num_classes}) for {config.dataset}, "
            f"got {config.target_class}"
        )
    if config.method not in CONTRASTIVE_METHODS:
        _sizes(info.size, config)
    elif config.train_size + config.test_size > info.size:
        raise BackdoorError(
            f"{config.dataset} has {info.size} rows: --train-size {config.train_size} + "
            f"--test-size {config.test_size} do not fit"
        )
    spec = config.trigger_spec()
    if spec is not None:
        trigger = parse_trigger(spec)
        try:
            trigger.check(tuple(info.input_shape))
        except PrivacylabError as error:
            raise BackdoorError(f"--trigger {spec}: {error}") from None
    if config.method not in CONTRASTIVE_METHODS:
        _make_attack(config)
    return info


def _make_attack(config: BackdoorConfig) -> Any:
    """The registered attack with the config's options (one line on unknown options)."""
    from privacylab.attacks.poisoning import backdoor_class

    cls = backdoor_class(config.method)
    options = _attack_options(config)
    _known_keywords(cls, options, config.method)
    return cls(**options)


def _known_keywords(fn: Callable[..., Any], options: Mapping[str, Any], what: str) -> None:
    """One line naming the options `fn` does not take (and those it does)."""
    parameters = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(options) - set(parameters))
    if unknown:
        takes = ", ".join(n for n in parameters if n not in ("self", "data", "progress"))
        raise BackdoorError(f"{what} takes no option {', '.join(unknown)}; it takes {takes}")


def _sizes(rows: int, config: BackdoorConfig) -> int:
    holdout = HOLDOUT
    needed = config.train_size + config.test_size + holdout + 1
    if needed > rows:
        raise BackdoorError(
            f"{config.dataset} has {rows} rows: --train-size {config.train_size} + --test-size "
            f"{config.test_size} + {holdout} held-out rows for the defender + at least 1 row "
            f"for the attacker do not fit"
        )
    return holdout


def split_rows(rows: int, config: BackdoorConfig) -> dict[str, np.ndarray]:
    """Four disjoint index sets of one seeded permutation of `rows`: "test", "holdout" (the
    defender's clean rows), "train" (the victim's X) and "source" (the attacker's own rows:
    every row left)."""
    holdout = _sizes(rows, config)
    order = np.random.default_rng(config.seed).permutation(rows)
    cuts = np.cumsum([config.test_size, holdout, config.train_size])
    return {
        "test": order[: cuts[0]],
        "holdout": order[cuts[0] : cuts[1]],
        "train": order[cuts[1] : cuts[2]],
        "source": order[cuts[2] :],
    }


# -------------------------------------------------------------------------------- files


def _claim(folder: Path, config: BackdoorConfig) -> None:
    """Write config.json (the victim's recipe written out in full, so that the folder
    keeps its own recipe if the defaults change), or check the folder's own is the same game
    (one line if not)."""
    path = folder / CONFIG_FILE
    if path.exists():
        saved = BackdoorConfig.from_dict(read_json(path, BackdoorError))
        if saved.identity() != config.identity():
            other = saved.identity()
            changed = sorted(k for k, v in config.identity().items() if other.get(k) != v)
            raise BackdoorError(
                f"{folder} holds a backdoor run with other settings ({', '.join(changed)}); "
                "use another --out"
            )
    folder.mkdir(parents=True, exist_ok=True)
    kept = config
    if config.method not in CONTRASTIVE_METHODS:
        kept = replace(config, recipe=config.victim_recipe().to_dict())
    write_json(path, kept.to_dict())


def _save_tensors(path: Path, tensors: dict[str, Tensor]) -> None:
    from safetensors.torch import save_file

    partial = path.with_name(path.name + ".partial")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(partial))
    partial.chmod(0o644)
    os.replace(partial, path)


def _load_tensors(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise BackdoorError(f"{path} is missing: the attack run did not finish; run it again")
    try:
        return load_file(str(path))
    except Exception as error:  # safetensors raises its own error types
        raise BackdoorError(f"cannot read {path}: {error}") from None


def _metadata(config: BackdoorConfig, trigger: Any, role: str, summary: Any) -> dict[str, Any]:
    return {
        "backdoor": {
            "config": config.to_dict(),
            "trigger": None if trigger is None else trigger.to_dict(),
            "target_class": config.target_class,
            "mode": config.mode,
            "method": config.method,
            "role": role,
        },
        "summary": summary,
    }


def _trained(
    folder: Path,
    checkpoints: Path,
    recipe: Any,
    data: Dataset,
    config: BackdoorConfig,
    role: str,
    trigger: Any,
    progress: Progress | None,
) -> tuple[nn.Module, dict[str, Any]]:
    """The model saved in `folder` (reused), or trained now by the victim's recipe on `data`
    (resuming from `checkpoints`) and saved there."""
    from privacylab.models import load_model, save_model

    stage = f"{role} model"
    if model_saved(folder):
        model, _, meta = load_model(folder, device=config.device)
        tick(progress, stage, 1, 1)
        return model, dict(meta.get("summary") or {})
    model, summary = _victim(recipe, data, config.seed, config.device, checkpoints, progress, stage)
    kept = trainer_summary(summary)
    save_model(model, folder, recipe.spec(data), _metadata(config, trigger, role, kept))
    shutil.rmtree(checkpoints, ignore_errors=True)
    with contextlib.suppress(OSError):
        checkpoints.parent.rmdir()
    return model, kept


def _victim(
    recipe: Any,
    data: Dataset,
    seed: int,
    device: str,
    checkpoints: Path | None,
    progress: Progress | None,
    stage: str,
) -> tuple[nn.Module, dict[str, Any]]:
    """`train_victim`, its start and end ticked on `stage`."""
    from privacylab.attacks.poisoning.recipe import train_victim

    epochs = float(recipe.epochs)
    tick(progress, stage, 0, epochs)
    model, summary = train_victim(
        recipe, data, seed=seed, device=device, checkpoint_dir=checkpoints
    )
    tick(progress, stage, epochs, epochs)
    return model, summary


# ------------------------------------------------------------------------------ the attack


def external_images(data: Dataset, count: int = EXTERNAL, seed: int = 0) -> Tensor:
    """Images of another source for the trojaning attack's Ext+Tri (Liu et al. 2018, Sec. V:
    inputs not from the training distribution): the other embedded digit set (sklearn's 8x8
    digits for 28x28 data, mnist5k for other sizes) resized to `data`'s (C, H, W) by bilinear
    interpolation (antialiased when shrinking), channels repeated; `count` rows, seeded."""
    channels, height, width = data.input_shape
    other = load_dataset("digits" if (height, width) != (8, 8) else "mnist5k")
    order = np.random.default_rng(seed).permutation(len(other))[:count]
    images = other.features[torch.as_tensor(order)]
    shrink = images.shape[-1] > width or images.shape[-2] > height
    resized = torch.nn.functional.interpolate(
        images, size=(height, width), mode="bilinear", align_corners=False, antialias=shrink
    ).clamp(0, 1)
    return resized.expand(-1, channels, -1, -1).contiguous() if channels != 1 else resized


def _image(value: Tensor) -> list[Any]:
    array = value.detach().cpu().float().clamp(0, 1).numpy()
    if array.ndim == 3 and array.shape[0] == 1:
        array = array[0]
    return np.round(array, IMAGE_DECIMALS).tolist()


def _trigger_picture(trigger: Any, channels: int) -> list[Any]:
    """The trigger's box, pattern · opacity-mask, (size, size) or (C, size, size) in [0, 1]."""
    return _image(trigger.box_pattern(channels) * (trigger.alpha * trigger.box_mask()))


def _images(
    trigger: Any, test: Dataset, config: BackdoorConfig, inverted: Tensor | None = None
) -> dict[str, Any]:
    """The report's pictures: the trigger, a clean non-target test image and its triggered
    copy (placed as at activation), and up to `MAX_INVERTED` inverted images (trojan)."""
    images: dict[str, Any] = {}
    if trigger is not None:
        channels = test.input_shape[0]
        images["trigger"] = _trigger_picture(trigger, channels)
        others = torch.nonzero(test.labels != config.target_class).flatten()
        row = int(others[0]) if len(others) else 0
        generator = torch.Generator().manual_seed(PROBE_SEED)
        stamped = trigger.stamp(test.features, generator)
        images["clean_example"] = _image(test.features[row])
        images["triggered_example"] = _image(stamped[row])
    if inverted is not None and len(inverted):
        images["inverted"] = [_image(x) for x in inverted[:MAX_INVERTED]]
    return images


def _label(config: BackdoorConfig, result: Mapping[str, Any]) -> str:
    spec = (result.get("trigger") or {}).get("spec") or "no trigger"
    parts = [config.method, spec]
    if config.method in DATA_POISONING:
        parts.append(f"{result.get('poisons')} poisons")
    parts.append(f"target {config.target_class}")
    if config.epsilon is not None:
        parts.append(f"ε={config.epsilon:g}")
    return ", ".join(parts)


def _add_to_report(folder: Path, payload: dict[str, Any], progress: Progress | None) -> None:
    try:
        from privacylab.report.backdoor import add_backdoor_run
    except ImportError:
        tick(progress, "report (not available in this installation)", 1, 1)
        return
    tick(progress, "report", 0, 1)
    add_backdoor_run(folder, payload)
    tick(progress, "report", 1, 1)


def _attack_options(config: BackdoorConfig) -> dict[str, Any]:
    options: dict[str, Any] = {**(config.attack_options or {}), "seed": config.seed}
    if config.trigger is not None:
        options["trigger"] = config.trigger
    if config.method == "badnets":
        options["mode"] = config.mode
    return options


def run_backdoor_attack(
    config: BackdoorConfig, out: str | Path, *, progress: Progress | None = None
) -> dict[str, Any]:
    """Play the game `config` names (module docstring) and write the folder `out`; returns
    `BackdoorResult.to_dict()` plus "folder", "dataset", "train_size", "test_size", "holdout",
    "epsilon" (None: non-private), "delta", "privacy" (what DP-SGD spent) and "asr_bound"
    (badnets under DP-SGD: the group-privacy bound on ASR for its k poisons). Resumable: the
    models of a killed run are resumed from their checkpoints, finished ones and a finished
    result are reused; a folder holding another game is refused. `progress(stage, done,
    total)` on each stage."""
    if not isinstance(config, BackdoorConfig):
        raise BackdoorError(f"run_backdoor_attack needs a BackdoorConfig, got {type(config)}")
    check_backdoor_config(config)
    folder = Path(out).resolve()
    if folder.exists() and not folder.is_dir():
        raise BackdoorError(f"{folder} exists and is not a folder")
    _claim(folder, config)
    done_path = folder / RESULT_FILE
    if done_path.is_file():
        finished = read_json(done_path, BackdoorError)
        if isinstance(finished, dict):
            tick(progress, "result (reused)", 1, 1)
            return finished
    if config.method in CONTRASTIVE_METHODS:
        result, images = _contrastive(config, folder, progress)
    else:
        result, images = _classifier_game(config, folder, progress)
    result["folder"] = str(folder)
    write_json(done_path, result)
    finished = read_json(done_path, BackdoorError)
    entry = {**finished, "label": _label(config, finished), "images": images}
    _add_to_report(folder, {"attack": entry}, progress)
    return finished


def _common(config: BackdoorConfig, result: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        **result,
        "dataset": config.dataset,
        "train_size": config.train_size,
        "test_size": config.test_size,
        "epsilon": config.epsilon,
        "delta": config.delta if config.epsilon is not None else None,
        **extra,
    }


def _classifier_game(
    config: BackdoorConfig, folder: Path, progress: Progress | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    from privacylab.attacks.poisoning import (
        PoisonTask,
        TrojanTask,
        run_poisoning,
        run_trojan,
    )

    tick(progress, "data", 0, 1)
    data = load_dataset(config.dataset)
    parts = split_rows(len(data), config)
    write_json(
        folder / SPLITS_FILE,
        {"dataset": config.dataset, "rows": len(data), **parts},
    )
    train, test, source = (data.subset(parts[k]) for k in ("train", "test", "source"))
    tick(progress, "data", 1, 1)
    recipe = config.victim_recipe()
    attack = _make_attack(config)
    checkpoints = folder / CHECKPOINTS_DIR
    trigger = getattr(attack, "trigger", None)
    clean_model, clean_summary = _trained(
        folder / CLEAN_DIR,
        checkpoints / CLEAN_DIR,
        recipe,
        train,
        config,
        "clean",
        trigger,
        progress,
    )
    inverted = None
    attacked_summary: dict[str, Any] = clean_summary
    if config.method == "badnets":
        budget = config.poison_budget(len(train))
        task = PoisonTask(source, budget, config.target_class, config.mode, seed=config.seed)
        summaries: list[dict[str, Any]] = []

        def victim(poisoned: Dataset) -> nn.Module:
            model, summary = _trained(
                folder / MODEL_DIR,
                checkpoints / MODEL_DIR,
                recipe,
                poisoned,
                config,
                "attacked",
                trigger,
                progress,
            )
            summaries.append(summary)
            return model

        tick(progress, "attack", 0, 1)
        outcome, _, poisons = run_poisoning(
            attack, task, train, test, victim, clean_model=clean_model, probe_seed=PROBE_SEED
        )
        _save_tensors(
            folder / POISONS_FILE, {"features": poisons.features, "labels": poisons.labels}
        )
        attacked_summary = summaries[0]
        result = outcome.to_dict()
        result["details"] = {**result["details"], "poison_rows": [len(train), len(train) + budget]}
    else:
        from privacylab.models import save_model

        tick(progress, "attack", 0, 1)
        task_t = TrojanTask(
            data.input_shape,
            data.num_classes,
            config.target_class,
            public=source.features,
            seed=config.seed,
        )
        outcome, output = run_trojan(
            attack,
            clean_model,
            task_t,
            test,
            external=external_images(data, seed=config.seed),
            probe_seed=PROBE_SEED,
        )
        trigger = output.trigger
        inverted = output.inverted
        _save_tensors(
            folder / POISONS_FILE,
            {
                "features": torch.zeros(0, *data.input_shape),
                "labels": torch.zeros(0, dtype=torch.int64),
            },
        )
        save_model(
            output.model,
            folder / MODEL_DIR,
            recipe.spec(train),
            _metadata(config, trigger, "attacked", clean_summary),
        )
        result = outcome.to_dict()
    tick(progress, "attack", 1, 1)
    privacy = (attacked_summary or {}).get("privacy")
    bound = None
    if config.epsilon is not None and config.method == "badnets":
        from privacylab.defenses.backdoor.dp import poisoning_asr_bound

        spent = float(privacy["epsilon"]) if privacy else float(config.epsilon)
        bound = poisoning_asr_bound(
            spent, config.delta, int(result["poisons"]), float(result["baseline_asr"] or 0.0)
        )
    result = _common(
        config,
        result,
        holdout=len(parts["holdout"]),
        privacy=privacy,
        asr_bound=bound,
    )
    return result, _images(trigger, test, config, inverted)


def _contrastive(
    config: BackdoorConfig, folder: Path, progress: Progress | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        from privacylab.attacks.poisoning.contrastive import run_contrastive
    except ImportError:
        raise BackdoorError(
            f"{config.method} is not available in this installation (no contrastive attacks)"
        ) from None
    from privacylab.attacks.poisoning import parse_trigger

    data = load_dataset(config.dataset)
    options: dict[str, Any] = {
        **(config.attack_options or {}),
        "data": data,
        "poisons": config.poison_budget(config.train_size),
        "target_class": config.target_class,
        "train_size": config.train_size,
        "test_size": config.test_size,
        "seed": config.seed,
        "device": config.device,
        "checkpoint_dir": folder / CHECKPOINTS_DIR,
        "progress": progress,
    }
    spec = config.trigger_spec()
    if spec is not None:
        options["trigger"] = spec
    if config.recipe and "epochs" in config.recipe:
        options["epochs"] = int(config.recipe["epochs"])
    tick(progress, "attack", 0, 1)
    _known_keywords(run_contrastive, options, config.method)
    outcome, _ = run_contrastive(config.method, **options)
    shutil.rmtree(folder / CHECKPOINTS_DIR, ignore_errors=True)
    tick(progress, "attack", 1, 1)
    result = _common(config, outcome.to_dict(), holdout=0, privacy=None, asr_bound=None)
    trigger = None if outcome.trigger is None else _trigger_from(outcome.trigger, parse_trigger)
    order = np.random.default_rng(config.seed).permutation(len(data))[: config.test_size]
    return result, _images(trigger, data.subset(order), config)


def _trigger_from(saved: Mapping[str, Any], parse: Callable[[str], Any]) -> Any:
    from privacylab.attacks.poisoning import Trigger

    return (
        Trigger.from_dict(dict(saved))
        if saved.get("pattern") or saved.get("mask")
        else parse(saved["spec"])
    )


# ------------------------------------------------------------------------------- the defence


@dataclass
class BackdoorRun:
    """An attack folder read back for a defence: its `config`, the attacked `model`, the
    `trigger`, the defender's `clean` held-out rows, the `training` set the victim received
    (X ∪ P in an order shuffled by the config's seed, so the poisons are not the last rows),
    the `poison_rows` positions in it (the evaluator's truth), and `test`."""

    folder: Path
    config: BackdoorConfig
    model: nn.Module
    trigger: Any
    clean: Dataset
    training: Dataset
    poison_rows: np.ndarray
    test: Dataset


def run_folder(target: str | Path) -> Path:
    """The attack folder `target` names: the folder itself or its `model/` (or `clean/`)
    sub-folder; one line if it holds no backdoor run."""
    path = Path(target)
    if not path.is_dir():
        raise BackdoorError(f"--target {target} is not a folder")
    if not (path / CONFIG_FILE).is_file() and path.name in (MODEL_DIR, CLEAN_DIR):
        path = path.parent
    if not (path / CONFIG_FILE).is_file():
        raise BackdoorError(
            f"--target {target} holds no backdoor run (no {CONFIG_FILE}); give the --out folder "
            "of privacylab attack backdoor"
        )
    return path


def load_backdoor_run(target: str | Path, device: str | None = None) -> BackdoorRun:
    """Read an attack folder (`run_folder`) back: one line for a contrastive run (the
    defences inspect classifiers) or an unfinished one."""
    from privacylab.attacks.poisoning import Poisons, Trigger
    from privacylab.models import load_model

    folder = run_folder(target)
    config = BackdoorConfig.from_dict(read_json(folder / CONFIG_FILE, BackdoorError)).validate()
    if config.method in CONTRASTIVE_METHODS:
        raise BackdoorError(
            f"{folder} holds a {config.method} run of a contrastive image–text model; the "
            "backdoor defences inspect classifiers (badnets, trojan runs)"
        )
    if not model_saved(folder / MODEL_DIR) or not (folder / RESULT_FILE).is_file():
        raise BackdoorError(f"{folder}: the attack run did not finish; run it again to resume")
    model, _, meta = load_model(folder / MODEL_DIR, device=device or config.device)
    saved = (meta.get("backdoor") or {}).get("trigger")
    if not isinstance(saved, dict):
        raise BackdoorError(f"{folder / MODEL_DIR}: the sidecar names no backdoor trigger")
    trigger = Trigger.from_dict(saved)
    data = load_dataset(config.dataset)
    splits = read_json(folder / SPLITS_FILE, BackdoorError)
    if not isinstance(splits, dict) or splits.get("rows") != len(data):
        raise BackdoorError(f"{folder / SPLITS_FILE} does not match {config.dataset}")
    try:
        train, test, clean = (data.subset(splits[k]) for k in ("train", "test", "holdout"))
    except (KeyError, PrivacylabError) as error:
        raise BackdoorError(f"{folder / SPLITS_FILE} is malformed: {error}") from None
    saved_poisons = _load_tensors(folder / POISONS_FILE)
    poisons = Poisons(
        saved_poisons["features"], saved_poisons["labels"], trigger, config.target_class,
        config.mode,
    )  # fmt: skip
    merged = poisons.merged(train)
    order = np.random.default_rng(config.seed).permutation(len(merged))
    received = merged.subset(order)
    rows = np.flatnonzero(order >= len(train))
    return BackdoorRun(folder, config, model, trigger, clean, received, rows, test)


def row_precision_recall(flagged: np.ndarray | None, poison_rows: np.ndarray) -> dict[str, Any]:
    """How the flagged training rows match the true poison rows: counts, precision =
    |flagged ∩ poisons| / |flagged|, recall = |flagged ∩ poisons| / |poisons| (None where a
    denominator is 0)."""
    if flagged is None:
        return {"flagged": None, "poisons": len(poison_rows), "true_positives": None,
                "precision": None, "recall": None}  # fmt: skip
    chosen = np.unique(np.asarray(flagged, dtype=np.int64))
    hits = int(np.isin(chosen, poison_rows).sum())
    return {
        "flagged": len(chosen),
        "poisons": len(poison_rows),
        "true_positives": hits,
        "precision": hits / len(chosen) if len(chosen) else None,
        "recall": hits / len(poison_rows) if len(poison_rows) else None,
    }


def defend_backdoor(
    target: str | Path,
    method: str,
    *,
    options: Mapping[str, Any] | None = None,
    seed: int | None = None,
    device: str | None = None,
    fresh: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the registered defence `method` (with `options`) on the attacked model of the
    folder `target` and return {"method", "attack", "detected", "flagged_class",
    "anomaly_index", "target_class" (the truth), "mode", "correct_class" (flagged class ==
    target; None when nothing was flagged or the attack is all-to-all), "before" and "after"
    (`evaluate_mitigation`: accuracy, ASR, rejection rates), "rows" (flagged training rows
    against the true poisons, `row_precision_recall`), "scores", "mitigation", "seconds",
    "details", "options", "seed", "folder"}. Writes `defenses/<method>.json` (with the flagged
    row indices) and adds the run to the folder's report. A finished run with the same
    options and seed is reused unless `fresh`; a defence's retraining on the cleansed set
    checkpoints under `checkpoints/` every epoch, so a killed run resumes it."""
    from privacylab.attacks.poisoning import target_labels
    from privacylab.defenses.backdoor import (
        BACKDOOR_DEFENSES,
        BackdoorEvidence,
        backdoor_defense_names,
        evaluate_mitigation,
        make_backdoor_defense,
    )

    names = backdoor_defense_names()
    if method not in names:
        raise BackdoorError(
            f"unknown backdoor defence {method!r}; choose one of {', '.join(names)}"
        )
    folder = run_folder(target).resolve()
    config = BackdoorConfig.from_dict(read_json(folder / CONFIG_FILE, BackdoorError)).validate()
    chosen = dict(options or {})
    run_seed = config.seed if seed is None else whole(BackdoorError, "--seed", seed, 0)
    _known_keywords(BACKDOOR_DEFENSES.get(method), chosen, method)
    defense = make_backdoor_defense(method, **chosen)
    store = folder / DEFENSES_DIR / f"{method}.json"
    if store.is_file() and not fresh:
        kept = read_json(store, BackdoorError)
        if (
            isinstance(kept, dict)
            and kept.get("options") == chosen
            and kept.get("seed") == run_seed
        ):
            tick(progress, f"{method} (reused)", 1, 1)
            return _public(kept)
    run = load_backdoor_run(folder, device)
    recipe = config.victim_recipe()
    retrained: list[Path] = []

    def retrain(data: Dataset) -> nn.Module:
        where = device or config.device
        stage = f"{method}: retrain"
        checkpoints = folder / CHECKPOINTS_DIR / f"{method}-retrain-{_digest(data)}"
        retrained.append(checkpoints)
        return _victim(recipe, data, config.seed, where, checkpoints, progress, stage)[0]

    evidence = BackdoorEvidence(
        num_classes=run.test.num_classes,
        clean=run.clean,
        training=run.training,
        retrain=retrain,
        seed=run_seed,
    )
    generator = torch.Generator().manual_seed(PROBE_SEED)
    triggered = run.trigger.stamp(run.test.features, generator)
    wanted = target_labels(
        run.test.labels, config.target_class, config.mode, run.test.num_classes
    ).numpy()
    before = evaluate_mitigation(None, run.model, run.test, triggered, wanted)
    tick(progress, method, 0, 1)
    start = time.perf_counter()
    detection = defense.inspect(run.model, evidence)
    seconds = time.perf_counter() - start
    tick(progress, method, 1, 1)
    after = evaluate_mitigation(detection.mitigation, run.model, run.test, triggered, wanted)
    verdict = detection.to_dict()
    flagged_rows = verdict.pop("flagged_rows")
    correct = None
    if detection.flagged_class is not None and config.mode == "all-to-one":
        correct = int(detection.flagged_class) == config.target_class
    payload = {
        "method": method,
        "attack": config.method,
        "detected": verdict["detected"],
        "flagged_class": detection.flagged_class,
        "anomaly_index": detection.anomaly_index,
        "target_class": config.target_class,
        "mode": config.mode,
        "correct_class": correct,
        "before": before,
        "after": after,
        "rows": row_precision_recall(detection.flagged_rows, run.poison_rows),
        "scores": verdict["scores"],
        "mitigation": verdict["mitigation"],
        "seconds": detection.seconds or seconds,
        "details": verdict["details"],
        "options": chosen,
        "seed": run_seed,
        "folder": str(folder),
    }
    write_json(store, {**payload, "flagged_rows": flagged_rows})
    for checkpoints in retrained:
        shutil.rmtree(checkpoints, ignore_errors=True)
    with contextlib.suppress(OSError):
        (folder / CHECKPOINTS_DIR).rmdir()
    public = _public(read_json(store, BackdoorError))
    _add_to_report(folder, {"defense": public}, progress)
    return public


def _digest(data: Dataset) -> str:
    """16 hex digits of the SHA-256 of a data set's rows and labels: the name of the folder of
    its retraining checkpoints, so a killed retraining resumes only on the same cleansed set."""
    digest = hashlib.sha256(data.features.detach().cpu().contiguous().numpy().tobytes())
    digest.update(data.labels.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _public(stored: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stored.items() if k != "flagged_rows"}
