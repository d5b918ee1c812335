"""The rest of issue 14's defence sweep — larger local batches, more local steps, secure
aggregation over k clients, DP-SGD at the client — each row with the test accuracy of a
federation trained with that same setting, so the privacy/utility trade-off is on one table.

    python benchmarks/federated_defenses.py [--json] [--quick] [--batches 1 2 4 8 16]
        [--steps 1 2 5 10] [--clients 1 2 4 8] [--epsilons 1 8 64] [--trials 1]
        [--rounds 300] [--per-round 10] [--iterations 300] [--ig-iterations 500]
        [--store PATH] [--seed 0]

Attacks: privacylab's public job API (`privacylab.reconstruct.GradientConfig` run through
`defense_grid` with a result store), on mnist5k's training rows, labels offered to the server
(only attacks declaring the side information "labels" use them; iDLG recovers its own):

* DLG and iDLG (Zhu et al. 2019, Alg. 1; Zhao et al. 2020) on DLG's sigmoid LeNet, freshly drawn
  U(-0.5, 0.5) weights (the papers' setting, `lenet-sigmoid`), ``--iterations`` L-BFGS steps;
  on FedAvg updates the job swaps DLG for its unrolled `dlg-fedavg` (local training known).
* Inverting Gradients (Geiping et al. 2020, Eq. 4; Sec. 5 for FedAvg) on the ReLU `cnn`
  (Papernot et al. 2021) *trained by the undefended federation below* (its global model after
  the last round, saved as a privacylab model folder and given as `GradientConfig.target`: the
  server attacks round R+1), TV weight `_reconstruction.IG_TV`, ``--ig-iterations``.

Sweeps (each defence alone, everything else at the undefended setting B=1, S=1, k=1):

* batch B: each client holds B rows and sends its FedSGD gradient (DLG, iDLG, IG);
* local steps S: FedAvg, S epochs of one full-batch SGD step (lr 0.1) on the client's
  ``--steps-batch`` rows, the server knowing the local procedure (dlg-fedavg, IG); S=1 is FedSGD;
* secure aggregation over k clients of ``--sa-batch`` rows each (Bonawitz et al. 2017): the server
  sees only the mean update and reconstructs all k*B rows at once (DLG, IG);
* DP-SGD at the client, ``dp:EPS`` (`privacylab.defenses.update`, Abadi et al. 2016 Alg. 1, clip 1,
  delta 1e-5, PLD): the attacked update is one participation calibrated to (EPS, 1e-5) — the
  least noise any update of a client at that ε carries, so the attack row bounds the leakage of
  the federation's updates from above; the federation calibrates σ for the most rounds any one
  client is selected in (`Federation.participations`: selection is seeded and data-independent,
  so a client is charged only for the rounds it takes part in, every client sharing the σ of
  the busiest; no amplification by the server's sampling of 10 of 4000 // B clients is
  claimed, so σ_federation is still an upper bound and the DP rows' accuracy a lower one). Both
  σ are printed, with the participations. Helper G's ε sweep (`dp_reconstruction.py`) on the
  same first image is shown beside when its store holds it.

Federation (the accuracy column; `privacylab.federated.Federation`): the ReLU `cnn`, seed
``--seed``, on mnist5k's 4,000 training rows cut into 4000 // B clients of B rows each (iid,
seeded), ``--per-round`` clients selected per round, ``--rounds`` rounds, FedSGD lr 0.1 (FedAvg
S epochs for the S rows), the row's defence applied by every client; test accuracy on the
1,000 held-out rows after the last round. Same architecture, seed, rounds and clients per round
on every row: what changes is only the row's setting. Secure aggregation changes what the
server sees, not the mean it steps with, so its federation must match the undefended one (a
check printed as such). Ratios: PSNR over the same attack's undefended PSNR; accuracy over the
undefended federation's.

Durable: attacks go to the result store (``--store``, default
``runs/bench-cache/federated_defenses.sqlite``) as each finishes; each federation checkpoints
every round in a folder beside it and its result is stored; a killed run resumes. A DP
federation's key (and folder) holds its participations and calibrated σ, so a change in how
the federation calibrates its noise trains it afresh instead of reusing a stale result. An
empty list (``--batches`` with no value) skips that sweep; the DP sweep's undefended row (and
the ratios' references) always runs, from the store when already there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _reconstruction import (
    BENCH_CACHE,
    IG_TV,
    MNIST_TRAIN,
    NUM_CLASSES,
    cached,
    finish,
    fmt,
    log,
    mean,
    mnist,
    num,
    open_store,
    pick_rows,
    ratio,
    store_path,
)
from privacylab.defenses.update import parse_update_defense
from privacylab.execution.store import config_key
from privacylab.federated import Federation, FederationConfig, LocalTraining
from privacylab.reconstruct import GradientConfig, defense_grid

SUCCESS = 20.0
"""Recognisable: PSNR above 20 dB (as in dp_reconstruction.py and ig_batch_steps.py)."""

LOCAL_LR = 0.1
FED_MODEL = {"name": "cnn", "options": {"activation": "relu"}}

SWEEPS = {  # sweep -> attacks run on its rows
    "batch": ("dlg", "idlg", "ig"),
    "steps": ("dlg", "ig"),
    "secure-aggregation": ("dlg", "ig"),
    "dp": ("dlg", "idlg", "ig"),
}


# ---------------------------------------------------------------------------------------------
# settings


def setting(sweep: str, value: float | None, args: argparse.Namespace) -> dict[str, Any]:
    """One row's protocol: client batch B, local epochs S, clients k under secure aggregation,
    update defence (spec). `value` None is the undefended reference."""
    out = {"sweep": sweep, "value": value, "batch": 1, "steps": 1, "clients": 1, "defense": "none"}
    if sweep == "batch" and value is not None:
        out["batch"] = int(value)
    elif sweep == "steps":
        out["batch"] = args.steps_batch
        out["steps"] = 1 if value is None else int(value)
    elif sweep == "secure-aggregation":
        out["batch"] = args.sa_batch
        out["clients"] = 1 if value is None else int(value)
    elif sweep == "dp" and value is not None:
        out["defense"] = f"dp:{value:g}"
    return out


def training_of(s: dict[str, Any]) -> LocalTraining:
    """The clients' local procedure of a setting (as `GradientConfig.training` builds it)."""
    if s["steps"] == 1:
        return LocalTraining()
    return LocalTraining("fedavg", epochs=s["steps"], batch_size=None, lr=LOCAL_LR)


