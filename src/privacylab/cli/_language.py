"""Options shared by the language-model commands (`privacylab attack lm-extraction`,
`exposure`, `lm-membership`): one declaration each, so their spelling and help agree."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from privacylab.cli._common import _path_arg

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
