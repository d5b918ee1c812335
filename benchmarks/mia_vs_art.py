"""Membership inference strength: privacylab's attack suite against IBM ART 1.17+.

    python benchmarks/mia_vs_art.py [--json] [--quick] [--references 16] [--cache DIR]

Setting: the `privacylab run` membership game (Carlini et al. 2022, Sec. III) on mnist5k with
the MLP 784-256-10: a non-private target and a DP-SGD target at ε = 8 (``--quick``: non-private
only, 4 references, 1,000 members, 15 epochs). Both toolkits attack the *same* trained model
(loaded from the pipeline's cache) on the *same* candidates.

Split. ART's `MembershipInferenceBlackBox` needs attack-training examples whose membership it
knows. So that it never sees the truth it is scored on, the candidates are cut in two halves
(stratified by membership, seeded permutation): ART fits on half A and every method — ART's and
ours — is scored on half B only. Our attacks score all candidates without their truth (they use
the target, the attacker's population and reference models), and only the half-B scores enter
the metrics.

Methods scored on half B:

* ours: every attack of `DEFAULT_ATTACKS` that scores all candidates (`attack_target`).
* ``art-bb-rf`` / ``art-bb-nn``: `MembershipInferenceBlackBox(input_type="prediction",
  attack_model_type="rf" | "nn")` on a `PyTorchClassifier` wrapping the target followed by a
  softmax (ART's "prediction" features are meant to be class probabilities; our MLP returns
  logits), fitted on half A (members vs non-members, with labels), scores from
  ``infer(..., probabilities=True)``.
* ``art-bb-rf-shadow`` / ``art-bb-nn-shadow``: the same attack models fitted Shokri-style on
  reference model 0's own IN/OUT examples (its keep mask over candidates ∪ population, the
  probabilities coming from the reference, which the attacker owns), then applied to the target.

Label-only, on a balanced subsample of half B (100 + 100; ``--quick`` 40 + 40):

* ``art-label-only``: `LabelOnlyDecisionBoundary` (Choquette-Choo et al. 2021; ART runs its
  `HopSkipJump` per example). Its threshold τ is calibrated by `calibrate_distance_threshold` on
  reference model 0 (IN and OUT examples of that reference; attacker-owned, so it is never
  queried as the target), and a fresh attack with that τ is run on the target. With a τ given and
  no calibration bins, ``infer(..., probabilities=True)`` returns sigmoid(distance − τ): monotone
  in the HopSkipJump distance, so the ROC is that of the distance itself. HopSkipJump settings are
  reduced (``max_iter``, ``max_eval``, ``init_eval`` below) to a budget near ours.
* ours ``boundary`` (our batched HopSkipJump, label-only) on exactly the same subsample, and with
  ``--with-cw`` also ``boundary-cw`` (white-box C&W distance; seconds on one thread).

Queries count the examples sent to the *target*: ours from the result (`Target` counts them),
ART's by wrapping the `PyTorchClassifier`'s ``predict`` (calls to reference models are not
counted for either toolkit). Seconds are wall-clock on a shared 2-core machine (noisy).
``ratio`` is our best TPR at 0.1% FPR over ART's best, on half B (goal ≥ 2); half B holds
about ``members`` non-members, so 0.1% FPR means at most one or two false positives.

Last, the wall time of training ``--references`` reference models for the non-private recipe
with a fresh cache and `LocalExecutor(2)`, and with `LocalExecutor(1)` (skipped with
``--quick``); this is pure training (the store and model loading included), no attacks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.attacks.membership import (
    MembershipResult,
    MembershipTask,
    make_attack,
    run_attack,
)
from privacylab.data import load_dataset, membership_split
from privacylab.execution import LocalExecutor, ResultStore
from privacylab.experiment import (
    DEFAULT_ATTACKS,
    SUBSAMPLED,
    RunConfig,
    attack_target,
    prepare_games,
)
from privacylab.report import membership_metrics

ART_HSJ = {
    "norm": 2,
    "max_iter": 10,
    "max_eval": 1000,
    "init_eval": 50,
    "init_size": 100,
    "verbose": False,
}
"""ART HopSkipJump settings (defaults are max_iter 50, max_eval 10000, init_eval 100)."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _halves(membership: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of halves A and B, each holding half of the members and half of the others."""
    rng = np.random.default_rng(seed)
    a, b = [], []
    for side in (1, 0):
        idx = rng.permutation(np.flatnonzero(membership == side))
        a.append(idx[: len(idx) // 2])
        b.append(idx[len(idx) // 2 :])
    return np.sort(np.concatenate(a)), np.sort(np.concatenate(b))


def _balanced(index: np.ndarray, membership: np.ndarray, per_side: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picks = [rng.permutation(index[membership[index] == s])[:per_side] for s in (1, 0)]
    return np.sort(np.concatenate(picks))


def _restrict(result: MembershipResult, index: np.ndarray) -> MembershipResult:
    return MembershipResult(
        attack=result.attack,
        scores=result.scores[index],
        membership=result.membership[index],
        access=result.access,
        queries=result.queries,
        seconds=result.seconds,
        params=result.params,
    )


def _row(result: MembershipResult, toolkit: str, delta: float) -> dict[str, Any]:
    m = membership_metrics(result, delta=delta)
    return {
        "method": result.attack,
        "toolkit": toolkit,
        "access": result.access,
        "examples": m.examples,
        "auc": m.auc,
        "tpr_at_1pct_fpr": m.tpr_at_1pct_fpr,
        "tpr_at_01pct_fpr": m.tpr_at_01pct_fpr,
        "queries": int(result.queries),
        "seconds": float(result.seconds),
    }


class _Counted:
    """An ART PyTorchClassifier whose `predict` counts the examples it is given."""

    def __init__(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int) -> None:
        from art.estimators.classification import PyTorchClassifier

        self.queries = 0
        self.classifier = PyTorchClassifier(
            model=nn.Sequential(model, nn.Softmax(dim=1)).eval(),
            loss=nn.CrossEntropyLoss(),
            input_shape=input_shape,
            nb_classes=num_classes,
            clip_values=(0.0, 1.0),
            device_type="cpu",
        )
        original = self.classifier.predict

        def predict(x: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
            self.queries += int(x.shape[0])
            return original(np.asarray(x, dtype=np.float32), *args, **kwargs)

        self.classifier.predict = predict  # type: ignore[method-assign]


def _art_blackbox(
    task: MembershipTask,
    membership: np.ndarray,
    target_model: nn.Module,
    half_a: np.ndarray,
    half_b: np.ndarray,
    seed: int,
) -> list[MembershipResult]:
    """ART MembershipInferenceBlackBox (rf, nn), fitted on half A or on reference 0."""
    from art.attacks.inference.membership_inference import MembershipInferenceBlackBox

    x = task.x.numpy()
    y = task.y.numpy()
    shape = tuple(x.shape[1:])
    results = []
    for kind in ("rf", "nn"):
        for source in ("half-A", "shadow"):
            np.random.seed(seed)
            torch.manual_seed(seed)
            counted = _Counted(target_model, shape, task.num_classes)
            attack = MembershipInferenceBlackBox(
                counted.classifier, input_type="prediction", attack_model_type=kind
            )
            start = time.perf_counter()
            if source == "half-A":
                a_in = half_a[membership[half_a] == 1]
                a_out = half_a[membership[half_a] == 0]
                attack.fit(x[a_in], y[a_in], x[a_out], y[a_out])
            else:
                assert task.keep is not None
                ref = _Counted(task.references[0], shape, task.num_classes).classifier
                all_x, all_y = task.all_x().numpy(), task.all_y().numpy()
                keep = task.keep[0]
                inside, outside = np.flatnonzero(keep), np.flatnonzero(~keep)
                attack.fit(
                    x=None,
                    y=all_y[inside],
                    test_x=None,
                    test_y=all_y[outside],
                    pred=ref.predict(all_x[inside]),
                    test_pred=ref.predict(all_x[outside]),
                )
            scores = attack.infer(x[half_b], y[half_b], probabilities=True)
            seconds = time.perf_counter() - start
            name = f"art-bb-{kind}" + ("-shadow" if source == "shadow" else "")
            results.append(
                MembershipResult(
                    attack=name,
                    scores=np.asarray(scores, dtype=np.float64).reshape(-1),
                    membership=membership[half_b],
                    access="scores",
                    queries=counted.queries,
                    seconds=seconds,
                    params={"attack_model_type": kind, "fitted_on": source},
                )
            )
            _log(f"  {name}: {seconds:.1f} s")
    return results


def _art_label_only(
    task: MembershipTask,
    membership: np.ndarray,
    target_model: nn.Module,
    small: np.ndarray,
    per_side: int,
    seed: int,
) -> MembershipResult:
    """ART LabelOnlyDecisionBoundary with τ calibrated on reference 0's IN/OUT examples."""
    from art.attacks.inference.membership_inference import LabelOnlyDecisionBoundary

    assert task.keep is not None
    x, y = task.x.numpy(), task.y.numpy()
    shape = tuple(x.shape[1:])
    all_x, all_y = task.all_x().numpy(), task.all_y().numpy()
    rng = np.random.default_rng(seed + 7)
    keep = task.keep[0]
    inside = rng.permutation(np.flatnonzero(keep))[:per_side]
    outside = rng.permutation(np.flatnonzero(~keep))[:per_side]
    np.random.seed(seed)
    start = time.perf_counter()
    reference = _Counted(task.references[0], shape, task.num_classes)
    calibration = LabelOnlyDecisionBoundary(reference.classifier)
    calibration.calibrate_distance_threshold(
        all_x[inside], all_y[inside], all_x[outside], all_y[outside], **ART_HSJ
    )
    tau = max(float(calibration.distance_threshold_tau), 1e-9)
    calibrated = time.perf_counter() - start
    counted = _Counted(target_model, shape, task.num_classes)
    attack = LabelOnlyDecisionBoundary(counted.classifier, distance_threshold_tau=tau)
    probabilities = attack.infer(x[small], y[small], probabilities=True, **ART_HSJ)
    seconds = time.perf_counter() - start
    _log(f"  art-label-only: {seconds:.1f} s (calibration {calibrated:.1f} s)")
    return MembershipResult(
        attack="art-label-only",
        scores=np.asarray(probabilities)[:, 1],
        membership=membership[small],
        access="label",
        queries=counted.queries,
        seconds=seconds,
        predictions=(np.asarray(probabilities)[:, 1] > 0.5).astype(np.int64),
        params={
            **ART_HSJ,
            "tau": tau,
            "calibration_seconds": calibrated,
            "reference_queries": reference.queries,
        },
    )


def _ours_label_only(
    game_target: Any,
    task: MembershipTask,
    membership: np.ndarray,
    small: np.ndarray,
    names: tuple[str, ...],
) -> list[MembershipResult]:
    small_task = task.subset(small)
    out = []
    for name in names:
        result = run_attack(make_attack(name), game_target, small_task, membership[small])
        _log(f"  {name}: {result.seconds:.1f} s")
        out.append(result)
    return out


def _best(rows: list[dict[str, Any]], toolkit: str) -> dict[str, Any] | None:
    mine = [r for r in rows if r["toolkit"] == toolkit]
    return max(mine, key=lambda r: (r["tpr_at_01pct_fpr"], r["auc"])) if mine else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if b == 0:
        return float("inf") if a > 0 else None
    return a / b


def compare(
    config: RunConfig, cache: Path, per_side: int, with_cw: bool = False
) -> list[dict[str, Any]]:
    """Every method on every target of `config`."""
    ours = tuple(a for a in DEFAULT_ATTACKS if a not in SUBSAMPLED)
    config.attacks = ours
    out = []
    for game in prepare_games(config, cache, progress=None):
        _log(f"{game.name}: test accuracy {game.test_accuracy:.3f}")
        task, membership = game.task, game.membership
        half_a, half_b = _halves(membership, config.seed)
        full = attack_target(game.target, task, membership, ours, subsample=1, seed=config.seed)
        rows = [_row(_restrict(r, half_b), "privacylab", config.delta) for r in full]
        rows += [
            _row(r, "art", config.delta)
            for r in _art_blackbox(task, membership, game.target.model, half_a, half_b, 0)
        ]
        small = _balanced(half_b, membership, per_side, config.seed + 1)
        label_rows = [
            _row(r, "privacylab", config.delta)
            for r in _ours_label_only(
                game.target,
                task,
                membership,
                small,
                ("boundary", "boundary-cw") if with_cw else ("boundary",),
            )
        ]
        art_label = _art_label_only(
            task, membership, game.target.model, small, per_side, config.seed
        )
        label_rows.append(_row(art_label, "art", config.delta))
        ours_best, art_best = _best(rows, "privacylab"), _best(rows, "art")
        ours_label = next(r for r in label_rows if r["method"] == "boundary")
        art_label_row = label_rows[-1]
        out.append(
            {
                "target": game.name,
                "test_accuracy": game.test_accuracy,
                "epsilon": game.record.get("epsilon"),
                "half_b": {"members": int(membership[half_b].sum()), "size": len(half_b)},
                "rows": rows,
                "label_only": {
                    "members": per_side,
                    "nonmembers": per_side,
                    "art_tau": art_label.params["tau"],
                    "art_calibration_reference_queries": art_label.params["reference_queries"],
                    "rows": label_rows,
                },
                "best": {"privacylab": ours_best, "art": art_best},
                "ratio_tpr_at_01pct_fpr": _ratio(
                    ours_best["tpr_at_01pct_fpr"] if ours_best else None,
                    art_best["tpr_at_01pct_fpr"] if art_best else None,
                ),
                "ratio_label_only_auc": _ratio(ours_label["auc"], art_label_row["auc"]),
            }
        )
    return out


def time_references(config: RunConfig, count: int, workers: int) -> dict[str, Any]:
    """Wall time of training `count` references of the first recipe in a fresh cache."""
    data = load_dataset(config.dataset, config.root)
    population = min(config.population, len(data) - 2 * config.members)
    split = membership_split(
        len(data), target_size=config.members, population_size=population, seed=config.seed
    )
    candidates, _ = split.target_indices()
    universe = np.concatenate([candidates, split.population])
    _, recipe = config.recipes()[0]
    from privacylab.attacks.membership.references import train_references

    folder = Path(tempfile.mkdtemp(prefix="mia_vs_art_refs_"))
    try:
        with ResultStore(folder / "store.sqlite") as store:
            start = time.perf_counter()
            train_references(
                recipe,
                universe,
                count,
                config.members,
                folder / "references",
                store=store,
                executor=LocalExecutor(workers),
                seed=config.seed,
            )
            seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "references": count,
        "workers": workers,
        "torch_threads_in_main": torch.get_num_threads(),
        "seconds": seconds,
        "epochs": config.epochs,
        "train_size": config.members,
    }


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if np.isfinite(value) else ("inf" if value > 0 else None)
    if isinstance(value, np.integer):
        return int(value)
    return value


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _print_table(payload: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for result in payload["targets"]:
        for title, rows in (
            (
                f"{result['target']} (test acc {result['test_accuracy']:.3f}): half B, "
                f"{result['half_b']['size']} candidates, {result['half_b']['members']} members",
                result["rows"],
            ),
            (
                f"{result['target']}: label-only, {result['label_only']['members']} + "
                f"{result['label_only']['nonmembers']} from half B "
                f"(ART τ = {result['label_only']['art_tau']:.3f})",
                result["label_only"]["rows"],
            ),
        ):
            table = Table(title=title)
            for col in ("method", "toolkit", "access", "AUC", "TPR@1%", "TPR@0.1%", "queries", "s"):
                table.add_column(col, justify="left" if col in ("method", "toolkit") else "right")
            for r in rows:
                table.add_row(
                    r["method"],
                    r["toolkit"],
                    r["access"],
                    _num(r["auc"], ".3f"),
                    _num(r["tpr_at_1pct_fpr"], ".3f"),
                    _num(r["tpr_at_01pct_fpr"], ".3f"),
                    str(r["queries"]),
                    _num(r["seconds"], ".1f"),
                )
            console.print(table)
        ours, art = result["best"]["privacylab"], result["best"]["art"]
        console.print(
            f"{result['target']}: best TPR@0.1%FPR ours {ours['method']} "
            f"{ours['tpr_at_01pct_fpr']:.3f} / ART {art['method']} {art['tpr_at_01pct_fpr']:.3f}"
            f" = ratio {_num(result['ratio_tpr_at_01pct_fpr'], '.2f')} (goal ≥ 2); "
            f"label-only AUC ratio {_num(result['ratio_label_only_auc'], '.2f')}"
        )
    for t in payload["reference_training"]:
        console.print(
            f"train {t['references']} references ({t['train_size']} examples, {t['epochs']} "
            f"epochs) with LocalExecutor({t['workers']}): {t['seconds']:.1f} s wall"
        )
    console.print(f"total {payload['seconds']:.0f} s (2 shared cores: timings are noisy)")


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print a table, or one JSON object with --json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quick", action="store_true", help="non-private only, small game")
    parser.add_argument("--references", type=int, default=None, help="16 (quick: 4)")
    parser.add_argument("--cache", default=None, help="model cache (default: a temporary dir)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--label-only", type=int, default=None, help="per side: 100 (quick 40)")
    parser.add_argument("--with-cw", action="store_true", help="add boundary-cw (slow)")
    parser.add_argument("--no-timing", action="store_true", help="skip reference-training timing")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TQDM_DISABLE", "1")

    start = time.perf_counter()
    if args.quick:
        config = RunConfig.quick(epsilons=(), workers=args.workers)
    else:
        config = RunConfig(epsilons=(8.0,), workers=args.workers)
    if args.references is not None:
        config.references = args.references
    per_side = args.label_only or (40 if args.quick else 100)
    temporary = args.cache is None
    cache = Path(tempfile.mkdtemp(prefix="mia_vs_art_") if temporary else args.cache)
    try:
        targets = compare(config, cache, per_side, args.with_cw)
    finally:
        if temporary:
            shutil.rmtree(cache, ignore_errors=True)
    timing = []
    if not args.no_timing:
        count = 16 if args.references is None else args.references
        base = RunConfig()
        base.references = count
        for workers in (2,) if args.quick else (2, 1):
            _log(f"timing {count} references with {workers} worker(s)")
            timing.append(time_references(base, count, workers))
    payload = {
        "setting": {
            "dataset": config.dataset,
            "model": f"{config.model} {config.model_options}",
            "members": config.members,
            "references": config.references,
            "epochs": config.epochs,
            "label_only_per_side": per_side,
            "art_hop_skip_jump": ART_HSJ,
            "quick": args.quick,
        },
        "targets": targets,
        "reference_training": timing,
        "seconds": time.perf_counter() - start,
    }
    if args.json:
        print(json.dumps(_json_safe(payload)))
    else:
        _print_table(payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
