"""The seed's DP-Forward experiment on our data: non-private, DP-SGD and DP-Forward fine-tuning of
MiniLM at each position and ε, each attacked by embedding inversion, attribute inference and
membership inference, in one table beside the seed's claims.

    python benchmarks/dpforward_table.py [--json] [--quick] [--work DIR] [--report DIR]
        [--epsilons 2 4 8] [--positions input layer:2 layer:4 output] [--moderate 8]
        [--documents 2400] [--layers K] [--epochs 3] [--victims 200] [--seed 0]

Du et al. 2023 ("DP-Forward: Fine-tuning and Inference on Language Models with Differential
Privacy in Forward Pass", CCS'23): Sec. 5.4 (Table 5, accuracy of DP-Forward at each position
against DP-SGD and non-private fine-tuning), Sec. 6.2 (sequence-level membership inference),
Sec. 6.3 (embedding inversion) and Sec. 6.4 (sensitive attribute inference). Models are trained
by the DP-Forward job (`privacylab.dpforward.train_dpforward`, the code behind
``privacylab dpforward train``) on the review corpus (`privacylab.data.reviews`: sentiment label,
product category as the sensitive attribute) and attacked by the embedding attack job
(`privacylab.embedding.run_embedding_attack`, behind ``privacylab attack embedding``):
``inversion-nn``, ``inversion-opt`` and ``attribute``, each run also reporting the confidence /
entropy membership attacks on the deployed classifier.

Models: ``non-private`` and ``dp-sgd`` at each ε of ``--epsilons`` (their cut only decides where
the attacker reads the clear embedding, so they are trained at each position of
``--baseline-positions``, by default every ``--positions``) and ``dp-forward`` at each position
× ε. A non-private or DP-SGD model computes the same function whatever its cut (no release layer),
so its accuracy and membership AUC should agree across positions (see the cost note below).

Claims (the seed's abstract and issue 16's "Must show"), each with ✓ / ✗ computed from the rows
(– when the rows cannot decide it):

1. DP-Forward's accuracy is above DP-SGD's at a moderate ε (every ε ≥ ``--moderate``) for some
   position (seed: up to +7.7 points);
2. the output position is DP-Forward's best at every ε;
3. embedding inversion (the better of nn and opt) recovers < ``--inversion-bound`` (0.2) of a
   victim's tokens under DP-Forward at every (position, ε) where DP-SGD leaves it high
   (≥ ``--high``, 0.5) (seed: up to 88 points less);
4. attribute inference is pushed towards chance under DP-Forward (its advantage over chance at
   most half the non-private model's at the same position) and barely reduced under DP-SGD
   (more than half kept) (seed: up to 41 points less, DP-SGD fails);
5. membership inference is mitigated by both: every DP model's |AUC − 0.5| is at most
   max(0.02, half the non-private model's) (an AUC below 0.5 is an attack whose decision may be
   flipped, so the distance counts); – when the non-private AUC is within 0.02 of 0.5 (nothing
   to mitigate).

Resumable: each model folder is under ``--work``/models/NAME (a killed training resumes from its
checkpoint, a finished one is read back) and each attack's result is kept as JSON under
``--work``/results/ (and in the model folder's result store). ``--report DIR``: every model's
facts and every attack run join the report section ``#dp-forward``
(`privacylab.report.dpforward.add_dpforward_run`). Progress on stderr; ``--json`` prints one
JSON object. ``--quick``: ε = 8 only, positions input and output, 300 documents, MiniLM's first
2 layers, 30 victims (about 5 minutes on a shared 2-core CPU).

Models: the baselines (non-private, DP-SGD at each ε) are trained once and read at every cut
of ``--baseline-positions`` (`run_embedding_attack(position=...)`: their function is the same
whatever the cut); DP-Forward is trained per cut × ε, and with ``--frozen-positions`` also with
f(·) frozen (one release per training sequence). The output cut and the frozen variant run
first, so a run cut short still holds the most telling rows; a re-run resumes the rest.

Measured (``--epsilons 2 8 --positions input layer:3 output --baseline-positions input layer:3
output --frozen-positions input output --victims 100``; 2,625 s on 2 CPU cores; the full
MiniLM, 960 training reviews, 3 epochs): accuracy non-private 0.932, DP-SGD 0.585 / 0.632
(ε 2 / 8), DP-Forward at the output 0.550 / 0.658, at layer:3 and input 0.48-0.50, frozen
0.49-0.50; inversion (nn / opt) at input 1.00 / 1.00 under non-private and DP-SGD, 0.00 / 0.00
under DP-Forward, at the output 0.00 / 0.22 under DP-Forward against a guessing level of 0.23;
attribute accuracy (chance 0.27) 0.93-1.00 non-private and DP-SGD, 0.22-0.27 DP-Forward. Claims
1-4 ✓ (1 at ε = 8 only, +2.6 points), 5 ✗ at 100 + 100 sequences (AUCs 0.46-0.60, standard
error ≈ 0.04); `benchmarks/dpforward_mia.py` decides it on every member and on the memorised
reviews.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _language import cached_json, finish, fmt, log, stderr_progress, table

ATTACKS = ("inversion-nn", "inversion-opt", "attribute")
SEED_CLAIMS = {
    "accuracy": "DP-Forward outperforms DP-SGD by up to 7.7pp at a moderate privacy level",
    "output_best": "perturbing the output (sentence embedding) is DP-Forward's best position",
    "inversion": "DP-Forward cuts embedding inversion success by up to 88pp; DP-SGD fails",
    "attribute": "DP-Forward cuts attribute inference by up to 41pp, towards chance; DP-SGD fails",
    "membership": "both DP-SGD and DP-Forward mitigate sequence-level membership inference",
}
SEED_POINTS = {"accuracy": 7.7, "inversion": 88.0, "attribute": 41.0}
MIA_SLACK = 0.02


@dataclass(frozen=True)
class Spec:
    """One model of the table: `method` ("non-private", "dp-sgd", "dp-forward") at `position`
    with target `epsilon` (None: non-private)."""

    method: str
    position: str
    epsilon: float | None
    frozen: bool = False

    @property
    def name(self) -> str:
        place = self.position.replace(":", "")
        kind = self.method + ("-frozen" if self.frozen else "")
        if self.epsilon is None:
            return f"{kind}-{place}"
        return f"{kind}-eps{self.epsilon:g}-{place}"

    @property
    def baseline(self) -> bool:
        """A model without a release layer: trained once, read at every cut."""
        return self.method != "dp-forward"

    @property
    def folder_name(self) -> str:
        """The trained model's folder: one per baseline (whatever cut it is read at)."""
        if not self.baseline:
            return self.name
        return self.method if self.epsilon is None else f"{self.method}-eps{self.epsilon:g}"


