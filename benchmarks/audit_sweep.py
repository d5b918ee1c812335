"""Soundness and power sweep of every audit method over ε ∈ {0.5, 1, 2, 4, 8}.

For each method of `privacylab.audit.METHODS` and each target ε this runs `run_audit` (DP-SGD on
digits, logistic regression, δ = 1e-5) and prints the accountant's ε next to the certified lower
bound: soundness means ε_LB ≤ ε everywhere (at the stated confidence), power is ε_LB / ε.  For
the poisoning audits (Jagielski et al. 2020) it also prints the separation of the test statistic,
μ̂ = (mean₁ − mean₀)/sd₀, which orders the tests where every Clopper–Pearson bound is still 0.

Trials are durable in a SQLite store (``--store``), so a killed sweep resumes.  Exit status 1 if
any lower bound exceeds its accountant ε.

    python benchmarks/audit_sweep.py [--trials 200] [--workers 2] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from privacylab.audit import METHODS, run_audit
from privacylab.audit.job import POISONING
from privacylab.audit.poisoning import PoisoningAudit, run_poisoning_audit
from privacylab.execution import ResultStore, make_executor

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)


def _separation(counts: dict[str, Any]) -> float | None:
    if "mean_stat_d0" not in counts:
        return None
    spread = counts["std_stat_d0"]
    if spread <= 0.0:
        return math.inf
    return (counts["mean_stat_d1"] - counts["mean_stat_d0"]) / spread


def sweep(
    methods: tuple[str, ...],
    epsilons: tuple[float, ...],
    trials: int,
    workers: int,
    store: Path,
    k: int | None = None,
    poisoning: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run every (method, ε) audit; return one row each. `poisoning` overrides fields of
    `PoisoningAudit` (e.g. ``batch_size``, ``epochs``) for the poisoning methods."""
    rows = []
    executor = make_executor("local", workers)
    with ResultStore(store) as db:
        for method in methods:
            for epsilon in epsilons:
                start = time.perf_counter()
                if method in POISONING:
                    config = PoisoningAudit(method=method, epsilon=epsilon, k=k, **poisoning or {})
                    result = run_poisoning_audit(config, trials, store=db, executor=executor)
                else:
                    result = run_audit(
                        method, epsilon=epsilon, trials=trials, store=db, executor=executor
                    )
                row = {
                    "method": method,
                    "k": result.params.get("k"),
                    "epsilon": epsilon,
                    "epsilon_theory": result.epsilon_theory,
                    "epsilon_lower_bound": result.epsilon_lower_bound,
                    "ratio": result.epsilon_lower_bound / result.epsilon_theory,
                    "sound": not result.violated,
                    "confidence": result.confidence,
                    "trials": result.trials,
                    "separation": _separation(result.counts),
                    "epsilon_lower_bound_cp": result.params.get("epsilon_lower_bound_cp"),
                    "seconds": time.perf_counter() - start,
                }
                rows.append(row)
                print(_line(row), file=sys.stderr, flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    sep = row["separation"]
    cp = row["epsilon_lower_bound_cp"]
    return (
        f"{row['method']:<17} k={row['k'] or '-':<2} eps={row['epsilon']:<4g} "
        f"theory={row['epsilon_theory']:7.3f} "
        f"LB={row['epsilon_lower_bound']:7.3f} ratio={row['ratio']:5.2f} "
        f"sound={'yes' if row['sound'] else 'NO '} "
        f"sep={'' if sep is None else f'{sep:6.3f}':>6} "
        f"cp={'' if cp is None else f'{cp:6.3f}':>6} "
        f"trials={row['trials']:<5} {row['seconds']:6.1f}s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--k", type=int, default=None, help="poisons (poisoning audits)")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="poisoning: expected batch (full batch)"
    )
    parser.add_argument("--epochs", type=int, default=None, help="poisoning: epochs (3)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--store", type=Path, default=Path(".cache/audit_sweep.sqlite"))
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="ε ∈ {1, 8} and 40 trials")
    args = parser.parse_args()
    methods = tuple(m for m in args.methods.split(",") if m)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    epsilons = (1.0, 8.0) if args.quick else EPSILONS
    trials = 40 if args.quick else args.trials
    args.store.parent.mkdir(parents=True, exist_ok=True)
    overrides = {
        name: value
        for name, value in (("batch_size", args.batch_size), ("epochs", args.epochs))
        if value is not None
    }
    rows = sweep(methods, epsilons, trials, args.workers, args.store, args.k, overrides)
    sound = all(r["sound"] for r in rows)
    if args.json:
        print(json.dumps({"rows": rows, "sound": sound}, indent=1))
    else:
        for row in rows:
            print(_line(row))
        print("sound everywhere" if sound else "UNSOUND: a lower bound exceeds its accountant ε")
    return 0 if sound else 1


if __name__ == "__main__":
    raise SystemExit(main())
