"""`privacylab train`: train a zoo model, privately with DP-SGD when asked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from privacylab.accounting import _validate as check
from privacylab.cli._common import (
    MAX_EPOCHS,
    JsonOpt,
    _accountant_name,
    _device,
    _emit_json,
    _guarded,
    _learning_rate,
    _model_fits,
    _path_arg,
    _say,
    _stderr,
    _whole_in,
    _widths,
    _writable_folder,
    app,
)


@app.command("train")
def train_command(
    out: Annotated[
        Path,
        typer.Option("--out", help="Folder for the model and checkpoints.", parser=_path_arg),
    ],
    dataset: Annotated[str, typer.Option("--dataset", help="Dataset name.")] = "mnist5k",
    model: Annotated[str, typer.Option("--model", help="Model name.")] = "mlp",
    epochs: Annotated[
        int | None,
        typer.Option("--epochs", help="Epochs [30; with --dp --epsilon: chosen from ε]."),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            help="Batch size (expected size under Poisson sampling) [256; with --dp --epsilon: "
            "chosen from ε and the data size].",
        ),
    ] = None,
    lr: Annotated[
        float | None,
        typer.Option("--lr", help="Learning rate [0.1; with --dp --epsilon: 0.1/C]."),
    ] = None,
    optimizer: Annotated[
        str | None, typer.Option("--optimizer", help="sgd, momentum or adam [momentum].")
    ] = None,
    schedule: Annotated[
        str, typer.Option("--schedule", help="constant, cosine or step.")
    ] = "constant",
    weight_decay: Annotated[float, typer.Option("--weight-decay")] = 0.0,
    label_smoothing: Annotated[float, typer.Option("--label-smoothing")] = 0.0,
    augment: Annotated[
        bool, typer.Option("--augment", help="Random rotations and shifts.")
    ] = False,
    widths: Annotated[
        str | None, typer.Option("--widths", help="Hidden widths, e.g. 512,256.")
    ] = None,
    activation: Annotated[
        str | None, typer.Option("--activation", help="relu, tanh or sigmoid.")
    ] = None,
    norm: Annotated[
        str | None, typer.Option("--norm", help="cnn normalisation: group (BatchNorm is refused).")
    ] = None,
    dp: Annotated[bool, typer.Option("--dp", help="Train with DP-SGD.")] = False,
    epsilon: Annotated[
        float | None, typer.Option("--epsilon", help="Target ε (σ is calibrated).")
    ] = None,
    noise_multiplier: Annotated[
        float | None, typer.Option("--noise-multiplier", help="σ (instead of --epsilon).")
    ] = None,
    delta: Annotated[float, typer.Option("--delta", help="δ, in (0, 1).")] = 1e-5,
    max_grad_norm: Annotated[
        float | None, typer.Option("--max-grad-norm", help="Clipping norm C [1].")
    ] = None,
    clipping: Annotated[
        str, typer.Option("--clipping", help="ghost, per_sample or auto.")
    ] = "ghost",
    sampling: Annotated[str, typer.Option("--sampling", help="poisson or shuffle.")] = "poisson",
    per_layer: Annotated[
        bool, typer.Option("--per-layer", help="Per-layer clipping (C/sqrt(K) per tensor).")
    ] = False,
    physical_batch_size: Annotated[
        int | None,
        typer.Option("--physical-batch-size", help="Micro-batch size (virtual batches)."),
    ] = None,
    secure_noise: Annotated[
        bool, typer.Option("--secure-noise", help="Noise from the OS CSPRNG (not seedable).")
    ] = False,
    accountant: Annotated[str, typer.Option("--accountant", help="pld or rdp.")] = "pld",
    tune: Annotated[
        int | None,
        typer.Option(
            "--tune",
            help="Private random search with about N trials (Papernot & Steinke 2022); the "
            "ε reported includes the tuning. Needs --dp --epsilon.",
        ),
    ] = None,
    vocab_size: Annotated[
        int | None,
        typer.Option("--vocab-size", help="transformer: token vocabulary [from the dataset]."),
    ] = None,
    max_len: Annotated[
        int | None,
        typer.Option("--max-len", help="transformer: positions learned [the sequence length]."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    fix: Annotated[
        bool,
        typer.Option(
            "--fix",
            help="With --dp: make the model trainable by DP-SGD (BatchNorm -> GroupNorm, "
            "LSTM/GRU/RNN/MultiheadAttention -> DP drop-ins); the changes are printed.",
        ),
    ] = False,
    json_output: JsonOpt = False,
) -> None:
    """Train a model, privately with DP-SGD (Abadi et al. 2016, Alg. 1) when --dp is given;
    writes OUT/model.safetensors and OUT/model.json, and resumes from OUT/checkpoint."""

    def run() -> None:
        from privacylab.training.config import PrivacyConfig, TrainConfig

        _writable_folder(out)
        if root is not None and not root.is_dir():
            raise ValueError(f"--root {root} is not a folder")
        if lr is not None:
            _learning_rate(lr)
        if epochs is not None:
            _whole_in(epochs, "--epochs", 1, MAX_EPOCHS)
        if batch_size is not None:
            _whole_in(batch_size, "--batch-size", 1, 10**7)
        _whole_in(seed, "--seed", 0, 2**63 - 1)
        _device(device)
        if fix and not dp:
            raise ValueError("--fix prepares a model for DP-SGD; add --dp")
        if fix and tune is not None:
            raise ValueError("--fix cannot be combined with --tune; fix the model first")
        if tune is not None:
            _whole_in(tune, "--tune", 2, 1000)
            if not dp or epsilon is None:
                raise ValueError(
                    "--tune needs --dp --epsilon E (the total budget, tuning included)"
                )
            if noise_multiplier is not None:
                raise ValueError("--tune calibrates the noise itself; drop --noise-multiplier")
            if sampling != "poisson":
                raise ValueError("--tune is accounted for Poisson sampling only")
        for value, name in ((vocab_size, "--vocab-size"), (max_len, "--max-len")):
            if value is not None:
                _whole_in(value, name, 1, 10**7)
        options: dict[str, Any] = {}
        if (w := _widths(widths)) is not None:
            options["widths"] = w
        if activation is not None:
            options["activation"] = activation
        if norm is not None:
            options["norm"] = norm
        options.update(_sequence_options(dataset, model, root, vocab_size, max_len))
        privacy = None
        chosen: dict[str, Any] | None = None
        explicit = {
            name: value
            for name, value in (
                ("epochs", epochs),
                ("batch_size", batch_size),
                ("lr", lr),
                ("optimizer", optimizer),
                ("max_grad_norm", max_grad_norm),
            )
            if value is not None
        }
        given = set(explicit)
        settings: dict[str, Any] = {
            "epochs": 30,
            "batch_size": 256,
            "lr": 0.1,
            "optimizer": "momentum",
            "max_grad_norm": 1.0,
        }
        if dp:
            _accountant_name(accountant, ("pld", "rdp", "rdp-classic"))
            if epsilon is not None:
                check.target_epsilon(epsilon, "--epsilon")
            if noise_multiplier is not None:
                check.noise_multiplier(noise_multiplier, "--noise-multiplier")
            if physical_batch_size is not None:
                _whole_in(physical_batch_size, "--physical-batch-size", 1, 10**7)
            if max_grad_norm is not None:
                check.positive("max grad norm", max_grad_norm)
            if epsilon is not None and noise_multiplier is None:
                chosen = _dp_defaults(dataset, root, epsilon, delta, max_grad_norm, given)
                settings.update({k: v for k, v in chosen.items() if k in settings})
        elif epsilon is not None or noise_multiplier is not None:
            raise ValueError("--epsilon and --noise-multiplier need --dp")
        settings.update(explicit)
        if dp:
            privacy = PrivacyConfig(
                epsilon=epsilon,
                noise_multiplier=noise_multiplier,
                delta=delta,
                max_grad_norm=settings["max_grad_norm"],
                clipping=clipping,
                sampling=sampling,
                accountant=accountant,
                per_layer=per_layer,
                physical_batch_size=physical_batch_size,
                secure_noise=secure_noise,
            )
        config = TrainConfig(
            epochs=settings["epochs"],
            batch_size=settings["batch_size"],
            lr=settings["lr"],
            optimizer=settings["optimizer"],
            schedule=schedule,
            weight_decay=weight_decay,
            label_smoothing=label_smoothing,
            augmentation=augment,
            seed=seed,
            device=device,
            privacy=privacy,
        ).validate()
        if chosen is not None and activation is None:
            from privacylab.models import model_options
            from privacylab.models.factory import is_factory

            if not is_factory(model) and "activation" in model_options(model):
                options["activation"] = chosen["activation"]
            else:
                chosen.pop("activation")
        _model_fits(dataset, model, options, root)
        console = _stderr()
        if chosen is not None:
            _say(console, _describe_defaults(chosen, epsilon, given))
        if tune is not None:
            summary = _tune(dataset, model, config, out, root, options, tune, given, console)
        else:
            summary = _train(dataset, model, config, out, root, options, console, fix)
        if chosen is not None:
            summary["defaults"] = chosen
        if json_output:
            _emit_json(summary)
            return
        line = f"test accuracy {summary['test_accuracy']:.4f} ({summary['dataset']}, {model})"
        if summary["private"]:
            line += (
                f"  ε = {summary['epsilon']:.4g} at δ = {summary['delta']:g}"
                f" [{summary['accountant']}]"
            )
            if tune is None:
                line += (
                    f"  σ = {summary['noise_multiplier']:.4g}, q = {summary['sample_rate']:.4g}, "
                    f"{summary['steps']} steps, C = {summary['max_grad_norm']:g}"
                )
        typer.echo(line)
        if tune is not None:
            tuning = summary["tuning"]
            best = tuning["best"]
            typer.echo(
                f"tuning: {tuning['trials_run']} trials (K ~ {tuning['distribution']}, "
                f"E[K] = {tuning['expected_trials']:g}); ε = {summary['epsilon']:.4g} includes "
                f"the tuning; each trial ε = {tuning['per_trial_epsilon']:.4g}"
            )
            typer.echo(
                f"best trial {best['index']}: lr {best['lr']:.4g}, C {best['max_grad_norm']:g}, "
                f"batch {best['batch_size']}, {best['epochs']} epochs, σ "
                f"{best['noise_multiplier']:.4g}; noisy validation accuracy "
                f"{best['noisy_validation_accuracy']:.4f}"
            )
            typer.echo(f"note: {tuning['unaccounted_claim']}")
        if summary["note"]:
            typer.echo(f"note: {summary['note']}")
        _say(console, f"wrote {out}")

    _guarded(run)


def _sequence_options(
    dataset: str,
    model: str,
    root: Path | None,
    vocab_size: int | None,
    max_len: int | None,
) -> dict[str, Any]:
    """Builder options a sequence model needs from its data: the transformer's vocabulary
    (`vocabulary_size` of the dataset unless --vocab-size is given) and --max-len."""
    if model != "transformer":
        if vocab_size is not None or max_len is not None:
            raise ValueError("--vocab-size and --max-len apply to --model transformer only")
        return {}
    from privacylab.data import load_dataset
    from privacylab.data.text import vocabulary_size

    data = load_dataset(dataset, root)
    if data.kind != "text":
        raise ValueError(
            f"--model transformer needs a text dataset (token ids), and {data.name} is "
            f"{data.kind}; try --dataset pydoc_topics"
        )
    needed = vocabulary_size(data)
    if vocab_size is not None and vocab_size < needed:
        raise ValueError(
            f"--vocab-size {vocab_size} is smaller than the {needed} tokens of {dataset}"
        )
    options: dict[str, Any] = {"vocab_size": vocab_size or needed}
    if max_len is not None:
        options["max_len"] = max_len
    return options


def _dp_defaults(
    dataset: str,
    root: Path | None,
    epsilon: float,
    delta: float,
    max_grad_norm: float | None,
    given: set[str],
) -> dict[str, Any]:
    """The rule's choice (`privacylab.training.defaults.dp_defaults`) for the options in its
    JSON form, with the list of options the user gave (which override it)."""
    from privacylab.data import load_dataset
    from privacylab.data.dataset import train_test_indices
    from privacylab.data.info import dataset_info
    from privacylab.training.defaults import dp_defaults

    info = dataset_info(dataset, root)
    if info.train_size is not None:
        n = info.train_size
    else:
        n = len(train_test_indices(load_dataset(dataset, root))[0])
    choice = dp_defaults(epsilon, delta, n, max_grad_norm=max_grad_norm).to_dict()
    choice["train_size"] = n
    choice["overridden"] = sorted(given)
    return choice


def _describe_defaults(chosen: dict[str, Any], epsilon: float | None, given: set[str]) -> str:
    parts = [
        f"batch size {chosen['batch_size']}",
        f"{chosen['epochs']} epochs (~{chosen['steps']} steps)",
        f"lr {chosen['lr']:g} ({chosen['optimizer']})",
        f"C {chosen['max_grad_norm']:g}",
    ]
    if "activation" in chosen:
        parts.append(f"activation {chosen['activation']}")
    line = (
        f"DP defaults for ε = {epsilon:g} on {chosen['train_size']} examples: "
        f"{', '.join(parts)}; σ calibrated. Rule: {chosen['rule']}."
    )
    if given:
        line += f" Given, so kept: {', '.join('--' + g.replace('_', '-') for g in sorted(given))}."
    return line


def _train(
    dataset: str,
    model: str,
    config: Any,
    out: Path,
    root: Path | None,
    options: dict[str, Any],
    console: Any,
    fix: bool = False,
) -> dict[str, Any]:
    from privacylab.training.job import train_job

    epochs = config.epochs
    with Progress(
        TextColumn("training"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} epochs"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task("train", total=epochs)

        def report(record: Any) -> None:
            eps = f"  ε {record.epsilon:.3f}" if record.epsilon is not None else ""
            acc = (
                f"  test acc {record.eval_accuracy:.4f}" if record.eval_accuracy is not None else ""
            )
            bar.console.print(
                f"epoch {record.epoch}/{epochs}  train acc {record.train_accuracy:.4f}{acc}{eps}"
            )
            bar.update(task, completed=record.epoch)

        return train_job(
            dataset,
            model,
            config,
            out,
            root=root,
            model_options=options,
            progress=report,
            fix=fix,
            notes=lambda line: _say(console, line),
        )


def _tune(
    dataset: str,
    model: str,
    config: Any,
    out: Path,
    root: Path | None,
    options: dict[str, Any],
    expected_trials: int,
    given: set[str],
    console: Any,
) -> dict[str, Any]:
    """`--tune N`: private random search (`privacylab.training.tuning`), then the best trial's
    model is evaluated on the test part once and saved."""
    import math

    import torch

    from privacylab.data import load_dataset, split_train_test
    from privacylab.models import ModelSpec, build_model, save_model
    from privacylab.training.tuning import private_random_search

    data = load_dataset(dataset, root)
    members, nonmembers = split_train_test(data, seed=config.seed)

    def build(seed: int) -> Any:
        return build_model(model, members.input_shape, members.num_classes, seed=seed, **options)

    result = private_random_search(
        build,
        members,
        config,
        float(expected_trials),
        fixed=given,
        progress=lambda line: _say(console, line),
    )
    net = result.model
    with torch.no_grad():
        logits = net(nonmembers.features.to(config.device))
    test_accuracy = float((logits.argmax(1).cpu() == nonmembers.labels).float().mean())
    budget = result.budget
    trials = [vars(t) for t in result.trials]
    best = vars(result.best)
    tuning = {
        "expected_trials": budget.expected_trials,
        "trials_run": len(result.trials),
        "distribution": f"truncated negative binomial (eta={budget.eta:g}, "
        f"gamma={budget.gamma:.4g})",
        "accounting": "Papernot & Steinke 2022, Theorem 2; RDP to (ε, δ): Balle et al. 2020",
        "total_epsilon": budget.total_epsilon,
        "per_trial_epsilon": budget.per_trial_epsilon,
        "score_noise": budget.score_noise,
        "train_size": result.train_size,
        "validation_size": result.validation_size,
        "best": best,
        "trials": trials,
        "unaccounted_claim": (
            f"reporting only the winning run, as an un-accounted search would, claims "
            f"ε = {budget.per_trial_epsilon:.4g}; the {len(result.trials)} trials and the "
            f"selection make it ε = {budget.total_epsilon:.4g}"
        ),
    }
    spec = ModelSpec(model, members.input_shape, members.num_classes, options)
    summary: dict[str, Any] = {
        "dataset": data.name,
        "model": model,
        "train_size": len(members),
        "test_size": len(nonmembers),
        "epochs_run": best["epochs"],
        "train_accuracy": None,
        "test_accuracy": test_accuracy if math.isfinite(test_accuracy) else None,
        "private": True,
        "epsilon": budget.total_epsilon,
        "delta": budget.delta,
        "accountant": "rdp",
        "noise_multiplier": best["noise_multiplier"],
        "sample_rate": min(1.0, best["batch_size"] / result.train_size),
        "steps": None,
        "max_grad_norm": best["max_grad_norm"],
        "note": None,
        "stopped": None,
        "out": str(out),
        "tuning": tuning,
    }
    metadata = {
        "data": {"name": data.name, "train_size": len(members), "test_size": len(nonmembers)},
        "training": config.to_dict(),
        "summary": summary,
        "privacy_event": None,
    }
    save_model(net, out, spec, metadata)
    return summary