def sigmas(spec: str, batch: int, training: LocalTraining, charged: int) -> dict[str, Any]:
    """σ of `dp:EPS` for one participation (the attacked update) and for `charged`, the
    most rounds any one client of the federation is selected in (what
    `Federation.participations` calibrates the clients' defence for), or the accountant's
    one-line error."""
    if not spec.startswith("dp:"):
        return {}
    defense = parse_update_defense(spec)
    out: dict[str, Any] = {"participations": charged}
    for name, r in (("sigma_attack", 1), ("sigma_federation", charged)):
        try:
            privacy = defense.local_privacy(training=training, examples=batch, rounds=r)
            out[name] = privacy.noise_multiplier
        except Exception as err:  # the accountant's one-line refusal is the result
            out[name] = None
            out[f"{name}_error"] = str(err)
    return out


# ---------------------------------------------------------------------------------------------
# federations


def fed_config(s: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The federation of a setting (what its store key and checkpoint folder name). A DP
    federation's also holds what fixes its noise — the participations its clients are
    calibrated for and the resulting σ — so results computed under another calibration (before
    `Federation.participations`: every round) are never reused; other settings' keys are
    unchanged."""
    b = s["batch"]
    out: dict[str, Any] = {
        "model": FED_MODEL,
        "clients": MNIST_TRAIN // b,
        "rows_per_client": b,
        "per_round": args.per_round,
        "rounds": args.rounds,
        "training": training_of(s).to_dict(),
        "secure_aggregation": s["clients"] > 1,
        "defense": s["defense"],
        "seed": args.seed,
    }
    if s["defense"].startswith("dp:"):
        p = participations(s, args)
        noise = sigmas(s["defense"], b, training_of(s), p)
        out["calibration"] = {"participations": p, "sigma": noise.get("sigma_federation")}
    return out


def make_federation(s: dict[str, Any], args: argparse.Namespace) -> Federation:
    """The (untrained) federation of setting `s`: the ReLU cnn seeded `--seed`, mnist5k's
    training rows cut into 4000 // B clients, the row's defence on every client."""
    from privacylab.models import build_model

    b = s["batch"]
    model = build_model(
        FED_MODEL["name"], (1, 28, 28), NUM_CLASSES, seed=args.seed, **FED_MODEL["options"]
    )
    x, y = mnist("train")
    cfg = FederationConfig(
        clients=MNIST_TRAIN // b,
        rows_per_client=b,
        clients_per_round=args.per_round,
        rounds=args.rounds,
        training=training_of(s),
        secure_aggregation=s["clients"] > 1,
        seed=args.seed,
    )
    defense = None if s["defense"] == "none" else parse_update_defense(s["defense"])
    return Federation(model, x, y, cfg, defense=defense)


def participations(s: dict[str, Any], args: argparse.Namespace) -> int:
    """`Federation.participations` of setting `s`'s federation: the most rounds any one client
    is selected in (seeded, data-independent), memoised per client count."""
    memo = ("participations", MNIST_TRAIN // s["batch"], args.per_round, args.rounds, args.seed)
    if memo not in args.memo:
        args.memo[memo] = make_federation(s, args).participations
    return args.memo[memo]


def federation(
    s: dict[str, Any], args: argparse.Namespace, *, keep_model: bool = False
) -> tuple[dict[str, Any], torch.nn.Module | None]:
    """Train (or resume, or read back) the federation of setting `s`; its test accuracy, and
    with `keep_model` its global model (rebuilt from the checkpoint when already trained)."""
    from privacylab.federated.server import accuracy

    config = fed_config(s, args)
    key = config_key(config)
    folder = None if args.cache is None else args.cache / f"fed-{key[:16]}"
    holder: dict[str, Any] = {}

    def compute() -> dict[str, Any]:
        test_x, test_y = mnist("test")
        fed = make_federation(s, args)
        every = max(1, args.rounds // 10)

        def show(record: Any) -> None:
            if record.round % every == 0:
                log(f"  federation {s['sweep']}={s['value']}: round {record.round}/{args.rounds}")

        result = fed.fit(checkpoint=folder, progress=show)
        holder["model"] = fed.model
        return {
            "accuracy": accuracy(fed.model, test_x, test_y),
            "rounds": result.rounds,
            "resumed_from": result.resumed_from,
            "seconds": result.seconds,
            "clients": config["clients"],
        }

    if key not in args.memo:
        args.memo[key] = cached(args.store_handle, "federated_defenses/federation", config, compute)
    out = args.memo[key]
    model = None
    if keep_model:
        model = holder.get("model")
        if model is None:
            fed = make_federation(s, args)
            fed.fit(checkpoint=folder, progress=False)
            model = fed.model
    return out, model


def save_target(model: torch.nn.Module, args: argparse.Namespace) -> str:
    """The undefended federation's global model as a privacylab model folder (safetensors +
    JSON sidecar), the `target` IG attacks."""
    import tempfile

    from privacylab.models import ModelSpec, save_model

    base = args.cache if args.cache is not None else Path(tempfile.mkdtemp(prefix="fed-defenses-"))
    folder = base / f"target-{config_key(fed_config(setting('batch', None, args), args))[:16]}"
    if not (folder / "model.json").is_file():
        spec = ModelSpec(FED_MODEL["name"], (1, 28, 28), NUM_CLASSES, FED_MODEL["options"])
        meta = {
            "data": {"name": "mnist5k"},
            "training": {"seed": 0},
            "federation": fed_config(setting("batch", None, args), args),
        }
        save_model(model, folder, spec, meta)
    return str(folder)


# ---------------------------------------------------------------------------------------------
# attacks


def gradient_config(
    method: str, s: dict[str, Any], rows: list[int], target: str | None, args: argparse.Namespace
) -> GradientConfig:
    """The job's configuration of one attack on setting `s`."""
    n = s["batch"] * s["clients"]
    options: dict[str, Any] = (
        {"iterations": args.ig_iterations, "tv": IG_TV}
        if method == "ig"
        else {"iterations": args.iterations}
    )
    return GradientConfig(
        dataset="mnist5k",
        model=None if method == "ig" else "lenet-sigmoid",
        target=target if method == "ig" else None,
        method=method,
        batch_size=s["batch"],
        clients=s["clients"],
        examples=tuple(rows[:n]),
        local_steps=s["steps"],
        local_lr=LOCAL_LR,
        defense=s["defense"],
        labels_known=True,
        options=options,
        seed=args.seed,
    )


def attack_runs(
    method: str, s: dict[str, Any], target: str | None, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One run per trial (trial t: its own seeded rows; the first n rows of a trial are the
    rows of every smaller setting), served from the store when already done."""
    n = s["batch"] * s["clients"]
    out = []
    for t in range(args.trials):
        rows = pick_rows(n, args.seed + 1000 * t)
        config = gradient_config(method, s, rows, target, args)
        memo = json.dumps([method, rows, s["batch"], s["steps"], s["clients"], s["defense"]])
        if memo not in args.memo:
            row = defense_grid([config], args.store)[0]
            row.pop("images", None)
            args.memo[memo] = row
        out.append(args.memo[memo])
    return out


def g_dp_psnr(method: str, spec: str, args: argparse.Namespace) -> float | None:
    """Helper G's PSNR (dp_reconstruction.py, default full settings) on the same first image,
    read from its store without writing to it; None when it is not there."""
    path = BENCH_CACHE / "dp_reconstruction.sqlite"
    if not path.is_file():
        return None
    row = pick_rows(1, args.seed)[0]
    config = {"method": method, "defense": spec, "row": row, "seed": args.seed,
              "iterations": 1000 if method == "ig" else 300, "epochs": 2,
              "tv": IG_TV if method == "ig" else None}  # fmt: skip
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            found = conn.execute(
                "select value from results where namespace = ? and key = ?",
                (f"dp_reconstruction/{method}", config_key(config)),
            ).fetchone()
    except sqlite3.Error:
        return None
    return None if found is None else json.loads(found[0]).get("psnr")


# ---------------------------------------------------------------------------------------------
# the sweep


def run(args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    args.memo = {}
    args.store_handle = open_store(args.store)
    if args.store is not None:
        args.cache = Path(args.store).with_suffix("")
        args.cache.mkdir(parents=True, exist_ok=True)
    else:
        args.cache = None
    try:
        reference, model = federation(setting("batch", None, args), args, keep_model=True)
        assert model is not None
        target = save_target(model, args)
        log(f"undefended federation: test accuracy {reference['accuracy']:.3f}; IG target {target}")
        values = {
            "batch": args.batches,
            "steps": args.steps,
            "secure-aggregation": args.clients,
            "dp": [None, *args.epsilons],
        }
        table: list[dict[str, Any]] = []
        undefended: dict[str, float] = {}
        for sweep, attacks in SWEEPS.items():
            for value in values[sweep]:
                s = setting(sweep, value, args)
                fed, _ = federation(s, args)
                extra = {}
                if s["defense"].startswith("dp:"):
                    p = participations(s, args)
                    extra = sigmas(s["defense"], s["batch"], training_of(s), p)
                for method in attacks:
                    runs = attack_runs(method, s, target, args)
                    psnrs = [num(r["psnr"]) for r in runs]
                    row = {
                        **s,
                        "method": runs[0]["method"],
                        "update_rows": s["batch"] * s["clients"],
                        "psnr": mean(psnrs),
                        "ssim": mean(r["ssim"] for r in runs),
                        "label_accuracy": mean(r["label_accuracy"] for r in runs),
                        "baseline_psnr": mean(r["baseline_psnr"] for r in runs),
                        "recognisable": mean(float(p > SUCCESS) for p in psnrs),
                        "attack_seconds": mean(r["seconds"] for r in runs),
                        "per_trial_psnr": psnrs,
                        "accuracy": fed["accuracy"],
                        "federation_clients": fed["clients"],
                        **extra,
                    }
                    if sweep == "dp" and value is not None:
                        row["g_psnr"] = g_dp_psnr(method, s["defense"], args)
                    undefended_setting = s["batch"] == 1 and s["steps"] == 1
                    undefended_setting &= s["clients"] == 1 and s["defense"] == "none"
                    if undefended_setting and method not in undefended:
                        undefended[method] = row["psnr"]
                    table.append(row)
                    log(
                        f"{sweep} {fmt(value, 'g') if value is not None else 'none'} "
                        f"{row['method']}: "
                        f"PSNR {row['psnr']:.1f} dB, accuracy {fed['accuracy']:.3f}"
                    )
    finally:
        if args.store_handle is not None:
            args.store_handle.close()
    for row in table:
        base = undefended.get(row["method"].removesuffix("-fedavg"))
        row["psnr_ratio"] = ratio(row["psnr"], base) if base is not None else math.nan
        row["accuracy_ratio"] = ratio(row["accuracy"], reference["accuracy"])
    sa = [r["accuracy"] for r in table if r["sweep"] == "secure-aggregation" and r["clients"] > 1]
    sa_check = None
    if sa:
        same = fed_config(setting("secure-aggregation", None, args), args)
        sa_base = next(
            r["accuracy"]
            for r in table
            if r["sweep"] == "secure-aggregation" and fed_config(r, args) == same
        )
        sa_check = {"accuracy_without": sa_base, "accuracy_with": sa[0], "equal": sa[0] == sa_base}
    return {
        "benchmark": "federated_defenses",
        "setting": {
            "attacks": (
                f"dlg/idlg: lenet-sigmoid (fresh U(-0.5,0.5), seed {args.seed}), "
                f"{args.iterations} L-BFGS steps; ig: the undefended federation's cnn (relu) "
                f"after {args.rounds} rounds, {args.ig_iterations} steps, tv {IG_TV:g}"
            ),
            "federation": (
                f"cnn (relu, seed {args.seed}), 4000 // B clients of B rows, "
                f"{args.per_round} per round, {args.rounds} rounds, lr {LOCAL_LR:g}, "
                "row's defence on every client"
            ),
            "trials": args.trials,
            "recognisable": f"PSNR > {SUCCESS:g} dB",
            "steps_batch": args.steps_batch,
            "sa_batch": args.sa_batch,
            "seed": args.seed,
            "torch_threads": torch.get_num_threads(),
        },
        "undefended_accuracy": reference["accuracy"],
        "undefended_psnr": undefended,
        "secure_aggregation_accuracy_check": sa_check,
        "table": table,
        "seconds": time.perf_counter() - start,
    }


def print_table(payload: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    s = payload["setting"]
    table = Table(title="Federated defences: reconstruction quality and the federation's accuracy")
    for col in ("sweep", "setting", "rows", "attack", "PSNR dB", "x undef.", "SSIM", "labels",
                "base", ">20 dB", "sigma att/fed (p)", "G's PSNR", "fed. acc",
                "x undef."):  # fmt: skip
        table.add_column(col)
    for r in payload["table"]:
        value = "none" if r["value"] is None else fmt(r["value"], "g")
        name = {"batch": "B", "steps": "S", "secure-aggregation": "k", "dp": "eps"}[r["sweep"]]
        sig = "-"
        if r.get("sigma_attack") is not None or r.get("sigma_federation") is not None:
            sig = f"{fmt(r.get('sigma_attack'), '.3g')}/{fmt(r.get('sigma_federation'), '.3g')}"
            sig += f" (p={r['participations']})" if "participations" in r else ""
        table.add_row(
            r["sweep"], f"{name}={value}", str(r["update_rows"]), r["method"], fmt(r["psnr"]),
            fmt(r["psnr_ratio"], ".2f"), fmt(r["ssim"], ".3f"), fmt(r["label_accuracy"], ".2f"),
            fmt(r["baseline_psnr"]), fmt(r["recognisable"], ".2f"), sig, fmt(r.get("g_psnr")),
            fmt(r["accuracy"], ".3f"), fmt(r["accuracy_ratio"], ".2f"),
        )  # fmt: skip
    console.print(table)
    check = payload["secure_aggregation_accuracy_check"]
    if check:
        console.print(
            f"secure aggregation: federation accuracy {check['accuracy_with']:.3f} with, "
            f"{check['accuracy_without']:.3f} without (equal: {check['equal']})"
        )
    console.print(
        f"attacks: {s['attacks']}; federation: {s['federation']}; trials {s['trials']}; "
        f"{s['recognisable']}; total {payload['seconds']:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; print the table, or one JSON object with --json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quick", action="store_true", help="2 values per sweep, few steps")
    parser.add_argument("--batches", type=int, nargs="*", default=None)
    parser.add_argument("--steps", type=int, nargs="*", default=None)
    parser.add_argument("--clients", type=int, nargs="*", default=None, help="k (secure agg.)")
    parser.add_argument("--epsilons", type=float, nargs="*", default=None)
    parser.add_argument("--steps-batch", type=int, default=1, help="rows per FedAvg client")
    parser.add_argument("--sa-batch", type=int, default=1, help="rows per securely summed client")
    parser.add_argument("--trials", type=int, default=1, help="seeded batches per row")
    parser.add_argument("--rounds", type=int, default=None, help="federation rounds")
    parser.add_argument("--per-round", type=int, default=10, help="clients per round")
    parser.add_argument("--iterations", type=int, default=None, help="DLG/iDLG L-BFGS steps")
    parser.add_argument("--ig-iterations", type=int, default=None)
    parser.add_argument(
        "--store", default=None, help="result store (default runs/bench-cache/...; 'none': off)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    quick = args.quick
    if args.batches is None:  # an empty list (the flag with no value) skips the sweep
        args.batches = [1, 4] if quick else [1, 2, 4, 8, 16]
    if args.steps is None:
        args.steps = [1, 2] if quick else [1, 2, 5, 10]
    if args.clients is None:
        args.clients = [1, 2] if quick else [1, 2, 4, 8]
    if args.epsilons is None:
        args.epsilons = [1.0, 64.0] if quick else [1.0, 8.0, 64.0]
    args.rounds = args.rounds or (20 if quick else 300)
    args.iterations = args.iterations or (20 if quick else 300)
    args.ig_iterations = args.ig_iterations or (50 if quick else 500)
    args.store = store_path(args.store, quick, "federated_defenses")
    sizes = args.batches + args.steps + args.clients
    sizes += [args.steps_batch, args.sa_batch, args.trials, args.per_round]
    if (
        min(sizes) < 1
        or min(args.epsilons, default=1.0) <= 0
        or min(args.iterations, args.ig_iterations) < 1
    ):
        parser.error("sizes, steps, clients, trials and iterations must be >= 1 and every ε > 0")
    if max([*args.batches, args.steps_batch, args.sa_batch]) * args.per_round > MNIST_TRAIN:
        parser.error("batch x clients per round exceeds mnist5k's 4,000 training rows")
    return finish(args, run, print_table)


if __name__ == "__main__":
    raise SystemExit(main())
