"""`privacylab run`: the main job, train targets, attack them, write the report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from privacylab.cli._common import (
    JsonOpt,
    _emit_json,
    _floats,
    _guarded,
    _print_summary,
    _Stages,
    _stderr,
    _widths,
    app,
)


@app.command("run")
def run_command(
    out: Annotated[
        Path, typer.Option("--out", help="Report folder (results.json, index.html).")
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
    json_output: JsonOpt = False,
) -> None:
    """Train a non-private and DP-SGD targets, attack each with the membership suite (metric,
    shadow, LiRA, RMIA, label-only) and write the report to OUT; resumes after a kill."""

    def run() -> None:
        from privacylab.experiment import DEFAULT_ATTACKS, RunConfig, run_experiment

        options: dict[str, Any] = {
            "dataset": dataset,
            "model": model,
            "model_options": {"widths": list(_widths(widths) or ())} if widths else {},
            "epsilons": _floats(epsilons, "--epsilons"),
            "nonprivate": not no_nonprivate,
            "attacks": tuple(a for a in (attacks or ",".join(DEFAULT_ATTACKS)).split(",") if a),
            "workers": workers,
            "seed": seed,
            "root": str(root) if root is not None else None,
            "device": device,
            "audits": tuple(a for a in audits.split(",") if a and audits != "none"),
        }
        for name, value in (("references", references), ("members", members), ("epochs", epochs)):
            if value is not None:
                options[name] = value
        config = RunConfig.quick(**options) if quick else RunConfig(**options)
        config.validate()
        with _Stages(_stderr()) as stages:
            payload = run_experiment(config, out, cache=cache, progress=stages)
        if json_output:
            _emit_json(payload)
            return
        _print_summary(payload)
        _stderr().print(f"wrote {out / 'index.html'} and {out / 'results.json'}")

    _guarded(run)
