"""`privacylab watermark embed|verify`: ownership watermarks (Adi et al. 2018) — train a model
with a secret trigger set, then test whether a suspect model was derived from it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from privacylab.cli._common import (
    MAX_EPOCHS,
    JsonOpt,
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

watermark_app = typer.Typer(
    help="Ownership watermarks (Adi et al. 2018): embed a trigger set while training, verify a "
    "suspect model with an exact binomial test.",
    no_args_is_help=True,
)
app.add_typer(watermark_app, name="watermark")


def _threshold(value: float) -> float:
    import math

    if not (math.isfinite(value) and 0.0 < value < 1.0):
        raise ValueError(f"--threshold must lie in (0, 1), got {value!r}")
    return value


@watermark_app.command("embed")
def embed_command(
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Folder for the watermarked model and its trigger set.", parser=_path_arg
        ),
    ],
    dataset: Annotated[str, typer.Option("--dataset", help="Dataset name.")] = "digits",
    model: Annotated[str, typer.Option("--model", help="Model name.")] = "mlp",
    widths: Annotated[
        str | None, typer.Option("--widths", help="Hidden widths, e.g. 512,256.")
    ] = None,
    triggers: Annotated[
        int, typer.Option("--triggers", help="Trigger inputs n (random labels).")
    ] = 100,
    kind: Annotated[
        str, typer.Option("--kind", help="Trigger inputs: noise or patterns (abstract blocks).")
    ] = "noise",
    trigger_fraction: Annotated[
        float,
        typer.Option(
            "--trigger-fraction",
            help="Share of each batch (in expectation) that are trigger rows (oversampling).",
        ),
    ] = 0.1,
    trigger_seed: Annotated[
        int | None,
        typer.Option("--trigger-seed", help="Seed of the trigger set [the training seed]."),
    ] = None,
    epochs: Annotated[int, typer.Option("--epochs", help="Training epochs.")] = 30,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 256,
    lr: Annotated[float, typer.Option("--lr", help="Learning rate.")] = 0.1,
    optimizer: Annotated[str, typer.Option("--optimizer", help="sgd, momentum or adam.")] = (
        "momentum"
    ),
    baseline: Annotated[
        bool,
        typer.Option(
            "--baseline/--no-baseline",
            help="Also train the unwatermarked model of the same recipe (OUT/baseline) for the "
            "accuracy cost.",
        ),
    ] = True,
    threshold: Annotated[
        float, typer.Option("--threshold", help="p-value below which a model is claimed.")
    ] = 1e-3,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Train a model on its training set plus a secret trigger set of abstract inputs with
    random labels (Adi et al. 2018, FromScratch); writes OUT/model.safetensors, OUT/model.json,
    the trigger set OUT/watermark.safetensors + OUT/watermark.json and, unless --no-baseline,
    the unwatermarked model OUT/baseline."""

    def run() -> None:
        from privacylab.byo import recipe_from_options
        from privacylab.defenses.watermark import TRIGGER_KINDS, trigger_copies, watermark_job

        _writable_folder(out)
        if root is not None and not root.is_dir():
            raise ValueError(f"--root {root} is not a folder")
        _whole_in(triggers, "--triggers", 1, 100_000)
        _whole_in(epochs, "--epochs", 1, MAX_EPOCHS)
        _whole_in(batch_size, "--batch-size", 1, 10**7)
        _whole_in(seed, "--seed", 0, 2**63 - 1)
        if trigger_seed is not None:
            _whole_in(trigger_seed, "--trigger-seed", 0, 2**63 - 1)
        _learning_rate(lr)
        _threshold(threshold)
        _device(device)
        if kind not in TRIGGER_KINDS:
            raise ValueError(f"unknown --kind {kind!r}; choose one of {', '.join(TRIGGER_KINDS)}")
        trigger_copies(1, 1, trigger_fraction)  # checks the fraction
        options: dict[str, Any] = {}
        if (w := _widths(widths)) is not None:
            options["widths"] = w
        config = recipe_from_options(
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            optimizer=optimizer,
            seed=seed,
            device=device,
        )
        _model_fits(dataset, model, options, root)
        console = _stderr()

        def report(stage: str, record: Any) -> None:
            acc = (
                f"  test acc {record.eval_accuracy:.4f}" if record.eval_accuracy is not None else ""
            )
            _say(
                console,
                f"{stage}: epoch {record.epoch}/{epochs}  train acc "
                f"{record.train_accuracy:.4f}{acc}",
            )

        summary = watermark_job(
            dataset,
            model,
            config,
            out,
            root=root,
            model_options=options,
            triggers=triggers,
            kind=kind,
            trigger_seed=trigger_seed,
            trigger_fraction=trigger_fraction,
            baseline=baseline,
            threshold=threshold,
            progress=report if console.is_terminal else None,
        )
        if json_output:
            _emit_json(summary)
            return
        line = (
            f"watermarked: test accuracy {summary['test_accuracy']:.4f}, trigger accuracy "
            f"{summary['trigger_accuracy']:.2f} ({summary['matches']}/{summary['triggers']}, "
            f"p = {summary['p_value']:.3g})"
        )
        if summary["baseline_test_accuracy"] is not None:
            line += (
                f"; unwatermarked {summary['baseline_test_accuracy']:.4f}: accuracy cost "
                f"{summary['accuracy_cost']:+.4f}"
            )
        typer.echo(line)
        if summary["note"]:
            typer.echo(f"note: {summary['note']}")
        _say(console, f"wrote {out}")

    _guarded(run)


@watermark_app.command("verify")
def verify_command(
    model: Annotated[
        Path,
        typer.Option(
            "--model",
            help="Folder of the watermarked model (written by `watermark embed`): its trigger "
            "set is read from there.",
            parser=_path_arg,
        ),
    ],
    suspect: Annotated[
        Path,
        typer.Option("--suspect", help="Folder of the suspect model.", parser=_path_arg),
    ],
    threshold: Annotated[
        float, typer.Option("--threshold", help="p-value below which the suspect is claimed.")
    ] = 1e-3,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Ask the suspect's labels on the trigger set and test them: p = P[Binomial(n, 1/K) >= k]
    for k matches of n triggers and K classes; the suspect is owned when p < --threshold."""

    def run() -> None:
        from privacylab.defenses.watermark import WatermarkError, load_trigger_set
        from privacylab.defenses.watermark import verify_watermark as verify
        from privacylab.models import load_model
        from privacylab.target import Access, Target

        _threshold(threshold)
        _device(device)
        trigger = load_trigger_set(model)
        net, spec, _ = load_model(suspect, device=device)
        if tuple(spec.input_shape) != trigger.input_shape:
            raise WatermarkError(
                f"the suspect takes inputs of shape {tuple(spec.input_shape)} but the trigger "
                f"set has {trigger.input_shape}"
            )
        target = Target(net, Access.LABEL, spec.num_classes, device=device)
        result = verify(target, trigger, threshold=threshold)
        payload = {**result.to_dict(), "model": str(model), "suspect": str(suspect)}
        if json_output:
            _emit_json(payload)
            return
        verdict = "owned" if result.owned else "not shown to be a copy"
        typer.echo(
            f"{verdict}: {result.matches}/{result.triggers} trigger labels matched (chance "
            f"1/{result.num_classes}), p = {result.p_value:.3g} "
            f"{'<' if result.owned else '>='} {result.threshold:g}"
        )

    _guarded(run)
