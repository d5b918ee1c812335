"""Embedding an ownership watermark while training (Adi et al. 2018, Sec. 4, "FromScratch").

The model is trained from scratch on the training set ∪ the trigger set
(`privacylab.defenses.watermark.trigger`), the trigger examples oversampled so that every batch
holds some of them, as the paper's FromScratch variant does. privacylab's one trainer
(`privacylab.training.train`) draws its batches uniformly from the data it is given, so the
oversampling is done by replication: the trigger set is repeated r times, r the smallest whole
number for which triggers make up at least `trigger_fraction` of the training rows — hence, in
expectation, of every batch (r·n / (N + r·n) ≥ f, i.e. r = ⌈f·N / ((1 − f)·n)⌉).

`watermark_job` is the whole run by names, what `privacylab watermark embed` does: it draws the
trigger set, trains the watermarked model and — for the accuracy cost — an unwatermarked model of
the same recipe (same architecture, initialisation seed, configuration and training rows), and
saves the watermarked model (safetensors + sidecar, `privacylab.models.save_model`) with its
trigger set beside it, and the unwatermarked one under ``baseline/``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from privacylab.data import Dataset, load_dataset, split_train_test
from privacylab.defenses.base import accuracy
from privacylab.defenses.watermark.trigger import (
    TRIGGER_SPEC_FILE,
    TriggerSet,
    WatermarkError,
    make_trigger_set,
    save_trigger_set,
)
from privacylab.defenses.watermark.verify import (
    DEFAULT_THRESHOLD,
    Verification,
    verify_watermark,
)
from privacylab.models import ModelSpec, build_model, save_model
from privacylab.training import EpochRecord, TrainConfig, TrainResult, train

__all__ = [
    "BASELINE_FOLDER",
    "DEFAULT_TRIGGER_FRACTION",
    "Watermarked",
    "embed_watermark",
    "trigger_copies",
    "watermark_job",
]

DEFAULT_TRIGGER_FRACTION = 0.1
"""Share of the training rows (hence of each batch, in expectation) that are trigger rows."""

BASELINE_FOLDER = "baseline"


@dataclass
class Watermarked:
    """A watermarked model, its trigger set, how many times the set was repeated (`copies`)
    and the trainer's result (history)."""

    model: nn.Module
    trigger: TriggerSet
    copies: int
    result: TrainResult


def trigger_copies(train_size: int, triggers: int, fraction: float) -> int:
    """r = ⌈f·N / ((1 − f)·n)⌉ (at least 1): the smallest number of copies of n triggers that
    makes them at least a share f of the N + r·n training rows."""
    if not (isinstance(fraction, int | float) and 0.0 < fraction < 1.0):
        raise WatermarkError(f"the trigger fraction must lie in (0, 1), got {fraction!r}")
    if train_size < 0 or triggers < 1:
        raise WatermarkError(
            f"need train_size >= 0 and triggers >= 1, got {train_size}, {triggers}"
        )
    return max(1, math.ceil(fraction * train_size / ((1.0 - fraction) * triggers) - 1e-12))


def embed_watermark(
    model: nn.Module,
    train_data: Dataset,
    trigger: TriggerSet,
    config: TrainConfig,
    *,
    trigger_fraction: float = DEFAULT_TRIGGER_FRACTION,
    eval_data: Dataset | None = None,
    progress: Callable[[EpochRecord], None] | None = None,
) -> Watermarked:
    """Train `model` (in place, from its current weights) on `train_data` ∪ r copies of
    `trigger` with `config` (Adi et al. 2018, FromScratch; r from `trigger_copies`)."""
    if not isinstance(train_data, Dataset):
        raise WatermarkError(
            f"train_data must be a privacylab Dataset, got {type(train_data).__name__}"
        )
    if tuple(train_data.input_shape) != trigger.input_shape:
        raise WatermarkError(
            f"trigger inputs have shape {trigger.input_shape} but the data "
            f"{tuple(train_data.input_shape)}"
        )
    if train_data.num_classes != trigger.num_classes:
        raise WatermarkError(
            f"the trigger set has {trigger.num_classes} classes but the data "
            f"{train_data.num_classes}"
        )
    copies = trigger_copies(len(train_data), len(trigger), trigger_fraction)
    repeat = (copies,) + (1,) * (trigger.inputs.ndim - 1)
    features = torch.cat([train_data.features, trigger.inputs.float().repeat(*repeat)])
    labels = torch.cat([train_data.labels, trigger.labels.repeat(copies)])
    result = train(model, (features, labels), config, eval_data, progress=progress)
    return Watermarked(result.model, trigger, copies, result)


