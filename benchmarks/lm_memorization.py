"""The memorisation experiment of issue 15, end to end: train small language models on the
default corpus (CPython's documentation with planted personal records and Secret-Sharer
canaries), non-private and DP-SGD at eps = 8, then extract training data, measure the exposure
of the canaries and run the LM membership-inference attacks, and print the numbers beside the
papers'.

    python benchmarks/lm_memorization.py [--json] [--quick] [--out DIR] [--samples N]
        [--epsilon 8] [--dp-sizes medium [small]] [--documents N] [--seed 0]

Steps (each one's result is kept under --out and skipped when present, so a killed run
resumes where it stopped; the generation store keeps samples as they are produced), per
target size (``--targets``: small, then medium, so that a complete result at the smaller size
comes first; --quick: small only):

1. corpus: `privacylab.data.corpus_build.build_corpus` (the default corpus; --quick: 600
   short documents, 3-digit secrets, fewer copies counts).
2. models (`privacylab.lm.train_language_model`, the `privacylab lm train` job): the target's
   smaller references and the target non-private, and the target with DP-SGD at ``--epsilon``
   (ghost clipping, PLD accountant, delta 1e-5; ``--dp-sizes``) -> DIR/<size>, DIR/<size>-dp.
3. extraction (`privacylab.lm_extract.run_lm_extraction`, Carlini et al. 2021, Sec. 5): on
   medium with references small and tiny, ``--samples`` samples per strategy (top-n,
   temperature, prefix), true memorised samples among the top 100 of each metric, printed
   beside the paper's Table 2 (GPT-2 XL, 200,000 samples per strategy; its "Small" and
   "Medium" reference rows are our "tiny" and "small"; its "Internet" column is our "prefix",
   prefixes from held-out text); records extracted against their copies count (where
   extraction begins); the same on small (reference tiny) to compare model sizes.
4. exposure (`privacylab.lm_exposure.run_exposure`, Carlini et al. 2019): every canary of
   medium and medium-dp, exposure against insertion count, beside log2|R| (the maximum) and
   the random level 1/ln 2 ~ 1.44 bits; the perplexity cost of DP (members / held-out).
5. membership (`privacylab.lm_membership.run_lm_membership_job`): loss, zlib, reference
   (small), lowercase, Min-K%, Min-K%++ on medium and medium-dp: AUC order.
6. report: every run through `privacylab.report.language.add_language_run(DIR, ...)`
   (DIR/index.html, section #language-models).

Timings per step are in the output ("seconds"). Run with OMP_NUM_THREADS set to the cores
you give it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _language import cached_json, finish, fmt, log, stderr_progress, table, train_folder

PAPER_TABLE2 = {
    "perplexity": {"top-n": 9, "temperature": 3, "prefix": 39},
    "tiny": {"top-n": 41, "temperature": 42, "prefix": 58},
    "small": {"top-n": 38, "temperature": 33, "prefix": 45},
    "zlib": {"top-n": 59, "temperature": 46, "prefix": 67},
    "window": {"top-n": 33, "temperature": 28, "prefix": 58},
    "lowercase": {"top-n": 53, "temperature": 22, "prefix": 60},
}
"""Carlini et al. 2021, Table 2 (seed 000): true memorised samples among the top 100 of each
metric for GPT-2 XL; row "Small" (GPT-2 Small reference) is our "tiny", "Medium" our "small";
column "Internet" is our "prefix". Total unique: 191 / 140 / 273."""
PAPER_TOTAL = {"top-n": 191, "temperature": 140, "prefix": 273}
STRATEGIES = ("top-n", "temperature", "prefix")
RANDOM_EXPOSURE = 1.0 / math.log(2.0)


def corpus_config(args: argparse.Namespace) -> Any:
    from privacylab.data.corpus_build import CorpusConfig

    if args.quick:
        return CorpusConfig(
            documents=args.documents or 600,
            record_copies=(1, 4, 16, 32),
            records_per_count=2,
            canary_repeats=(0, 1, 8, 32),
            secret_length=3,
            seed=args.seed,
        )
    return CorpusConfig(documents=args.documents or CorpusConfig().documents, seed=args.seed)


def train(
    args: argparse.Namespace, out: Path, corpus: Any, name: str, facts: dict[str, Any]
) -> dict[str, Any]:
    """The model folder `name` ("small", "medium-dp", ...) trained once (skipped when present)."""
    if name in facts:
        return facts[name]
    size, private = name.removesuffix("-dp"), name.endswith("-dp")
    start = time.perf_counter()
    facts[name] = train_folder(
        out / name,
        corpus,
        size,
        epsilon=args.epsilon if private else None,
        epochs=args.quick_epochs if args.quick else (args.dp_epochs if private else None),
        seed=args.seed,
        progress=stderr_progress(f"train {name}"),
    )
    facts[name]["wall_seconds"] = time.perf_counter() - start
    return facts[name]


def extraction(args: argparse.Namespace, out: Path, target: str, refs: list[str]) -> dict:
    from privacylab.lm_extract import run_lm_extraction

    def compute() -> dict[str, Any]:
        return run_lm_extraction(
            out / target,
            strategies=list(STRATEGIES),
            samples=args.samples,
            references=[out / r for r in refs],
            top=args.top,
            seed=args.seed,
            store_path=out / f"generations-{target}.sqlite",
            progress=stderr_progress(f"extraction {target}"),
        )

    return cached_json(out / "results" / f"extraction-{target}.json", compute)


def exposure(args: argparse.Namespace, out: Path, target: str) -> dict:
    from privacylab.lm_exposure import run_exposure

    def compute() -> dict[str, Any]:
        return run_exposure(
            out / target,
            method=args.exposure_method,
            enumerate_limit=args.enumerate_limit,
            seed=args.seed,
            store=out / f"exposure-{target}.sqlite",
            progress=stderr_progress(f"exposure {target}"),
        )

    return cached_json(out / "results" / f"exposure-{target}.json", compute)


def membership(args: argparse.Namespace, out: Path, target: str, reference: str) -> dict:
    from privacylab.lm_membership import run_lm_membership_job

    def compute() -> dict[str, Any]:
        return run_lm_membership_job(
            out / target,
            reference=out / reference,
            documents=args.mia_documents,
            seed=args.seed,
            progress=stderr_progress(f"membership {target}"),
        )

    return cached_json(out / "results" / f"membership-{target}.json", compute)


def _step(payload: dict[str, Any], name: str, compute: Any, *args: Any) -> dict[str, Any] | None:
    """Run one step, time it, and record it as missing (not fatal) when its module is absent."""
    start = time.perf_counter()
    try:
        value = compute(*args)
    except ImportError as err:
        payload["missing"].append(f"{name}: {err}")
        log(f"{name}: skipped ({err})")
        return None
    except Exception as err:  # one failed step is reported; the others still run
        import traceback

        traceback.print_exc()
        payload["missing"].append(f"{name}: failed: {type(err).__name__}: {err}")
        return None
    payload["seconds"][name] = time.perf_counter() - start
    log(f"{name}: {payload['seconds'][name]:.0f}s")
    return value


def summarise_extraction(run: dict[str, Any]) -> dict[str, Any]:
    """The Table 2 view of an extraction run: ours beside the paper's per metric x strategy,
    total unique true samples per strategy, where extraction begins."""
    ours = run.get("table", {})
    rows = {}
    metrics = run.get("metrics") or sorted({m for s in ours.values() for m in s})
    for metric in metrics:
        rows[metric] = {
            s: {"ours": ours.get(s, {}).get(metric), "paper": PAPER_TABLE2.get(metric, {}).get(s)}
            for s in run.get("strategies", STRATEGIES)
        }
    unique: dict[str, set[str]] = {}
    for item in run.get("extracted", []):
        unique.setdefault(item.get("strategy"), set()).add(item.get("text"))
    best = {}
    for s in run.get("strategies", STRATEGIES):
        col = {m: ours.get(s, {}).get(m) for m in metrics}
        col = {m: v for m, v in col.items() if v is not None}
        best[s] = max(col, key=col.get) if col else None
    zl, pp = "zlib", "perplexity"
    return {
        "rows": rows,
        "total_unique": {s: len(unique.get(s, ())) for s in run.get("strategies", STRATEGIES)},
        "best_metric": best,
        "zlib_beats_perplexity": {
            s: (ours.get(s, {}).get(zl) or 0) > (ours.get(s, {}).get(pp) or 0) for s in ours
        },
        "reference_beats_perplexity": {
            s: max((ours.get(s, {}).get(r) or 0) for r in ("small", "tiny"))
            > (ours.get(s, {}).get(pp) or 0)
            for s in ours
        },
        "records": run.get("records"),
        "extraction_begins_at": run.get("extraction_begins_at"),
        "seconds_per_1000_samples": run.get("seconds_per_1000_samples"),
    }


def summarise_exposure(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Exposure against repeats per model: mean over canaries with that count."""
    out: dict[str, Any] = {}
    for name, run in runs.items():
        by: dict[int, list[float]] = {}
        space = None
        for c in run.get("canaries", []):
            if c.get("user"):
                continue
            by.setdefault(int(c["repeats"]), []).append(float(c["exposure"]))
            space = c.get("space_bits", space)
        out[name] = {
            "space_bits": space,
            "by_repeats": {str(r): sum(v) / len(v) for r, v in sorted(by.items())},
            "at_least_8": [v for r, vs in by.items() if r >= 8 for v in vs],
        }
    return out


