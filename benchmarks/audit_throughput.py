"""Audit throughput: ClipBKD audit trials per minute, serial vs local processes vs Ray.

Each trial is one trial of the logreg ClipBKD audit (Jagielski et al. 2020, Alg. 2 with the
CLIPBKD poison of Alg. 4): :func:`privacylab.audit.poisoning.poisoning_trial` trains a
multinomial logistic regression with DP-SGD (Abadi et al. 2016, Alg. 1) on D0 (300 digits) and on
D1 (D0 plus the poison) and returns both test statistics.  By default the DP-SGD runs use Poisson
minibatches of 50 for 10 epochs (60 steps each), so a trial is a few tenths of a second; the
audit's own default (3 full-batch steps) is so short that process overhead would dominate.  The
trials go through :func:`privacylab.audit.runner.run_trials` (one row of a fresh result store per
trial), so the numbers include the durable store.

Executors: ``SerialExecutor`` (1 worker), ``LocalExecutor(1)`` (in-process), ``LocalExecutor(2)``
(spawned pool: its start-up and the workers' imports are counted) and ``RayExecutor`` with 1 and
2 workers on a local Ray instance of that many CPUs (Ray's own start-up is reported apart as
``ray_startup_s``; the actors' start-up and first imports are counted).  ``speedup_2_vs_1`` is
each executor's 2-worker rate over its own 1-worker rate (``ray_vs_local_1``: Ray's 2 workers over
the in-process local worker), over the whole run and in steady state (the last two thirds of the
results, after every worker's start-up).  ``same_scores`` checks that every executor gave the
same trial results (seeds travel with the tasks).  Every worker, and this process, uses one
intra-op thread, so two workers need two free cores; on a shared machine the speed-ups are lower
bounds.

    python benchmarks/audit_throughput.py --trials 400 --json
"""

from __future__ import annotations

import os

# One OpenMP/BLAS thread everywhere, set before torch is imported (here, in the spawned workers
# that re-import this module, and in Ray workers): torch.set_num_threads(1) after the import
# leaves the OpenMP pool sized for every core, which ran a trial ~2.5x slower on this machine.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_name] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from privacylab.audit.poisoning import (  # noqa: E402
    PoisoningAudit,
    poisoning_trial,
    trial_payload,
)
from privacylab.audit.runner import run_trials  # noqa: E402
from privacylab.execution import (  # noqa: E402
    Executor,
    LocalExecutor,
    ResultStore,
    SerialExecutor,
)


def _measure(
    name: str, executor: Executor, trials: int, config: dict[str, Any], folder: Path
) -> dict[str, Any]:
    finished: list[float] = []
    with ResultStore(folder / f"{name}.db") as store:
        start = time.perf_counter()
        results = run_trials(
            poisoning_trial,
            config,
            trials,
            store=store,
            executor=executor,
            on_done=lambda key, value, cached: finished.append(time.perf_counter()),
        )
        seconds = time.perf_counter() - start
    # Steady state: the last two thirds of the results over the time they took (the first
    # results carry each worker's process start-up and first imports).
    head = max(executor.workers, len(finished) // 3)
    warm = len(finished) - 1 - head
    steady = finished[-1] - finished[head] if warm > 0 else 0.0
    return {
        "executor": name,
        "workers": executor.workers,
        "trials": len(results),
        "seconds": round(seconds, 3),
        "trials_per_minute": round(60.0 * trials / seconds, 2),
        "steady_trials_per_minute": round(60.0 * warm / steady, 2) if steady > 0 else None,
        "scores": [[r["stat_d0"], r["stat_d1"]] for r in results],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print a table (stderr) or one JSON object (stdout) and return it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400, help="trials per executor")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=50, help="0: full batch")
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray executor")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    audit = PoisoningAudit(
        method="clipbkd",
        epsilon=args.epsilon,
        epochs=args.epochs,
        batch_size=args.batch_size or None,
    )
    config = trial_payload(audit)
    runs: list[dict[str, Any]] = []
    startup: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, executor in (
            ("serial", SerialExecutor()),
            ("local-1", LocalExecutor(workers=1)),
            ("local-2", LocalExecutor(workers=2)),
        ):
            runs.append(_measure(name, executor, args.trials, config, folder))
            print(f"{name}: {runs[-1]['trials_per_minute']} trials/min", file=sys.stderr)
        if not args.no_ray:
            try:
                from privacylab.execution.ray_executor import RayExecutor

                RayExecutor(workers=1)
            except ValueError as err:
                print(f"ray skipped: {err}", file=sys.stderr)
            else:
                for workers in (1, 2):
                    name = f"ray-{workers}"
                    ray_executor = RayExecutor(workers=workers)
                    start = time.perf_counter()
                    with ray_executor.start():
                        startup[name] = round(time.perf_counter() - start, 3)
                        runs.append(_measure(name, ray_executor, args.trials, config, folder))
                    print(f"{name}: {runs[-1]['trials_per_minute']} trials/min", file=sys.stderr)
    by_name = {run["executor"]: run for run in runs}
    reference = by_name["serial"]["scores"]
    same = all(run["scores"] == reference for run in runs)
    speedup: dict[str, float | None] = {}
    pairs = (("local", "local-1", "local-2"), ("ray", "ray-1", "ray-2"))
    pairs += (("ray_vs_local_1", "local-1", "ray-2"),)
    for label, single, two in pairs:
        if two not in by_name:
            continue
        for suffix, field in (("", "trials_per_minute"), ("_steady", "steady_trials_per_minute")):
            one, many = by_name[single][field], by_name[two][field]
            speedup[label + suffix] = round(many / one, 3) if one and many else None
    report = {
        "benchmark": "audit_throughput",
        "trial": "ClipBKD audit trial: DP-SGD logreg on digits, D0 and D1",
        "config": config,
        "cpus": os.cpu_count(),
        "runs": [{k: v for k, v in run.items() if k != "scores"} for run in runs],
        "ray_startup_s": startup,
        "speedup_2_vs_1": speedup,
        "same_scores": same,
    }
    if args.json:
        print(json.dumps(report))
    else:
        for run in report["runs"]:
            print(
                f"{run['executor']:>8}  workers={run['workers']}  {run['seconds']:8.2f} s  "
                f"{run['trials_per_minute']:8.2f} trials/min  "
                f"(steady {run['steady_trials_per_minute']})"
            )
        print(f"speed-up 2 workers / 1 worker: {speedup}  (ray start-up {startup} s)")
        print(f"same scores on every executor: {same}")
    return report


if __name__ == "__main__":
    main()
