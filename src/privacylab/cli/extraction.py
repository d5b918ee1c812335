"""`privacylab attack extraction`: steal a saved model with the registered extraction attacks
(`privacylab.extract`), through the deployment the options describe.

One method and one deployment print the issue's flat object (`method`, `queries`,
`accuracy`, `fidelity`, `victim_accuracy`, ..., the exact attacks' errors, a watch's
`detected` and `queries_until_detection`); several methods (comma-separated) or several
`--defense` alternatives print `{"target": ..., "attacks": [one such object each]}`.
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
    _writable_folder,
)
from privacylab.cli._reports import check_paths, json_options, print_summary
from privacylab.cli.attack import attack_app

SUMMARY = (
    ("method", "method"),
    ("output", "output"),
    ("defense", "defence"),
    ("queries", "queries"),
    ("accuracy", "accuracy"),
    ("fidelity", "fidelity"),
    ("victim_accuracy", "victim acc."),
    ("detected", "detected"),
    ("queries_until_detection", "detected after"),
    ("max_output_error_log2", "output err. log2"),
    ("seconds", "seconds"),
)
"""(key, header) of the terminal summary."""


def _payload(result: dict[str, Any]) -> dict[str, Any]:
    """The CLI's JSON: one run flat, several under `attacks`."""
    block = result["extraction"]
    rows = [dict(r) for r in block["attacks"]]
    if len(rows) == 1:
        return {**rows[0], "target": block["target"]["target"]}
    return {
        "target": block["target"]["target"],
        "queries_budget": block["queries"],
        "attacks": rows,
    }


def _methods(text: str) -> tuple[str, ...]:
    from privacylab.attacks.extraction import ExtractionError, extraction_names

    names = tuple(m.strip() for m in text.split(",") if m.strip())
    if not names:
        raise ExtractionError(
            f"--method needs at least one method; choose from {', '.join(extraction_names())}"
        )
    return names


@attack_app.command("extraction")
def attack_extraction_command(
    target: Annotated[
        Path,
        typer.Option("--target", help="A model folder saved by privacylab.", parser=_path_arg),
    ],
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="Extraction attack(s), comma-separated (registered: see the error for "
            "an unknown name), e.g. knockoff,jacobian or relu-exact.",
        ),
    ] = "knockoff",
    queries: Annotated[
        int, typer.Option("--queries", help="The thief's query budget (>= 1).")
    ] = 1000,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            help="What a query returns: labels, scores, logits or rounded:D (default: what "
            "each attack declares, at least scores).",
        ),
    ] = None,
    defense: Annotated[
        str,
        typer.Option(
            "--defense",
            help="Defence alternatives, comma-separated, each run separately: none, prada, "
            "budget:N, rounding:2, label-only, ...; stack with + (rounding:2+prada).",
        ),
    ] = "none",
    options: Annotated[
        str | None,
        typer.Option(
            "--options",
            help='Attack options as JSON, per method, e.g. \'{"knockoff": {"policy": '
            '"adaptive"}}\'.',
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the attacks.")] = 0,
    cache: Annotated[
        Path | None,
        typer.Option(
            "--cache", help="Result store (default TARGET/extraction-cache).", parser=_path_arg
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
    """Steal a saved model by querying it: learning-based copies (accuracy and fidelity
    against queries), equation solving, exact recovery of ReLU networks; optionally through
    output defences and query watches (PRADA, budgets). Results are stored as each attack
    finishes; a re-run is served from the store."""

    def run() -> None:
        from privacylab.extract import ExtractConfig, run_extract

        config = ExtractConfig(
            target=str(target),
            methods=_methods(method),
            queries=queries,
            output=output,
            defenses=tuple(defense.split(",")) if defense.strip() else ("none",),
            attack_options=json_options(options, '{"knockoff": {...}}'),
            seed=seed,
            root=str(root) if root is not None else None,
            device=_device(device),
        ).validate()
        check_paths(root=root, target=target, out=out)
        store = cache if cache is not None else target / "extraction-cache"
        _writable_folder(store, "--cache")
        with _Stages(_stderr()) as stages:
            result = run_extract(config, out=out, cache=store, progress=stages)
        payload = _payload(result)
        if json_output:
            _emit_json(payload)
            return
        rows = result["extraction"]["attacks"]
        heading = f"model extraction of {target} ({result['extraction']['target']['dataset']})"
        print_summary(heading, SUMMARY, rows)
        for row in rows:
            if row.get("error"):
                print(f"{row['method']} ({row.get('defense')}): {row['error']}")
        if out is not None:
            print(f"report: {out / 'index.html'}")

    _guarded(run)