def watermark_job(
    dataset: str,
    model: str,
    config: TrainConfig,
    out: str | Path,
    *,
    root: str | Path | None = None,
    model_options: dict[str, Any] | None = None,
    triggers: int = 100,
    kind: str = "noise",
    trigger_seed: int | None = None,
    trigger_fraction: float = DEFAULT_TRIGGER_FRACTION,
    baseline: bool = True,
    threshold: float = DEFAULT_THRESHOLD,
    progress: Callable[[str, EpochRecord], None] | None = None,
) -> dict[str, Any]:
    """Watermark `model` on the canonical train part of `dataset` and save it to `out` with its
    trigger set (module docstring); with `baseline`, also train the unwatermarked model of the
    same recipe into ``out/baseline`` for the accuracy cost. Returns the run's summary: test
    accuracies, the cost, and the watermarked model's own verification (matches, p-value).

    The trigger inputs span the training features' range [min, max]; `trigger_seed` (default:
    the training seed) draws them and their labels. `progress(stage, record)` gets each epoch,
    stage "watermarked" or "baseline"."""
    started = time.monotonic()
    config = config.validate()
    if config.privacy is not None:
        raise WatermarkError("watermark embedding trains without DP-SGD; drop the privacy options")
    data = load_dataset(dataset, root)
    if data.kind == "text":
        raise WatermarkError(f"{data.name} is a text dataset; trigger sets are drawn for features")
    members, nonmembers = split_train_test(data, seed=config.seed)
    options = dict(model_options or {})
    spec = ModelSpec(model, members.input_shape, members.num_classes, options)
    seed = config.seed if trigger_seed is None else trigger_seed
    low, high = float(members.features.min()), float(members.features.max())
    if not low < high:
        high = low + 1.0
    trigger = make_trigger_set(
        members.input_shape, members.num_classes, triggers, seed=seed, kind=kind, low=low, high=high
    )

    def stage(name: str) -> Callable[[EpochRecord], None] | None:
        if progress is None:
            return None
        return lambda record: progress(name, record)

    net = build_model(model, members.input_shape, members.num_classes, seed=config.seed, **options)
    marked = embed_watermark(
        net,
        members,
        trigger,
        config,
        trigger_fraction=trigger_fraction,
        eval_data=nonmembers,
        progress=stage("watermarked"),
    )
    check: Verification = verify_watermark(marked.model, trigger, threshold=threshold)
    test_accuracy = accuracy(marked.model, nonmembers)
    summary: dict[str, Any] = {
        "dataset": data.name,
        "model": model,
        "out": str(out),
        "train_size": len(members),
        "test_size": len(nonmembers),
        "triggers": len(trigger),
        "trigger_kind": kind,
        "trigger_copies": marked.copies,
        "trigger_fraction": trigger_fraction,
        "num_classes": trigger.num_classes,
        "test_accuracy": test_accuracy,
        "trigger_accuracy": check.trigger_accuracy,
        "matches": check.matches,
        "p_value": check.p_value,
        "owned": check.owned,
        "threshold": check.threshold,
        "baseline_test_accuracy": None,
        "accuracy_cost": None,
        "baseline": None,
        "paper": trigger.paper,
        "note": None
        if check.owned
        else (
            f"the watermark is not verifiable on the watermarked model itself "
            f"({check.matches}/{len(trigger)} triggers, p = {check.p_value:.3g} >= "
            f"{check.threshold:g}): train longer or raise the trigger fraction"
        ),
    }
    out = Path(out)
    if baseline:
        plain = build_model(
            model, members.input_shape, members.num_classes, seed=config.seed, **options
        )
        plain = train(plain, members, config, nonmembers, progress=stage("baseline")).model
        null = verify_watermark(plain, trigger, threshold=threshold)
        baseline_accuracy = accuracy(plain, nonmembers)
        summary["baseline_test_accuracy"] = baseline_accuracy
        summary["accuracy_cost"] = baseline_accuracy - test_accuracy
        summary["baseline"] = {
            "out": str(out / BASELINE_FOLDER),
            "matches": null.matches,
            "p_value": null.p_value,
            "owned": null.owned,
        }
        save_model(
            plain,
            out / BASELINE_FOLDER,
            spec,
            {
                "data": {"name": data.name, "train_size": len(members)},
                "training": config.to_dict(),
                "summary": {"test_accuracy": baseline_accuracy, "watermarked": False},
            },
        )
    summary["seconds"] = time.monotonic() - started
    metadata = {
        "data": {"name": data.name, "train_size": len(members), "test_size": len(nonmembers)},
        "training": config.to_dict(),
        "watermark": {
            **trigger.spec(),
            "file": TRIGGER_SPEC_FILE,
            "trigger_fraction": trigger_fraction,
            "copies": marked.copies,
        },
        "summary": summary,
    }
    save_model(marked.model, out, spec, metadata)
    save_trigger_set(trigger, out)
    return summary
