"""`privacylab lm train`: train a byte-level GPT on a corpus with planted records and canaries,
non-privately or with DP-SGD (ghost clipping, Li et al. 2022), and write the model folder the
language-model attacks read (`privacylab.lm`: model.safetensors, model.json, corpus.json).

`--corpus default` builds the default corpus (CPython's documentation with synthetic personal
records and Secret-Sharer canaries, `privacylab.data.corpus_build`); `--corpus FILE.txt` uses
a text file's paragraphs (documents separated by blank lines) with the same planted strings;
`--corpus corpus.json` (or a folder holding one) reuses a corpus as it is. `--canary "my PIN is
{482913}" --repeats 4` plants a user canary (repeatable; the n-th --repeats goes with the n-th
--canary, all default to 1). A corpus with fewer member documents than the default planted
strings need (571: records planted 1-64 times, canaries 0-32 times) keeps the smaller counts
that fit (`_fit_planted`) and says so on stderr.

`--corpus public` is the public text of the default corpus built with the same --documents,
--context and --seed: the pydoc chunks it does not use, all trained on, no planted strings
(`corpus_build.public_corpus`). `--init DIR` starts from the weights of a model folder written
by `lm train` (same size and context) and fine-tunes them on --corpus, non-privately or with
--dp (Li et al. 2022's setting: DP fine-tuning of a publicly pretrained model).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from privacylab.cli._common import (
    JsonOpt,
    _device,
    _emit_json,
    _guarded,
    _path_arg,
    _say,
    _Stages,
    _stderr,
    _whole_in,
    _writable_folder,
    app,
)
from privacylab.errors import PrivacylabError

if TYPE_CHECKING:
    from privacylab.data.corpus_build import CorpusConfig

MIN_CONTEXT, MAX_CONTEXT = 32, 1024
"""--context's range: the shortest planted record ('Ann: (201) 555-0100') needs about 28 tokens
with some host text; the GPT attends over all pairs of positions (memory grows as the square)."""

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
) -> tuple[Any, str | None]:
    """The corpus named by --corpus (see the module docstring) and the note saying how its
    planted copies were cut to fit (None when they were not)."""
    from privacylab.data.corpus import CORPUS_FILE, load_corpus
    from privacylab.data.corpus_build import (
        CorpusConfig,
        build_corpus,
        public_corpus,
        read_text_corpus,
    )

    if repeats and len(repeats) != len(canaries):
        raise PrivacylabError(
            f"{len(repeats)} --repeats for {len(canaries)} --canary: give one --repeats per "
            "--canary, in the same order (or none: 1 each)"
        )
    pairs = tuple(zip(canaries, repeats or [1] * len(canaries), strict=True))
    path = Path(source)
    sizes: dict[str, Any] = {
        k: v for k, v in (("documents", documents), ("context", context)) if v is not None
    }
    if source == "public":
        if pairs:
            raise PrivacylabError("--canary plants into a private corpus, not --corpus public")
        return public_corpus(CorpusConfig(seed=seed, **sizes).validate()), None
    if source != "default" and (path.suffix == ".json" or (path / CORPUS_FILE).is_file()):
        given = [f"--{name}" for name in sizes]
        if pairs:
            given.append("--canary")
        if given:
            raise PrivacylabError(
                f"{', '.join(given)} cannot change a saved corpus ({source}); use a text file "
                "or --corpus default"
            )
        return load_corpus(path), None
    config = CorpusConfig(user_canaries=pairs, seed=seed, **sizes).validate()
    texts = None if source == "default" else read_text_corpus(path)
    bare = replace(
        config, record_copies=(), records_per_count=0, canary_repeats=(), user_canaries=()
    )
    members = len(build_corpus(bare, texts=texts).member_indices)
    fitted = _fit_planted(config, members)
    note = None
    if fitted != config:
        note = (
            f"note: {members} member documents hold {_planted(fitted)}, not "
            f"{_planted(config)}; a larger corpus (--documents) holds them all"
        )
    return build_corpus(fitted, texts=texts), note


def _planted(config: CorpusConfig) -> str:
    """'records planted 1-64 times and canaries 0-32 times' (`config`'s counts)."""
    parts = []
    for kind, counts in (("records", config.record_copies), ("canaries", config.canary_repeats)):
        low, high = min(counts, default=0), max(counts, default=0)
        if not counts:
            parts.append(f"no {kind}")
        else:
            parts.append(
                f"{kind} planted {low}-{high} times"
                if low < high
                else f"{kind} planted {low} times"
            )
    return " and ".join(parts)


def _fit_planted(config: CorpusConfig, members: int) -> CorpusConfig:
    """`config` with its largest record copy counts and canary repeat counts dropped, the
    largest of either kind first (records on a tie), until the planted strings and the user's
    canaries need at most `members` member documents (`config` itself when they already fit).
    The user's canaries are never dropped: one line when they alone need more."""
    users = sum(repeats for _, repeats in config.user_canaries)
    if users > members:
        raise PrivacylabError(
            f"the --canary strings need {users} distinct member documents; the corpus has "
            f"{members}: lower --repeats or use a larger corpus"
        )
    records, canaries = sorted(config.record_copies), sorted(config.canary_repeats)
    room = members - users

    def need() -> int:
        return config.records_per_count * sum(records) + config.canaries_per_repeat * sum(canaries)

    while need() > room:
        if records and records[-1] >= (canaries[-1] if canaries else 0):
            records.pop()
        else:
            canaries.pop()
    if len(records) == len(config.record_copies) and len(canaries) == len(config.canary_repeats):
        return config
    kept = set(records), set(canaries)
    return replace(
        config,
        record_copies=tuple(c for c in config.record_copies if c in kept[0]),
        canary_repeats=tuple(r for r in config.canary_repeats if r in kept[1]),
    )


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
        "init": language.get("init"),
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
            help="default (CPython docs + planted records/canaries), public (the CPython docs "
            "chunks default does not use, no planted strings), a .txt file (documents "
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
        typer.Option(
            "--batch-size",
            help="Documents per batch (default 64; with --dp 256, at most a third of the members).",
        ),
    ] = None,
    lr: Annotated[
        float | None,
        typer.Option("--lr", help="Adam learning rate (default 2e-3; 3e-3 with --dp)."),
    ] = None,
    documents: Annotated[
        int | None,
        typer.Option(
            "--documents",
            help="Source documents used, half of them members (2000); fewer than 1142 hold "
            "fewer planted copies.",
        ),
    ] = None,
    context: Annotated[
        int | None,
        typer.Option(
            "--context",
            help=f"Tokens per document incl. BOS/EOS (128; {MIN_CONTEXT}-{MAX_CONTEXT}).",
        ),
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
    init: Annotated[
        Path | None,
        typer.Option(
            "--init",
            help="Fine-tune: start from the weights of this model folder (same size, context).",
            parser=_path_arg,
        ),
    ] = None,
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
            init=None if init is None else str(init),
        ).validate()
        if context is not None:
            _whole_in(context, "--context", MIN_CONTEXT, MAX_CONTEXT)
        _writable_folder(out)
        text, note = _corpus(
            corpus,
            documents=documents,
            context=context,
            canaries=list(canary or []),
            repeats=list(repeats or []),
            seed=seed,
        )
        with _Stages(_stderr()) as stages:
            language = train_language_model(text, config, out, progress=stages)
        if note is not None:
            _say(_stderr(), note)
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
            f"{payload['epochs']} epochs, {privacy}, {payload['seconds']:.0f} s"
            + (f", fine-tuned from {payload['init']['folder']}" if payload["init"] else "")
            + "\n"
            f"perplexity: members {perplexity['members']:.3f}, "
            f"held-out {perplexity['heldout']:.3f} "
            f"({payload['documents']['members']} / {payload['documents']['heldout']} documents)\n"
            f"model folder: {out}"
        )

    _guarded(run)
