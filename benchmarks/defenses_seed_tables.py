"""The seeds' defence tables, reproduced on the embedded Purchase-like data, ours beside theirs.

One `privacylab.defend` evaluation (every model kept in the cache: a second run trains
nothing) of the defences the seeds tabulate, then one table per seed finding:

- seed 004 / Shokri et al. 2017 (Purchase-100): top-k (k = 3, 1), label only, rounding (d = 3,
  1), temperature (t = 5, 20) and L2 (λ = 1e-4, 1e-3, 1e-2): test accuracy and the
  classifier-based (shadow) attack's accuracy;
- seed 004 / Nasr et al. 2018 (Purchase-100): AdvReg at λ = 1, 3 (train, test, attack accuracy);
- seed 004 / Song & Mittal 2021 (Texas-100): no defence, AdvReg, early stopping against the
  metric attacks (confidence, entropy, modified entropy);
- seed 004 / Shejwalkar & Houmansadr 2021 (Purchase + FC): AdvReg vs DMP, test accuracy and
  attack accuracy;
- seed 000 / Choquette-Choo et al. 2021 (Purchase): undefended vs MemGuard, gap, confidence
  vector (the shadow attack calibrated on undefended references, as in the paper) and noise
  robustness.

"Attack accuracy" is balanced accuracy on a balanced member/non-member set, as in the seeds.
Each of our cells names the attack variant: adaptive (references queried through, or trained
with, the defence) or not.

    python benchmarks/defenses_seed_tables.py --json            # ~10-20 min on 2 cores
    python benchmarks/defenses_seed_tables.py --members 1000    # quicker, noisier
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from privacylab.defend import DefendConfig, evaluate_defenses

SHOKRI = {  # seed 004, Purchase dataset: (test accuracy, attack total accuracy)
    "none": (0.66, 0.92),
    "topk:3": (0.66, 0.92),
    "topk:1": (0.66, 0.89),
    "label-only": (0.66, 0.66),
    "rounding:3": (0.66, 0.92),
    "rounding:1": (0.66, 0.89),
    "temperature:5": (0.66, 0.88),
    "temperature:20": (0.66, 0.84),
    "l2:1e-4": (0.68, 0.87),
    "l2:1e-3": (0.72, 0.77),
    "l2:3e-3": (math.nan, math.nan),
    "l2:1e-2": (0.63, 0.53),
}
NASR = {  # seed 004, Purchase100, classifier-based attack: (train, test, attack accuracy)
    "none": (1.00, 0.801, 0.676),
    "advreg:1": (0.987, 0.783, 0.570),
    "advreg:3": (0.922, 0.765, 0.518),
}
SONG_MITTAL = {  # seed 004, Texas100 (class-dependent thresholds): no defence, AdvReg, early stop
    "confidence": (0.678, 0.586, 0.594),
    "entropy": (0.602, 0.535, 0.540),
    "modified-entropy": (0.677, 0.586, 0.595),
}
DMP_TABLE = {  # seed 004, Purchase + FC: (test accuracy, black-box attack accuracy)
    "advreg": (0.565, 0.554),
    "dmp": (0.741, 0.551),
}
CHOQUETTE = {  # seed 000, Purchase: undefended / MemGuard attack accuracy
    "gap": (0.671, 0.671),
    "confidence-vector": (0.861, 0.500),
    "noise": (0.874, 0.874),
}

DEFENSES = (
    "none",
    "topk:3",
    "topk:1",
    "label-only",
    "rounding:3",
    "rounding:1",
    "temperature:5",
    "temperature:20",
    "memguard",
    "l2:1e-4",
    "l2:1e-3",
    "l2:3e-3",
    "l2:1e-2",
    "early-stopping",
    "advreg:1",
    "advreg:3",
    "dmp",
    "selena",
    "dp:8",
)
ATTACKS = ("confidence", "entropy", "modified-entropy", "shadow", "lira-online", "gap", "noise")


def attack(row: dict[str, Any], name: str, adaptive: bool | None = None) -> dict[str, Any] | None:
    """The row's result of attack `name` (the adaptive variant when both ran, unless asked)."""
    found = [a for a in row["attacks"] if a["attack"] == name and "skipped" not in a]
    if adaptive is not None:
        found = [a for a in found if a["adaptive"] is adaptive]
    found.sort(key=lambda a: not a["adaptive"])
    return found[0] if found else None


def acc(result: dict[str, Any] | None) -> float:
    return math.nan if result is None else float(result["balanced_accuracy"])


