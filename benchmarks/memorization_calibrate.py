"""Calibration of the memorization weight checks (`privacylab.defenses.memorization`) on
honestly trained models: the statistic of every registered `WeightCheck` on models of the
victim recipe (`VictimRecipe()`: the 784-512-256-10 ReLU MLP, 20 epochs of Adam at 2e-3,
batch 64) trained on mnist5k's 3,500 training rows, seeds 100..119 by default — seeds the
false-positive measurement (benchmarks/memorization_checks.py, seeds 0..19) does not use.

Split per seed s (as the job's): one permutation of mnist5k's 5,000 rows by
`numpy.random.default_rng(s)`: the first 1,000 rows are the test rows, the next 3,500 the
training rows; the model is built and trained with seed s.

Each model is saved under `<store>/models/seed-<s>/` (safetensors + JSON sidecar) and its
statistics in `<store>/results.sqlite` (namespace "calibration"); a re-run trains only the
missing models and recomputes nothing finished (kill it and start it again to resume).

    python benchmarks/memorization_calibrate.py --store /work/bench18/h4/calib [--seeds 100-119]
        [--train-only] [--quick] [--json]

`--quick`: 2 seeds, 2 epochs (smoke run), kept apart under `<store>/quick/` so that a later
full run never reuses its models or statistics. stdout: per check, the honest statistics (sorted),
their mean, standard deviation, maximum, the rule max(mean + 4 sd, 1.25 max) that set each
default threshold (rounded up) and the threshold in force; `--json`: one object.

Measured (20 models, ~17 CPU-s each; test accuracy 0.933-0.958):

    correlation: mean 39.39 sd 5.36 max 49.75 rule 62.19 threshold 63
    lsb-entropy: mean 86.35 sd 25.3 max 137.6 rule 187.7 threshold 188
    sign-pattern: mean 104.6 sd 4.83 max 114.2 rule 142.8 threshold 143
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from privacylab.attacks.memorization.training import train_honest
from privacylab.attacks.poisoning.recipe import VictimRecipe
from privacylab.data import Dataset, load_dataset
from privacylab.defenses.base import accuracy
from privacylab.defenses.memorization import WEIGHT_CHECKS
from privacylab.execution.store import ResultStore
from privacylab.models import load_model, save_model

TRAIN_ROWS = 3500
TEST_ROWS = 1000


def split(data: Dataset, seed: int) -> tuple[Dataset, Dataset]:
    """(train, test) of the job's shape: a seeded permutation, test first."""
    order = np.random.default_rng(seed).permutation(len(data))
    return data.subset(order[TEST_ROWS : TEST_ROWS + TRAIN_ROWS]), data.subset(order[:TEST_ROWS])


def seeds_arg(text: str) -> list[int]:
    """ "100-119" or "1,2,5" as a list of seeds."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def honest_model(store: Path, recipe: VictimRecipe, data: Dataset, seed: int) -> Any:
    """The honest model of `seed`, trained once and reloaded from the store afterwards."""
    folder = store / "models" / f"seed-{seed}"
    train, test = split(data, seed)
    if (folder / "model.json").is_file():
        model, _, meta = load_model(folder)
        return model, train, meta
    start = time.perf_counter()
    model, _ = train_honest(recipe, train, seed=seed, checkpoint_dir=store / "ckpt" / str(seed))
    meta = {
        "seed": seed,
        "test_accuracy": accuracy(model, test),
        "seconds": time.perf_counter() - start,
        "recipe": recipe.to_dict(),
    }
    save_model(model, folder, recipe.spec(train), meta)
    return model, train, meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--seeds", type=seeds_arg, default=list(range(100, 120)))
    parser.add_argument("--train-only", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    recipe = VictimRecipe()
    seeds = args.seeds
    if args.quick:
        recipe = VictimRecipe(epochs=2)
        seeds = seeds[:2]
    print("command: python " + " ".join(sys.argv), file=sys.stderr)
    data = load_dataset("mnist5k")
    store = args.store / "quick" if args.quick else args.store
    store.mkdir(parents=True, exist_ok=True)
    results = ResultStore(store / "results.sqlite")
    rows: dict[str, dict[int, float]] = {}
    for i, seed in enumerate(seeds):
        model, train, meta = honest_model(store, recipe, data, seed)
        print(
            f"[{i + 1}/{len(seeds)}] seed {seed}: test accuracy {meta['test_accuracy']:.3f}",
            file=sys.stderr,
        )
        if args.train_only:
            continue
        key = f"seed-{seed}"
        found = results.get("calibration", key) or {}
        missing = [n for n in WEIGHT_CHECKS.names() if n not in found]
        for name in missing:
            check = WEIGHT_CHECKS.get(name)()
            found[name] = check.statistic(model, train)
        if missing:
            results.put("calibration", key, found)
        for name in WEIGHT_CHECKS.names():
            rows.setdefault(name, {})[seed] = float(found[name])
    if args.train_only:
        return 0
    summary: dict[str, Any] = {}
    for name, values in rows.items():
        v = np.array(sorted(values.values()))
        summary[name] = {
            "values": {str(k): values[k] for k in sorted(values)},
            "mean": float(v.mean()),
            "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
            "max": float(v.max()),
            "threshold": WEIGHT_CHECKS.get(name)().threshold,
        }
        spread = summary[name]
        spread["rule"] = max(spread["mean"] + 4 * spread["std"], 1.25 * spread["max"])
    if args.json:
        print(json.dumps({"seeds": seeds, "checks": summary}))
        return 0
    for name, s in summary.items():
        values = " ".join(f"{x:.3g}" for x in sorted(s["values"].values()))
        print(
            f"{name}: mean {s['mean']:.4g} sd {s['std']:.3g} max {s['max']:.4g} "
            f"rule {s['rule']:.4g} threshold {s['threshold']:.4g}\n  {values}"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
