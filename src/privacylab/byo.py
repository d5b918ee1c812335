"""Bring your own model and data: the full membership report for a model you trained yourself.

What you give:

- the model: a *factory* that builds a fresh, untrained instance — `"package.module:make_net"`,
  `"path/to/file.py:make_net"` or the function itself — and the trained weights (a safetensors
  file, or the trained `nn.Module`);
- the data: `x_train, y_train, x_test, y_test` (an .npz file, a folder of .npy files, a
  `Dataset` with a canonical cut, or the four arrays); the training rows are the members;
- how the model was trained, so that reference models can be trained the same way: a `TrainConfig`
  (or its dict, or the `training` entry `privacylab train` writes) for the project's trainer, or
  your own loop `train_fn(model, x, y)`.

What you get: the same game, attacks, metrics and HTML/JSON report as `privacylab run`
(Carlini et al. 2022's membership game; `privacylab.experiment.model_game`), for one target.
From the command line: `privacylab run --model-factory pkg.module:make_net --weights
net.safetensors --data data.npz`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from privacylab.attacks.membership.references import Recipe, TrainFn
from privacylab.attacks.membership.result import AttackError
from privacylab.data import Dataset, load_dataset
from privacylab.data.arrays import save_arrays
from privacylab.experiment import Progress, RunConfig, model_game, run_experiment
from privacylab.models.factory import absolute_reference, build_from_factory, load_weights
from privacylab.models.storage import shape_mismatch
from privacylab.report.verdict import check_threshold
from privacylab.training import PrivacyConfig, TrainConfig

DataLike = Dataset | str | Path | tuple[Any, Any, Any, Any]
Factory = str | Callable[..., nn.Module]


def callable_reference(fn: Callable[..., Any]) -> str:
    """`module:qualname` of a module-level function; a function of the running script is named by
    the script's file, so worker processes and later runs can import it."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if not module or not qualname or "<" in qualname:
        raise AttackError(
            f"{fn!r} must be a module-level function (not a lambda or a nested function), so "
            "that worker processes can import it"
        )
    if module in ("__main__", "__mp_main__"):
        main_file = getattr(sys.modules.get(module), "__file__", None)
        if main_file is None:
            raise AttackError(
                f"{qualname} is defined in an interactive session; put it in a .py file"
            )
        return f"{Path(main_file).resolve()}:{qualname}"
    return f"{module}:{qualname}"


def _factory(factory: Factory) -> str:
    if isinstance(factory, str):
        return absolute_reference(factory)
    if callable(factory):
        return callable_reference(factory)
    raise AttackError(f"model_factory must be 'module:function' or a function, got {factory!r}")


def _dataset(data: DataLike, cache: Path) -> tuple[Dataset, str]:
    """The dataset and a name worker processes can load it by (a path to arrays)."""
    if isinstance(data, (str, Path)):
        path = str(Path(data).expanduser().resolve())
        return load_dataset(path), path
    if isinstance(data, Dataset):
        if data.train_size is None:
            raise AttackError(
                "the dataset has no train/test cut: give x_train, y_train, x_test, y_test"
            )
        n = data.train_size
        arrays: tuple[Any, ...] = (
            data.features[:n],
            data.labels[:n],
            data.features[n:],
            data.labels[n:],
        )
        num_classes: int | None = data.num_classes
    elif isinstance(data, tuple) and len(data) == 4:
        arrays, num_classes = data, None
    else:
        raise AttackError("data must be a path, a Dataset or (x_train, y_train, x_test, y_test)")
    cache.mkdir(parents=True, exist_ok=True)
    path = str(save_arrays(cache / "data.npz", *arrays, num_classes=num_classes).resolve())
    return load_dataset(path), path


def _recipe(
    recipe: TrainConfig | dict[str, Any] | None, train_fn: TrainFn | None, seed: int
) -> dict[str, Any]:
    if (recipe is None) == (train_fn is None):
        raise AttackError(
            "say how the references are trained: give exactly one of recipe (a TrainConfig) "
            "or train_fn(model, x, y)"
        )
    if train_fn is not None:
        return {"train_fn": callable_reference(train_fn), "seed": seed}
    config = recipe if isinstance(recipe, TrainConfig) else TrainConfig.from_dict(dict(recipe))
    return config.validate().to_dict()