def fmt(x: float) -> str:
    return "  -  " if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def tables(rows: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Every seed table, ours beside theirs."""
    out: dict[str, list[dict[str, Any]]] = {}
    shokri = []
    for label, (their_test, their_attack) in SHOKRI.items():
        row = rows.get(label)
        if row is None:
            continue
        shadow = attack(row, "shadow")
        shokri.append(
            {
                "defense": label,
                "test_accuracy": row["test_accuracy"],
                "seed_test_accuracy": their_test,
                "shadow_attack_accuracy": acc(shadow),
                "shadow_adaptive": None if shadow is None else shadow["adaptive"],
                "gap_attack_accuracy": acc(attack(row, "gap")),
                "best_attack_accuracy": max(
                    (acc(a) for a in row["attacks"] if "skipped" not in a), default=math.nan
                ),
                "seed_attack_accuracy": their_attack,
            }
        )
    out["shokri_output_and_l2"] = shokri
    nasr = []
    for label, (tr, te, at) in NASR.items():
        row = rows.get(label)
        if row is None:
            continue
        nasr.append(
            {
                "defense": label,
                "train_accuracy": row["train_accuracy"],
                "test_accuracy": row["test_accuracy"],
                "shadow_attack_accuracy": acc(attack(row, "shadow")),
                "seed": [tr, te, at],
            }
        )
    out["nasr_advreg"] = nasr
    song = []
    for name, theirs in SONG_MITTAL.items():
        ours = [acc(attack(rows[d], name)) if d in rows else math.nan for d in
                ("none", "advreg:3", "early-stopping")]  # fmt: skip
        song.append({"attack": name, "ours": ours, "seed": list(theirs)})
    out["song_mittal_early_stopping"] = song
    dmp = []
    for label, key in (("advreg:3", "advreg"), ("dmp", "dmp"), ("selena", None)):
        row = rows.get(label)
        if row is None:
            continue
        dmp.append(
            {
                "defense": label,
                "test_accuracy": row["test_accuracy"],
                "shadow_attack_accuracy": acc(attack(row, "shadow")),
                "best_attack_accuracy": max(
                    (acc(a) for a in row["attacks"] if "skipped" not in a), default=math.nan
                ),
                "best_tpr_at_01pct_fpr": row["best"]["tpr_at_01pct_fpr"],
                "seed": list(DMP_TABLE[key]) if key else None,
            }
        )
    out["distillation"] = dmp
    memguard = []
    for name, (undefended, defended) in CHOQUETTE.items():
        attack_name, adaptive = ("shadow", False) if name == "confidence-vector" else (name, None)
        memguard.append(
            {
                "attack": name,
                "undefended": acc(attack(rows["none"], attack_name)) if "none" in rows else None,
                "memguard": acc(attack(rows["memguard"], attack_name, adaptive))
                if "memguard" in rows
                else None,
                "seed": [undefended, defended],
            }
        )
    if "memguard" in rows:
        memguard.append(
            {
                "attack": "entropy (label-free confidence vector), non-adaptive",
                "undefended": acc(attack(rows["none"], "entropy")),
                "memguard": acc(attack(rows["memguard"], "entropy", False)),
                "seed": [0.861, 0.500],
            }
        )
        adaptive_shadow = attack(rows["memguard"], "shadow", True)
        memguard.append(
            {
                "attack": "confidence-vector, adaptive (references through MemGuard)",
                "undefended": acc(attack(rows["none"], "shadow")),
                "memguard": acc(adaptive_shadow),
                "seed": None,
            }
        )
    out["choquette_memguard"] = memguard
    return out


def print_tables(result: dict[str, list[dict[str, Any]]]) -> None:
    print("\nSeed 004 / Shokri et al. 2017, Purchase: output masking and L2")
    print(
        f"{'defence':16} {'test':>6} {'seed':>6} | {'shadow':>6} {'gap':>6} {'best':>6} {'seed':>6}"
    )
    for r in result["shokri_output_and_l2"]:
        print(
            f"{r['defense']:16} {fmt(r['test_accuracy']):>6} {fmt(r['seed_test_accuracy']):>6} | "
            f"{fmt(r['shadow_attack_accuracy']):>6} {fmt(r['gap_attack_accuracy']):>6} "
            f"{fmt(r['best_attack_accuracy']):>6} {fmt(r['seed_attack_accuracy']):>6}"
        )
    print("\nSeed 004 / Nasr et al. 2018, Purchase100: adversarial regularisation")
    print(f"{'defence':12} {'train':>6} {'test':>6} {'attack':>6} | seed (train, test, attack)")
    for r in result["nasr_advreg"]:
        print(
            f"{r['defense']:12} {fmt(r['train_accuracy']):>6} {fmt(r['test_accuracy']):>6} "
            f"{fmt(r['shadow_attack_accuracy']):>6} | {r['seed']}"
        )
    print("\nSeed 004 / Song & Mittal 2021: none, AdvReg, early stopping (metric attacks)")
    for r in result["song_mittal_early_stopping"]:
        ours = " ".join(fmt(x) for x in r["ours"])
        print(f"{r['attack']:18} ours {ours} | seed (Texas100) {r['seed']}")
    print("\nSeed 004 / Shejwalkar & Houmansadr 2021: distillation vs AdvReg")
    for r in result["distillation"]:
        print(
            f"{r['defense']:10} test {fmt(r['test_accuracy'])} shadow "
            f"{fmt(r['shadow_attack_accuracy'])} best {fmt(r['best_attack_accuracy'])} "
            f"TPR@0.1% {fmt(r['best_tpr_at_01pct_fpr'])} | seed (test, attack) {r['seed']}"
        )
    print("\nSeed 000 / Choquette-Choo et al. 2021, Purchase: MemGuard")
    for r in result["choquette_memguard"]:
        print(
            f"{r['attack']:58} undefended {fmt(r['undefended'])} MemGuard {fmt(r['memguard'])}"
            f" | seed {r['seed']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="purchase-like")
    parser.add_argument("--members", type=int, default=2500)
    parser.add_argument("--references", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--cache", default="benchmarks/.cache/defenses_seed_tables")
    parser.add_argument("--defenses", default=",".join(DEFENSES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    config = DefendConfig(
        dataset=args.dataset,
        defenses=tuple(args.defenses.split(",")),
        attacks=ATTACKS,
        members=args.members,
        references=args.references,
        epochs=args.epochs,
    )
    start = time.perf_counter()

    def progress(stage: str, done: float, total: float) -> None:
        if done >= total:
            print(f"[{time.perf_counter() - start:6.0f}s] {stage}", file=sys.stderr, flush=True)

    section, _ = evaluate_defenses(config, Path(args.cache), progress=progress)
    rows = {r["defense"]: r for r in section["rows"]}
    result = tables(rows)
    if args.json:
        print(json.dumps({"tables": result, "seconds": time.perf_counter() - start}))
    else:
        print_tables(result)
        print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
