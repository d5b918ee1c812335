"""Does an ownership watermark survive model extraction? Adi et al. 2018's trigger-set watermark
on a victim, each learning-based extraction attack's copy verified, beside independent models.

    python benchmarks/watermark_survival.py [--dataset mnist5k] [--budget 5000] [--json]

Setting. The victim is an MLP trained on the canonical train part of ``--dataset`` with a trigger
set of ``--triggers`` abstract inputs with random labels (`privacylab.defenses.watermark`,
FromScratch oversampling); an unwatermarked model of the same recipe gives the accuracy cost.
The thief owns half of the victim's test rows, unlabelled (`extraction_split`: the evaluator
keeps the other half for accuracy and fidelity), knows the architecture and queries the victim
at ``--access`` (scores by default) with each learning-based attack of
`privacylab.attacks.extraction.learning` — random, copycat, jacobian, knockoff (random and
adaptive policies) — for ``--budget`` queries. Each copy is then verified like any suspect:
k of n trigger labels matched, p = P[Binomial(n, 1/K) >= k], "survives" when p < the threshold.
The null rows are ``--nulls`` models trained independently (other seeds, same recipe, no
triggers): their p-values are what an innocent model gets.

What to expect: extraction copies the victim's behaviour where the thief queries it. A copy
trained on in-distribution queries (copycat, knockoff, jacobian) sees few inputs near the
abstract triggers and learns the task, not the watermark (the weakness Jia et al. 2021's
entangled watermarks address); queries drawn from the triggers' own distribution (random noise
against noise triggers) are where some of it may transfer.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privacylab.attacks.extraction import (
    ExtractionError,
    ExtractionTask,
    Truth,
    extraction_names,
    make_extraction,
    predicted_labels,
    run_extraction,
)
from privacylab.attacks.extraction.pools import extraction_split
from privacylab.data import load_dataset, split_train_test
from privacylab.defenses.watermark import (
    DEFAULT_THRESHOLD,
    load_trigger_set,
    verify_watermark,
    watermark_job,
)
from privacylab.models import build_model, load_model
from privacylab.target import Access, Target
from privacylab.training import TrainConfig, train

ATTACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "random": ("random", {}),
    "copycat": ("copycat", {}),
    "jacobian": ("jacobian", {}),
    "knockoff": ("knockoff", {"policy": "random"}),
    "knockoff-adaptive": ("knockoff", {"policy": "adaptive"}),
}
"""Row name: (registered extraction attack, its options)."""


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    widths = tuple(int(w) for w in args.widths.split(",") if w.strip())
    config = TrainConfig(epochs=args.epochs, batch_size=128, lr=0.1, seed=args.seed)
    folder = Path(args.out or tempfile.mkdtemp(prefix="watermark-survival-"))
    started = time.monotonic()
    summary = watermark_job(
        args.dataset,
        "mlp",
        config,
        folder,
        model_options={"widths": widths},
        triggers=args.triggers,
        kind=args.kind,
        trigger_seed=args.trigger_seed,
        threshold=args.threshold,
    )
    print(
        f"victim: test accuracy {summary['test_accuracy']:.4f} (unwatermarked "
        f"{summary['baseline_test_accuracy']:.4f}), trigger {summary['matches']}/"
        f"{summary['triggers']}, p = {summary['p_value']:.3g} "
        f"[{time.monotonic() - started:.0f}s]",
        file=sys.stderr,
    )
    victim, spec, _ = load_model(folder)
    trigger = load_trigger_set(folder)
    data = load_dataset(args.dataset)
    members, _ = split_train_test(data, seed=args.seed)
    pool_rows, eval_rows = extraction_split(data, args.seed)
    low, high = float(members.features.min()), float(members.features.max())
    truth = Truth(victim, data.features[eval_rows], data.labels[eval_rows], bounds=(low, high))
    victim_labels = predicted_labels(victim, truth.x)
    checkpoints = tuple(sorted({max(1, args.budget // 2**k) for k in range(3, -1, -1)}))
    rows: list[dict[str, Any]] = []

    def verified(name: str, role: str, model: torch.nn.Module, **facts: Any) -> dict[str, Any]:
        check = verify_watermark(model, trigger, threshold=args.threshold)
        labels = predicted_labels(model, truth.x)
        row = {
            "model": name,
            "role": role,
            "queries": facts.pop("queries", None),
            "accuracy": float((labels == truth.y).double().mean()),
            "fidelity": float((labels == victim_labels).double().mean()),
            "matches": check.matches,
            "triggers": check.triggers,
            "p_value": check.p_value,
            "survives": check.owned,
            **facts,
        }
        rows.append(row)
        print(
            f"{name}: fidelity {row['fidelity']:.3f}, trigger {check.matches}/{check.triggers},"
            f" p = {check.p_value:.3g} [{time.monotonic() - started:.0f}s]",
            file=sys.stderr,
        )
        return row

    verified("victim (watermarked)", "victim", victim)
    plain, _, _ = load_model(folder / "baseline")
    verified("unwatermarked, same recipe", "null", plain)
    for i in range(args.nulls):
        seed = args.seed + 1 + i
        net = build_model("mlp", members.input_shape, members.num_classes, seed=seed, widths=widths)
        model = train(net, members, TrainConfig(**{**config.to_dict(), "seed": seed})).model
        verified(f"independent (seed {seed})", "null", model)
    available = set(extraction_names())
    wanted = [a for a in args.attacks.split(",") if a.strip()]
    for name in wanted:
        if name not in ATTACKS:
            raise SystemExit(f"error: unknown attack {name!r}; choose from {', '.join(ATTACKS)}")
        method, options = ATTACKS[name]
        if method not in available:
            print(f"{name}: skipped ({method} is not registered here)", file=sys.stderr)
            rows.append({"model": name, "role": "copy", "skipped": "not registered"})
            continue
        attack = make_extraction(method, **options)
        task = ExtractionTask(
            input_shape=tuple(spec.input_shape),
            num_classes=spec.num_classes,
            pool=data.features[pool_rows],
            pool_kind="in-distribution",
            architecture=spec,
            bounds=(low, high),
            budget=args.budget,
            checkpoints=checkpoints,
            seed=args.seed,
        )
        target = Target(victim, Access.LOGITS, spec.num_classes).with_access(args.access)
        try:
            result = run_extraction(attack, target, task, truth)
        except ExtractionError as error:
            print(f"{name}: skipped ({error})", file=sys.stderr)
            rows.append({"model": name, "role": "copy", "skipped": str(error)})
            continue
        row = verified(
            name,
            "copy",
            result.stolen.model,
            queries=result.queries,
            seconds=result.seconds,
            curve=[vars(p) for p in result.curve],
        )
        if abs(row["fidelity"] - result.fidelity) > 1e-9:
            raise AssertionError(f"{name}: fidelity {row['fidelity']} != {result.fidelity}")
    return {
        "benchmark": "watermark_survival",
        "paper": trigger.paper,
        "dataset": args.dataset,
        "widths": list(widths),
        "epochs": args.epochs,
        "access": args.access,
        "budget": args.budget,
        "trigger_kind": args.kind,
        "triggers": len(trigger),
        "num_classes": trigger.num_classes,
        "threshold": args.threshold,
        "victim_test_accuracy": summary["test_accuracy"],
        "unwatermarked_test_accuracy": summary["baseline_test_accuracy"],
        "accuracy_cost": summary["accuracy_cost"],
        "trigger_copies": summary["trigger_copies"],
        "rows": rows,
        "seconds": time.monotonic() - started,
        "note": "measured on a loaded machine (2 shared cores)",
    }


def table(payload: dict[str, Any]) -> str:
    """The rows as a plain text table."""
    headers = ["model", "role", "queries", "accuracy", "fidelity", "trigger", "p-value", "survives"]
    lines = []
    for row in payload["rows"]:
        if "skipped" in row:
            lines.append([row["model"], row["role"], "-", "-", "-", "-", "-", row["skipped"]])
            continue
        lines.append(
            [
                row["model"],
                row["role"],
                "-" if row["queries"] is None else str(row["queries"]),
                f"{row['accuracy']:.3f}",
                f"{row['fidelity']:.3f}",
                f"{row['matches']}/{row['triggers']}",
                f"{row['p_value']:.2g}",
                "yes" if row["survives"] else "no",
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in lines)) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines]
    head = (
        f"{payload['dataset']} MLP {payload['widths']}, {payload['triggers']} "
        f"{payload['trigger_kind']} triggers (K = {payload['num_classes']}, chance "
        f"{1 / payload['num_classes']:.2f}); "
        f"test accuracy {payload['victim_test_accuracy']:.4f} watermarked vs "
        f"{payload['unwatermarked_test_accuracy']:.4f} unwatermarked (cost "
        f"{payload['accuracy_cost']:+.4f}); extraction at {payload['access']}, budget "
        f"{payload['budget']}; survives: p < {payload['threshold']:g}"
    )
    return head + "\n" + "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist5k", choices=("mnist5k", "digits"))
    parser.add_argument("--widths", default="256")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--triggers", type=int, default=100)
    parser.add_argument("--kind", default="noise", choices=("noise", "patterns"))
    parser.add_argument("--trigger-seed", type=int, default=None)
    parser.add_argument("--access", default="scores", choices=("label", "scores", "logits"))
    parser.add_argument("--budget", type=int, default=5000)
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--nulls", type=int, default=3)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="Folder for the victim [a temporary one].")
    parser.add_argument("--json", action="store_true", help="Print one JSON object on stdout.")
    args = parser.parse_args(argv)
    if args.budget < 1 or args.triggers < 1 or args.nulls < 0 or args.epochs < 1:
        print(
            "error: --budget, --triggers and --epochs must be >= 1, --nulls >= 0", file=sys.stderr
        )
        return 2
    if not 0 < args.threshold < 1:
        print(f"error: --threshold must lie in (0, 1), got {args.threshold}", file=sys.stderr)
        return 2
    np.seterr(all="ignore")
    payload = run(args)
    if args.json:
        print(json.dumps(payload, allow_nan=False))
    else:
        print(table(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
