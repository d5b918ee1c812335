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
    epochs: Annotated[int, typer.Option("--epochs", help="Epochs.")] = 30,
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Batch size (expected size under Poisson sampling).")
    ] = 256,
    lr: Annotated[float, typer.Option("--lr", help="Learning rate.")] = 0.1,
    optimizer: Annotated[
        str, typer.Option("--optimizer", help="sgd, momentum or adam.")
    ] = "momentum",
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
    max_grad_norm: Annotated[float, typer.Option("--max-grad-norm", help="Clipping norm C.")] = 1.0,
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
    seed: Annotated[int, typer.Option("--seed")] = 0,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Train a model, privately with DP-SGD (Abadi et al. 2016, Alg. 1) when --dp is given;
    writes OUT/model.safetensors and OUT/model.json, and resumes from OUT/checkpoint."""

    def run() -> None:
        from privacylab.training.config import PrivacyConfig, TrainConfig
        from privacylab.training.job import train_job

        _writable_folder(out)
        if root is not None and not root.is_dir():
            raise ValueError(f"--root {root} is not a folder")
        _learning_rate(lr)
        _whole_in(epochs, "--epochs", 1, MAX_EPOCHS)
        _whole_in(batch_size, "--batch-size", 1, 10**7)
        _whole_in(seed, "--seed", 0, 2**63 - 1)
        _device(device)
        privacy = None
        if dp:
            _accountant_name(accountant, ("pld", "rdp", "rdp-classic"))
            if epsilon is not None:
                check.target_epsilon(epsilon, "--epsilon")
            if noise_multiplier is not None:
                check.noise_multiplier(noise_multiplier, "--noise-multiplier")
            if physical_batch_size is not None:
                _whole_in(physical_batch_size, "--physical-batch-size", 1, 10**7)
            privacy = PrivacyConfig(
                epsilon=epsilon,
                noise_multiplier=noise_multiplier,
                delta=delta,
                max_grad_norm=max_grad_norm,
                clipping=clipping,
                sampling=sampling,
                accountant=accountant,
                per_layer=per_layer,
                physical_batch_size=physical_batch_size,
                secure_noise=secure_noise,
            )
        elif epsilon is not None or noise_multiplier is not None:
            raise ValueError("--epsilon and --noise-multiplier need --dp")
        config = TrainConfig(
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            optimizer=optimizer,
            schedule=schedule,
            weight_decay=weight_decay,
            label_smoothing=label_smoothing,
            augmentation=augment,
            seed=seed,
            device=device,
            privacy=privacy,
        ).validate()
        options: dict[str, Any] = {}
        if (w := _widths(widths)) is not None:
            options["widths"] = w
        if activation is not None:
            options["activation"] = activation
        if norm is not None:
            options["norm"] = norm
        _model_fits(dataset, model, options, root)
        console = _stderr()
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
                    f"  test acc {record.eval_accuracy:.4f}"
                    if record.eval_accuracy is not None
                    else ""
                )
                bar.console.print(
                    f"epoch {record.epoch}/{epochs}  train acc {record.train_accuracy:.4f}"
                    f"{acc}{eps}"
                )
                bar.update(task, completed=record.epoch)

            summary = train_job(
                dataset, model, config, out, root=root, model_options=options, progress=report
            )
        if json_output:
            _emit_json(summary)
            return
        line = f"test accuracy {summary['test_accuracy']:.4f} ({summary['dataset']}, {model})"
        if summary["private"]:
            line += (
                f"  ε = {summary['epsilon']:.4g} at δ = {summary['delta']:g}"
                f" [{summary['accountant']}]"
                f"  σ = {summary['noise_multiplier']:.4g}, q = {summary['sample_rate']:.4g}, "
                f"{summary['steps']} steps, C = {summary['max_grad_norm']:g}"
            )
        typer.echo(line)
        if summary["note"]:
            typer.echo(f"note: {summary['note']}")
        _say(console, f"wrote {out}")

    _guarded(run)
