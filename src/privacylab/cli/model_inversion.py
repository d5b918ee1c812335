"""`privacylab attack inversion`: invert each class of a saved model with MI-Face (Fredrikson
et al. 2015, Alg. 1; `privacylab.invert`) and judge the inversions with an independent
classifier.

`--json` prints one object: `method`, `access`, `evaluator_accuracy`, `mean_confidence`,
`queries`, `seconds`, `target`, `evaluator` and `classes` (one row per class: `label`,
`confidence`, `predicted`, `correct`, `distance_to_mean`, ...). `--out DIR` writes
`results.json`, one PNG per class, the grid and `index.html` (anchor `#model-inversion`).
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
from privacylab.errors import PrivacylabError

SUMMARY = (
    ("label", "class"),
    ("confidence", "target conf."),
    ("predicted", "evaluator says"),
    ("distance_to_mean", "MSE to mean"),
    ("iterations", "iterations"),
    ("stopped", "stopped by"),
    ("queries", "queries"),
    ("seconds", "seconds"),
)
"""(key, header) of the terminal summary."""


def _classes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            out.append(int(part))
        except ValueError:
            raise PrivacylabError(
                f"--class must be class numbers, e.g. 3 or 0,5; got {text!r}"
            ) from None
    return tuple(out)


def _payload(result: dict[str, Any]) -> dict[str, Any]:
    block = result["model_inversion"]
    return {
        "method": block["method"],
        "access": block["access"],
        "evaluator_accuracy": block["evaluator_accuracy"],
        "mean_confidence": block["mean_confidence"],
        "queries": block["queries"],
        "seconds": result["seconds"],
        "target": block["target"]["target"],
        "dataset": block["target"]["dataset"],
        "model": block["target"]["model"],
        "evaluator": block["evaluator"],
        "classes": [{k: v for k, v in r.items() if k != "params"} for r in block["classes"]],
    }


@attack_app.command("inversion")
def attack_inversion_command(
    target: Annotated[
        Path,
        typer.Option("--target", help="A model folder saved by privacylab.", parser=_path_arg),
    ],
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="Model-inversion attack: miface (scores access) or miface-whitebox.",
        ),
    ] = "miface",
    classes: Annotated[
        str | None,
        typer.Option("--class", help="Class(es) to invert, comma-separated (default: all)."),
    ] = None,
    options: Annotated[
        str | None,
        typer.Option(
            "--options",
            help='Attack options as JSON, e.g. \'{"alpha": 300, "beta": 50, "step": 0.05}\'.',
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the attack.")] = 0,
    cache: Annotated[
        Path | None,
        typer.Option(
            "--cache", help="Result store (default TARGET/inversion-cache).", parser=_path_arg
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write results.json, PNGs and index.html here.", parser=_path_arg
        ),
    ] = None,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Invert each class of a saved model (MI-Face, Fredrikson et al. 2015): gradient descent
    on the input to maximise the class's confidence, from scores access (gradients estimated
    from queries) or white-box. An independent classifier trained on data the target never saw
    judges the inversions. Each class is stored as it finishes; a re-run is served from the
    store."""

    def run() -> None:
        from privacylab.attacks.inversion import inversion_class
        from privacylab.invert import run_inversion

        inversion_class(method, "model")
        chosen = _classes(classes)
        attack_options = json_options(options, '{"alpha": 300}')
        if seed < 0:
            raise PrivacylabError(f"--seed must be >= 0, got {seed}")
        check_paths(root=root, target=target, out=out)
        store = cache if cache is not None else target / "inversion-cache"
        _writable_folder(store, "--cache")
        with _Stages(_stderr()) as stages:
            result = run_inversion(
                target,
                method,
                chosen,
                options=attack_options,
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
        heading = (
            f"model inversion of {target} ({payload['dataset']}, {payload['model']}) with "
            f"{payload['method']}: evaluator accuracy {payload['evaluator_accuracy']:.1%}"
        )
        print_summary(heading, SUMMARY, payload["classes"], out)

    _guarded(run)