def _preflight(reference: str, data: Dataset, train: dict[str, Any], model: nn.Module) -> None:
    """Refuse, in this process and before any reference is trained, what would fail in a
    worker: a factory whose model does not take the data or does not return (n, classes), and a
    DP recipe for a model the DP engine cannot clip (BatchNorm; a layer without a ghost rule)."""
    fresh = build_from_factory(reference, data.input_shape, data.num_classes, seed=0)
    for net, what in ((fresh, "a fresh model from the factory"), (model, "your trained model")):
        net.eval()
        try:
            with torch.no_grad():
                out = net(data.features[:2].to(next(net.parameters(), torch.empty(0)).device))
        except Exception as error:
            raise AttackError(
                f"{what} fails on two rows of the data of shape "
                f"{tuple(data.features[:2].shape)}: {type(error).__name__}: {error}"
            ) from None
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, data.num_classes):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise AttackError(
                f"{what} returns {shape} for 2 rows; expected (2, {data.num_classes}) scores"
            )
    problems = shape_mismatch(
        {k: tuple(v.shape) for k, v in fresh.state_dict().items()},
        {k: tuple(v.shape) for k, v in model.state_dict().items()},
    )
    if problems:
        raise AttackError(f"your trained model and the factory's differ: {'; '.join(problems)}")
    privacy = train.get("privacy")
    if train.get("train_fn") is None and privacy:
        from privacylab.training.dp.engine import check_no_batch_norm
        from privacylab.training.dp.ghost.clipper import ghost_layers

        check_no_batch_norm(fresh)
        if privacy.get("clipping", "ghost") == "ghost":
            _, problems = ghost_layers(fresh)
            if problems:
                raise AttackError(problems[0])


def own_model_config(
    *,
    attacks: Sequence[str] | None = None,
    references: int = 8,
    subsample: int = 200,
    workers: int = 2,
    seed: int = 0,
    device: str = "cpu",
    quick: bool = False,
) -> RunConfig:
    """The `RunConfig` of a report on one user model: no targets of its own and no audits of
    the project's DP-SGD (those describe our training, not yours)."""
    options: dict[str, Any] = {
        "epsilons": (),
        "nonprivate": True,
        "references": references,
        "workers": workers,
        "seed": seed,
        "device": device,
        "audits": (),
        "subsample": subsample,
    }
    if attacks is not None:
        options["attacks"] = tuple(attacks)
    return (RunConfig.quick(**options) if quick else RunConfig(**options)).validate()


def report_own_model(
    model_factory: Factory,
    data: DataLike,
    out: str | Path,
    *,
    weights: str | Path | None = None,
    model: nn.Module | None = None,
    recipe: TrainConfig | dict[str, Any] | None = None,
    train_fn: TrainFn | None = None,
    outputs: str = "logits",
    epsilon: float | None = None,
    name: str = "your-model",
    config: RunConfig | None = None,
    cache: str | Path | None = None,
    progress: Progress | None = None,
    verdict_threshold: float = 0.002,
) -> dict[str, Any]:
    """Attack your trained model with the membership suite and write the report to `out`.

    The trained model is `model`, or a fresh `model_factory()` filled with `weights`. References
    are fresh `model_factory()` models trained by `recipe` (the project's trainer; DP-SGD if it
    has a privacy section) or by `train_fn(model, x, y)`; they are stored in `cache` (default
    `out/cache`) as each finishes, so a killed run resumes. `outputs` says what the model returns:
    "logits" (checked) or "probabilities" (a model ending in softmax). `epsilon` is the ε you claim
    for the model, shown beside the attacks' ε lower bounds. The verdict fails the model when an
    attack finds more than `verdict_threshold` of members at 0.1% FPR. Returns the report payload
    (`results.json`).
    """
    check_threshold(verdict_threshold)
    if outputs not in ("logits", "probabilities"):
        raise AttackError(f"outputs must be logits or probabilities, got {outputs!r}")
    config = config if config is not None else own_model_config()
    out = Path(out)
    cache_dir = Path(cache) if cache is not None else out / "cache"
    dataset, data_name = _dataset(data, cache_dir)
    reference = _factory(model_factory)
    if model is None:
        if weights is None:
            raise AttackError("give the trained model or its weights file")
        model = load_weights(
            build_from_factory(reference, dataset.input_shape, dataset.num_classes), weights
        )
    elif not isinstance(model, nn.Module):
        raise AttackError(f"model must be a torch nn.Module, got {type(model).__name__}")
    train = _recipe(recipe, train_fn, config.seed)
    _preflight(reference, dataset, train, model)
    game = model_game(
        model,
        dataset,
        Recipe(data_name, reference, train, {}, None),
        references=config.references,
        cache=cache_dir,
        workers=config.workers,
        seed=config.seed,
        name=name,
        epsilon=epsilon,
        outputs=outputs,
        train_fn=train_fn,
        device=config.device,
        progress=progress,
    )
    config.dataset, config.model, config.model_options = data_name, reference, {}
    return run_experiment(
        config,
        out,
        cache=cache_dir,
        progress=progress,
        games=[game],
        verdict_threshold=verdict_threshold,
    )


def recipe_from_options(
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    optimizer: str = "momentum",
    epsilon: float | None = None,
    delta: float = 1e-5,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    device: str = "cpu",
) -> TrainConfig:
    """The project trainer's configuration from the few options a user states on the CLI."""
    privacy = (
        PrivacyConfig(epsilon=epsilon, delta=delta, max_grad_norm=max_grad_norm)
        if epsilon is not None
        else None
    )
    return TrainConfig(
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        optimizer=optimizer,
        seed=seed,
        device=device,
        privacy=privacy,
    ).validate()
