"""`privacylab attack property`: infer a global property of a model's training set with the
registered property-inference attacks (`privacylab.infer_property`, Ganju et al. 2018).

One method prints the flat object (`method`, `property`, `accuracy`, `auc`, `chance`,
`queries`, ...); several (comma-separated) print `{"property": ..., "attacks": [...]}`.
With `--out`, `results.json` and `index.html` (section `#property-inference`) are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from privacylab.cli._common import (
    JsonOpt,
    _device,
    _emit_json,
    _guarded,
    _path_arg,
    _Stages,
    _stderr,
    _widths,
    _writable_folder,
)
from privacylab.cli._reports import check_paths, print_summary
from privacylab.cli.attack import attack_app
from privacylab.errors import PrivacylabError

SUMMARY = (
    ("method", "method"),
    ("accuracy", "accuracy"),
    ("auc", "AUC"),
    ("chance", "chance"),
    ("p_value", "p (vs chance)"),
    ("targets", "targets"),
    ("queries", "queries"),
    ("seconds", "seconds"),
)
"""(key, header) of the terminal summary."""

FACTS = (
    "property",
    "dataset",
    "model",
    "shadows_per_world",
    "train_size",
    "models_trained",
    "models_from_store",
)
"""Facts of the run copied into the flat JSON object."""


def _payload(result: dict[str, Any]) -> dict[str, Any]:
    """The CLI's JSON: one method flat, several under `attacks`."""
    block = result["property_inference"]
    facts = {k: block.get(k) for k in FACTS}
    rows = [dict(r) for r in block["attacks"]]
    if len(rows) == 1:
        return {**rows[0], **facts}
    return {**facts, "attacks": rows}


@attack_app.command("property")
def attack_property_command(
    dataset: Annotated[
        str, typer.Option("--dataset", help="Dataset (digits, mnist5k, ...).")
    ] = "digits",
    property_spec: Annotated[
        str,
        typer.Option(
            "--property",
            help="class-share:C:LOW:HIGH (share of class C: LOW in world 0, HIGH in world 1) "
            "or row-parity (a control the data does not vary in).",
        ),
    ] = "class-share:0:0.1:0.5",
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="property-whitebox (Ganju et al.'s permutation-invariant meta-classifier on "
            "the weights) or property-blackbox (on probability vectors); comma-separated for "
            "both.",
        ),
    ] = "property-whitebox",
    shadows: Annotated[int, typer.Option("--shadows", help="Shadow models per world.")] = 8,
    targets: Annotated[
        int, typer.Option("--targets", help="Evaluation targets, half per world (even).")
    ] = 6,
    model: Annotated[str, typer.Option("--model", help="Architecture (mlp, cnn, ...).")] = "mlp",
    widths: Annotated[
        str | None,
        typer.Option("--widths", help="Hidden widths of the mlp, e.g. 16 or 32,16 (default 16)."),
    ] = None,
    train_size: Annotated[
        int | None,
        typer.Option(
            "--train-size", help="Rows per training set (default: the largest <= 200 that fits)."
        ),
    ] = None,
    epochs: Annotated[int, typer.Option("--epochs", help="Training epochs of every model.")] = 10,
    queries: Annotated[
        int, typer.Option("--queries", help="Black-box query set size (per target).")
    ] = 64,
    seed: Annotated[int, typer.Option("--seed", help="Seed of splits, models, attacks.")] = 0,
    cache: Annotated[
        Path | None,
        typer.Option(
            "--cache",
            help="Trained models and result store (default OUT/property-cache, else "
            "./property-cache); a re-run resumes from it.",
            parser=_path_arg,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write results.json and index.html here.", parser=_path_arg),
    ] = None,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Infer a property of a model's training set (Ganju et al. 2018): shadow models trained
    with and without it teach a meta-classifier, measured on evaluation targets of known
    worlds (accuracy, AUC, chance). Models are stored as they finish; a re-run resumes."""

    def run() -> None:
        from privacylab.infer_property import cache_folder, run_property

        if model == "mlp":
            options: dict[str, Any] = {"widths": list(_widths(widths) or (16,))}
        elif widths is not None:
            raise PrivacylabError("--widths is for --model mlp only")
        else:
            options = {}
        check_paths(root=root, out=out)
        store = cache_folder(cache, out)
        _writable_folder(store, "--cache")
        with _Stages(_stderr()) as stages:
            result = run_property(
                dataset=dataset,
                property=property_spec,
                method=method,
                shadows=shadows,
                targets=targets,
                model=model,
                model_options=options,
                train_size=train_size,
                epochs=epochs,
                queries=queries,
                seed=seed,
                root=str(root) if root is not None else None,
                device=_device(device),
                cache=store,
                out=out,
                progress=stages,
            )
        payload = _payload(result)
        if json_output:
            _emit_json(payload)
            return
        block = result["property_inference"]
        heading = (
            f"property inference: {block['property']} on {block['dataset']} ({block['model']})"
        )
        print_summary(heading, SUMMARY, block["attacks"], out)

    _guarded(run)
