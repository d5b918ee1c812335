"""`privacylab attack gradients`: recover a federated client's training examples from the
update it sends (`privacylab.reconstruct`), with or without update defences.

One defence prints the issue's flat object (`method`, `psnr`, `ssim`, `mse`,
`label_accuracy`, `batch_size`, `defense`, ... plus `dataset`, `model`, `examples`,
`local_steps`, `clients`); several comma-separated `--defense` values print
`{"method", "dataset", "model", "results": [one such object each]}`.
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
    _writable_file,
)
from privacylab.cli._reports import check_paths, json_options, print_summary
from privacylab.cli.attack import attack_app
from privacylab.errors import PrivacylabError

SUMMARY = (
    ("method", "method"),
    ("defense", "defence"),
    ("batch_size", "rows"),
    ("local_steps", "local steps"),
    ("clients", "clients"),
    ("psnr", "PSNR (dB)"),
    ("ssim", "SSIM"),
    ("mse", "MSE"),
    ("label_accuracy", "label acc."),
    ("baseline_psnr", "baseline PSNR"),
    ("seconds", "seconds"),
)
"""(key, header) of the terminal summary."""

HIDDEN = ("images",)
"""Row keys left out of the printed JSON (the pixels are in results.json with --out)."""


def _payload(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The CLI's JSON: one run flat, several under `results`."""
    shown = [{k: v for k, v in r.items() if k not in HIDDEN} for r in rows]
    if len(shown) == 1:
        return shown[0]
    first = shown[0]
    return {
        "method": first.get("method"),
        "dataset": first.get("dataset"),
        "model": first.get("model"),
        "results": shown,
    }


def _examples(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise PrivacylabError(
            f"--examples must be comma-separated row indices, e.g. 0,5,9; got {text!r}"
        ) from None


def _defenses(text: str) -> list[str]:
    from privacylab.defenses import DefenseError

    specs = [d.strip() for d in text.split(",")]
    if not any(specs) or not all(specs):
        raise DefenseError(
            f"--defense {text!r} has an empty entry; write e.g. none,noise:1e-2,prune:0.2"
        )
    return specs


@attack_app.command("gradients")
def attack_gradients_command(
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", help="digits or mnist5k (default digits; --target: its own)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="lenet-sigmoid (DLG's LeNet, U(-0.5, 0.5) weights), mlp (ReLU) or cnn (ReLU, "
            ">= 14x14 inputs); default lenet-sigmoid. Ignored with --target.",
        ),
    ] = None,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="dlg, idlg, ig or analytic (registered attacks); with --local-steps > 1, dlg "
            "and idlg run their -fedavg variants, which replay the local steps.",
        ),
    ] = "dlg",
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Rows each client holds (B >= 1).")
    ] = 1,
    local_steps: Annotated[
        int,
        typer.Option("--local-steps", help="1: FedSGD (one gradient); S > 1: FedAvg, S epochs."),
    ] = 1,
    local_batch_size: Annotated[
        int | None,
        typer.Option("--local-batch-size", help="FedAvg local batch (default: all B rows)."),
    ] = None,
    local_lr: Annotated[float, typer.Option("--local-lr", help="FedAvg local step size.")] = 0.1,
    defense: Annotated[
        str,
        typer.Option(
            "--defense",
            help="Update defence(s), comma-separated, each run separately: none, noise:VAR, "
            "laplace:VAR, prune:P, fp16, int8, dp:EPS.",
        ),
    ] = "none",
    examples: Annotated[
        str | None,
        typer.Option(
            "--examples",
            help="Rows of the training part, comma-separated, B per client (default: seeded).",
        ),
    ] = None,
    clients: Annotated[
        int,
        typer.Option("--clients", help="k clients of B rows under secure aggregation."),
    ] = 1,
    labels_known: Annotated[
        bool,
        typer.Option(
            "--labels-known/--labels-unknown",
            help="Whether the server is given the labels (used by attacks that declare it).",
        ),
    ] = True,
    options: Annotated[
        str | None,
        typer.Option("--options", help="Attack options as JSON, e.g. '{\"iterations\": 300}'."),
    ] = None,
    target: Annotated[
        Path | None,
        typer.Option("--target", help="A model folder saved by privacylab.", parser=_path_arg),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of model, rows, noise, attack.")] = 0,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write results.json, pictures and index.html here.", parser=_path_arg
        ),
    ] = None,
    store: Annotated[
        Path | None,
        typer.Option(
            "--store",
            help="Result store file (default OUT/gradients.sqlite with --out): finished runs "
            "are kept there and not recomputed.",
            parser=_path_arg,
        ),
    ] = None,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Reconstruct a federated client's training examples from the update its server
    observed (DLG, iDLG, Inverting Gradients, analytic), undefended or behind update defences
    (noise, pruning, quantisation, local DP-SGD), FedSGD or FedAvg, one client or several
    under secure aggregation; scores in [0, 1] pixel space beside the dummy-init baseline."""

    def run() -> None:
        from privacylab.reconstruct import GradientConfig, defense_configs, run_gradients

        base = GradientConfig(
            dataset=dataset,
            model=model,
            method=method,
            batch_size=batch_size,
            examples=_examples(examples),
            local_steps=local_steps,
            local_batch_size=local_batch_size,
            local_lr=local_lr,
            clients=clients,
            labels_known=labels_known,
            target=str(target) if target is not None else None,
            options=json_options(options, '{"iterations": 300}'),
            seed=seed,
            device=_device(device),
            root=str(root) if root is not None else None,
        )
        configs = defense_configs(base, _defenses(defense))
        for config in configs:
            config.validate()
        check_paths(root=root, target=target, out=out)
        kept = store if store is not None else (out / "gradients.sqlite" if out else None)
        if kept is not None:
            _writable_file(kept, "--store")
        with _Stages(_stderr()) as stages:
            payload = run_gradients(configs, out=out, store=kept, progress=stages)
        rows = payload["reconstruction"]["runs"]
        if json_output:
            _emit_json(_payload(rows))
            return
        from privacylab.report.reconstruction import labels_given

        first = rows[0]
        n = len(first.get("examples") or [])
        heading = (
            f"gradient inversion on {first.get('dataset')} / {first.get('model')}: "
            f"{n} training row{'' if n == 1 else 's'}, seed {first.get('seed')}"
        )
        shown = [{**r, "label_accuracy": "given"} if labels_given(r) else r for r in rows]
        print_summary(heading, SUMMARY, shown, out)

    _guarded(run)
