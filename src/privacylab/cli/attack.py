"""`privacylab attack`: attacks on a saved model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from privacylab.cli._common import (
    MAX_EPOCHS,
    JsonOpt,
    _device,
    _emit_json,
    _guarded,
    _learning_rate,
    _path_arg,
    _print_summary,
    _Stages,
    _stderr,
    _whole_in,
    _writable_folder,
    app,
)
from privacylab.errors import PrivacylabError

attack_app = typer.Typer(help="Attacks on a saved model.", no_args_is_help=True)
app.add_typer(attack_app, name="attack")


def _check_saved_target(target: Path) -> None:
    """Load the model at `target` and check the training recipe in its sidecar, so that a
    damaged or hand-edited sidecar is one line here, not a failure in a worker process."""
    from privacylab.models import load_model
    from privacylab.training.config import TrainConfig

    if not target.is_dir():
        raise PrivacylabError(f"--target {target} is not a model folder")
    _, _, meta = load_model(target)
    data, training = meta.get("data"), meta.get("training")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise PrivacylabError(f"{target}: the sidecar's metadata.data.name is not a dataset name")
    if not isinstance(training, dict):
        raise PrivacylabError(f"{target}: the sidecar's metadata.training is not an object")
    if not isinstance(training.get("privacy"), dict | None):
        raise PrivacylabError(f"{target}: the sidecar's training.privacy is not an object")
    try:
        config = TrainConfig.from_dict(training).validate()
    except TypeError as error:
        raise PrivacylabError(f"{target}: bad training recipe in the sidecar: {error}") from None
    _learning_rate(config.lr, f"{target}: the sidecar's training lr")
    _whole_in(config.epochs, f"{target}: the sidecar's training epochs", 1, MAX_EPOCHS)
    _device(config.device)
    summary = meta.get("summary", {})
    if not isinstance(summary, dict) or not isinstance(summary.get("epsilon"), int | float | None):
        raise PrivacylabError(f"{target}: the sidecar's metadata.summary is malformed")


@attack_app.command("membership")
def attack_membership_command(
    target: Annotated[
        Path,
        typer.Option(
            "--target", help="A model folder written by `privacylab train`.", parser=_path_arg
        ),
    ],
    attack: Annotated[
        str, typer.Option("--attack", help="Attack name(s), comma-separated, e.g. lira,rmia.")
    ] = "lira",
    references: Annotated[int, typer.Option("--references", help="Reference models.")] = 16,
    workers: Annotated[int, typer.Option("--workers", help="Training processes.")] = 2,
    cache: Annotated[
        Path | None, typer.Option("--cache", help="Reference models (default TARGET/attack-cache).")
    ] = None,
    subsample: Annotated[
        int, typer.Option("--subsample", help="Examples a side for boundary attacks.")
    ] = 200,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    json_output: JsonOpt = False,
) -> None:
    """Membership inference against a saved model: its training rows are the members, half of
    its test rows the non-members; references are trained with its own recipe."""

    def run() -> None:
        from privacylab.experiment import attack_target, resolve_attacks, saved_target_game
        from privacylab.report import membership_metrics

        asked = [a.strip() for a in attack.split(",") if a.strip()]
        if not asked:
            raise PrivacylabError("--attack needs at least one attack name, e.g. lira,rmia")
        names = resolve_attacks(asked)
        _whole_in(references, "--references")
        _whole_in(workers, "--workers", 1, 1024)
        _whole_in(subsample, "--subsample")
        if root is not None and not root.is_dir():
            raise PrivacylabError(f"--root {root} is not a folder")
        _check_saved_target(target)
        _writable_folder(cache if cache is not None else target / "attack-cache", "--cache")
        with _Stages(_stderr()) as stages:
            game = saved_target_game(
                target,
                references=references,
                cache=cache if cache is not None else target / "attack-cache",
                workers=workers,
                root=str(root) if root is not None else None,
                progress=stages,
            )
            results = attack_target(
                game.target,
                game.task,
                game.membership,
                names,
                subsample=subsample,
                seed=0,
                progress=stages,
            )
        delta = (game.recipe.train.get("privacy") or {}).get("delta", 1e-5)
        payload = {
            "target": str(target),
            "epsilon": game.record.get("epsilon"),
            "delta": delta,
            "train_accuracy": game.record["train_accuracy"],
            "test_accuracy": game.test_accuracy,
            "references": references,
            "attacks": [membership_metrics(r, delta=delta).to_dict() for r in results],
        }
        if json_output:
            _emit_json(payload)
            return
        _print_summary(
            {
                "title": f"membership inference on {escape(str(target))}",
                "targets": [
                    {
                        "name": game.name,
                        **{
                            k: payload[k]
                            for k in (
                                "epsilon",
                                "delta",
                                "train_accuracy",
                                "test_accuracy",
                                "attacks",
                            )
                        },
                    }
                ],
            }
        )

    _guarded(run)
