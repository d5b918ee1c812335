"""`privacylab lm train`: train a byte-level GPT on a corpus with planted records and canaries,
non-privately or with DP-SGD (ghost clipping, Li et al. 2022), and write the model folder the
language-model attacks read (`privacylab.lm`: model.safetensors, model.json, corpus.json).

`--corpus default` builds the default corpus (CPython's documentation with synthetic personal
records and Secret-Sharer canaries, `privacylab.data.corpus_build`); `--corpus FILE.txt` uses
a text file's paragraphs (documents separated by blank lines) with the same planted strings;
`--corpus corpus.json` (or a folder holding one) reuses a corpus as it is. `--canary "my PIN is
{482913}" --repeats 4` plants a user canary (repeatable; the n-th --repeats goes with the n-th
--canary, all default to 1).
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
from privacylab.errors import PrivacylabError

lm_app = typer.Typer(
    help="Language models: train byte-level GPTs (optionally with DP-SGD) on a corpus with "
    "planted records and canaries, for the extraction, exposure and membership attacks.",
    no_args_is_help=True,
)
app.add_typer(lm_app, name="lm")


def _corpus(
    source: str,
    *,
    documents: int | None,
    context: int | None,
    canaries: list[str],
    repeats: list[int],
    seed: int,
) -> Any:
    """The corpus named by --corpus (see the module docstring)."""
    from privacylab.data.corpus import CORPUS_FILE, load_corpus
    from privacylab.data.corpus_build import CorpusConfig, build_corpus, read_text_corpus

    if repeats and len(repeats) != len(canaries):
        raise PrivacylabError(
            f"{len(repeats)} --repeats for {len(canaries)} --canary: give one --repeats per "
            "--canary, in the same order (or none: 1 each)"
        )
    pairs = tuple(zip(canaries, repeats or [1] * len(canaries), strict=True))
    path = Path(source)
    if source != "default" and (path.suffix == ".json" or (path / CORPUS_FILE).is_file()):
        given = [
            n for n, v in (("--documents", documents), ("--context", context)) if v is not None
        ]
        if pairs:
            given.append("--canary")
        if given:
            raise PrivacylabError(
                f"{', '.join(given)} cannot change a saved corpus ({source}); use a text file "
                "or --corpus default"
            )
        return load_corpus(path)
    options: dict[str, Any] = {"user_canaries": pairs, "seed": seed}
    if documents is not None:
        options["documents"] = documents
    if context is not None:
        options["context"] = context
    config = CorpusConfig(**options)
    if source == "default":
        return build_corpus(config)
    return build_corpus(config, texts=read_text_corpus(path))


def _payload(out: Path, language: dict[str, Any]) -> dict[str, Any]:
    return {
        "out": str(out),
        "size": language["size"],
        "parameters": language["parameters"],
        "context": language["context"],
        "epochs": language["epochs"],
        "private": language["private"],
        "epsilon": language["epsilon"],
        "delta": language["delta"],
        "accountant": language["accountant"],
        "noise_multiplier": language["noise_multiplier"],
        "perplexity": dict(language["perplexity"]),
        "documents": dict(language["documents"]),
        "seconds": language["seconds"],
    }


@lm_app.command("train")
def lm_train_command(
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Model folder to write (resumes a killed run).", parser=_path_arg
        ),
    ],
    corpus: Annotated[
        str,
        typer.Option(
            "--corpus",
            help="default (CPython docs + planted records/canaries), a .txt file (documents "
            "separated by blank lines; same planted strings) or a corpus.json.",
        ),
    ] = "default",
    size: Annotated[
        str, typer.Option("--size", help="Model size: tiny, small or medium.")
    ] = "small",
    dp: Annotated[bool, typer.Option("--dp", help="Train with DP-SGD (needs --epsilon).")] = False,
    epsilon: Annotated[
        float | None, typer.Option("--epsilon", help="Target epsilon of DP-SGD (with --dp).")
    ] = None,
    delta: Annotated[float, typer.Option("--delta", help="delta of DP-SGD.")] = 1e-5,
    epochs: Annotated[
        int | None, typer.Option("--epochs", help="Epochs (default: the size's).")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option("--batch-size", help="Documents per batch (default 64; 256 with --dp)."),
    ] = None,
    lr: Annotated[
        float | None,
        typer.Option("--lr", help="Adam learning rate (default 2e-3; 3e-3 with --dp)."),
    ] = None,
    documents: Annotated[
        int | None,
        typer.Option("--documents", help="Source documents used, half of them members (2000)."),
    ] = None,
    context: Annotated[
        int | None, typer.Option("--context", help="Tokens per document incl. BOS/EOS (128).")
    ] = None,
    canary: Annotated[
        list[str] | None,
        typer.Option("--canary", help="A canary to plant, e.g. 'my PIN is {482913}' (repeatable)."),
    ] = None,
    repeats: Annotated[
        list[int] | None,
        typer.Option("--repeats", help="Copies of the matching --canary (repeatable; default 1)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the corpus and the training.")] = 0,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Train a language model on a corpus (Carlini et al. 2021's setting, with planted records
    and canaries whose copies are known) and write the model folder the `privacylab attack`
    language-model commands read. With --dp: DP-SGD at --epsilon (Poisson sampling, ghost
    clipping, PLD accountant; the epsilon reached and the accountant are reported)."""

    def run() -> None:
        from privacylab.lm import LMConfig, train_language_model

        if dp and epsilon is None:
            raise PrivacylabError("--dp needs --epsilon (the target epsilon of DP-SGD)")
        if epsilon is not None and not dp:
            raise PrivacylabError("--epsilon is for DP-SGD: add --dp")
        config = LMConfig(
            size=size,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            epsilon=epsilon,
            delta=delta,
            seed=seed,
            device=_device(device),
        ).validate()
        _writable_folder(out)
        text = _corpus(
            corpus,
            documents=documents,
            context=context,
            canaries=list(canary or []),
            repeats=list(repeats or []),
            seed=seed,
        )
        with _Stages(_stderr()) as stages:
            language = train_language_model(text, config, out, progress=stages)
        payload = _payload(out, language)
        if json_output:
            _emit_json(payload)
            return
        privacy = (
            f"DP-SGD eps={payload['epsilon']:.3g} delta={payload['delta']:g} "
            f"({payload['accountant']}, sigma={payload['noise_multiplier']:.3g})"
            if payload["private"]
            else "non-private"
        )
        perplexity = payload["perplexity"]
        typer.echo(
            f"{payload['size']} GPT, {payload['parameters']:,} parameters, "
            f"{payload['epochs']} epochs, {privacy}, {payload['seconds']:.0f} s\n"
            f"perplexity: members {perplexity['members']:.3f}, "
            f"held-out {perplexity['heldout']:.3f} "
            f"({payload['documents']['members']} / {payload['documents']['heldout']} documents)\n"
            f"model folder: {out}"
        )

    _guarded(run)
