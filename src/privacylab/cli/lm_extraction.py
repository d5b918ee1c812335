"""`privacylab attack lm-extraction`: extract training data from a language model trained by
`privacylab lm train` (Carlini et al. 2021; job `privacylab.lm_extract`).

--json prints the "extraction run" object: per strategy x metric the true memorised samples in
the top 100 (`table`, `precision_at_100`), the true samples with their k and PII (`extracted`),
records extracted per copy count (`records`, `extraction_begins_at`), queries and time. With
`--out`, the run joins `results.json` and `index.html` (section `#language-models`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from privacylab.cli._common import JsonOpt, _device, _guarded, _path_arg
from privacylab.cli._language import (
    DeviceOpt,
    ModelFolderOpt,
    OutOpt,
    Summary,
    run_language_job,
    store_option,
)
from privacylab.cli.attack import attack_app
from privacylab.errors import PrivacylabError


def _summary_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One terminal row per strategy: true samples in the top per metric."""
    return [{"strategy": s, **run["table"][s]} for s in run["strategies"]]


StoreOpt = store_option("generations.sqlite", "the generations")


@attack_app.command("lm-extraction")
def attack_lm_extraction_command(
    target: ModelFolderOpt,
    strategy: Annotated[
        str,
        typer.Option(
            "--strategy",
            help="top-n, temperature or prefix (Carlini et al. 2021, Sec. 5.1); comma-separated "
            "for several.",
        ),
    ] = "top-n",
    samples: Annotated[
        int, typer.Option("--samples", help="Samples generated per strategy.")
    ] = 1000,
    reference: Annotated[
        list[Path] | None,
        typer.Option(
            "--reference",
            help="A smaller model folder of the attacker's own (repeatable); its size names "
            "the ratio metric (small, tiny).",
            parser=_path_arg,
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", help="Samples kept per metric.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the generations.")] = 0,
    min_match: Annotated[
        int,
        typer.Option(
            "--min-match",
            help="Bytes of verbatim overlap with a training document that make a sample "
            "memorised (the paper's 50-token window; tokens are bytes here).",
        ),
    ] = 50,
    store: StoreOpt = None,
    device: DeviceOpt = "cpu",
    out: OutOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Generate samples from a language model, rank them by six membership metrics and check
    the top ones against its training data (Carlini et al. 2021): true memorised samples per
    strategy and metric, their k (training documents containing them) and the PII in them."""

    def run() -> None:
        from privacylab.lm_extract import parse_strategies, run_lm_extraction

        names = parse_strategies(strategy)
        for folder in reference or []:
            if not folder.is_dir():
                raise PrivacylabError(f"--reference {folder} is not a model folder")

        def summary(result: dict[str, Any]) -> Summary:
            columns = [("strategy", "strategy"), *((m, m) for m in result["metrics"])]
            heading = (
                f"training-data extraction: {len(result['extracted'])} true memorised samples "
                f"in the top {result['top']} (extraction begins at "
                f"{result['extraction_begins_at']} copies)"
            )
            return heading, columns, _summary_rows(result)

        run_language_job(
            target=target,
            out=out,
            json_output=json_output,
            kind="extraction",
            job=lambda stages: run_lm_extraction(
                target,
                strategies=names,
                samples=samples,
                references=list(reference or []),
                top=top,
                seed=seed,
                min_match=min_match,
                store_path=store,
                device=_device(device),
                progress=stages,
            ),
            summary=summary,
        )

    _guarded(run)
