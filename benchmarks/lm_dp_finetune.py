"""DP fine-tuning of a publicly pretrained language model against DP training from scratch: the
result shape of Li et al. 2022 ("Large Language Models Can Be Strong Differentially Private
Learners", Sec. 3 and Table 1: with a pretrained model, DP fine-tuning comes close to
non-private quality).

    python benchmarks/lm_dp_finetune.py [--json] [--out DIR] [--size medium] [--quick]
        [--scratch runs/lm-mem-2] [--epsilon 8] [--pretrain-epochs N] [--finetune-epochs N]

No pretrained weights can be downloaded here, so the public model is ours: pretrained
(non-private) on the public pydoc chunks the private corpus does not use
(`privacylab.data.corpus_build.public_corpus`), then fine-tuned on the default (private)
corpus non-privately and with DP-SGD at ``--epsilon`` (`privacylab.lm.LMConfig.init`). The
from-scratch pair is ``--scratch``/<size> and <size>-dp (the folders of
benchmarks/lm_memorization.py) when they hold a model of the same corpus, else trained here.
Reported: held-out and member perplexity of the private corpus for scratch / fine-tuned x
non-private / DP; for the fine-tuned pair the canaries' exposure
(`privacylab.lm_exposure.run_exposure`, method "extrapolate") and the LM membership AUCs
(`privacylab.lm_membership.run_lm_membership_job`, loss, min-k, min-k++).

Every model folder and result is kept under --out and skipped when present (a killed training
resumes from its checkpoint); progress on stderr; --json prints one JSON object on stdout.
--quick: a 600-document corpus, the tiny size, 2-3 epochs (a smoke run, minutes on a CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _language import cached_json, finish, fmt, log, stderr_progress, table

MEMBERSHIP_ATTACKS = ("loss", "min-k", "min-k++")


def corpus_config(args: argparse.Namespace) -> Any:
    from privacylab.data.corpus_build import CorpusConfig

    if args.quick:
        return CorpusConfig(
            documents=600,
            record_copies=(1, 4, 16, 32),
            records_per_count=2,
            canary_repeats=(0, 1, 8, 32),
            secret_length=3,
            seed=args.seed,
        )
    return CorpusConfig(seed=args.seed)


def trained(
    folder: Path, corpus: Any, config: Any, label: str, seconds: dict[str, float]
) -> dict[str, Any]:
    """The model folder `folder` trained with `config` on `corpus` (skipped when finished)."""
    from privacylab.lm import target_facts, train_language_model

    if not (folder / "model.json").exists():
        log(f"training {label} -> {folder}")
        start = time.perf_counter()
        folder.mkdir(parents=True, exist_ok=True)
        train_language_model(corpus, config, folder, progress=stderr_progress(label))
        seconds[label] = time.perf_counter() - start
    else:
        log(f"{folder}: found, skipped")
    return target_facts(folder)


def scratch_folder(args: argparse.Namespace, name: str, corpus: Any) -> Path | None:
    """`--scratch`/name when it holds a finished model of `corpus` and of --size, else None."""
    from privacylab.lm import LMError, load_language_model

    if args.scratch is None:
        return None
    folder = Path(args.scratch) / name
    if not (folder / "model.json").exists():
        return None
    try:
        loaded = load_language_model(folder)
    except LMError:
        return None
    if loaded.language.get("size") != args.size:
        return None
    if loaded.corpus.to_dict() != corpus.to_dict():
        log(f"{folder}: another corpus, not reused")
        return None
    return folder


def run(args: argparse.Namespace) -> dict[str, Any]:
    from privacylab.data.corpus_build import build_corpus, public_corpus
    from privacylab.lm import LMConfig

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = corpus_config(args)
    private = build_corpus(config)
    public = public_corpus(config)
    seconds: dict[str, float] = {}
    quick_epochs = 3 if args.quick else None

    def lm(**options: Any) -> LMConfig:
        return LMConfig(size=args.size, seed=args.seed, **options)

    pretrain_epochs = args.pretrain_epochs or quick_epochs
    finetune_epochs = args.finetune_epochs or (2 if args.quick else None)
    pretrained = out / "pretrained"
    facts = {
        "pretrained": trained(
            pretrained, public, lm(epochs=pretrain_epochs), "pretrain (public)", seconds
        )
    }
    models: dict[str, Path] = {}
    for name, epsilon in (("scratch", None), ("scratch-dp", args.epsilon)):
        reused = scratch_folder(args, args.size + ("-dp" if epsilon else ""), private)
        if reused is not None:
            log(f"{reused}: reused as {name}")
            models[name] = reused
            continue
        models[name] = out / name
        epochs = quick_epochs if epsilon is None else (quick_epochs or args.dp_epochs)
        trained(models[name], private, lm(epochs=epochs, epsilon=epsilon), name, seconds)
    for name, epsilon in (("finetuned", None), ("finetuned-dp", args.epsilon)):
        models[name] = out / name
        options = lm(epochs=finetune_epochs, epsilon=epsilon, init=str(pretrained))
        if epsilon is not None and args.dp_lr is not None:
            options = replace(options, lr=args.dp_lr)
        trained(models[name], private, options, name, seconds)

    from privacylab.lm import target_facts

    for name, folder in models.items():
        facts[name] = target_facts(folder)
    perplexity = {
        name: {
            "heldout": facts[name]["perplexity"]["heldout"],
            "members": facts[name]["perplexity"]["members"],
            "epsilon": facts[name]["epsilon"],
            "epochs": facts[name]["epochs"],
            "folder": facts[name]["folder"],
        }
        for name in models
    }

    from privacylab.lm_exposure import run_exposure
    from privacylab.lm_membership import run_lm_membership_job

    exposure: dict[str, Any] = {}
    membership: dict[str, Any] = {}
    for name in ("finetuned", "finetuned-dp"):
        start = time.perf_counter()
        run_ = cached_json(
            out / "results" / f"exposure-{name}.json",
            lambda name=name: run_exposure(
                models[name],
                method="extrapolate",
                seed=args.seed,
                store=out / f"exposure-{name}.sqlite",
                progress=stderr_progress(f"exposure {name}"),
            ),
        )
        exposure[name] = [
            {k: c.get(k) for k in ("prefix", "repeats", "space_bits", "exposure")}
            for c in run_["canaries"]
        ]
        mia = cached_json(
            out / "results" / f"membership-{name}.json",
            lambda name=name: run_lm_membership_job(
                models[name],
                attacks=MEMBERSHIP_ATTACKS,
                documents=args.mia_documents,
                seed=args.seed,
                progress=stderr_progress(f"membership {name}"),
            ),
        )
        membership[name] = {a["name"]: a.get("auc") for a in mia["attacks"]}
        seconds[f"attacks {name}"] = time.perf_counter() - start

    gap = {
        kind: perplexity[f"{kind}-dp"]["heldout"] - perplexity[kind]["heldout"]
        for kind in ("scratch", "finetuned")
    }
    return {
        "size": args.size,
        "quick": args.quick,
        "epsilon": args.epsilon,
        "corpus": {
            "private_members": len(private.member_indices),
            "private_heldout": len(private.heldout_indices),
            "public_documents": len(public.documents),
        },
        "perplexity": perplexity,
        "dp_heldout_gap": gap,
        "exposure": exposure,
        "membership_auc": membership,
        "pretrained": facts["pretrained"],
        "seconds": seconds,
        "paper": "Li et al. 2022, Table 1/Fig. 1: DP fine-tuning of a pretrained model at eps 8 "
        "comes close to non-private fine-tuning",
    }


def show(payload: dict[str, Any]) -> None:
    rows = [
        [name, fmt(p["epsilon"]), p["epochs"], fmt(p["members"]), fmt(p["heldout"])]
        for name, p in payload["perplexity"].items()
    ]
    print(table(rows, ["model", "epsilon", "epochs", "ppl members", "ppl held-out"]))
    print(f"DP held-out gap: {payload['dp_heldout_gap']}")
    for name, canaries in payload["exposure"].items():
        print(f"\nexposure {name}:")
        print(
            table(
                [[c["repeats"], fmt(c["exposure"]), fmt(c["space_bits"])] for c in canaries],
                ["repeats", "exposure", "max bits"],
            )
        )
    print(f"\nmembership AUC: {payload['membership_auc']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--size", default=None, choices=("tiny", "small", "medium"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--scratch", default="runs/lm-mem-2")
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--pretrain-epochs", type=int, default=None)
    parser.add_argument("--finetune-epochs", type=int, default=None)
    parser.add_argument("--dp-epochs", type=int, default=None)
    parser.add_argument("--dp-lr", type=float, default=None)
    parser.add_argument("--mia-documents", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.size is None:
        args.size = "tiny" if args.quick else "medium"
    if args.out is None:
        args.out = "runs/lm-dp-finetune" + ("-quick" if args.quick else "")
    return finish(args, run, show)


if __name__ == "__main__":
    raise SystemExit(main())
