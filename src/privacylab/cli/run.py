"""`privacylab run`: the main job, train targets, attack them, write the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from privacylab.cli._common import (
    JsonOpt,
    _device,
    _emit_json,
    _floats,
    _guarded,
    _path_arg,
    _print_summary,
    _say,
    _Stages,
    _stderr,
    _widths,
    _writable_folder,
    app,
)


@app.command("run")
def run_command(
    out: Annotated[
        Path,
        typer.Option("--out", help="Report folder (results.json, index.html).", parser=_path_arg),
    ] = Path("privacylab-report"),
    dataset: Annotated[str, typer.Option("--dataset", help="Dataset name.")] = "mnist5k",
    model: Annotated[str, typer.Option("--model", help="Model name.")] = "mlp",
    widths: Annotated[str, typer.Option("--widths", help="Hidden widths, e.g. 256.")] = "256",
    epsilons: Annotated[
        str, typer.Option("--epsilons", help="ε of the DP-SGD targets, comma-separated.")
    ] = "1,8",
    no_nonprivate: Annotated[
        bool, typer.Option("--no-nonprivate", help="Skip the non-private target.")
    ] = False,
    attacks: Annotated[
        str | None, typer.Option("--attacks", help="Comma-separated attacks (default: all).")
    ] = None,
    references: Annotated[
        int | None, typer.Option("--references", help="Reference models per target.")
    ] = None,
    audits: Annotated[
        str,
        typer.Option("--audits", help="Audits of DP-SGD at each ε, comma-separated, or none."),
    ] = "dirac,one-run-whitebox",
    members: Annotated[
        int | None, typer.Option("--members", help="Training-set size of each target.")
    ] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", help="Training epochs.")] = None,
    workers: Annotated[int, typer.Option("--workers", help="Training processes.")] = 2,
    cache: Annotated[
        Path | None, typer.Option("--cache", help="Trained models and store (default OUT/cache).")
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="4 references, 15 epochs, 1,000 members.")
    ] = False,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    model_factory: Annotated[
        str | None,
        typer.Option(
            "--model-factory",
            help="Your model: pkg.module:make_net or file.py:make_net, returning a fresh "
            "nn.Module (needs --weights and --data).",
        ),
    ] = None,
    weights: Annotated[
        Path | None, typer.Option("--weights", help="Your trained weights (.safetensors).")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Your data: .npz (or folder of .npy) with x_train, y_train, x_test, y_test; "
            "the training rows are the members.",
        ),
    ] = None,
    outputs: Annotated[
        str, typer.Option("--outputs", help="What your model returns: logits or probabilities.")
    ] = "logits",
    recipe: Annotated[
        Path | None,
        typer.Option(
            "--recipe",
            help="How your model was trained, for its references: a JSON TrainConfig (e.g. "
            "the 'training' entry of a privacylab sidecar); else --epochs/--lr/--batch-size.",
        ),
    ] = None,
    lr: Annotated[float, typer.Option("--lr", help="Your model: references' learning rate.")] = 0.1,
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Your model: references' batch size.")
    ] = 128,
    optimizer: Annotated[
        str, typer.Option("--optimizer", help="Your model: sgd, momentum or adam.")
    ] = "momentum",
    epsilon: Annotated[
        float | None,
        typer.Option("--epsilon", help="Your model: the ε it was trained at (DP references)."),
    ] = None,
    verdict_threshold: Annotated[
        float,
        typer.Option(
            "--verdict-threshold",
            help="A target fails when an attack finds more than this fraction of members at "
            "0.1% FPR (95% confidence over all attacks).",
        ),
    ] = 0.002,
    defenses: Annotated[
        str | None,
        typer.Option(
            "--defenses",
            help="Defences evaluated on the non-private target, comma-separated (default: "
            "none,topk:1,rounding:1,label-only; 'off' for no defence section).",
        ),
    ] = None,
    max_tpr: Annotated[
        float | None,
        typer.Option(
            "--max-tpr-at-0.1",
            help="Defence release gate: a defended model passes when no attack finds more "
            "than this fraction of members at 0.1% FPR.",
        ),
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Train a non-private and DP-SGD targets, attack each with the membership suite (metric,
    shadow, LiRA, RMIA, label-only) and write the report to OUT; resumes after a kill. With
    --model-factory, --weights and --data: the same report for your own trained model."""

    def run() -> None:
        from privacylab.report.verdict import check_threshold

        check_threshold(verdict_threshold)
        _writable_folder(out)
        if cache is not None:
            _writable_folder(cache, "--cache")
        _device(device)
        if model_factory is not None or weights is not None or data is not None:
            _run_own_model()
            return
        from privacylab.experiment import DEFAULT_ATTACKS, RunConfig, run_experiment

        options: dict[str, Any] = {
            "dataset": dataset,
            "model": model,
            "model_options": {"widths": list(_widths(widths) or ())} if widths else {},
            "epsilons": _floats(epsilons, "--epsilons"),
            "nonprivate": not no_nonprivate,
            "attacks": tuple(
                a
                for a in (",".join(DEFAULT_ATTACKS) if attacks is None else attacks).split(",")
                if a
            ),
            "workers": workers,
            "seed": seed,
            "root": str(root) if root is not None else None,
            "device": device,
            "audits": tuple(a for a in audits.split(",") if a and audits != "none"),
        }
        from privacylab.defend import RUN_DEFENSES

        chosen = ",".join(RUN_DEFENSES) if defenses is None else defenses
        if chosen.strip() != "off" and not no_nonprivate:
            options["defenses"] = tuple(d for d in chosen.split(",") if d.strip())
        options["max_tpr"] = max_tpr
        for name, value in (("references", references), ("members", members), ("epochs", epochs)):
            if value is not None:
                options[name] = value
        config = RunConfig.quick(**options) if quick else RunConfig(**options)
        config.validate()
        with _Stages(_stderr()) as stages:
            payload = run_experiment(
                config,
                out.resolve(),
                cache=None if cache is None else cache.resolve(),
                progress=stages,
                verdict_threshold=verdict_threshold,
            )
        finish(payload)

    def finish(payload: dict[str, Any]) -> None:
        if json_output:
            _emit_json(payload)
            return
        _print_summary(payload)
        if payload.get("defenses"):
            from privacylab.cli.defend import print_defenses

            print_defenses(payload["defenses"])
        _say(_stderr(), f"wrote {out / 'index.html'} and {out / 'results.json'}")

    def _run_own_model() -> None:
        from privacylab.byo import own_model_config, recipe_from_options, report_own_model
        from privacylab.experiment import DEFAULT_ATTACKS

        if model_factory is None or weights is None or data is None:
            raise ValueError("your own model needs all of --model-factory, --weights and --data")
        if recipe is not None:
            try:
                train = json.loads(Path(recipe).read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
                raise ValueError(f"cannot read recipe {recipe}: {error}") from None
            if not isinstance(train, dict):
                raise ValueError(f"recipe {recipe} must hold a JSON object")
        else:
            train = recipe_from_options(
                epochs=epochs if epochs is not None else (15 if quick else 30),
                batch_size=batch_size,
                lr=lr,
                optimizer=optimizer,
                epsilon=epsilon,
                seed=seed,
                device=device,
            ).to_dict()
        names = tuple(
            a for a in (",".join(DEFAULT_ATTACKS) if attacks is None else attacks).split(",") if a
        )
        config = own_model_config(
            attacks=names,
            references=references if references is not None else (4 if quick else 8),
            workers=workers,
            seed=seed,
            device=device,
            quick=quick,
        )
        with _Stages(_stderr()) as stages:
            payload = report_own_model(
                model_factory,
                data,
                out,
                weights=weights,
                recipe=train,
                outputs=outputs,
                epsilon=epsilon,
                config=config,
                cache=cache,
                progress=stages,
                verdict_threshold=verdict_threshold,
            )
        finish(payload)

    _guarded(run)
