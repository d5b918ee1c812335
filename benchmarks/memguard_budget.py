"""MemGuard's distortion-budget curve on our data, beside the authors' published one.

    python benchmarks/memguard_budget.py [--dataset purchase-like] [--members N] [--json]

Setting (MemGuard, Jia et al. 2019, Sec. 5; the authors' `config.ini` for Location): an MLP
target overfit on ``--members`` examples; the defender's classifier g is fitted on those members
and ``--members`` holdout examples; the evaluation non-members are ``--members`` other examples;
the attacker owns the rest and trains ``--references`` reference models like the target on
``--members`` of them each (never through MemGuard: the attacker calibrates on undefended
outputs, as in the paper's NN-attack and seed 000's tables).

For each budget ε in 0, 0.1, 0.3, 0.5, 0.7, 1.0 the defended target is attacked by

* ``confidence-vector``: the label-free entropy of the confidence vector (Song & Mittal 2021,
  Eq. 4), its threshold chosen on the references' in/out outputs — the score-only attack MemGuard
  defends against; its balanced accuracy is the "inference accuracy" of the paper's Figure 1;
* ``shadow``: Shokri et al.'s per-class shadow attack (uses the true label too);
* ``gap``: the label-only gap attack (Yeom et al. 2018), which MemGuard cannot move.

Balanced accuracy, AUC and TPR at 0.1% FPR come from `privacylab.report.membership_metrics`.
MemGuard's README (Location, NN-attack) reports inference accuracy 0.73, 0.69, 0.62, 0.55,
0.52, 0.50 for budgets 0, 0.1, 0.3, 0.5, 0.7, 1.0; the table prints ours beside theirs and
ours / theirs. Last, MemGuard's time per 1,000 fresh queries (Phase I + II, one thread, no
memoised rows), on the attacker's population rows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.attacks.membership import MembershipTask, make_attack, run_attack
from privacylab.data import Dataset, available_datasets, load_dataset
from privacylab.defenses import DefenseData
from privacylab.defenses.base import accuracy
from privacylab.defenses.output.memguard import MemGuard
from privacylab.models import build_model
from privacylab.report import membership_metrics
from privacylab.target import Target
from privacylab.training import TrainConfig, train

BUDGETS = (0.0, 0.1, 0.3, 0.5, 0.7, 1.0)
PUBLISHED = (0.73, 0.69, 0.62, 0.55, 0.52, 0.50)
"""MemGuard README, Location: inference accuracy at `BUDGETS`."""

ATTACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "confidence-vector": ("entropy", {"thresholds": "global"}),
    "shadow": ("shadow", {}),
    "gap": ("gap", {}),
}


def log(message: str) -> None:
    """One progress line on stderr (stdout carries the table or the JSON)."""
    print(message, file=sys.stderr, flush=True)


def train_mlp(data: Dataset, rows: np.ndarray, seed: int, epochs: int) -> nn.Module:
    """The target recipe: an MLP with one 256-wide hidden layer, SGD with momentum, no
    regularisation, trained long enough to overfit."""
    model = build_model("mlp", data.input_shape, data.num_classes, seed=seed, widths=(256,))
    config = TrainConfig(epochs=epochs, batch_size=32, lr=0.05, seed=seed)
    return train(model, data.subset(rows), config).model.eval()


def monotone(values: list[float], tolerance: float = 0.01) -> bool:
    """Non-increasing, allowing `tolerance` of noise between neighbours."""
    return all(b <= a + tolerance for a, b in itertools.pairwise(values))


def run(dataset: str, members: int, references: int, epochs: int, seed: int) -> dict[str, Any]:
    """Train the target and the references, fit MemGuard once, attack it at every budget in
    `BUDGETS` (ours beside `PUBLISHED`, and ours / theirs), time 1,000 fresh queries."""
    torch.set_num_threads(1)
    data = load_dataset(dataset)
    perm = np.random.default_rng(seed).permutation(len(data))
    if len(perm) < 4 * members:
        raise SystemExit(f"{dataset} has {len(perm)} rows; --members {members} needs 4x that")
    mem, hold = perm[:members], perm[members : 2 * members]
    non, pop = perm[2 * members : 3 * members], perm[3 * members :]
    log(f"training the target on {members} {dataset} examples ...")
    model = train_mlp(data, mem, seed, epochs)
    candidates = np.concatenate([mem, non])
    n = len(candidates)
    refs, keep = [], []
    for r in range(references):
        log(f"training reference {r + 1}/{references} ...")
        inside = np.zeros(len(pop), dtype=bool)
        chosen = np.random.default_rng(seed + 100 + r).permutation(len(pop))[:members]
        inside[chosen] = True
        refs.append(train_mlp(data, pop[inside], seed + 100 + r, epochs))
        keep.append(np.concatenate([np.zeros(n, dtype=bool), inside]))
    task = MembershipTask(
        data.features[candidates],
        data.labels[candidates],
        data.num_classes,
        data.features[pop],
        data.labels[pop],
        refs,
        np.array(keep),
    )
    truth = np.r_[np.ones(members), np.zeros(members)].astype(np.int64)

    log("fitting MemGuard's defender classifier ...")
    started = time.perf_counter()
    defense = MemGuard(seed=seed)
    defense.fit(model, data.subset(mem), DefenseData(holdout=data.subset(hold)))
    fit_seconds = time.perf_counter() - started

    rows: list[dict[str, Any]] = []
    for budget, theirs in zip(BUDGETS, PUBLISHED, strict=True):
        log(f"budget {budget:g}: attacking ...")
        view = defense.with_budget(budget)
        target = view.defend(Target(model, "scores", data.num_classes))
        probs = Target(model, "scores", data.num_classes).probabilities(task.x)
        answered = view.transform(probs)
        row: dict[str, Any] = {
            "budget": budget,
            "mean_l1_distortion": float((answered - probs).abs().sum(1).mean()),
            "labels_kept": bool(torch.equal(answered.argmax(1), probs.argmax(1))),
            "published_inference_accuracy": theirs,
        }
        for label, (name, options) in ATTACKS.items():
            m = membership_metrics(run_attack(make_attack(name, **options), target, task, truth))
            row[label] = {
                "balanced_accuracy": m.balanced_accuracy,
                "auc": m.auc,
                "tpr_at_0.1pct_fpr": m.tpr_at_01pct_fpr,
            }
        row["ratio_to_published"] = row["confidence-vector"]["balanced_accuracy"] / theirs
        rows.append(row)

    fresh = defense.with_budget(1.0)
    fresh._memo = {}  # time Phase I afresh, not the memo
    queries = Target(model, "scores", data.num_classes).probabilities(data.features[pop[:1000]])
    started = time.perf_counter()
    fresh.transform(queries)
    per_1000 = (time.perf_counter() - started) * 1000 / len(queries)

    ours = [r["confidence-vector"]["balanced_accuracy"] for r in rows]
    return {
        "benchmark": "memguard_budget",
        "dataset": dataset,
        "members": members,
        "references": references,
        "epochs": epochs,
        "seed": seed,
        "target": {
            "train_accuracy": accuracy(model, data.subset(mem)),
            "test_accuracy": accuracy(model, data.subset(non)),
        },
        "defender": {**defense.notes, "fit_seconds": fit_seconds, "params": defense.params},
        "budgets": rows,
        "monotone_ours": monotone(ours),
        "monotone_published": monotone(list(PUBLISHED), 0.0),
        "seconds_per_1000_queries": per_1000,
        "timed_queries": len(queries),
        "threads": torch.get_num_threads(),
    }


def table(result: dict[str, Any]) -> str:
    """The budget curve as text: ours, the published accuracy and the ratio, per budget."""
    head = (
        f"{'budget':>6} {'L1':>6} | {'conf-vec BA':>11} {'AUC':>5} {'TPR@.1%':>7} | "
        f"{'published':>9} {'ratio':>5} | {'shadow BA':>9} {'AUC':>5} | {'gap BA':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in result["budgets"]:
        c, s, g = r["confidence-vector"], r["shadow"], r["gap"]
        lines.append(
            f"{r['budget']:>6.1f} {r['mean_l1_distortion']:>6.3f} | "
            f"{c['balanced_accuracy']:>11.3f} {c['auc']:>5.3f} {c['tpr_at_0.1pct_fpr']:>7.3f} | "
            f"{r['published_inference_accuracy']:>9.2f} {r['ratio_to_published']:>5.2f} | "
            f"{s['balanced_accuracy']:>9.3f} {s['auc']:>5.3f} | {g['balanced_accuracy']:>6.3f}"
        )
    t = result["target"]
    lines.append(
        f"target train/test accuracy {t['train_accuracy']:.3f}/{t['test_accuracy']:.3f}; "
        f"g accuracy on its own data {result['defender']['defender_accuracy']:.3f}; "
        f"monotone: ours {result['monotone_ours']}, published {result['monotone_published']}; "
        f"MemGuard {result['seconds_per_1000_queries']:.2f} s per 1,000 queries (1 thread)"
    )
    return "\n".join(lines)


def main() -> None:
    """Parse the options (bad ones: one line, exit 2), run, print the table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="purchase-like")
    parser.add_argument("--members", type=int, default=None)
    parser.add_argument("--references", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.dataset.replace("_", "-") not in {d.replace("_", "-") for d in available_datasets()}:
        print(
            f"unknown dataset {args.dataset!r}; available: {', '.join(available_datasets())}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    members = args.members or (150 if args.dataset == "digits" else 1000)
    if members < 10 or args.references < 1 or args.epochs < 1:
        print("--members must be >= 10, --references and --epochs >= 1", file=sys.stderr)
        raise SystemExit(2)
    result = run(args.dataset, members, args.references, args.epochs, args.seed)
    print(json.dumps(result, indent=2) if args.json else table(result))


if __name__ == "__main__":
    main()
