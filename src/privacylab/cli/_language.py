"""Options shared by the language-model commands (`privacylab attack lm-extraction`,
`exposure`, `lm-membership`): one declaration each, so their spelling and help agree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from privacylab.cli._common import _emit_json, _path_arg, _Stages, _stderr
from privacylab.cli._reports import check_paths, print_summary

ModelFolderOpt = Annotated[
    Path,
    typer.Option(
        "--target", help="Model folder written by `privacylab lm train`.", parser=_path_arg
    ),
]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
OutOpt = Annotated[
    Path | None,
    typer.Option("--out", help="Write results.json and index.html here.", parser=_path_arg),
]


def store_option(default: str, holds: str) -> Any:
    """The `--store` option of a command whose result store defaults to TARGET/`default` and
    keeps `holds` (finished work a re-run resumes from)."""
    return Annotated[
        Path | None,
        typer.Option(
            "--store",
            help=f"Result store of {holds} (default TARGET/{default}); a re-run resumes from it.",
            parser=_path_arg,
        ),
    ]


Summary = tuple[str, Sequence[tuple[str, str]], list[dict[str, Any]]]
"""(heading, (key, header) columns, rows) of a command's terminal summary."""


def run_language_job(
    *,
    target: Path,
    out: Path | None,
    json_output: bool,
    kind: str,
    job: Callable[[_Stages], dict[str, Any]],
    summary: Callable[[dict[str, Any]], Summary],
) -> None:
    """The run of a language-model command: check --target and --out, run `job` with progress
    stages, add its result to --out as a `kind` run, then print it as JSON or as `summary`."""
    check_paths(target=target, out=out)
    if out is not None:
        from privacylab.report.language import add_language_run
    with _Stages(_stderr()) as stages:
        result = job(stages)
    if out is not None:
        add_language_run(out, kind, result)
    if json_output:
        _emit_json(result)
        return
    print_summary(*summary(result), out)
