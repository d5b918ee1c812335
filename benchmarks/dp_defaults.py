"""Accuracy of `privacylab train --dp --epsilon E` with no other flag (the DP defaults of
`privacylab.training.defaults.dp_defaults`), median of 3 seeds, on mnist5k.

Each run is the real command, `privacylab train --dataset mnist5k --model M --dp --epsilon E
--seed S --json`, in a fresh process (one torch thread), so the numbers are what a user gets.

    python benchmarks/dp_defaults.py                         # mlp, cnn, scatnet at ε = 1, 8
    python benchmarks/dp_defaults.py --models mlp --epsilons 1,8 --json

Prints a table (model, ε, median test accuracy, every seed's accuracy, the largest ε reported,
the median time per run) and, with --json, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run_once(model: str, epsilon: float, seed: int, extra: list[str]) -> dict:
    """One `privacylab train` run; its JSON summary plus the wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable,
            "-m",
            "privacylab",
            "train",
            "--dataset",
            "mnist5k",
            "--model",
            model,
            "--dp",
            "--epsilon",
            str(epsilon),
            "--seed",
            str(seed),
            "--out",
            out,
            "--json",
            *extra,
        ]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip().splitlines()[-1:]}")
    summary = json.loads(done.stdout)
    summary["seconds"] = seconds
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,cnn,scatnet")
    parser.add_argument("--epsilons", default="1,8")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--json", action="store_true", help="Print one JSON object at the end.")
    parser.add_argument("extra", nargs="*", help="Options passed on to privacylab train.")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for epsilon in (float(e) for e in args.epsilons.split(",")):
            runs = [run_once(model, epsilon, int(s), args.extra) for s in args.seeds.split(",")]
            accuracies = [r["test_accuracy"] for r in runs]
            row = {
                "model": model,
                "epsilon_target": epsilon,
                "median_accuracy": statistics.median(accuracies),
                "accuracies": accuracies,
                "max_epsilon_reported": max(r["epsilon"] for r in runs),
                "median_seconds": statistics.median(r["seconds"] for r in runs),
                "defaults": runs[0].get("defaults"),
            }
            rows.append(row)
            print(
                f"{model:8s} ε={epsilon:<4g} median acc {row['median_accuracy']:.4f} "
                f"({', '.join(f'{a:.4f}' for a in accuracies)})  ε reported ≤ "
                f"{row['max_epsilon_reported']:.4f}  {row['median_seconds']:.0f} s/run",
                file=sys.stderr,
                flush=True,
            )
    header = f"{'model':8s} {'ε':>4s} {'accuracy':>9s} {'ε reported':>10s} {'time/run':>9s}"
    print(header)
    for row in rows:
        print(
            f"{row['model']:8s} {row['epsilon_target']:4g} {row['median_accuracy']:9.4f} "
            f"{row['max_epsilon_reported']:10.4f} {row['median_seconds']:8.0f}s"
        )
    if args.json:
        print(json.dumps({"benchmark": "dp_defaults", "dataset": "mnist5k", "rows": rows}))


if __name__ == "__main__":
    main()
