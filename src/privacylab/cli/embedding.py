"""`privacylab attack embedding`: embedding inversion, sensitive attribute inference and
sequence-level membership inference against a model folder of `privacylab dpforward train`
(Du et al. 2023, DP-Forward, Sec. 6), run by `privacylab.embedding.run_embedding_attack`.

The run is stored in a result store (`--store`, default TARGET/embedding.sqlite) and a re-run
reads it back. `--json` prints schemas.md §5's result (method, target facts, accuracy, ε with
its event and accountant, position, inversion recall beside the recall of guessing (the
recovered tokens against another victim's), attribute accuracy and chance, MIA AUC and
per-attack metrics, inversion examples, queries, seconds). With `--out`, the run joins the
report's "#dp-forward" section (`privacylab.report.dpforward.add_dpforward_run`).
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
)
from privacylab.cli._reports import check_paths, print_summary
from privacylab.cli.attack import attack_app
from privacylab.errors import PrivacylabError

SUMMARY = (
    ("method", "attack"),
    ("position", "position"),
    ("epsilon", "ε"),
    ("accuracy", "accuracy"),
    ("inversion_recall", "inversion recall"),
    ("inversion_baseline_recall", "guessing recall"),
    ("attribute_accuracy", "attribute acc."),
    ("attribute_chance", "chance"),
    ("mia_auc", "MIA AUC"),
    ("queries", "queries"),
)
"""(key, header) of the terminal summary."""


@attack_app.command("embedding")
def attack_embedding_command(
    target: Annotated[
        Path,
        typer.Option(
            "--target",
            help="Model folder written by `privacylab dpforward train`.",
            parser=_path_arg,
        ),
    ],
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="inversion-nn (token-wise nearest neighbour), inversion-opt (softmax "
            "relaxation, deeper layers) or attribute (classifier on auxiliary embeddings).",
        ),
    ],
    victims: Annotated[
        int,
        typer.Option(
            "--victims",
            help="Test sequences attacked (and members / non-members each for membership).",
        ),
    ] = 200,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the victims' sample.")] = 0,
    store: Annotated[
        Path | None,
        typer.Option(
            "--store",
            help="Result store of finished runs (default TARGET/embedding.sqlite); a re-run "
            "reads the run back.",
            parser=_path_arg,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Add the run to the report written here (#dp-forward).", parser=_path_arg
        ),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    position: Annotated[
        str | None,
        typer.Option(
            "--position",
            help="Cut to read a non-private or DP-SGD model at (input, layer:K, output; "
            "default: its own). A DP-Forward model releases only at its cut.",
        ),
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """What do the embeddings users release reveal? Invert them to tokens or infer the
    review's category from them, and test membership on the deployed classifier: recall,
    attribute accuracy against chance and MIA AUC beside the model's accuracy and ε."""

    def run() -> None:
        from privacylab.embedding import METHODS, run_embedding_attack

        check_paths(target=target, out=out)
        if method.strip().lower() not in METHODS:
            raise PrivacylabError(
                f"unknown --method {method!r}; choose one of {', '.join(METHODS)}"
            )
        if victims < 1:
            raise PrivacylabError(f"--victims must be a whole number >= 1, got {victims}")
        if seed < 0:
            raise PrivacylabError(f"--seed must be a whole number >= 0, got {seed}")
        where = _device(device)
        if out is not None:
            from privacylab.report.dpforward import add_dpforward_run
        with _Stages(_stderr()) as stages:
            result = run_embedding_attack(
                target,
                method,
                victims=victims,
                seed=seed,
                store=store,
                progress=stages,
                device=where,
                position=position,
            )
        if out is not None:
            add_dpforward_run(out, result)
        if json_output:
            _emit_json(result)
            return
        _summary(result, out)

    _guarded(run)


def _summary(result: dict[str, Any], out: Path | None) -> None:
    target = result["target"]
    heading = (
        f"embedding attack {result['method']} on {target.get('folder')} "
        f"({target.get('method')}, accountant {result.get('accountant') or '-'})"
    )
    print_summary(heading, SUMMARY, [result], out)
    for example in result["examples"]:
        print(f"  truth:     {example['truth']}")
        print(f"  recovered: {example['recovered']}")
