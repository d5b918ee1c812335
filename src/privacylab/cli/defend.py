"""`privacylab defend`: evaluate defences against membership inference, adaptively, on one
privacy–utility frontier (the group's own command, run when no sub-command is given); its
sub-commands defend against other attacks (`privacylab defend backdoor`, `cli/backdoor.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from privacylab.cli._common import (
    JsonOpt,
    _device,
    _emit_json,
    _guarded,
    _path_arg,
    _plain_table,
    _say,
    _Stages,
    _stderr,
    _widths,
    _writable_folder,
    app,
)

defend_app = typer.Typer(
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(defend_app, name="defend")


@defend_app.callback(invoke_without_command=True)
def defend_command(
    ctx: typer.Context,
    out: Annotated[
        Path,
        typer.Option("--out", help="Report folder (results.json, index.html).", parser=_path_arg),
    ] = Path("privacylab-defend"),
    dataset: Annotated[str, typer.Option("--dataset", help="Dataset name.")] = "purchase-like",
    model: Annotated[str, typer.Option("--model", help="Model name.")] = "mlp",
    widths: Annotated[str, typer.Option("--widths", help="Hidden widths, e.g. 256.")] = "256",
    defenses: Annotated[
        str | None,
        typer.Option(
            "--defenses",
            help="Comma-separated defences, e.g. none,topk:1,rounding:1,label-only,memguard,"
            "l2:1e-3,advreg:3,dmp,selena,dp:8 (the default).",
        ),
    ] = None,
    attacks: Annotated[
        str,
        typer.Option(
            "--attacks",
            help="Comma-separated membership attacks, or 'default' (the suite, less those "
            "needing more than --access).",
        ),
    ] = "default",
    max_tpr: Annotated[
        float | None,
        typer.Option(
            "--max-tpr-at-0.1",
            help="Release gate: a defended model passes when no attack finds more than this "
            "fraction of members at 0.1% FPR (adaptive attacks included).",
        ),
    ] = None,
    access: Annotated[
        str, typer.Option("--access", help="What the deployment serves: scores or logits.")
    ] = "scores",
    references: Annotated[
        int | None, typer.Option("--references", help="Reference models per recipe.")
    ] = None,
    members: Annotated[
        int | None, typer.Option("--members", help="Training-set size of each target.")
    ] = None,
    holdout: Annotated[
        int | None,
        typer.Option("--holdout", help="Rows in each of the defender's and attacker's pools."),
    ] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", help="Training epochs.")] = None,
    workers: Annotated[int, typer.Option("--workers", help="Training processes.")] = 2,
    cache: Annotated[
        Path | None, typer.Option("--cache", help="Trained models and store (default OUT/cache).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Train the undefended target and one model per training-time defence, put each output
    defence in front of it, attack every defended model with the membership suite — adaptively
    (references queried through, or trained with, the defence) — and write the frontier report
    to OUT; resumes after a kill and reuses every trained model. Sub-command `backdoor`:
    backdoor defences on a `privacylab attack backdoor` folder."""
    if ctx.invoked_subcommand is not None:
        return

    def run() -> None:
        from privacylab.defend import DEFAULT_DEFENSES, DefendConfig, run_defend

        _writable_folder(out)
        if cache is not None:
            _writable_folder(cache, "--cache")
        _device(device)
        options: dict[str, Any] = {
            "dataset": dataset,
            "model": model,
            "model_options": {"widths": list(_widths(widths) or ())} if widths else {},
            "defenses": tuple(
                d
                for d in (defenses if defenses is not None else ",".join(DEFAULT_DEFENSES)).split(
                    ","
                )
                if d.strip()
            ),
            "attacks": None
            if attacks.strip() == "default"
            else tuple(a for a in attacks.split(",") if a.strip()),
            "access": access,
            "max_tpr": max_tpr,
            "workers": workers,
            "seed": seed,
            "root": str(root) if root is not None else None,
            "device": device,
        }
        for name, value in (
            ("references", references),
            ("members", members),
            ("holdout", holdout),
            ("epochs", epochs),
        ):
            if value is not None:
                options[name] = value
        if not options["defenses"]:
            raise ValueError("no defences given; write e.g. --defenses none,topk:1,l2:1e-3")
        config = DefendConfig(**options).validate()
        with _Stages(_stderr()) as stages:
            payload = run_defend(
                config,
                out.resolve(),
                cache=None if cache is None else cache.resolve(),
                progress=stages,
            )
        if json_output:
            _emit_json(payload)
            return
        print_defenses(payload["defenses"])
        _say(_stderr(), f"wrote {out / 'index.html'} and {out / 'results.json'}")

    _guarded(run)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.2f}%"


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{float(value):.{digits}f}"


def defense_table(section: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and one text row per defence, as the terminal summary shows them."""
    headers = [
        "defence",
        "test acc",
        "train acc",
        "strongest attack",
        "TPR@0.1%FPR",
        "AUC",
        "ε lower bound",
        "Pareto",
        "gate",
    ]
    rows = []
    for row in section.get("rows") or []:
        best = row.get("best") or {}
        attack = best.get("attack", "-")
        if best and not best.get("adaptive"):
            attack += " (non-adaptive)"
        gate = {True: "pass", False: "FAIL", None: "-"}[row.get("passes")]
        rows.append(
            [
                str(row.get("defense")),
                _pct(row.get("test_accuracy")),
                _pct(row.get("train_accuracy")),
                attack,
                _pct(best.get("tpr_at_01pct_fpr")),
                _num((row.get("best_auc") or {}).get("auc")),
                _num(best.get("epsilon_lower_bound"), 2),
                "yes" if row.get("pareto") else "",
                gate,
            ]
        )
    return headers, rows


def print_defenses(section: dict[str, Any]) -> None:
    """The frontier as a table on stdout (rich at a terminal, plain text otherwise)."""
    headers, rows = defense_table(section)
    threshold = section.get("max_tpr_at_01pct_fpr")
    gate = (
        f"release gate TPR@0.1%FPR <= {_pct(threshold)}: pass: "
        f"{', '.join(section.get('passing') or []) or 'none'}"
        if threshold is not None
        else "no release gate (give --max-tpr-at-0.1)"
    )
    title = f"defences on {section.get('dataset')} ({section.get('model')}); {gate}"
    console = Console()
    if not console.is_terminal:
        print(title)
        print(_plain_table(headers, rows))
        return
    table = Table(title=title, title_justify="left")
    for header in headers:
        table.add_column(header, overflow="fold")
    for line in rows:
        table.add_row(*line)
    console.print(table)
