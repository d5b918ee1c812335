"""DP-SGD inside the federated client against gradient inversion: DLG and iDLG on DLG's sigmoid
LeNet, Inverting Gradients on a trained ReLU CNN, for ε from 0.5 to 10^4 — PSNR against the
dummy-initialisation baseline, and the ε at which reconstructions start to succeed.

    python benchmarks/dp_reconstruction.py [--json] [--quick] [--epsilons 0.5 1 2 ...]
        [--images 4] [--iterations 300] [--ig-iterations 1000] [--store PATH] [--seed 0]

Defence: ``dp:EPS`` (`privacylab.defenses.update`): the client runs DP-SGD (Abadi et al. 2016,
Alg. 1) for its one local step: the example's gradient clipped to norm 1, Gaussian noise of
standard deviation sigma * 1 added, sigma calibrated by the PLD accountant so that the client's
data is (EPS, 1e-5)-DP over its one participation (no amplification by sampling: fixed local
batches; the sigma used is printed per ε). The server sees that privatised FedSGD update.

Attacks (ours, `privacylab.attacks.inversion` via `run_reconstruction`), on ``--images``
seeded single mnist5k training images:

* ``dlg`` and ``idlg``: the sigmoid LeNet (U(-0.5, 0.5) init, seed 0), ``--iterations`` L-BFGS
  iterations; note that clipping alone rescales the gradient, which Euclidean gradient
  matching does not expect (the server does not know the example's gradient norm).
* ``ig``: `cnn` with ReLU trained 2 epochs on mnist5k (as in `ig_batch_steps.py`), labels
  known, ``--ig-iterations`` iterations, TV weight ``--tv`` (0.05, `_reconstruction.IG_TV`),
  cosine distance (blind to the clipping scale).

Success: PSNR > 20 dB (a recognisable digit; > 30 dB, an exact copy, is reported too). "Starts
to succeed": the smallest ε from which, at it and every larger ε tried, at least half the images
are reconstructed (PSNR > 20 dB). PSNR near the dummy-init baseline (what no leakage gives)
means the attack learned nothing. Durable: each run is stored as it finishes (``--store``,
default ``runs/bench-cache/dp_reconstruction.sqlite``); a re-run resumes. For an ε the update
defence's PLD calibration refuses (its grid grows with ε), sigma comes from the RDP accountant
instead (`RdpLocalDP`; an over-estimate of ε, so a larger sigma: still a valid guarantee); the
table says which accountant set each sigma.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _reconstruction import (
    IG_TV,
    attack,
    cached,
    finish,
    fmt,
    log,
    mean,
    mnist,
    num,
    open_store,
    pick_rows,
    result_row,
    sigmoid_lenet,
    store_path,
    success,
    trained_relu_cnn,
)
from privacylab.errors import PrivacylabError
from privacylab.federated import LocalPrivacy, LocalTraining

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 256.0, 1e3, 1e4)
METHODS = ("dlg", "idlg", "ig")
SUCCESS = 20.0
EXACT = 30.0


class RdpLocalDP:
    """``dp:EPS`` for an ε whose PLD calibration the update defence refuses (its privacy-loss
    grid grows with ε: ε >= 1e3 here): the same DP-SGD in the client (clip 1, Gaussian noise
    sigma * clip, `federated.LocalPrivacy`), with sigma from
    `privacylab.accounting.calibrate_noise_multiplier(..., accountant="rdp")`. RDP over-states
    ε, so this sigma is at least the PLD one would be: the (ε, 1e-5) guarantee still holds."""

    def __init__(self, epsilon: float, delta: float = 1e-5, clip: float = 1.0) -> None:
        from privacylab.accounting import calibrate_noise_multiplier

        self.epsilon, self.clip = epsilon, clip
        self.sigma = calibrate_noise_multiplier(
            epsilon, delta, sample_rate=1.0, steps=1, accountant="rdp"
        )

    @property
    def spec(self) -> str:
        return f"dp:{self.epsilon:g}"

    def local_privacy(self, *, training: LocalTraining, examples: int, rounds: int) -> LocalPrivacy:
        if training.steps(examples) * rounds != 1:
            raise PrivacylabError("RdpLocalDP is calibrated for one local step in one round")
        return LocalPrivacy(self.clip, self.sigma)

    def apply(self, update: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        return dict(update)


def defence_for(epsilon: float) -> tuple[Any, dict[str, Any]]:
    """The client defence for ``dp:EPS`` (ours: `parse_update_defense`; the RDP-calibrated
    stand-in when that refuses) and its noise multiplier, accountant and any refusal."""
    from privacylab.defenses.update import parse_update_defense

    spec = f"dp:{epsilon:g}"
    try:
        defence = parse_update_defense(spec)
        privacy = defence.local_privacy(training=LocalTraining(), examples=1, rounds=1)
        return spec, {"sigma": privacy.noise_multiplier, "clip": privacy.clip,
                      "accountant": "pld", "error": None}  # fmt: skip
    except PrivacylabError as err:
        stand_in = RdpLocalDP(epsilon)
        return stand_in, {"sigma": stand_in.sigma, "clip": stand_in.clip, "accountant": "rdp",
                          "error": None, "pld_refused": str(err)}  # fmt: skip


def starts_to_succeed(rows: list[dict[str, Any]]) -> float | None:
    """Smallest ε from which every larger ε tried (with a result) has success rate >= 0.5."""
    found = None
    for r in sorted((r for r in rows if r["epsilon"] is not None), key=lambda r: -r["epsilon"]):
        if r["success_rate"] is None or math.isnan(r["success_rate"]):
            continue
        if r["success_rate"] >= 0.5:
            found = r["epsilon"]
        else:
            break
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    store = open_store(args.store)
    x_all, y_all = mnist("train")
    rows = pick_rows(args.images, args.seed)
    lenet = sigmoid_lenet((1, 28, 28), seed=args.seed)
    cnn, cnn_accuracy = (None, math.nan)
    if "ig" in args.methods:
        cnn, cnn_accuracy = trained_relu_cnn(args.epochs, args.seed)
        log(f"trained relu cnn: test accuracy {cnn_accuracy:.3f}")
    defences = {eps: defence_for(eps) for eps in args.epsilons}
    sigmas = {eps: info for eps, (_, info) in defences.items()}
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in args.methods}
    try:
        for method in args.methods:
            model = cnn if method == "ig" else lenet
            iterations = args.ig_iterations if method == "ig" else args.iterations
            for eps in [None, *args.epsilons]:
                spec = "none" if eps is None else f"dp:{eps:g}"
                if eps is not None and sigmas[eps]["error"]:
                    results[method].append(
                        {
                            "epsilon": eps,
                            "defense": spec,
                            "error": sigmas[eps]["error"],
                            "psnr": None,
                            "success_rate": None,
                        }
                    )
                    log(f"{method} {spec}: {sigmas[eps]['error']}")
                    continue
                runs = []
                for row in rows:
                    config = {"method": method, "defense": spec, "row": row, "seed": args.seed,
                              "iterations": iterations, "epochs": args.epochs,
                              "tv": args.tv if method == "ig" else None}  # fmt: skip
                    if eps is not None and sigmas[eps]["accountant"] != "pld":
                        config["accountant"] = sigmas[eps]["accountant"]
                    shield = "none" if eps is None else defences[eps][0]

                    def compute(row: int = row, model: Any = model, shield: Any = shield,
                                method: str = method, iterations: int = iterations
                                ) -> dict[str, Any]:  # fmt: skip
                        x, y = x_all[row : row + 1], y_all[row : row + 1]
                        options: dict[str, Any] = {"iterations": iterations}
                        if method == "ig":
                            options["tv"] = args.tv
                        res = attack(method, model, x, y, defense=shield, seed=args.seed,
                                     options=options)  # fmt: skip
                        return {"row": row, **result_row(res)}

                    runs.append(cached(store, f"dp_reconstruction/{method}", config, compute))
                psnrs = [num(r["psnr"]) for r in runs]
                entry = {
                    "epsilon": eps,
                    "defense": spec,
                    "sigma": None if eps is None else sigmas[eps]["sigma"],
                    "psnr": mean(psnrs),
                    "ssim": mean(r["ssim"] for r in runs),
                    "baseline_psnr": mean(r["baseline_psnr"] for r in runs),
                    "success_rate": success(psnrs, SUCCESS),
                    "exact_rate": success(psnrs, EXACT),
                    "label_accuracy": mean(r["label_accuracy"] for r in runs),
                    "seconds_per_image": mean(r["seconds"] for r in runs),
                    "per_image_psnr": psnrs,
                    "error": None,
                }
                entry["above_baseline_db"] = entry["psnr"] - entry["baseline_psnr"]
                results[method].append(entry)
                log(
                    f"{method} {spec}: PSNR {entry['psnr']:.1f} dB "
                    f"(baseline {entry['baseline_psnr']:.1f}), success {entry['success_rate']:.2f}"
                )
    finally:
        if store is not None:
            store.close()
    return {
        "benchmark": "dp_reconstruction",
        "setting": {
            "rows": rows,
            "dlg_idlg_model": f"lenet (sigmoid, U(-0.5, 0.5), seed {args.seed}), untrained",
            "ig_model": f"cnn (relu), trained {args.epochs} epochs, test acc {cnn_accuracy:.3f}",
            "defense": "dp:EPS, clip 1, delta 1e-5, PLD, one FedSGD participation",
            "success": f"PSNR > {SUCCESS:g} dB (exact: > {EXACT:g} dB)",
            "iterations": {
                "dlg": args.iterations,
                "idlg": args.iterations,
                "ig": args.ig_iterations,
            },
            "seed": args.seed,
            "torch_threads": torch.get_num_threads(),
        },
        "sigma": {f"{eps:g}": sigmas[eps] for eps in args.epsilons},
        "results": results,
        "starts_to_succeed": {m: starts_to_succeed(rows_) for m, rows_ in results.items()},
        "seconds": time.perf_counter() - start,
    }


def print_tables(payload: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    s = payload["setting"]
    methods = list(payload["results"])
    table = Table(title=f"DP-SGD at the client vs gradient inversion — {s['success']}")
    table.add_column("defence")
    table.add_column("sigma")
    for m in methods:
        table.add_column(f"{m} PSNR (base)")
        table.add_column(f"{m} succ.")
    specs = [r["defense"] for r in payload["results"][methods[0]]]
    for i, spec in enumerate(specs):
        first = payload["results"][methods[0]][i]
        accountant = payload["sigma"].get(spec.removeprefix("dp:"), {}).get("accountant")
        cells = [spec, fmt(first.get("sigma"), ".3g") + (f" ({accountant})" if accountant else "")]
        for m in methods:
            r = payload["results"][m][i]
            if r.get("error"):
                cells += ["error", "-"]
                continue
            cells += [
                f"{fmt(r['psnr'])} ({fmt(r['baseline_psnr'])})",
                fmt(r["success_rate"], ".2f"),
            ]
        table.add_row(*cells)
    console.print(table)
    errors = {r["defense"]: r["error"] for rows in payload["results"].values() for r in rows
              if r.get("error")}  # fmt: skip
    for spec, err in errors.items():
        console.print(f"{spec}: {err}")
    starts = payload["starts_to_succeed"]
    console.print(
        "reconstructions start to succeed at ε >= "
        + ", ".join(f"{m}: {fmt(starts[m], 'g') if starts[m] else 'never'}" for m in starts)
        + f"; models: {s['dlg_idlg_model']}; {s['ig_model']}; total {payload['seconds']:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; print the table, or one JSON object with --json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quick", action="store_true", help="1 image, 3 ε, few iterations")
    parser.add_argument("--epsilons", type=float, nargs="*", default=None)
    parser.add_argument("--methods", nargs="*", default=None, choices=METHODS)
    parser.add_argument("--images", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=None, help="DLG/iDLG L-BFGS steps")
    parser.add_argument("--ig-iterations", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None, help="CNN training epochs (IG)")
    parser.add_argument("--tv", type=float, default=IG_TV, help="our ig's TV weight")
    parser.add_argument(
        "--store", default=None, help="result store (default runs/bench-cache/...; 'none': off)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.epsilons = args.epsilons or ([1.0, 64.0, 1e4] if args.quick else list(EPSILONS))
    args.methods = args.methods or list(METHODS)
    args.images = args.images or (1 if args.quick else 4)
    args.iterations = args.iterations or (20 if args.quick else 300)
    args.ig_iterations = args.ig_iterations or (40 if args.quick else 1000)
    args.epochs = args.epochs or (1 if args.quick else 2)
    args.store = store_path(args.store, args.quick, "dp_reconstruction")
    if min(args.images, args.iterations, args.ig_iterations) < 1 or min(args.epsilons) <= 0:
        parser.error("images and iterations must be >= 1 and every ε > 0")
    return finish(args, run, print_tables)


if __name__ == "__main__":
    raise SystemExit(main())