def specs(args: argparse.Namespace) -> list[Spec]:
    """Every model of the run: baselines at each baseline position, DP-Forward at each
    position × ε."""
    out = [Spec("non-private", p, None) for p in args.baseline_positions]
    out += [Spec("dp-sgd", p, e) for e in args.epsilons for p in args.baseline_positions]
    forward = [Spec("dp-forward", p, e) for e in args.epsilons for p in args.positions]
    frozen = args.frozen_positions
    forward += [Spec("dp-forward", p, e, True) for e in args.epsilons for p in frozen]
    # the output cut first and the frozen variant first: the cheapest, most telling rows land
    # early when a long run is cut short (a re-run resumes the rest)
    order = {"output": 0, "input": 1}
    forward.sort(key=lambda s: (order.get(s.position, 2), s.position, not s.frozen))
    return out + forward


def config_of(spec: Spec, args: argparse.Namespace) -> Any:
    """The `privacylab.dpforward.DPForwardConfig` of `spec` (schemas §3)."""
    from privacylab.dpforward import DPForwardConfig

    return DPForwardConfig(
        method=spec.method,
        epsilon=spec.epsilon,
        delta=args.delta,
        position="output" if spec.baseline else spec.position,
        frozen=spec.frozen,
        epochs=args.epochs,
        layers=args.layers,
        encoder=args.encoder,
        documents=args.documents,
        seed=args.seed,
        device=args.device,
    )


