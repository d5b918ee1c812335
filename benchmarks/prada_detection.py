"""PRADA (Juuti et al. 2019, Alg. 1) against every extraction attack registered here: queries
until detection for each attack (one client, one fresh watch), and false alarms on ten benign
clients streaming natural test rows — beside what the paper reports.

Victims, trained here with the project trainer on the dataset's training rows (`digits` by
default: 8x8, 10 classes): an MLP (hidden widths `--widths`) for the learning-based attacks
(random, copycat, jacobian, knockoff random/adaptive) and `relu-exact`; a softmax (logistic
regression) model for `equation`, which only applies to softmax-linear victims. Each attack is
served what it declares (labels for the learning attacks, probability vectors for equation,
logits in float64 for relu-exact) through a `Prada` watch that never blocks (the attack runs
to its budget) and records its whole Shapiro–Wilk trace, (queries, W) at every test, so the
detection point at any δ is read from it. The thief's pool is half the test rows
(`pools.extraction_split`); benign clients stream random orderings of the whole test split
(natural rows the victim never trained on; a benign user is not the thief, so the pool's rows
are natural queries for them too).

Two thresholds are reported: the fixed `--delta` (default 0.9), and a *calibrated* δ chosen
the way the paper chooses it, from benign data: the smallest W that ten calibration clients
(one seed) ever reached, less `--margin`. False alarms are then counted on ten *other* benign
clients (another seed), so the calibration is not scored on its own clients.

Paper (Juuti et al. 2019, Sec. VI, Table "queries until detection"): PRADA detected every
attack it was tested on (Papernot et al. 2017's Jacobian augmentation, Tramèr et al. 2016, and
the paper's own T-RND / COLOR attacks on MNIST and GTSRB) with no false alarm on benign
streams, δ chosen per model from benign data. The exact per-attack query counts could not be
read back offline while writing this (no copy of the paper's table was reachable), so
`paper` below states only what the text claims, and no number is invented for it.

    python benchmarks/prada_detection.py [--json] [--dataset digits|mnist5k] [--delta 0.9]
        [--budget 2000] [--relu-budget 200000] [--methods ...] [--clients 10]
        [--benign-queries 400] [--margin 0.01] [--seed 0]

Progress goes to stderr; stdout holds the table (or one JSON object with `--json`). Timings
are wall-clock seconds on whatever machine runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from privacylab.attacks.extraction import (
    ExtractionError,
    ExtractionTask,
    Truth,
    extraction_class,
    extraction_names,
    make_extraction,
    relu_layers,
    run_extraction,
)
from privacylab.attacks.extraction.pools import extraction_split, in_distribution_pool
from privacylab.data import load_dataset
from privacylab.data.dataset import train_test_indices
from privacylab.defenses.query.prada import Prada
from privacylab.models import ModelSpec
from privacylab.target import Access, Target
from privacylab.training import TrainConfig, train

LEARNING = {
    "random": ("random", {}),
    "copycat": ("copycat", {}),
    "jacobian": ("jacobian", {}),
    "knockoff-random": ("knockoff", {"policy": "random"}),
    "knockoff-adaptive": ("knockoff", {"policy": "adaptive"}),
}
EXACT = {"equation": ("equation", {}), "relu-exact": ("relu-exact", {})}

FULL_TRACE = 1e-9
"""The watches run with this δ (never crossed) so that the whole W trace is recorded; detection
at any δ is read from the trace (`first_below`)."""


SWEEP = (0.85, 0.9, 0.92, 0.94, 0.95, 0.96)
"""The δ values the trade-off table covers (false alarms over all 2 x `--clients` benign
clients, queries until detection per attack)."""


def first_below(trace: list[tuple[int, float]], delta: float) -> int | None:
    """The query count at the first test with W < `delta`, or None."""
    return next((q for q, w in trace if w < delta), None)


def _benign(
    watch: Prada, model: Any, natural: Any, clients: int, queries: int, seed: int, classes: int
) -> list[list[tuple[int, float]]]:
    """W traces of `clients` benign clients, each streaming a random ordering of `natural`."""
    rng = np.random.default_rng(seed)
    shared = Target(model, Access.SCORES, classes)
    traces = []
    for _ in range(clients):
        client = watch.fresh()
        view = client.defend(shared)
        order = rng.permutation(len(natural))[:queries]
        for i in range(0, len(order), 16):
            view.probabilities(natural[torch.from_numpy(order[i : i + 16])])
        traces.append(client.trace())
    return traces


PAPER = {
    "claim": "every tested attack detected, 0 false alarms on benign streams",
    "attacks": "Papernot et al. 2017 (Jacobian), Tramèr et al. 2016, T-RND, COLOR",
    "datasets": "MNIST, GTSRB",
    "queries_until_detection": None,
    "source": "Juuti et al. 2019, PRADA, Sec. VI (numbers not reproduced here: see docstring)",
}


def _train(spec: ModelSpec, data: Any, rows: np.ndarray, epochs: int, seed: int) -> Any:
    model = spec.build(seed=seed)
    train(model, data.subset(rows), TrainConfig(epochs=epochs, seed=seed))
    return model.cpu().eval()


def _methods(wanted: list[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The wanted methods whose attack is registered now (the others are reported missing)."""
    names = set(extraction_names())
    return {
        m: spec for m, spec in {**LEARNING, **EXACT}.items() if m in wanted and spec[0] in names
    }


