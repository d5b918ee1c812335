"""A whole training run by names: load the data, build the model, train, save — what
`privacylab train` does, usable from Python too."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from privacylab.data import load_dataset, split_train_test
from privacylab.models import ModelSpec, build_model, save_model
from privacylab.training.config import TrainConfig, TrainingError
from privacylab.training.dp.validate import fix as fix_model
from privacylab.training.dp.validate import validate
from privacylab.training.hooks import Callback, Regularizer
from privacylab.training.trainer import EpochRecord, train


def train_job(
    dataset: str,
    model: str,
    config: TrainConfig,
    out: str | Path,
    *,
    root: str | Path | None = None,
    model_options: dict[str, Any] | None = None,
    progress: Callable[[EpochRecord], None] | None = None,
    regularizer: Regularizer | None = None,
    callbacks: Iterable[Callback] = (),
    fix: bool = False,
    notes: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train `model` on the canonical train part of `dataset`, evaluate on its test part, and
    save the model (safetensors + JSON sidecar) to `out`; returns the run's summary.

    The state is checkpointed under `out/checkpoint` after each epoch, so a killed run resumes.
    A private run's sidecar holds ``metadata["privacy_event"]``: the JSON form of the composed
    privacy event the run executed, which `privacylab.training.reaccount` bounds again.
    `regularizer` and `callbacks` are passed to `train` (see `privacylab.training.hooks`).

    A private run first validates the model for DP-SGD (`privacylab.training.dp.validate`) and
    passes each finding to `notes`; with `fix` the model is replaced by its fixed copy
    (BatchNorm -> GroupNorm, stock recurrent/attention layers -> DP drop-ins) and the saved
    spec records the ``"dp-fix"`` transform, so `load_model` rebuilds the same architecture.
    """
    config.validate()
    data = load_dataset(dataset, root)
    members, nonmembers = split_train_test(data, seed=config.seed)
    options = dict(model_options or {})
    spec = ModelSpec(model, members.input_shape, members.num_classes, options)
    net = build_model(model, members.input_shape, members.num_classes, seed=config.seed, **options)
    if config.privacy is not None:
        findings = validate(net)
        if notes is not None:
            for finding in findings:
                notes(finding.line())
        blocking = [f for f in findings if f.blocking]
        if fix and findings:
            spec = replace(spec, transforms=("dp-fix",))
            net = fix_model(net)
        elif blocking:
            first = blocking[0]
            hint = (
                "; add --fix (Python: train_job(..., fix=True)) to apply it"
                if first.fix is not None
                else ""
            )
            raise TrainingError(f"DP-SGD cannot train {first.line()}{hint}")
    out = Path(out)
    result = train(
        net,
        members,
        config,
        nonmembers,
        checkpoint_dir=out / "checkpoint",
        progress=progress,
        regularizer=regularizer,
        callbacks=callbacks,
    )
    last = result.history[-1] if result.history else None
    privacy = result.privacy
    summary: dict[str, Any] = {
        "dataset": data.name,
        "model": model,
        "train_size": len(members),
        "test_size": len(nonmembers),
        "epochs_run": len(result.history),
        "train_accuracy": last.train_accuracy if last else None,
        "test_accuracy": last.eval_accuracy if last else None,
        "private": privacy is not None,
        "epsilon": privacy.epsilon if privacy else None,
        "delta": privacy.delta if privacy else None,
        "accountant": privacy.accountant if privacy else None,
        "noise_multiplier": privacy.noise_multiplier if privacy else None,
        "sample_rate": privacy.sample_rate if privacy else None,
        "steps": privacy.steps if privacy else None,
        "max_grad_norm": privacy.max_grad_norm if privacy else None,
        "note": privacy.note if privacy else None,
        "stopped": result.stopped,
        "out": str(out),
    }
    metadata = {
        "data": {"name": data.name, "train_size": len(members), "test_size": len(nonmembers)},
        "training": config.to_dict(),
        "result": result.to_dict(),
        "summary": summary,
        "privacy_event": privacy.event if privacy else None,
    }
    save_model(net, out, spec, metadata)
    return summary
