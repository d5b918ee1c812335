"""`privacylab dpforward train`: DP-Forward, DP-SGD and non-private fine-tuning of an encoder
on the review corpus, writing the model folder `privacylab attack embedding` reads
(`privacylab.dpforward`; Du et al. 2023, "DP-Forward", CCS'23).

    privacylab dpforward train --epsilon 8 --position output --out runs/fwd-out-8 --json
    privacylab dpforward train --epsilon 8 --position layer:3 --label-epsilon 3 --out DIR
    privacylab dpforward train --method dp-sgd --epsilon 8 --out runs/sgd-8
    privacylab dpforward train --method non-private --out runs/clear
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
    app,
)

dpforward_app = typer.Typer(
    help="DP-Forward (Du et al. 2023): fine-tune an encoder with aMGM noise in the forward "
    "pass (SeqLDP), with DP-SGD or non-privately, for the embedding attacks.",
    no_args_is_help=True,
)
app.add_typer(dpforward_app, name="dpforward")


def _summary(facts: dict[str, Any]) -> str:
    method = facts["method"]
    if facts["epsilon"] is None:
        privacy = "non-private"
    else:
        spent = facts.get("privacy") or {}
        privacy = f"eps={facts['epsilon']:.4g} delta={facts['delta']:g} ({facts['accountant']}" + (
            f", SeqLDP of {spent.get('releases')} release(s) per training sequence, sensitivity 2C)"
            if method == "dp-forward"
            else ", central DP)"
        )
        if method == "dp-forward":
            privacy += f", one inference release eps={spent['inference_epsilon']:.4g}"
            if spent.get("label_epsilon") is not None:
                privacy += (
                    f", labels RR eps={spent['label_epsilon']:g}, (X, y) eps="
                    f"{spent['total_epsilon']:.4g}"
                )
            shuffled = spent.get("shuffled")
            if shuffled:
                privacy += (
                    f", shuffled (per round of {shuffled['rounds']}) eps="
                    f"{shuffled['epsilon']:.4g} delta={shuffled['delta']:.3g}"
                )
    per_step = facts.get("seconds_per_step")
    step = f", {per_step:.3f} s/step" if per_step is not None else ""
    return (
        f"{method} at {facts['position']} on {facts['encoder']} ({facts['layers']} layers), "
        f"{facts['epochs']} epochs: {privacy}\n"
        f"accuracy (test, deployed pipeline) {facts['accuracy']:.4f}, train "
        f"{facts['train_accuracy']:.4f} ({facts['members']} members, {facts['non_members']} "
        f"non-members), {facts['seconds']:.1f} s{step}\n"
        f"model folder: {facts['folder']}"
    )


@dpforward_app.command("train")
def dpforward_train_command(
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Model folder to write (resumes a killed run).", parser=_path_arg
        ),
    ],
    method: Annotated[
        str, typer.Option("--method", help="dp-forward, dp-sgd or non-private.")
    ] = "dp-forward",
    epsilon: Annotated[
        float,
        typer.Option(
            "--epsilon",
            help="Target ε (> 0): SeqLDP of a training sequence over all epochs (dp-forward) "
            "or central DP (dp-sgd); ignored by non-private.",
        ),
    ] = 8.0,
    position: Annotated[
        str,
        typer.Option("--position", help="Where the noise goes: input, layer:K or output."),
    ] = "output",
    label_epsilon: Annotated[
        float | None,
        typer.Option(
            "--label-epsilon", help="ε of randomized response on the labels (dp-forward)."
        ),
    ] = None,
    clip: Annotated[
        float, typer.Option("--clip", help="C: Frobenius norm f(X) is normalised to (> 0).")
    ] = 1.0,
    delta: Annotated[float, typer.Option("--delta", help="δ, in (0, 1).")] = 1e-5,
    epochs: Annotated[int, typer.Option("--epochs", help="Epochs (each a release).")] = 3,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per batch.")] = 32,
    lr: Annotated[
        float | None,
        typer.Option("--lr", help="Adam learning rate (default 5e-5; 5e-4 for dp-sgd)."),
    ] = None,
    max_len: Annotated[
        int, typer.Option("--max-len", help="Tokens per sequence, padded ([CLS] ... [SEP]).")
    ] = 48,
    layers: Annotated[
        int | None,
        typer.Option("--layers", help="Use only the encoder's first K layers (default all)."),
    ] = None,
    encoder: Annotated[
        str, typer.Option("--encoder", help="minilm (all-MiniLM-L6-v2) or tiny (tests).")
    ] = "minilm",
    documents: Annotated[
        int, typer.Option("--documents", help="Reviews in the corpus (train 40%, test 30%).")
    ] = 2400,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the data, noise and training.")] = 0,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    reduce: Annotated[
        int | None,
        typer.Option(
            "--reduce",
            help="dp-forward: release r x D' instead of r x d through trainable maps d -> D' "
            "-> d (Du et al. 2023, Sec. 3.2, against the curse of dimensionality).",
        ),
    ] = None,
    frozen: Annotated[
        bool,
        typer.Option(
            "--frozen",
            help="dp-forward: keep f(.) pretrained and release each training sequence once; "
            "p(.) trains every epoch on those releases (ε of one release, Du et al. Sec. 3.3).",
        ),
    ] = False,
    json_output: JsonOpt = False,
) -> None:
    """Fine-tune an encoder on the review corpus with DP-Forward (aMGM noise at --position,
    normalised to --clip, SeqLDP at --epsilon, PLD-accounted), DP-SGD (ghost clipping, PLD)
    or non-privately, and write the model folder --out (accuracy, ε with its event and
    accountant, seconds per step)."""

    def run() -> None:
        from privacylab.dpforward import DPForwardConfig, train_dpforward

        config = DPForwardConfig(
            method=method,
            epsilon=epsilon,
            delta=delta,
            position=position,
            clip=clip,
            label_epsilon=label_epsilon,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            max_len=max_len,
            layers=layers,
            encoder=encoder,
            documents=documents,
            seed=seed,
            device=_device(device),
            reduce=reduce,
            frozen=frozen,
        ).validate()
        _writable_folder(out)
        with _Stages(_stderr()) as stages:
            facts = train_dpforward(config, out, progress=stages)
        if json_output:
            _emit_json(facts)
            return
        typer.echo(_summary(facts))

    _guarded(run)