def main(argv: list[str] | None = None) -> int:
    """Train the victims, run every attack through a PRADA watch, then the benign clients."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--dataset", choices=("digits", "mnist5k"), default="digits")
    parser.add_argument("--widths", default="32")
    parser.add_argument("--delta", type=float, default=0.9)
    parser.add_argument("--budget", type=int, default=2000)
    parser.add_argument("--relu-budget", type=int, default=200_000)
    parser.add_argument("--methods", default=",".join([*LEARNING, *EXACT]))
    parser.add_argument("--epochs", type=int, default=3, help="thief epochs per fit")
    parser.add_argument("--victim-epochs", type=int, default=30)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--benign-queries", type=int, default=400)
    parser.add_argument("--margin", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    wanted = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in wanted if m not in {**LEARNING, **EXACT}]
    if unknown:
        print(f"error: unknown method(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not 0 < args.delta < 1:
        print(f"error: --delta must be in (0, 1), got {args.delta}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    watch = Prada(delta=FULL_TRACE)

    data = load_dataset(args.dataset)
    train_rows, _ = train_test_indices(data, seed=args.seed)
    pool_rows, eval_rows = extraction_split(data, args.seed)
    widths = [int(w) for w in args.widths.split(",")]
    mlp_spec = ModelSpec("mlp", data.input_shape, data.num_classes, {"widths": widths})
    start = time.perf_counter()
    mlp = _train(mlp_spec, data, train_rows, args.victim_epochs, args.seed)
    softmax_spec = ModelSpec("logreg", data.input_shape, data.num_classes, {})
    softmax = _train(softmax_spec, data, train_rows, args.victim_epochs, args.seed)
    print(f"victims trained in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    pool = in_distribution_pool(data, pool_rows)
    x_eval, y_eval = data.features[eval_rows], data.labels[eval_rows]

    natural = data.features[np.concatenate([pool_rows, eval_rows])]
    cal = _benign(watch, mlp, natural, args.clients, args.benign_queries, args.seed + 1, 10)
    calibrated = round(min(w for t in cal for _, w in t) - args.margin, 4)
    evaluation = _benign(watch, mlp, natural, args.clients, args.benign_queries, args.seed + 2, 10)
    print(f"calibrated δ = {calibrated} (10 calibration clients' min W - margin)", file=sys.stderr)

    rows: list[dict[str, Any]] = []
    traces: dict[str, list[tuple[int, float]]] = {}
    methods = _methods(wanted)
    for method in wanted:
        if method not in methods:
            rows.append({"method": method, "skipped": "attack not registered"})
    for method, (name, options) in methods.items():
        cls = extraction_class(name)
        exact = name in ("equation", "relu-exact")
        victim, spec = (softmax, softmax_spec) if name == "equation" else (mlp, mlp_spec)
        budget = args.relu_budget if name == "relu-exact" else args.budget
        if exact:
            attack = make_extraction(name, **options)
            truth = Truth(victim, x_eval, y_eval, layers=relu_layers(victim))
        else:
            attack = make_extraction(name, answers="labels", epochs=args.epochs, **options)
            truth = Truth(victim, x_eval, y_eval)
        access = cls.threat_model.access
        precision = "float64" if exact else "float32"
        client = watch.fresh()
        target = client.defend(Target(victim, access, data.num_classes, precision=precision))
        task = ExtractionTask(
            data.input_shape,
            data.num_classes,
            pool=pool,
            architecture=spec,
            budget=budget,
            seed=args.seed,
        )
        began = time.perf_counter()
        try:
            result = run_extraction(attack, target, task, truth)
        except ExtractionError as error:
            rows.append({"method": method, "error": str(error)})
            print(f"{method:18s} refused: {error}", file=sys.stderr)
            continue
        trace = traces[method] = client.trace()
        at, at_calibrated = first_below(trace, args.delta), first_below(trace, calibrated)
        row = {
            "method": method,
            "access": access.value,
            "queries": result.queries,
            "fidelity": result.fidelity,
            "detected": at is not None,
            "queries_until_detection": at,
            "detected_calibrated": at_calibrated is not None,
            "queries_until_detection_calibrated": at_calibrated,
            "min_w": min((w for _, w in trace), default=None),
            "tests": len(trace),
            "seconds": time.perf_counter() - began,
        }
        rows.append(row)
        print(
            f"{method:18s} queries {row['queries']:>7d} detected {row['detected']!s:5s} "
            f"at {row['queries_until_detection']} (calibrated δ: {at_calibrated})  "
            f"min W {row['min_w']}",
            file=sys.stderr,
        )

    sweep = [
        {
            "delta": delta,
            "false_alarms": sum(first_below(t, delta) is not None for t in [*cal, *evaluation]),
            "benign_clients": len(cal) + len(evaluation),
            "queries_until_detection": {m: first_below(t, delta) for m, t in traces.items()},
        }
        for delta in SWEEP
    ]
    summary = {
        "dataset": args.dataset,
        "victim": f"mlp {widths}, softmax (equation)",
        "delta": args.delta,
        "delta_calibrated": calibrated,
        "min_queries": watch.params["min_queries"],
        "attacks": rows,
        "benign": {
            "clients": args.clients,
            "queries_each": min(args.benign_queries, len(natural)),
            "false_alarms": sum(first_below(t, args.delta) is not None for t in evaluation),
            "false_alarms_calibrated": sum(
                first_below(t, calibrated) is not None for t in evaluation
            ),
            "min_w": min(w for t in evaluation for _, w in t),
            "calibration_min_w": min(w for t in cal for _, w in t),
        },
        "sweep": sweep,
        "paper": PAPER,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"δ = {args.delta:g}; calibrated δ = {calibrated:g}")
        print(f"{'method':18s} {'queries':>8s} {'at δ':>8s} {'at cal. δ':>10s} {'min W':>6s}")
        for r in rows:
            if "fidelity" not in r:
                print(f"{r['method']:18s} {r.get('skipped') or r.get('error')}")
                continue
            at, cal_at, w = (
                r["queries_until_detection"],
                r["queries_until_detection_calibrated"],
                r["min_w"],
            )
            print(
                f"{r['method']:18s} {r['queries']:8d} {at if at is not None else '-':>8} "
                f"{cal_at if cal_at is not None else '-':>10} {'-' if w is None else f'{w:.3f}':>6}"
            )
        b = summary["benign"]
        print(
            f"benign ({b['clients']} held-out clients): {b['false_alarms']} false alarms at δ, "
            f"{b['false_alarms_calibrated']} at calibrated δ, min W {b['min_w']:.3f}"
        )
        print("sweep: δ, false alarms / benign clients, queries until detection per attack")
        for point in sweep:
            found = ", ".join(f"{m} {q}" for m, q in point["queries_until_detection"].items())
            print(
                f"  {point['delta']:.2f}  {point['false_alarms']}/{point['benign_clients']}  "
                f"{found}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