def trained(spec: Spec, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The model folder of `spec` under --work (trained, resumed, or read back) and its facts."""
    from privacylab.dpforward import train_dpforward

    folder = Path(args.work) / "models" / spec.folder_name
    started = time.perf_counter()
    if not (folder / "model.json").is_file():
        log(f"training {spec.name} -> {folder}")
    facts = train_dpforward(
        config_of(spec, args), folder, progress=stderr_progress(f"train {spec.name}")
    )
    if time.perf_counter() - started > 1.0:
        log(f"  {spec.name}: accuracy {facts['accuracy']:.3f} in {facts['seconds']:.0f}s")
    return folder, facts


def attacked(folder: Path, spec: Spec, method: str, args: argparse.Namespace) -> dict[str, Any]:
    """`method`'s embedding attack job result on `folder` (schemas §5), cached under --work."""
    from privacylab.embedding import run_embedding_attack

    path = Path(args.work) / "results" / spec.name / f"{method}-v{args.victims}-s{args.seed}.json"
    return cached_json(
        path,
        lambda: run_embedding_attack(
            folder,
            method,
            victims=args.victims,
            seed=args.seed,
            progress=stderr_progress(f"{method} {spec.name}"),
            device=args.device,
            position=spec.position if spec.baseline else None,
        ),
    )


def _get(result: dict[str, Any] | None, key: str) -> Any:
    return None if result is None else result.get(key)


def row_of(spec: Spec, facts: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The table row of one model: its facts and its attacks' numbers."""
    mia = next((r["mia_auc"] for r in runs.values() if r.get("mia_auc") is not None), None)
    attribute = runs.get("attribute")
    return {
        "name": spec.name,
        "method": spec.method,
        "frozen": spec.frozen,
        "position": spec.position,
        "target_epsilon": spec.epsilon,
        "epsilon": facts.get("epsilon"),
        "delta": facts.get("delta"),
        "accountant": facts.get("accountant"),
        "event": facts.get("event"),
        "accuracy": facts.get("accuracy"),
        "train_accuracy": facts.get("train_accuracy"),
        "inversion_nn": _get(runs.get("inversion-nn"), "inversion_recall"),
        "inversion_opt": _get(runs.get("inversion-opt"), "inversion_recall"),
        "inversion_opt_baseline": _get(runs.get("inversion-opt"), "inversion_baseline_recall"),
        "attribute_accuracy": _get(attribute, "attribute_accuracy"),
        "attribute_chance": _get(attribute, "attribute_chance"),
        "mia_auc": mia,
        "train_seconds": facts.get("seconds"),
        "seconds_per_step": facts.get("seconds_per_step"),
        "folder": facts.get("folder"),
    }


def _num(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _inversion(row: dict[str, Any]) -> float | None:
    values = [_num(row.get(k)) for k in ("inversion_nn", "inversion_opt")]
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _advantage(row: dict[str, Any]) -> float | None:
    acc, chance = _num(row.get("attribute_accuracy")), _num(row.get("attribute_chance"))
    return None if acc is None or chance is None else acc - chance


def _find(
    rows: list[dict[str, Any]], method: str, position: str, epsilon: float | None
) -> dict[str, Any] | None:
    for row in rows:
        if (
            row["method"] == method
            and row["position"] == position
            and row["target_epsilon"] == epsilon
        ):
            return row
    return None


def _mark(value: bool | None) -> str:
    return "–" if value is None else ("✓" if value else "✗")


def claims(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The five claims of the module docstring, each {claim, seed, ours, holds, mark}."""
    forward = [r for r in rows if r["method"] == "dp-forward"]
    out: list[dict[str, Any]] = []

    # 1. accuracy above DP-SGD at moderate ε, some position
    moderate = [e for e in args.epsilons if e >= args.moderate]
    wins, gains, decided = [], [], False
    for eps in moderate:
        sgd_acc = [
            _num(r["accuracy"])
            for r in rows
            if r["method"] == "dp-sgd" and r["target_epsilon"] == eps
        ]
        sgd_acc = [a for a in sgd_acc if a is not None]
        if not sgd_acc:
            continue
        reference = max(sgd_acc)
        for r in forward:
            acc = _num(r["accuracy"])
            if r["target_epsilon"] == eps and acc is not None:
                decided = True
                gains.append(100 * (acc - reference))
                if acc > reference:
                    wins.append(f"{r['position']} at ε={eps:g}")
    out.append(
        {
            "claim": "DP-Forward accuracy > DP-SGD at moderate ε for some position",
            "seed": SEED_CLAIMS["accuracy"],
            "ours": (
                f"above at {', '.join(wins) or 'no position'}; best gain "
                f"{max(gains):+.1f}pp (seed: +{SEED_POINTS['accuracy']}pp)"
                if gains
                else "no rows"
            ),
            "holds": bool(wins) if decided else None,
        }
    )

    # 2. output best at every ε
    best, decided_eps = [], 0
    for eps in args.epsilons:
        at = [(r["position"], _num(r["accuracy"])) for r in forward if r["target_epsilon"] == eps]
        at = [(p, a) for p, a in at if a is not None]
        if len(at) < 2 or "output" not in [p for p, _ in at]:
            continue
        decided_eps += 1
        top = max(a for _, a in at)
        best.append((eps, [p for p, a in at if a == top]))
    output_wins = sum("output" in positions for _, positions in best)
    out.append(
        {
            "claim": "output is DP-Forward's best position at every ε",
            "seed": SEED_CLAIMS["output_best"],
            "ours": "; ".join(f"ε={e:g}: best {', '.join(p)}" for e, p in best) or "no rows",
            "holds": (output_wins == decided_eps) if decided_eps else None,
        }
    )

    # 3. inversion < bound under DP-Forward where DP-SGD leaves it high
    pairs, cuts = [], []
    for r in forward:
        sgd = _find(rows, "dp-sgd", r["position"], r["target_epsilon"])
        ours, theirs = _inversion(r), None if sgd is None else _inversion(sgd)
        if ours is None or theirs is None or theirs < args.high:
            continue
        pairs.append((r["position"], r["target_epsilon"], ours, theirs))
        cuts.append(100 * (theirs - ours))
    high_anywhere = any(
        (_inversion(r) or 0.0) >= args.high for r in rows if r["method"] == "dp-sgd"
    )
    out.append(
        {
            "claim": (
                f"inversion recall < {args.inversion_bound:g} under DP-Forward where DP-SGD's "
                f"is ≥ {args.high:g}"
            ),
            "seed": SEED_CLAIMS["inversion"],
            "ours": (
                "; ".join(f"{p} ε={e:g}: {o:.2f} vs DP-SGD {t:.2f}" for p, e, o, t in pairs)
                + f"; largest cut {max(cuts):.0f}pp (seed: {SEED_POINTS['inversion']:.0f}pp)"
                if pairs
                else (
                    "DP-SGD's recall is high nowhere"
                    if not high_anywhere
                    else "no DP-Forward row at the positions where it is high"
                )
            ),
            "holds": all(o < args.inversion_bound for _, _, o, _ in pairs) if pairs else None,
        }
    )

    # 4. attribute towards chance under DP-Forward, barely under DP-SGD
    checks, notes, cuts = [], [], []
    for r in rows:
        if r["method"] == "non-private":
            continue
        base = _find(rows, "non-private", r["position"], None)
        a, a0 = _advantage(r), None if base is None else _advantage(base)
        if a is None or a0 is None or a0 <= 0:
            continue
        kept = a / a0
        ok = kept <= 0.5 if r["method"] == "dp-forward" else kept > 0.5
        checks.append(ok)
        notes.append(f"{r['name']} keeps {kept:.0%}")
        if r["method"] == "dp-forward":
            sgd = _find(rows, "dp-sgd", r["position"], r["target_epsilon"])
            if sgd is not None and _num(sgd.get("attribute_accuracy")) is not None:
                cuts.append(
                    100 * (float(sgd["attribute_accuracy"]) - float(r["attribute_accuracy"]))
                )
    extra = f"; largest cut vs DP-SGD {max(cuts):.0f}pp (seed: 41pp)" if cuts else ""
    out.append(
        {
            "claim": (
                "attribute advantage over chance: ≤ half of non-private's under DP-Forward, "
                "> half under DP-SGD"
            ),
            "seed": SEED_CLAIMS["attribute"],
            "ours": ("; ".join(notes) + extra) if notes else "no rows",
            "holds": all(checks) if checks else None,
        }
    )

    # 5. MIA mitigated by both
    base_auc = [_num(r["mia_auc"]) for r in rows if r["method"] == "non-private"]
    base_auc = [a for a in base_auc if a is not None]
    private = [
        (r["name"], _num(r["mia_auc"]))
        for r in rows
        if r["method"] != "non-private" and _num(r["mia_auc"]) is not None
    ]
    if not base_auc or not private:
        holds, text = None, "no rows"
    else:
        excess = max(abs(a - 0.5) for a in base_auc)
        allowed = max(MIA_SLACK, 0.5 * excess)
        text = f"non-private AUC {max(base_auc):.3f}; " + ", ".join(
            f"{n} {a:.3f}" for n, a in private
        )
        if excess < MIA_SLACK:
            holds, text = None, text + " (non-private does not leak: nothing to mitigate)"
        else:
            holds = all(abs(a - 0.5) <= allowed for _, a in private)
    out.append(
        {
            "claim": f"|MIA AUC − 0.5| ≤ max({MIA_SLACK}, half non-private's) for DP-SGD and "
            "DP-Forward",
            "seed": SEED_CLAIMS["membership"],
            "ours": text,
            "holds": holds,
        }
    )
    for claim in out:
        claim["mark"] = _mark(claim["holds"])
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report = None
    if args.report:
        from privacylab.report.dpforward import add_dpforward_run

        report = add_dpforward_run
    rows = []
    for spec in specs(args):
        folder, facts = trained(spec, args)
        if report is not None:
            report(args.report, {"facts": facts})
        runs: dict[str, dict[str, Any]] = {}
        for method in args.attacks:
            runs[method] = attacked(folder, spec, method, args)
            if report is not None:
                report(args.report, runs[method])
        rows.append(row_of(spec, facts, runs))
        log(
            f"{spec.name}: accuracy {fmt(_num(rows[-1]['accuracy']), '.3f')}, inversion "
            f"{fmt(_num(rows[-1]['inversion_nn']), '.2f')}/"
            f"{fmt(_num(rows[-1]['inversion_opt']), '.2f')}, attribute "
            f"{fmt(_num(rows[-1]['attribute_accuracy']), '.2f')} (chance "
            f"{fmt(_num(rows[-1]['attribute_chance']), '.2f')}), MIA AUC "
            f"{fmt(_num(rows[-1]['mia_auc']), '.3f')}"
        )
    return {
        "benchmark": "dpforward_table",
        "quick": args.quick,
        "setting": {
            "epsilons": args.epsilons,
            "delta": args.delta,
            "positions": args.positions,
            "baseline_positions": args.baseline_positions,
            "frozen_positions": args.frozen_positions,
            "documents": args.documents,
            "layers": args.layers,
            "encoder": args.encoder,
            "epochs": args.epochs,
            "victims": args.victims,
            "attacks": list(args.attacks),
            "seed": args.seed,
            "work": str(work),
            "report": args.report,
        },
        "rows": rows,
        "claims": claims(rows, args),
        "seconds": time.perf_counter() - start,
    }


def show(payload: dict[str, Any]) -> None:
    rows = [
        [
            r["method"] + (" (frozen f)" if r.get("frozen") else ""),
            r["position"],
            fmt(_num(r["epsilon"]), ".2f") if r["epsilon"] is not None else "∞",
            r["accountant"] or "-",
            fmt(_num(r["accuracy"]), ".3f"),
            fmt(_num(r["inversion_nn"]), ".2f"),
            fmt(_num(r["inversion_opt"]), ".2f"),
            f"{fmt(_num(r['attribute_accuracy']), '.2f')} "
            f"({fmt(_num(r['attribute_chance']), '.2f')})",
            fmt(_num(r["mia_auc"]), ".3f"),
        ]
        for r in payload["rows"]
    ]
    print(
        table(
            rows,
            [
                "method",
                "position",
                "ε",
                "accountant",
                "accuracy",
                "inv nn",
                "inv opt",
                "attribute (chance)",
                "MIA AUC",
            ],
        )
    )
    print("\nclaims:")
    for claim in payload["claims"]:
        print(f"{claim['mark']} {claim['claim']}")
        print(f"    seed: {claim['seed']}\n    ours: {claim['ours']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a few minutes' smoke run")
    parser.add_argument("--work", default=None, help="model folders and results (resumable)")
    parser.add_argument("--report", default=None, help="report folder (section #dp-forward)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=None)
    parser.add_argument("--positions", nargs="+", default=None)
    parser.add_argument("--baseline-positions", nargs="+", default=None)
    parser.add_argument(
        "--frozen-positions",
        nargs="*",
        default=None,
        help="DP-Forward with f(.) frozen and one release per training sequence (--frozen)",
    )
    parser.add_argument("--moderate", type=float, default=8.0, help="smallest moderate ε")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--documents", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None, help="MiniLM layers kept (all: 6)")
    parser.add_argument("--encoder", default="minilm", choices=("minilm", "tiny"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--victims", type=int, default=None)
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=ATTACKS)
    parser.add_argument("--inversion-bound", type=float, default=0.2)
    parser.add_argument("--high", type=float, default=0.5, help="a 'high' inversion recall")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    quick = args.quick
    args.epsilons = args.epsilons or ([8.0] if quick else [2.0, 4.0, 8.0])
    args.positions = args.positions or (
        ["input", "output"] if quick else ["input", "layer:2", "layer:4", "output"]
    )
    args.baseline_positions = args.baseline_positions or list(args.positions)
    if args.frozen_positions is None:
        args.frozen_positions = ["output"] if quick else ["input", "output"]
    args.documents = args.documents or (300 if quick else 2400)
    if quick and args.layers is None:
        args.layers = 2
    args.victims = args.victims or (30 if quick else 200)
    args.work = args.work or ("runs/dpforward-table" + ("-quick" if quick else ""))
    if any(e <= 0 for e in args.epsilons):
        parser.error("every ε must be > 0")
    return finish(args, run, show)


if __name__ == "__main__":
    raise SystemExit(main())