SMALLER = {"medium": ["small", "tiny"], "small": ["tiny"], "tiny": []}


def _report(payload: dict[str, Any], out: Path, kind: str, run_: dict[str, Any]) -> None:
    """Add the run to the report page in `out` at once (a killed run keeps what it showed)."""
    try:
        from privacylab.report.language import add_language_run
    except ImportError as err:
        payload["missing"].append(f"report: {err}")
        return
    payload["report"] = str(add_language_run(out, kind, run_))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Per target size (``--targets``, small then medium by default: a complete result at the
    smaller size first), train its references, itself and its DP twin, then extraction on it,
    exposure and membership on it and on its DP twin; every result cached under --out."""
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "benchmark": "lm_memorization",
        "quick": args.quick,
        "out": str(out),
        "seconds": {},
        "missing": [],
    }
    from privacylab.data.corpus_build import build_corpus

    config = corpus_config(args)
    corpus = build_corpus(config)
    payload["corpus"] = {
        "documents": len(corpus.documents),
        "members": int(corpus.members.sum()),
        "records": len(corpus.records),
        "canaries": len(corpus.canaries),
        "record_copies": list(config.record_copies),
        "canary_repeats": list(config.canary_repeats),
        "secret_length": config.secret_length,
    }
    facts: dict[str, Any] = {}
    payload["models"] = facts
    payload["extraction"], payload["exposure"], payload["membership"] = {}, {}, {}
    payload["dp_cost"] = {}
    exposures: dict[str, Any] = {}
    for big in args.targets:
        refs = SMALLER[big]
        dp = f"{big}-dp" if big in args.dp_sizes else None
        for name in [*reversed(refs), big]:
            _step(payload, f"train {name}", train, args, out, corpus, name, facts)
        got = _step(payload, f"extraction {big}", extraction, args, out, big, refs)
        if got is not None:
            payload["extraction"][big] = summarise_extraction(got)
            _report(payload, out, "extraction", got)
        for name in [big, *([dp] if dp else [])]:
            if name == dp:
                _step(payload, f"train {name}", train, args, out, corpus, name, facts)
            got = _step(payload, f"exposure {name}", exposure, args, out, name)
            if got is not None:
                exposures[name] = got
                _report(payload, out, "exposure", got)
            if refs:
                got = _step(payload, f"membership {name}", membership, args, out, name, refs[0])
                if got is not None:
                    payload["membership"][name] = {
                        "order": got["order"],
                        "auc": {a["name"]: a.get("auc") for a in got["attacks"]},
                        "tpr_at_1pct_fpr": {
                            a["name"]: a.get("tpr_at_1pct_fpr", a.get("tpr@1%"))
                            for a in got["attacks"]
                        },
                    }
                    _report(payload, out, "membership", got)
        if dp and dp in facts:
            payload["dp_cost"][big] = {
                "non_private": facts[big].get("perplexity"),
                "dp": facts[dp].get("perplexity"),
                "epsilon": facts[dp].get("epsilon"),
            }
    payload["exposure"] = summarise_exposure(exposures)
    payload["seconds"]["total"] = time.perf_counter() - start
    return payload


def show(payload: dict[str, Any]) -> None:
    c = payload.get("corpus", {})
    print(
        f"corpus: {c.get('documents')} documents ({c.get('members')} members), "
        f"{c.get('records')} records, {c.get('canaries')} canaries"
    )
    for name, f in (payload.get("models") or {}).items():
        ppl = f.get("perplexity") or {}
        print(
            f"model {name}: {f.get('parameters', 0):,} parameters, eps {f.get('epsilon')}, "
            f"perplexity members {fmt(ppl.get('members'), '.2f')} held-out "
            f"{fmt(ppl.get('heldout'), '.2f')}, {fmt(f.get('wall_seconds'), '.0f')}s"
        )
    for target, ex in (payload.get("extraction") or {}).items():
        print(f"\nextraction on {target}: true memorised samples in the top 100 (ours | paper)")
        strategies = list(next(iter(ex["rows"].values()), {}).keys()) if ex["rows"] else []
        rows = [
            [metric]
            + [
                f"{v[s]['ours']} | {v[s]['paper'] if v[s]['paper'] is not None else '-'}"
                for s in strategies
            ]
            for metric, v in ex["rows"].items()
        ]
        rows.append(
            ["total unique"]
            + [f"{ex['total_unique'].get(s)} | {PAPER_TOTAL.get(s)}" for s in strategies]
        )
        print(table(rows, ["metric", *strategies]))
        print(
            f"extraction begins at {ex.get('extraction_begins_at')} copies; records: "
            + json.dumps(ex.get("records"))
        )
    for name, e in (payload.get("exposure") or {}).items():
        print(
            f"\nexposure {name} (max {fmt(e['space_bits'], '.2f')} bits, random "
            f"{RANDOM_EXPOSURE:.2f}): "
            + ", ".join(f"{r}x {fmt(v, '.2f')}" for r, v in e["by_repeats"].items())
        )
    for name, m in (payload.get("membership") or {}).items():
        print(f"\nmembership {name}: order " + " > ".join(m["order"]))
        print("  AUC " + ", ".join(f"{a} {fmt(v, '.3f')}" for a, v in m["auc"].items()))
    if payload.get("dp_cost"):
        print(f"\nDP cost: {json.dumps(payload['dp_cost'])}")
    print("\nseconds: " + ", ".join(f"{k} {v:.0f}" for k, v in payload["seconds"].items()))
    for line in payload.get("missing", []):
        print(f"missing: {line}")
    if payload.get("report"):
        print(f"report: {payload['report']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--samples", type=int, default=None, help="samples per strategy")
    parser.add_argument("--top", type=int, default=100)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--targets", nargs="+", default=None, choices=["small", "medium"])
    parser.add_argument("--dp-sizes", nargs="*", default=None)
    parser.add_argument("--documents", type=int, default=None)
    parser.add_argument("--mia-documents", type=int, default=None)
    parser.add_argument("--exposure-method", default="auto")
    parser.add_argument("--enumerate-limit", type=int, default=10**5)
    parser.add_argument("--quick-epochs", type=int, default=8)
    parser.add_argument(
        "--dp-epochs", type=int, default=None, help="DP epochs (default: privacylab.lm's)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    quick = args.quick
    root = Path(__file__).resolve().parents[1] / "runs"
    args.out = args.out or str(root / ("lm-memorization-quick" if quick else "lm-memorization"))
    args.samples = args.samples or (200 if quick else 2000)
    args.mia_documents = args.mia_documents or (100 if quick else 500)
    if args.targets is None:
        args.targets = ["small"] if quick else ["small", "medium"]
    if args.dp_sizes is None:
        args.dp_sizes = list(args.targets)
    return finish(args, run, show)


if __name__ == "__main__":
    raise SystemExit(main())
