"""Output defences against membership inference: privacylab's post-processors against IBM ART's
(`art.defences.postprocessor`), the same target and the same adaptive attacks, in one run.

    python benchmarks/defenses_vs_art.py [--json] [--dataset purchase-like] [--members 2500]
        [--references 4] [--epochs 30] [--cache DIR]

Setting: the `privacylab run` membership game (`privacylab.experiment.prepare_games`): an MLP
600-256-100 (`--dataset purchase-like`, Shokri et al.'s Purchase-100 made the same way) trained
on `--members` rows, as many non-member candidates, a population the attacker owns, and
`--references` reference models trained like the target on known halves of the candidates
(Carlini et al. 2022). The default run (2,000 members, 4 references, 30 epochs) takes about 5
minutes on 2 cores; `--cache DIR` keeps the trained models for a second run. Every defence,
ours or ART's, is put in front of *that* target as a `Target` output defence (ART's numpy
post-processors wrapped: float64 numpy in, tensor out), served at scores (at label for
label-only / ClassLabels).

Attacks, adaptive (Kerckhoffs): the attacker knows the post-processor, so every reference model
is queried through the same one (`MembershipTask.reference_defense`); the score attacks (loss,
confidence, entropy, modified-entropy, shadow, lira-online, rmia) run where the deployment
serves scores, the label-only attacks (gap; noise robustness on a balanced subsample) always.
Metrics come from `privacylab.report.membership_metrics`. Per defence: test accuracy (the
served label on the non-member candidates, which the target never saw), best AUC, best TPR at
0.1% FPR and the attack achieving it, and the post-processor's seconds per 10,000 queries
(median of 5 calls on 10,000 probability rows, as the `Target` hook calls it).

Pairs (ours ↔ ART, same parameters):

* ``topk:1`` ↔ ``HighConfidence(cutoff=0.5)`` and ``topk:3`` ↔ ``HighConfidence(0.25)``. Not
  twins, said plainly: HighConfidence zeroes every score below a fixed cutoff, so at most
  ⌊1/cutoff⌋ scores survive (1 and 4 — ties at exactly the cutoff aside) but a row whose top
  score is below the cutoff comes back all zeros and its label becomes class 0; top-k always
  returns exactly k scores.
* ``rounding:1`` / ``rounding:3`` ↔ ``Rounded(1)`` / ``Rounded(3)``: ours lifts the model's
  arg-max one step where rounding ties it, so the label is kept.
* ``label-only`` ↔ ``ClassLabels``. ART 1.20's ``ClassLabels`` on a batch sets
  ``class_labels[:, index_labels] = 1``: every row gets a 1 at *every* arg-max of the batch, so
  served labels collapse. We report it as shipped (``art:ClassLabels``, gap attack only: its
  labels carry nothing) and called one row at a time (``art:ClassLabels/row``, correct, ART's
  intent); the pair uses the row-by-row one.
* ``noise:0.1`` ↔ ``GaussianNoise(0.1)`` (same recipe: add N(0, 0.1²), clip at 0, renormalise;
  ours draws from a seeded generator and keeps the label, ART's from `np.random`, seeded here).
* ``reverse-sigmoid:1:0.1`` ↔ ``ReverseSigmoid(beta=1, gamma=0.1)`` (the same formula).

Verdict. A point (test accuracy, best TPR@0.1%FPR) covers another when its accuracy is ≥ and
its TPR ≤ the other's — strictly, and within noise (each within one standard error of the
other's estimate plus one example: a TPR at 0.1% FPR measured on `--members` members moves by
that much between seeds). Our frontier dominates or equals ART's when every ART point is
covered by one of our points (the undefended model included); the pairs are compared one by
one as well. Ratios: our accuracy / ART's, our TPR / ART's (1 when both TPRs are 0) and our
post-processor's seconds per 10,000 queries / ART's.

Last, the training-time defences privacylab registers (`defense_names()` of kind "training");
ART ships none against membership inference (its `defences/trainer` holds adversarial-training
trainers against evasion and DP-InstaHide against poisoning; listed from the installed ART).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privacylab.attacks.membership import MembershipTask, make_attack, run_attack
from privacylab.defenses import OutputDefense, defense_names, parse_defense
from privacylab.defenses.base import DEFENSES
from privacylab.experiment import RunConfig, prepare_games
from privacylab.report import membership_metrics
from privacylab.target import Access, Target

SCORE_ATTACKS = (
    "loss",
    "confidence",
    "entropy",
    "modified-entropy",
    "shadow",
    "lira-online",
    "rmia",
)
LABEL_ATTACKS = ("gap", "noise")
ATTACK_OPTIONS: dict[str, dict[str, Any]] = {
    "noise": {"n_samples": 20},
    "shadow": {"shadows": 2, "max_iter": 25},
}
"""Lighter settings than the defaults, to keep the run near 5 minutes on 2 cores: the noise
attack with 20 noisy copies (`RunConfig.quick`'s setting); Shokri's shadow attack on 2 of the
references with 25 boosting rounds per class (its 100 per-class models dominate the run time
otherwise; it is never the strongest attack here, LiRA and RMIA are)."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class ArtOutput:
    """An ART post-processor as a `Target` output defence: probability rows go to ART as a
    float64 numpy array, its answer comes back as a tensor of the rows' dtype. With `per_row`,
    ART is called once per row (see ClassLabels in the module docstring)."""

    def __init__(self, postprocessor: Any, label: str, per_row: bool = False) -> None:
        self.postprocessor = postprocessor
        self.label = label
        self.per_row = per_row

    def __call__(self, probs: Tensor) -> Tensor:
        rows = probs.double().numpy()
        if self.per_row:
            out = np.concatenate([self.postprocessor(rows[i : i + 1]) for i in range(len(rows))])
        else:
            out = self.postprocessor(rows)
        return torch.as_tensor(np.asarray(out)).to(probs.dtype)


@dataclasses.dataclass
class Entry:
    """One deployment to attack: its display name, toolkit, post-processor and access."""

    name: str
    toolkit: str
    defense: Callable[[Tensor], Tensor] | None
    serves: Access
    seed_numpy: bool = False
    label_attacks: tuple[str, ...] = LABEL_ATTACKS


def _entries() -> tuple[list[Entry], list[tuple[str, str, str]]]:
    """Every deployment and the (ours, ART, note) pairs."""
    from art.defences import postprocessor as pp

    ours = ["topk:1", "topk:3", "rounding:1", "rounding:3", "label-only", "noise:0.1"]
    ours.append("reverse-sigmoid:1:0.1")
    entries = [Entry("none", "-", None, Access.SCORES)]
    for spec in ours:
        defense = parse_defense(spec)
        assert isinstance(defense, OutputDefense)
        entries.append(Entry(spec, "privacylab", defense, defense.serves))
    art = [
        ("art:HighConfidence(0.5)", pp.HighConfidence(cutoff=0.5), False),
        ("art:HighConfidence(0.25)", pp.HighConfidence(cutoff=0.25), False),
        ("art:Rounded(1)", pp.Rounded(decimals=1), False),
        ("art:Rounded(3)", pp.Rounded(decimals=3), False),
        ("art:ClassLabels", pp.ClassLabels(), False),
        ("art:ClassLabels/row", pp.ClassLabels(), True),
        ("art:GaussianNoise(0.1)", pp.GaussianNoise(scale=0.1), False),
        ("art:ReverseSigmoid(1,0.1)", pp.ReverseSigmoid(beta=1.0, gamma=0.1), False),
    ]
    for name, post, per_row in art:
        serves = Access.LABEL if "ClassLabels" in name else Access.SCORES
        label_attacks = ("gap",) if name == "art:ClassLabels" else LABEL_ATTACKS
        wrapped = ArtOutput(post, name, per_row)
        entries.append(Entry(name, "art", wrapped, serves, "Noise" in name, label_attacks))
    pairs = [
        ("topk:1", "art:HighConfidence(0.5)", "not twins: cutoff 0.5 keeps at most 1 score, "
         "an all-zero row (label 0) when the top score is < 0.5"),
        ("topk:3", "art:HighConfidence(0.25)", "not twins: cutoff 0.25 keeps at most 4 scores, "
         "an all-zero row (label 0) when the top score is < 0.25"),
        ("rounding:1", "art:Rounded(1)", "same rounding; ours keeps the label at ties"),
        ("rounding:3", "art:Rounded(3)", "same rounding; ours keeps the label at ties"),
        ("label-only", "art:ClassLabels/row", "ART called row by row (its batch call is broken)"),
        ("noise:0.1", "art:GaussianNoise(0.1)", "same recipe; ours keeps the label"),
        ("reverse-sigmoid:1:0.1", "art:ReverseSigmoid(1,0.1)", "same formula"),
    ]  # fmt: skip
    return entries, pairs


def _seconds_per_10k(defense: Callable[[Tensor], Tensor], probs: Tensor) -> float:
    """Median seconds of 5 calls on 10,000 rows."""
    rows = probs.repeat(math.ceil(10_000 / len(probs)), 1)[:10_000].contiguous()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        defense(rows)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _balanced(membership: np.ndarray, per_side: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picks = [rng.permutation(np.flatnonzero(membership == s))[:per_side] for s in (1, 0)]
    return np.sort(np.concatenate(picks))


def attack_entry(
    entry: Entry,
    scores_target: Target,
    task: MembershipTask,
    membership: np.ndarray,
    per_side: int,
    seed: int,
) -> dict[str, Any]:
    """Serve the target through `entry`'s post-processor, attack it adaptively, measure it."""
    if entry.defense is None:
        served = scores_target
    else:
        served = scores_target.with_output_defense(entry.defense, entry.serves)
    adaptive = dataclasses.replace(task, reference_defense=entry.defense, reference_outputs={})
    if entry.seed_numpy:
        np.random.seed(seed)
    others = membership == 0
    test_accuracy = float((served.labels(task.x[others]) == task.y[others]).float().mean())
    small = _balanced(membership, per_side, seed + 1)
    rows: dict[str, dict[str, Any]] = {}
    names = (SCORE_ATTACKS if served.access.allows(Access.SCORES) else ()) + entry.label_attacks
    for name in names:
        options = ATTACK_OPTIONS.get(name, {})
        if name == "noise":
            result = run_attack(
                make_attack(name, **options), served, adaptive.subset(small), membership[small]
            )
        else:
            result = run_attack(make_attack(name, **options), served, adaptive, membership)
        m = membership_metrics(result)
        rows[name] = {
            "auc": m.auc,
            "tpr_at_01pct_fpr": m.tpr_at_01pct_fpr,
            "tpr_at_1pct_fpr": m.tpr_at_1pct_fpr,
            "examples": m.examples,
            "seconds": result.seconds,
        }
    best = max(rows, key=lambda n: (rows[n]["tpr_at_01pct_fpr"], rows[n]["auc"]))
    best_auc = max(rows, key=lambda n: rows[n]["auc"])
    probs = scores_target.probabilities(task.x[:2000])
    seconds = None if entry.defense is None else _seconds_per_10k(entry.defense, probs)
    return {
        "name": entry.name,
        "toolkit": entry.toolkit,
        "serves": served.access.value,
        "test_accuracy": test_accuracy,
        "best_auc": rows[best_auc]["auc"],
        "best_auc_attack": best_auc,
        "best_tpr_at_01pct_fpr": rows[best]["tpr_at_01pct_fpr"],
        "best_attack": best,
        "seconds_per_10k_queries": seconds,
        "attacks": rows,
    }


def _se(p: float, n: int) -> float:
    """One binomial standard error of a proportion p measured on n examples, plus 1/n."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) + 1.0 / n


def _ratio(a: float, b: float) -> float | None:
    if b == 0:
        return 1.0 if a == 0 else float("inf")
    return a / b


def _covers(o: dict[str, Any], a: dict[str, Any], members: int, tests: int, noise: bool) -> bool:
    """Whether point `o` is at least as good as `a`: accuracy ≥ and best TPR@0.1%FPR ≤ (with
    `noise`, each within one standard error of `a`'s estimate plus one example)."""
    acc_o, acc_a = o["test_accuracy"], a["test_accuracy"]
    tpr_o, tpr_a = o["best_tpr_at_01pct_fpr"], a["best_tpr_at_01pct_fpr"]
    if not noise:
        return acc_o >= acc_a and tpr_o <= tpr_a
    return acc_o >= acc_a - _se(acc_a, tests) and tpr_o <= tpr_a + _se(tpr_a, members)


def frontier(rows: dict[str, dict[str, Any]], members: int, tests: int) -> list[dict[str, Any]]:
    """For every ART point, the first of our points (the undefended model included) that
    covers it strictly, else within noise, else None."""
    ours = [r for r in rows.values() if r["toolkit"] in ("privacylab", "-")]
    out = []
    for art in (r for r in rows.values() if r["toolkit"] == "art"):
        strict = [o["name"] for o in ours if _covers(o, art, members, tests, False)]
        within = [o["name"] for o in ours if _covers(o, art, members, tests, True)]
        out.append(
            {
                "art": art["name"],
                "covered_strictly_by": strict,
                "covered_within_noise_by": within,
            }
        )
    return out


def compare_pairs(
    rows: dict[str, dict[str, Any]], pairs: list[tuple[str, str, str]], members: int, tests: int
) -> list[dict[str, Any]]:
    """Per pair: whether our point dominates or equals ART's (strictly, and within noise)."""
    out = []
    for ours_name, art_name, note in pairs:
        ours, art = rows[ours_name], rows[art_name]
        acc_o, acc_a = ours["test_accuracy"], art["test_accuracy"]
        tpr_o, tpr_a = ours["best_tpr_at_01pct_fpr"], art["best_tpr_at_01pct_fpr"]
        sec_o, sec_a = ours["seconds_per_10k_queries"], art["seconds_per_10k_queries"]
        strict = _covers(ours, art, members, tests, False)
        within = _covers(ours, art, members, tests, True)
        out.append(
            {
                "ours": ours_name,
                "art": art_name,
                "note": note,
                "accuracy": [acc_o, acc_a],
                "tpr_at_01pct_fpr": [tpr_o, tpr_a],
                "ratio_accuracy": _ratio(acc_o, acc_a),
                "ratio_tpr_at_01pct_fpr": _ratio(tpr_o, tpr_a),
                "seconds_per_10k_queries": [sec_o, sec_a],
                "ratio_seconds_per_10k_queries": _ratio(sec_o, sec_a),
                "dominates_strict": strict,
                "dominates_within_noise": within,
            }
        )
    return out


def art_trainers() -> list[str]:
    """The trainer modules of the installed ART (`art.defences.trainer`)."""
    import pkgutil

    import art.defences.trainer as trainer

    return sorted(m.name for m in pkgutil.iter_modules(trainer.__path__) if m.name != "trainer")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train (or load) the target and its references, then attack every deployment."""
    start = time.perf_counter()
    config = RunConfig(
        dataset=args.dataset,
        epsilons=(),
        references=args.references,
        members=args.members,
        population=args.population,
        epochs=args.epochs,
        lr=args.lr,
        attacks=SCORE_ATTACKS + LABEL_ATTACKS,
        workers=args.workers,
        seed=args.seed,
    )
    temporary = args.cache is None
    cache = Path(tempfile.mkdtemp(prefix="defenses_vs_art_") if temporary else args.cache)
    try:
        games = prepare_games(config, cache, progress=None)
        game = next(games)
        games.close()
    finally:
        if temporary:
            shutil.rmtree(cache, ignore_errors=True)
    trained = time.perf_counter() - start
    _log(f"target and {args.references} references ready in {trained:.0f} s; "
         f"test accuracy {game.test_accuracy:.3f}")  # fmt: skip
    entries, pairs = _entries()
    scores_target = game.target.with_access(Access.SCORES)
    rows: dict[str, dict[str, Any]] = {}
    torch.set_num_threads(1)
    for entry in entries:
        began = time.perf_counter()
        rows[entry.name] = attack_entry(
            entry, scores_target, game.task, game.membership, args.label_only, args.seed
        )
        r = rows[entry.name]
        _log(f"  {entry.name}: acc {r['test_accuracy']:.3f}, best TPR@0.1% "
             f"{r['best_tpr_at_01pct_fpr']:.3f} ({r['best_attack']}), AUC {r['best_auc']:.3f} "
             f"[{time.perf_counter() - began:.0f} s]")  # fmt: skip
    members = int(game.membership.sum())
    tests = int((game.membership == 0).sum())
    compared = compare_pairs(rows, pairs, members, tests)
    covered = frontier(rows, members, tests)
    training = [n for n in defense_names() if DEFENSES.get(n).kind == "training"]
    return {
        "setting": {
            "dataset": config.dataset,
            "model": f"{config.model} {config.model_options}",
            "members": members,
            "nonmembers": tests,
            "references": config.references,
            "epochs": config.epochs,
            "lr": config.lr,
            "score_attacks": list(SCORE_ATTACKS),
            "label_attacks": list(LABEL_ATTACKS),
            "attack_options": ATTACK_OPTIONS,
            "noise_attack_per_side": args.label_only,
            "adaptive": "references queried through the same post-processor",
            "seed": args.seed,
        },
        "undefended_test_accuracy": game.test_accuracy,
        "defenses": list(rows.values()),
        "pairs": compared,
        "frontier": covered,
        "verdict": {
            "frontier_dominates_or_equals_within_noise": all(
                f["covered_within_noise_by"] for f in covered
            ),
            "frontier_dominates_or_equals_strict": all(f["covered_strictly_by"] for f in covered),
            "every_pair_within_noise": all(p["dominates_within_noise"] for p in compared),
            "every_pair_strict": all(p["dominates_strict"] for p in compared),
        },
        "training_defenses": {
            "privacylab": training,
            "art_membership_training_defenses": [],
            "art_trainers_installed": art_trainers(),
            "art_lacks": training,
        },
        "seconds": {"train": trained, "total": time.perf_counter() - start},
    }


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else ("inf" if value > 0 else None)
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    return value


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _print_table(payload: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    s = payload["setting"]
    table = Table(
        title=f"{s['dataset']}: {s['members']} members, {s['nonmembers']} non-members, "
        f"{s['references']} references (adaptive)"
    )
    for col in ("defence", "toolkit", "serves", "test acc", "best AUC", "TPR@0.1%", "by",
                "s / 10k"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("defence", "toolkit", "by") else "right")
    for r in payload["defenses"]:
        table.add_row(
            r["name"],
            r["toolkit"],
            r["serves"],
            f"{r['test_accuracy']:.3f}",
            f"{r['best_auc']:.3f}",
            f"{r['best_tpr_at_01pct_fpr']:.3f}",
            r["best_attack"],
            _num(r["seconds_per_10k_queries"], ".4f"),
        )
    console.print(table)
    pairs = Table(title="ours vs ART (accuracy ↑, TPR@0.1%FPR ↓)")
    for col in ("ours", "ART", "acc ratio", "TPR ratio", "time ratio", "strict", "within noise"):
        pairs.add_column(col)
    for p in payload["pairs"]:
        pairs.add_row(
            p["ours"],
            p["art"],
            _num(p["ratio_accuracy"], ".3f"),
            _num(p["ratio_tpr_at_01pct_fpr"], ".3f"),
            _num(p["ratio_seconds_per_10k_queries"], ".2f"),
            "yes" if p["dominates_strict"] else "no",
            "yes" if p["dominates_within_noise"] else "no",
        )
    console.print(pairs)
    for p in payload["pairs"]:
        console.print(f"  {p['ours']} ↔ {p['art']}: {p['note']}")
    for f in payload["frontier"]:
        by = f["covered_strictly_by"] or f["covered_within_noise_by"]
        how = "strictly" if f["covered_strictly_by"] else "within noise" if by else "NOT covered"
        console.print(f"  {f['art']}: {how} by {', '.join(by) or '—'}")
    v = payload["verdict"]

    def yes(flag: bool) -> str:
        return "YES" if flag else "NO"

    console.print(
        "verdict: our frontier dominates or equals every ART point: "
        f"{yes(v['frontier_dominates_or_equals_within_noise'])} within noise, "
        f"{yes(v['frontier_dominates_or_equals_strict'])} strictly; pair by pair: "
        f"{yes(v['every_pair_within_noise'])} within noise, {yes(v['every_pair_strict'])} strictly"
    )
    t = payload["training_defenses"]
    console.print(
        f"training-time defences privacylab has and ART lacks: {', '.join(t['art_lacks'])}"
    )
    console.print(f"(ART's trainers: {', '.join(t['art_trainers_installed'])})")
    seconds = payload["seconds"]
    console.print(
        f"total {seconds['total']:.0f} s (training {seconds['train']:.0f} s; "
        "2 shared cores, timings are noisy)"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print tables, or one JSON object with --json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--dataset", default="purchase-like")
    parser.add_argument("--members", type=int, default=2000, help="target training-set size")
    parser.add_argument("--population", type=int, default=1000, help="attacker's own rows")
    parser.add_argument("--references", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--label-only", type=int, default=100, help="noise attack, per side")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=None, help="model cache (default: a temporary dir)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TQDM_DISABLE", "1")
    payload = run(args)
    if args.json:
        print(json.dumps(_json_safe(payload)))
    else:
        _print_table(payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
