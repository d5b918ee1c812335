"""BadNets (Gu et al. 2017) on mnist5k against the poison rate, on a normally trained victim and
on victims trained with DP-SGD (Abadi et al. 2016) at ε = 1 and 8 — with the group-privacy
bound on the ASR that DP promises (`privacylab.defenses.backdoor.dp.poisoning_asr_bound`:
min(1, e^{kε} p0 + δ_k), Jagielski et al. 2020 Lemma 1) beside the measured ASR.

The split is the job's (`privacylab attack backdoor`): one seeded permutation of mnist5k's
5,000 rows into 1,000 test rows, 300 held out for a defender, the victim's 3,500 training rows
and the attacker's own source (the 200 rows left). The trigger is `square:4@corner` (a white
4x4 square in the bottom-right corner), all-to-one, target class 0. For each ε (None:
non-private) a clean model and one poisoned model per rate are trained with the shared victim
recipe (`VictimRecipe()` defaults, `.private(ε)` for DP-SGD: the same recipe, its DP batch size
and learning rate); the clean model gives the baseline accuracy and the baseline ASR p0 (the
patch alone on a model that never saw a poison), which is what the bound multiplies.

Rows: ε, rate, poisons k, clean accuracy (clean model), poisoned accuracy, ASR, baseline ASR,
the bound, seconds. The bound is an upper limit on the *expected* ASR over DP-SGD's randomness;
one trained model is one draw.

    python benchmarks/badnets_dp.py [--json] [--quick] [--rates 0.0025 0.005 0.01 0.02]
        [--epsilons none 1 8] [--seed 0] [--threads 2]

`--quick`: rates 0.01 only, ε none and 8. Progress on stderr; stdout holds the table (or one
JSON object with `--json`). Not resumable (a few minutes on two idle CPU cores).

Measured here (seed 0, one thread per run, each `--epsilons` value run as its own process on
a shared 2-core machine; the seconds are wall-clock, the DP rows' under ~9x
oversubscription — a non-private model costs ~17 CPU-seconds):

      eps    rate    k clean acc pois acc    ASR base ASR  bound k<ASR.5   sec
        -  0.0025    9     0.935    0.937  0.801    0.002      -       -    15
        -  0.0050   18     0.935    0.932  0.984    0.002      -       -    14
        -  0.0100   35     0.935    0.938  0.990    0.002      -       -    18
        -  0.0200   71     0.935    0.938  0.974    0.002      -       -    17
        1  0.0025    9     0.809    0.810  0.041    0.032  1.000       2   120
        1  0.0050   18     0.809    0.809  0.046    0.032  1.000       2    78
        1  0.0100   35     0.809    0.813  0.086    0.032  1.000       2    80
        1  0.0200   71     0.809    0.811  0.213    0.032  1.000       2    83
        8  0.0025    9     0.875    0.884  0.061    0.019  1.000       0   125
        8  0.0050   18     0.875    0.882  0.103    0.019  1.000       0   105
        8  0.0100   35     0.875    0.879  0.456    0.019  1.000       0   105
        8  0.0200   71     0.875    0.876  0.863    0.019  1.000       0   152

Non-private, BadNets reaches ASR >= 95 % from 0.5 % poison with the poisoned model's accuracy
within 1 point of the clean model's. At 1 % over seeds 0, 1, 2: ASR 0.990, 0.956, 0.996,
clean accuracy 0.935 / 0.938 / 0.942 against poisoned 0.938 / 0.935 / 0.947; at 0.5 %: 0.984,
0.945, 0.869 (0.5 % is the edge: two seeds in three fall below 95 % there, none at 1 %).
DP-SGD cuts the ASR sharply at the same k (ε = 1: 0.09 at 1 %, 0.21 at 2 %; ε = 8: 0.46 at 1 %,
0.86 at 2 %) at a price in clean accuracy (0.81 at ε = 1, 0.875 at ε = 8, against 0.935) —
but the guarantee behind it is vacuous at these k: the group-privacy bound is 1 in every row
(at ε = 1 it is 0.087 for one poison and 0.24 for two; `k<ASR.5`, the most poisons for which
the bound stays below 1/2, is 2 at ε = 1 and 0 at ε = 8). The measured resistance is
empirical, not certified: the bound is meaningful only for k ≲ 1/ε.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from privacylab.attacks.poisoning import (
    PoisonTask,
    make_backdoor,
    poison_count,
    predict_labels,
    run_poisoning,
)
from privacylab.attacks.poisoning.recipe import VictimRecipe, train_victim
from privacylab.attacks.poisoning.trigger import parse_trigger
from privacylab.data import load_dataset
from privacylab.defenses.backdoor.dp import max_poisons_for, poisoning_asr_bound
from privacylab.stats.backdoor import attack_success_rate

TEST, HOLDOUT, TRAIN = 1000, 300, 3500
TRIGGER = "square:4@corner"
TARGET = 0


def _epsilon(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(
    rates: list[float], epsilons: list[float | None], seed: int, recipe: VictimRecipe
) -> dict[str, Any]:
    """Every (ε, rate) row; see the module docstring."""
    data = load_dataset("mnist5k")
    order = np.random.default_rng(seed).permutation(len(data))
    cuts = np.cumsum([TEST, HOLDOUT, TRAIN])
    test = data.subset(order[: cuts[0]])
    train = data.subset(order[cuts[1] : cuts[2]])
    source = data.subset(order[cuts[2] :])
    trigger = parse_trigger(TRIGGER)
    triggered = trigger.stamp(test.features)
    rows: list[dict[str, Any]] = []
    for epsilon in epsilons:
        private = recipe.private(epsilon)
        start = time.perf_counter()
        clean, summary = train_victim(private, train, seed=seed)
        clean_seconds = time.perf_counter() - start
        clean_acc = float(np.mean(predict_labels(clean, test.features) == test.labels.numpy()))
        p0 = attack_success_rate(predict_labels(clean, triggered), test.labels.numpy(), TARGET)
        spent = (summary.get("privacy") or {}).get("epsilon")
        _log(
            f"eps={epsilon}: clean acc {clean_acc:.3f}, baseline ASR {p0:.3f} "
            f"({clean_seconds:.0f} s)"
        )
        for rate in rates:
            k = poison_count(rate, len(train))
            result, _, _ = run_poisoning(
                make_backdoor("badnets", trigger=TRIGGER),
                PoisonTask(source, k, TARGET, seed=seed),
                train,
                test,
                lambda d, r=private: train_victim(r, d, seed=seed)[0],
                clean_model=clean,
            )
            bound = None if epsilon is None else poisoning_asr_bound(epsilon, private.delta, k, p0)
            row = {
                "epsilon": epsilon,
                "epsilon_spent": spent,
                "delta": None if epsilon is None else private.delta,
                "rate": rate,
                "poisons": k,
                "clean_accuracy": clean_acc,
                "poisoned_accuracy": result.clean_accuracy,
                "asr": result.asr,
                "baseline_asr": result.baseline_asr,
                "asr_bound": bound,
                "max_poisons_for_half": None
                if epsilon is None
                else max_poisons_for(epsilon, private.delta, p0, 0.5),
                "seconds": result.seconds,
                "clean_seconds": clean_seconds,
            }
            rows.append(row)
            _log(
                f"eps={epsilon} rate={rate:.4f} k={k}: acc {result.clean_accuracy:.3f}, "
                f"ASR {result.asr:.3f}, bound {bound}, {result.seconds:.0f} s"
            )
    return {
        "benchmark": "badnets_dp",
        "dataset": "mnist5k",
        "split": {"test": TEST, "holdout": HOLDOUT, "train": TRAIN, "source": len(source)},
        "trigger": TRIGGER,
        "target_class": TARGET,
        "mode": "all-to-one",
        "seed": seed,
        "recipe": recipe.to_dict(),
        "threads": torch.get_num_threads(),
        "rows": rows,
    }


def _cell(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def table(result: dict[str, Any]) -> str:
    """The rows as a fixed-width text table."""
    head = (
        f"{'eps':>5} {'rate':>7} {'k':>4} {'clean acc':>9} {'pois acc':>8} {'ASR':>6} "
        f"{'base ASR':>8} {'bound':>6} {'k<ASR.5':>7} {'sec':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        lines.append(
            f"{_cell(r['epsilon'], 'g'):>5} {r['rate']:>7.4f} {r['poisons']:>4} "
            f"{r['clean_accuracy']:>9.3f} {r['poisoned_accuracy']:>8.3f} {r['asr']:>6.3f} "
            f"{r['baseline_asr']:>8.3f} {_cell(r['asr_bound']):>6} "
            f"{_cell(r['max_poisons_for_half'], 'd'):>7} {r['seconds']:>5.0f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--quick", action="store_true", help="rate 0.01, eps none and 8")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0025, 0.005, 0.01, 0.02])
    parser.add_argument("--epsilons", type=_epsilon, nargs="+", default=[None, 1.0, 8.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rates, epsilons = args.rates, args.epsilons
    if args.quick:
        rates, epsilons = [0.01], [None, 8.0]
    result = run(rates, epsilons, args.seed, VictimRecipe())
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
