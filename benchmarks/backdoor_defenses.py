"""The backdoor defences table: Neural Cleanse, STRIP, activation clustering, spectral
signatures and fine-pruning on BadNets models and on clean models, beside BackdoorBench's
published CIFAR-10 numbers.

    python benchmarks/backdoor_defenses.py [--json] [--quick] [--store FILE] [--report DIR]
        [--seeds 2] [--clean-models 5] [--nc-seeds 2]

Models (mnist5k, the split of `backdoor_vs_art.py`: 3,500 training rows, 500 clean held-out
rows for the defender, 1,000 test rows; the family's `VictimRecipe()`): BadNets
(`square:4@corner`, all-to-one, target 0; Gu et al. 2017) at 1% and 10% poison for
``--seeds`` seeds (the seed draws the poisoned rows and the training), and ``--clean-models``
clean models (training seeds 0, 1, ...). ``--quick``: 1,200 / 300 / 500 rows, 8 epochs, one
seed at 10%, 2 clean models, one Neural Cleanse seed with 1 restart of 5 epochs (~2 minutes).

Defences (`privacylab.defenses.backdoor`, by registry name, their default options):

* ``neural-cleanse`` (Wang et al. 2019, Sec. IV-C), run with ``--nc-seeds`` seeds on every
  model (each run the median of 3 restarts): detection rate and target-class accuracy on the
  backdoored models, false-positive rate (anomaly index > 2 on a clean model) over clean
  models x NC seeds; ASR and accuracy after its unlearning (Sec. VI-C).
* ``strip`` (Gao et al. 2019, Sec. V-B): boundary at the 1% quantile of clean entropies; FRR
  (clean test inputs rejected) and FAR (triggered non-target test inputs let through); its
  verdict from the training rows; ASR and accuracy with the filter in front of the model.
* ``activation-clustering`` (Chen et al. 2019) and ``spectral`` (Tran et al. 2018): verdict,
  flagged class, precision and recall of the flagged training rows against the true poisons;
  on backdoored models ASR and accuracy after retraining without the flagged rows.
* ``fine-pruning`` (Liu et al. 2018): mitigation only; ASR and accuracy after it.

Every unit (a trained model, one defence on one model) is written to a
`privacylab.execution.store.ResultStore` (``--store``, by default ``backdoor_defenses.sqlite``
in the working directory; the models' training checkpoints in a folder beside it) as it
finishes (a defence's key holds a hash of its whole configuration, so a result made under
other defaults is not reused); a killed run resumes where it stopped. ``--report DIR`` merges
the table into a report folder (`privacylab.report.backdoor.add_backdoor_run(DIR,
{"tables": {"defenses": rows}})`).

Published, not measured here: BackdoorBench (Wu et al. 2022, NeurIPS Datasets and Benchmarks),
CIFAR-10, PreAct-ResNet18, BadNets — the leaderboard's data file ``static/data/results.csv`` of
github.com/backdoorbench/backdoorbench.github.io (commit a4ef038, rows 11520-11559), quoted in
`privacylab.report.backdoor.PUBLISHED`: at 10% poison the undefended model has ASR 95.0%
(accuracy 91.3%), Neural Cleanse brings it to 1.3% (89.1%), activation clustering leaves 86.2%
and spectral signatures 92.4%; at 1% poison (ASR 74.7%) NC 0.9%, AC 27.2%, spectral 74.2%
(spectral fails, AC only partly works), fine-pruning 20.2%.

Measured (``OMP_NUM_THREADS=1 python benchmarks/backdoor_defenses.py --json``, defaults: 2
seeds per rate, 5 clean models, one NC run of 3 restarts per model; `VictimRecipe()` = the MLP
at Adam 2e-3; a re-run from the store reproduces every number but the seconds, which include
each defence's mitigation and are noisy on a shared machine):

* Models: BadNets 1% (35 poisons) ASR 0.966 / 0.989, accuracy 0.953 / 0.943; 10% (389)
  ASR 0.998 / 1.000, accuracy 0.949 / 0.951; clean models accuracy 0.927-0.956, the trigger's
  ASR on them 0.002-0.004.
* Neural Cleanse (its defaults of commit 957d0d8 and after; re-measured with the models of the
  store): 10% detected 2/2, target class named 2/2 (6/6 restarts), mean anomaly index 3.19,
  unlearning ASR 1.00 → 0.02 at accuracy 0.95 → 0.94 (BackdoorBench: 0.95 → 0.013); 1%
  detected 2/2 (6/6 restarts, target named), index 2.09 / 3.24, ASR 0.98 → 0.015. False
  positives on clean models: 2/5 runs (class 5 both times), 5/15 restarts; mean index 1.81.
* STRIP (filter): FRR 0.01; FAR 0.41 at 1% and 0.05 at 10%, so ASR with the filter 0.98 →
  0.39 and 1.00 → 0.05 at accuracy −0.01 to −0.02.
* Activation clustering: at 1% flags 2/2 models (the target in 1 of 2), precision 0.21,
  recall 0.39, retrained ASR 0.82; at 10% flags nothing (0/2); clean models flagged 2/5 — it
  fails (BackdoorBench: 27% ASR left at 1%, 86% at 10%).
* Spectral signatures: no verdict of backdoor (0/4), flagged-row precision 0.03 / 0.09, recall
  0.41 / 0.13; retrained without them the ASR stays 0.96 / 1.00 — it fails, as BackdoorBench
  finds (74% and 92% ASR left).
* Fine-pruning: ASR 0.98 → 0.23 at 1% and 1.00 → 0.18 at 10%, accuracy 0.95 → 0.92
  (BackdoorBench: 0.20 and 0.57 left).
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backdoor_vs_art import TARGET, split
from privacylab.attacks.poisoning import (
    PoisonTask,
    make_backdoor,
    parse_trigger,
    poison_count,
    predict_labels,
    target_labels,
)
from privacylab.attacks.poisoning.recipe import VictimRecipe, train_victim
from privacylab.data import Dataset
from privacylab.defenses.backdoor import (
    BackdoorEvidence,
    evaluate_mitigation,
    make_backdoor_defense,
)
from privacylab.execution import ResultStore
from privacylab.execution.store import config_key
from privacylab.report.backdoor import PUBLISHED, PUBLISHED_SOURCE
from privacylab.stats.backdoor import attack_success_rate

TRIGGER = "square:4@corner"
RATES = (0.01, 0.10)
NC_THRESHOLD = 2.0
DEFENSES = ("neural-cleanse", "strip", "activation-clustering", "spectral", "fine-pruning")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- the models


def model_specs(quick: bool, seeds: int, clean_models: int) -> list[dict[str, Any]]:
    """Every model of the table: BadNets per (rate, seed), then the clean ones."""
    rates = (0.10,) if quick else RATES
    backdoored = [
        {"key": f"badnets-{rate:g}-s{seed}", "kind": "badnets", "rate": rate, "seed": seed}
        for seed in range(seeds)
        for rate in rates
    ]
    clean = [
        {"key": f"clean-s{seed}", "kind": "clean", "rate": 0.0, "seed": seed}
        for seed in range(clean_models)
    ]
    return backdoored[: len(rates)] + clean + backdoored[len(rates) :]


class Built:
    """A trained model with its training set, true poison rows and triggered test inputs."""

    def __init__(self, model: nn.Module, training: Dataset, truth: np.ndarray) -> None:
        self.model = model
        self.training = training
        self.truth = truth


def poisoned_set(spec: dict[str, Any], victim: Dataset) -> tuple[Dataset, np.ndarray]:
    """X ∪ P for a BadNets spec (X for a clean one) and the indices of the poisons."""
    if spec["kind"] == "clean":
        return victim, np.zeros(0, dtype=np.int64)
    budget = poison_count(spec["rate"], len(victim))
    task = PoisonTask(source=victim, budget=budget, target_class=TARGET, seed=spec["seed"])
    poisons = make_backdoor("badnets", trigger=TRIGGER, seed=spec["seed"]).craft(task)  # type: ignore[attr-defined]
    merged = poisons.merged(victim)
    return merged, np.arange(len(victim), len(merged))


def build(
    spec: dict[str, Any], data: tuple[Dataset, Dataset, Dataset], recipe: VictimRecipe, work: Path
) -> Built:
    """Train (or resume from its checkpoint) the model of `spec`."""
    training, truth = poisoned_set(spec, data[0])
    model = train_victim(recipe, training, seed=spec["seed"], checkpoint_dir=work / spec["key"])[0]
    return Built(model, training, truth)


def triggered_test(test: Dataset) -> tuple[Tensor, np.ndarray]:
    """The test inputs with the trigger and their backdoor label."""
    stamped = parse_trigger(TRIGGER).stamp(test.features)
    wanted = target_labels(test.labels, TARGET, "all-to-one", test.num_classes).numpy()
    return stamped, wanted


def model_unit(spec: dict[str, Any], built: Built, test: Dataset) -> dict[str, Any]:
    """Accuracy and ASR of a trained model (ASR of the trigger on a clean model too)."""
    stamped, wanted = triggered_test(test)
    accuracy = float(np.mean(predict_labels(built.model, test.features) == test.labels.numpy()))
    asr = attack_success_rate(predict_labels(built.model, stamped), test.labels.numpy(), wanted)
    return {**spec, "poisons": len(built.truth), "accuracy": accuracy, "asr": asr}


# ----------------------------------------------------------------------------- the defences


def defence_units(
    spec: dict[str, Any], quick: bool, nc_seeds: int
) -> list[tuple[str, str, dict[str, Any]]]:
    """(unit key, defence name, options) for one model."""
    units = []
    for k in range(nc_seeds):
        options: dict[str, Any] = {"seed": k}
        if quick:
            options.update(seeds=1, epochs=5, max_rows=100)
        units.append((f"{spec['key']}/neural-cleanse/{k}", "neural-cleanse", options))
    for name in DEFENSES[1:]:
        if name == "fine-pruning" and spec["kind"] == "clean":
            continue
        units.append((f"{spec['key']}/{name}", name, {}))
    return units


def defence_fingerprint(name: str, options: dict[str, Any]) -> str:
    """A short key of the defence's whole configuration (its defaults included), so a stored
    result made under other defaults is computed again rather than reused."""
    defence = make_backdoor_defense(name, **options)
    plain = {
        k: v
        for k, v in sorted(vars(defence).items())
        if isinstance(v, str | int | float | bool | type(None))
        or (isinstance(v, list | tuple) and all(isinstance(x, str | int | float) for x in v))
    }
    return config_key(plain)[:12]


def recipe_fingerprint(recipe: VictimRecipe) -> dict[str, Any]:
    """The recipe's fields that shape a non-private model (DP-SGD's only when private)."""
    fields = recipe.to_dict()
    if recipe.epsilon is None:
        for name in ("delta", "max_grad_norm", "private_lr", "private_batch_size"):
            fields.pop(name)
    return fields


def run_defence(
    name: str,
    options: dict[str, Any],
    spec: dict[str, Any],
    built: Built,
    data: tuple[Dataset, Dataset, Dataset],
    recipe: VictimRecipe,
) -> dict[str, Any]:
    """One defence on one model: verdict, flagged rows against the truth, mitigation."""
    _victim, clean, test = data
    defence = make_backdoor_defense(name, **options)
    retrain = None
    if spec["kind"] == "badnets":

        def retrain(rows: Dataset) -> nn.Module:
            return train_victim(recipe, rows, seed=spec["seed"])[0]

    evidence = BackdoorEvidence(
        num_classes=test.num_classes,
        clean=clean,
        training=built.training if "training-data" in defence.needs else None,
        retrain=retrain,
        seed=spec["seed"],
    )
    start = time.perf_counter()
    detection = defence.inspect(built.model, evidence)
    seconds = time.perf_counter() - start
    stamped, wanted = triggered_test(test)
    after = None
    if detection.mitigation is not None:
        after = evaluate_mitigation(detection.mitigation, built.model, test, stamped, wanted)
    flagged = detection.flagged_rows
    precision = recall = None
    if flagged is not None and len(flagged) and len(built.truth):
        hits = np.isin(flagged, built.truth).sum()
        precision, recall = float(hits / len(flagged)), float(hits / len(built.truth))
    elif flagged is not None and len(built.truth):
        recall = 0.0
    return {
        "model": spec["key"],
        "kind": spec["kind"],
        "poison_rate": spec["rate"],
        "seed": spec["seed"],
        "defense": name,
        "options": options,
        "detected": detection.detected,
        "flagged_class": detection.flagged_class,
        "anomaly_index": detection.anomaly_index,
        "flagged_rows": None if flagged is None else len(flagged),
        "precision": precision,
        "recall": recall,
        "after": after,
        "mitigation": None if detection.mitigation is None else detection.mitigation.description,
        "restarts": [
            {k: r.get(k) for k in ("seed", "detected", "flagged_class", "index")}
            for r in detection.details.get("per_seed", [])
        ],
        "seconds": seconds,
    }


# ------------------------------------------------------------------------------- the table


def _mean(values: list[Any]) -> float | None:
    real = [float(v) for v in values if v is not None and np.isfinite(float(v))]
    return float(np.mean(real)) if real else None


def summarise(models: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (defence, group): BadNets 1%, BadNets 10%, clean."""
    groups: list[tuple[str, str, float]] = [
        (f"badnets {rate:.0%}", "badnets", rate)
        for rate in sorted({m["rate"] for m in models if m["kind"] == "badnets"})
    ]
    if any(m["kind"] == "clean" for m in models):
        groups.append(("clean", "clean", 0.0))
    rows = []
    for label, kind, rate in groups:
        members = [m for m in models if m["kind"] == kind and m["rate"] == rate]
        for name in DEFENSES:
            mine = [
                r
                for r in runs
                if r["defense"] == name and r["kind"] == kind and r["poison_rate"] == rate
            ]
            if not mine:
                continue
            verdicts = [r["detected"] for r in mine if r["detected"] is not None]
            flagged = [r["flagged_class"] for r in mine if r["detected"]]
            afters = [r["after"] for r in mine if r["after"] is not None]
            row: dict[str, Any] = {
                "defense": name,
                "models": label,
                "runs": len(mine),
                "asr_before": _mean([m["asr"] for m in members]),
                "accuracy_before": _mean([m["accuracy"] for m in members]),
                "detection_rate": _mean([float(v) for v in verdicts]) if verdicts else None,
                "target_class_rate": (
                    _mean([float(c == TARGET) for c in flagged]) if flagged else None
                ),
                "anomaly_index": _mean([r["anomaly_index"] for r in mine]),
                "precision": _mean([r["precision"] for r in mine]),
                "recall": _mean([r["recall"] for r in mine]),
                "frr": _mean([a["rejected_clean"] for a in afters]) if name == "strip" else None,
                "far": (
                    _mean([1.0 - a["rejected_triggered"] for a in afters])
                    if name == "strip"
                    else None
                ),
                "asr_after": _mean([a["asr"] for a in afters]),
                "accuracy_after": _mean([a["accuracy"] for a in afters]),
                "seconds": _mean([r["seconds"] for r in mine]),
            }
            restarts = [x for r in mine for x in r.get("restarts") or []]
            if restarts:
                row["restarts"] = len(restarts)
                row["restart_detection_rate"] = _mean([float(x["detected"]) for x in restarts])
            if kind == "clean" and verdicts:
                row["false_positive_rate"] = row.pop("detection_rate")
                row["target_class_rate"] = None
            rows.append(row)
    return rows


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def table(result: dict[str, Any]) -> str:
    """The human-readable table, ours then the published numbers."""
    lines = ["Models:"]
    for m in result["models"]:
        lines.append(
            f"  {m['key']:<18} poisons {m['poisons']:>4}  accuracy {m['accuracy']:.3f}  "
            f"ASR {m['asr']:.3f}"
        )
    lines.append("")
    head = (
        f"{'defence':<23}{'models':<13}{'runs':>5}{'det':>6}{'FPR':>6}{'class':>6}{'AI':>7}"
        f"{'rst':>6}{'prec':>6}{'rec':>6}{'FRR':>6}{'FAR':>6}{'ASR':>13}{'acc':>13}{'sec':>7}"
    )
    lines.append(head)
    lines.append(
        "  (det: detection rate over runs; FPR: the same on clean models; class: share of"
        " detections naming the target; AI: mean anomaly index; rst: detection rate over"
        " Neural Cleanse's restarts)"
    )
    for r in result["table"]:
        asr = f"{_fmt(r['asr_before'], '.2f')}->{_fmt(r['asr_after'], '.2f')}"
        acc = f"{_fmt(r['accuracy_before'], '.2f')}->{_fmt(r['accuracy_after'], '.2f')}"
        lines.append(
            f"{r['defense']:<23}{r['models']:<13}{r['runs']:>5}"
            f"{_fmt(r.get('detection_rate'), '.2f'):>6}"
            f"{_fmt(r.get('false_positive_rate'), '.2f'):>6}"
            f"{_fmt(r['target_class_rate'], '.2f'):>6}{_fmt(r['anomaly_index'], '.2f'):>7}"
            f"{_fmt(r.get('restart_detection_rate'), '.2f'):>6}"
            f"{_fmt(r['precision'], '.2f'):>6}{_fmt(r['recall'], '.2f'):>6}"
            f"{_fmt(r['frr'], '.2f'):>6}{_fmt(r['far'], '.2f'):>6}{asr:>13}{acc:>13}"
            f"{_fmt(r['seconds'], '.1f'):>7}"
        )
    lines.append("")
    lines.append(f"Published (not measured here): {PUBLISHED_SOURCE}")
    for p in PUBLISHED:
        lines.append(
            f"  {p['defense']:<23}BadNets {p['poison_rate']:.0%}   accuracy {p['accuracy']:.3f}"
            f"  ASR {p['asr']:.3f}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train every model and run every defence, resuming from the store."""
    quick = args.quick
    seeds = 1 if quick else args.seeds
    clean_models = 2 if quick else args.clean_models
    nc_seeds = 1 if quick else args.nc_seeds
    recipe = VictimRecipe(epochs=8) if quick else VictimRecipe()
    data = split(quick, 0)
    store_path = args.store or Path(
        "backdoor_defenses_quick.sqlite" if quick else "backdoor_defenses.sqlite"
    )
    setting = {
        "quick": quick,
        "recipe": recipe_fingerprint(recipe),
        "rows": [len(d) for d in data],
        "trigger": TRIGGER,
    }
    namespace = f"backdoor-defenses-{config_key(setting)[:16]}-"
    work = store_path.with_suffix(".models") / config_key(setting)[:16]
    models, runs = [], []
    with ResultStore(store_path) as store:
        for spec in model_specs(quick, seeds, clean_models):
            built: Built | None = None
            stored = store.get(namespace + "model", spec["key"])
            if stored is None:
                start = time.perf_counter()
                built = build(spec, data, recipe, work)
                stored = model_unit(spec, built, data[2])
                store.put(namespace + "model", spec["key"], stored)
                _log(
                    f"{spec['key']}: accuracy {stored['accuracy']:.3f}, ASR {stored['asr']:.3f} "
                    f"({time.perf_counter() - start:.0f}s)"
                )
            models.append(stored)
            for unit, name, options in defence_units(spec, quick, nc_seeds):
                key = f"{unit}/{defence_fingerprint(name, options)}"
                done = store.get(namespace + "defense", key)
                if done is None:
                    if built is None:
                        built = build(spec, data, recipe, work)
                    done = run_defence(name, options, spec, built, data, recipe)
                    store.put(
                        namespace + "defense", key, json.loads(json.dumps(done, default=float))
                    )
                    _log(
                        f"{key}: detected {done['detected']}, class {done['flagged_class']} "
                        f"({done['seconds']:.0f}s)"
                    )
                runs.append(done)
    return {
        "setting": {
            **setting,
            "store": str(store_path),
            "seeds": seeds,
            "clean_models": clean_models,
            "nc_seeds": nc_seeds,
        },
        "models": models,
        "runs": runs,
        "table": summarise(models, runs),
        "published": {"source": PUBLISHED_SOURCE, "rows": list(PUBLISHED)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a ~2 minute run")
    parser.add_argument("--store", type=Path, default=None, help="the result store (SQLite)")
    parser.add_argument("--report", type=Path, default=None, help="merge the table here")
    parser.add_argument("--seeds", type=int, default=2, help="BadNets models per poison rate")
    parser.add_argument("--clean-models", type=int, default=5)
    parser.add_argument(
        "--nc-seeds", type=int, default=1, help="Neural Cleanse runs per model (3 restarts each)"
    )
    args = parser.parse_args(argv)
    if min(args.seeds, args.clean_models, args.nc_seeds) < 1:
        print("error: --seeds, --clean-models and --nc-seeds must be >= 1", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    result = run(args)
    if args.report is not None:
        from privacylab.report.backdoor import add_backdoor_run

        add_backdoor_run(args.report, {"tables": {"defenses": result["table"]}})
        _log(f"table merged into {args.report}")
    if args.json:
        print(json.dumps(result, default=float))
    else:
        print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
