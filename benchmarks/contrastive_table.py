"""Carlini & Terzis 2022 ("Poisoning and Backdooring Contrastive Learning", ICLR'22), the
ablations of Sec. 5 at toy scale: a small CLIP (`privacylab.models.dual_encoder`) trained on
captioned mnist5k digits (`privacylab.data.captions`), attacked by `clip-backdoor` and
`clip-poison` (`privacylab.attacks.poisoning.contrastive.run_contrastive`).

Tables (each cell: mean over seeds of the zero-shot ASR — for clip-poison the share of target
images classified as the target label — and of the backdoor z-score, Sec. 5.1):

- `poisons`: backdoor success and z-score against the number of poisoned pairs
  (0, 2, 5, 10, 20, 40, 100 of 4,000 = up to 2.4%), patch at a fixed corner vs at a random place
  (Sec. 5.2, Figs. 3-4: the paper finds random placement *more* effective);
- `patch_size`: 2, 4, 6-pixel checkerboard patches at a fixed number of poisons (Sec. 5.3);
- `dataset_size`: 1,000 / 2,000 / 4,000 victim pairs at a fixed number of poisons (Sec. 5.2:
  "attack success rate remains almost completely constant" as the dataset shrinks);
- `targeted`: clip-poison success against the poisoned pairs per target image (Sec. 4.1, 5
  target images per model).

Measured (2026-11-24, 2 shared cores at load ~13, 10 epochs, 500 test images; the full grid
one seed in 1,645 s, `--quick --first-seed 1` a second seed; seed 0 [2-seed mean where run]):

- fixed corner 4-px checkerboard, N = 0/2/5/10/20/40/100 of 4,000: ASR 0.01/0.38/0.76
  [0.78]/0.85/0.99 [0.99]/1.00 [1.00]/1.00, z-score 0.31/5.0/8.2/10.5/15.7/13.9/14.3 (clean
  model 0.31). A backdoor from 2 pairs (0.05%) is measurable, from 20 (0.5%) complete — the
  paper's "0.01%" regime, at toy scale. Zero-shot accuracy 0.90-0.95 throughout (clean 0.908).
- random place: ASR <= 0.05 and z ~ 0 up to N = 40 (1%), ASR 0.19 / z 0.67 at N = 100. This is
  the OPPOSITE of the paper's finding (random beats fixed): our tiny CNN trained 10 epochs does
  not learn a position-invariant patch detector from N examples at N places (a variant with
  global max+mean pooling instead of the flattened head, tried once at N = 40, failed alike:
  ASR 0.01); on 8x8 digits with 60 of 800 pairs (7%) a random 3-px patch reaches ASR 0.50.
- patch size at N = 20, corner: 2/4/6 px ASR 0.94 [0.90]/0.99/0.99, z 12.5/15.7/16.3 — even a
  2-px patch backdoors the model (as the paper says of small patches); random: all fail.
- dataset size at N = 20, corner: 1,000/2,000/4,000 pairs ASR 0.98/1.00/0.99 (z 13.2/15.0/15.7)
  while zero-shot accuracy grows 0.79 -> 0.91: success does not depend on the dataset size at
  fixed N, as the paper finds (so the poison *rate* needed falls as the data grows).
- targeted poisoning, 5 targets in one model, N = 1/2/5/10/20 pairs per target: success
  0.00 [0.10]/0.60/1.00 [0.90]/1.00/1.00 [1.00] (clean model 0.00 throughout).

Every finished cell goes to a `ResultStore` (`--store`), so a re-run resumes and a second run
trains nothing. Progress on stderr; `--json` prints one JSON object.

    python benchmarks/contrastive_table.py          # full grid, 1 seed: ~20 min, 2 busy cores
    python benchmarks/contrastive_table.py --quick  # fewer points, ~8 min
    python benchmarks/contrastive_table.py --seeds 3 --json
    python benchmarks/contrastive_table.py --quick --first-seed 1   # another seed, same store
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privacylab.attacks.poisoning.contrastive import EPOCHS, run_contrastive
from privacylab.data import load_dataset
from privacylab.execution.store import ResultStore

NAMESPACE = "contrastive_table"


class Runner:
    """Runs (or reads back) one attack cell; clean models are trained once per (size, seed)."""

    def __init__(self, store: ResultStore, epochs: int, test_size: int) -> None:
        self.store = store
        self.epochs = epochs
        self.test_size = test_size
        self.data = load_dataset("mnist5k")
        self.clean: dict[tuple[int, int], Any] = {}

    def _clean_model(self, train_size: int, seed: int) -> Any:
        key = (train_size, seed)
        if key not in self.clean:
            _, model = run_contrastive("clip-backdoor", **self._common(train_size, seed), poisons=0)
            self.clean[key] = model
        return self.clean[key]

    def _common(self, train_size: int, seed: int) -> dict[str, Any]:
        return {
            "data": self.data,
            "train_size": train_size,
            "test_size": self.test_size,
            "seed": seed,
            "epochs": self.epochs,
        }

    def cell(
        self, method: str, poisons: int, trigger: str | None, train_size: int, seed: int
    ) -> dict[str, Any]:
        config = {
            "method": method,
            "poisons": poisons,
            "trigger": trigger,
            "train_size": train_size,
            "seed": seed,
            "epochs": self.epochs,
            "test_size": self.test_size,
        }
        key = json.dumps(config, sort_keys=True)
        saved = self.store.get(NAMESPACE, key)
        if saved is not None:
            return saved
        start = time.perf_counter()
        options: dict[str, Any] = {**self._common(train_size, seed), "poisons": poisons}
        if trigger is not None:
            options["trigger"] = trigger
        if poisons or (train_size, seed) in self.clean:
            options["clean_model"] = self._clean_model(train_size, seed)
        result, model = run_contrastive(method, **options)
        if not poisons and (train_size, seed) not in self.clean:
            self.clean[(train_size, seed)] = model
        row = {
            **config,
            "asr": result.asr,
            "baseline_asr": result.baseline_asr,
            "z_score": result.z_score,
            "baseline_z_score": result.details.get("baseline_z_score"),
            "clean_accuracy": result.clean_accuracy,
            "baseline_accuracy": result.baseline_accuracy,
            "poison_rate": result.poison_rate,
            "seconds": time.perf_counter() - start,
        }
        self.store.put(NAMESPACE, key, row)
        print(
            f"  {method} N={poisons} {trigger} |X|={train_size} seed={seed}: "
            f"asr={result.asr:.3f} z={result.z_score} acc={result.clean_accuracy:.3f} "
            f"({row['seconds']:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        return row


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None and not math.isnan(r[key])]
    return float(np.mean(values)) if values else None


def _summary(rows: list[dict[str, Any]], **label: Any) -> dict[str, Any]:
    return {
        **label,
        "seeds": len(rows),
        "asr": _mean(rows, "asr"),
        "asr_per_seed": [r["asr"] for r in rows],
        "baseline_asr": _mean(rows, "baseline_asr"),
        "z_score": _mean(rows, "z_score"),
        "baseline_z_score": _mean(rows, "baseline_z_score"),
        "clean_accuracy": _mean(rows, "clean_accuracy"),
        "baseline_accuracy": _mean(rows, "baseline_accuracy"),
        "poison_rate": _mean(rows, "poison_rate"),
    }


def tables(runner: Runner, seeds: list[int], quick: bool) -> dict[str, list[dict[str, Any]]]:
    """The four tables of the module docstring."""
    counts = (0, 5, 20, 40) if quick else (0, 2, 5, 10, 20, 40, 100)
    places = ("corner", "random")
    out: dict[str, list[dict[str, Any]]] = {
        "poisons": [],
        "patch_size": [],
        "dataset_size": [],
        "targeted": [],
    }
    for place in places:
        spec = f"pattern:4@{place}"
        for n in counts:
            print(f"poisons: {n} {spec}", file=sys.stderr, flush=True)
            rows = [runner.cell("clip-backdoor", n, spec, 4000, s) for s in seeds]
            out["poisons"].append(_summary(rows, poisons=n, trigger=spec))
    fixed = 20
    for place in places:
        for size in (2, 4, 6):
            spec = f"pattern:{size}@{place}"
            print(f"patch size: {spec}", file=sys.stderr, flush=True)
            rows = [runner.cell("clip-backdoor", fixed, spec, 4000, s) for s in seeds]
            out["patch_size"].append(_summary(rows, poisons=fixed, trigger=spec, size=size))
    sizes = (1000, 4000) if quick else (1000, 2000, 4000)
    for place in places:
        spec = f"pattern:4@{place}"
        for size in sizes:
            print(f"dataset size: {size} {spec}", file=sys.stderr, flush=True)
            rows = [runner.cell("clip-backdoor", fixed, spec, size, s) for s in seeds]
            out["dataset_size"].append(
                _summary(rows, poisons=fixed, trigger=spec, dataset_size=size)
            )
    for n in (1, 5, 20) if quick else (1, 2, 5, 10, 20):
        print(f"targeted: {n}", file=sys.stderr, flush=True)
        rows = [runner.cell("clip-poison", n, None, 4000, s) for s in seeds]
        out["targeted"].append(_summary(rows, poisons_per_target=n))
    return out


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_tables(result: dict[str, Any]) -> None:
    """Plain-text tables on stdout."""
    t = result["tables"]
    print("\nBackdoor vs poisoned pairs (4,000 clean pairs; ASR, z-score; clean model's in ())")
    for row in t["poisons"]:
        print(
            f"  {row['trigger']:<18} N={row['poisons']:>4} ({100 * row['poison_rate']:.2f}%)  "
            f"ASR {_fmt(row['asr'])} ({_fmt(row['baseline_asr'])})  "
            f"z {_fmt(row['z_score'])} ({_fmt(row['baseline_z_score'])})  "
            f"zero-shot acc {_fmt(row['clean_accuracy'], 3)}"
        )
    print("\nPatch size (N = 20 of 4,000)")
    for row in t["patch_size"]:
        print(f"  {row['trigger']:<18} ASR {_fmt(row['asr'])}  z {_fmt(row['z_score'])}")
    print("\nDataset size (N = 20)")
    for row in t["dataset_size"]:
        print(
            f"  {row['trigger']:<18} |X|={row['dataset_size']:>5}  ASR {_fmt(row['asr'])}  "
            f"z {_fmt(row['z_score'])}  acc {_fmt(row['clean_accuracy'], 3)}"
        )
    print("\nTargeted poisoning (5 target images, one model; share classified as the target)")
    for row in t["targeted"]:
        print(
            f"  N={row['poisons_per_target']:>3} per target  success "
            f"{_fmt(row['asr'])} (clean model {_fmt(row['baseline_asr'])})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--quick", action="store_true", help="fewer points")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per cell")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds run from this one")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--test-size", type=int, default=500)
    parser.add_argument(
        "--store",
        type=Path,
        default=Path(tempfile.gettempdir()) / "privacylab-contrastive_table.sqlite",
        help="result store (resume; a second run trains nothing)",
    )
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.epochs < 1 or args.first_seed < 0:
        print("error: --seeds and --epochs must be >= 1, --first-seed >= 0", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, torch.get_num_threads()))
    start = time.perf_counter()
    with ResultStore(args.store) as store:
        runner = Runner(store, args.epochs, args.test_size)
        result = {
            "paper": "Carlini & Terzis 2022, Sec. 5",
            "dataset": "mnist5k",
            "epochs": args.epochs,
            "seeds": list(range(args.first_seed, args.first_seed + args.seeds)),
            "tables": tables(
                runner, list(range(args.first_seed, args.first_seed + args.seeds)), args.quick
            ),
        }
    result["seconds"] = time.perf_counter() - start
    if args.json:
        print(json.dumps(result))
    else:
        print_tables(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
