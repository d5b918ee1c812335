"""Inverting Gradients (Geiping et al. 2020) on a trained ReLU CNN: PSNR against the batch size
and against the number of local FedAvg steps, a plot of both curves and a picture grid of the
reconstructions, with breaching's IG as the peer on the batch-size curve when it can run.

    python benchmarks/ig_batch_steps.py [--json] [--quick] [--plot PATH] [--grid PATH]
        [--batches 1 2 4 8 16 32] [--steps 1 2 5] [--steps-batch 1] [--iterations 1000]
        [--restarts 2] [--tv 0.05] [--epochs 2] [--no-peer] [--seed 0]

Model: mnist5k's `cnn` with ReLU (Papernot et al.'s conv 16 8x8 / conv 32 4x4 / linear 32),
trained ``--epochs`` epochs on the 4,000 training rows by privacylab's trainer (its test
accuracy is printed), so the attack faces a trained model, as Geiping et al. stress. One
client, labels known (their main setting; `GradientTask.labels`), our ``ig`` through
`run_reconstruction` at its defaults (cosine distance + TV, signed Adam with step decay, box
[0, 1]) except ``--iterations``, ``--restarts`` (best restart by gradient loss) and the TV
weight ``--tv`` (default `_reconstruction.IG_TV` = 0.05, chosen for digits; see there).

* batch size B (FedSGD): the client's gradient of its B seeded training rows.
* local steps S (FedAvg, their Sec. 5): a client with ``--steps-batch`` rows (default 1), S
  local epochs of one full-batch SGD step each (lr 0.1), the weight change sent; the server
  knows the local procedure (side information "local-training") and IG replays the S unrolled
  steps.

PSNR in [0, 1] pixel space after matching the batch order (`privacylab.stats.images`); the
dummy-initialisation PSNR is the no-leakage baseline. Peer: breaching 0.1.2's
``invertinggradients`` config (cosine, TV 0.2, signed Adam, box, step decay) on the same FedSGD
gradients, labels given, same iteration budget, one restart per our restart (see
`_reconstruction` for how breaching runs here, and why only its attack code does).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _reconstruction import (
    IG_TV,
    attack,
    breaching_attack,
    breaching_status,
    finish,
    fmt,
    log,
    mnist,
    pick_rows,
    plain_update,
    result_row,
    scores,
    trained_relu_cnn,
)
from privacylab.federated import LocalTraining

SUCCESS = 20.0
"""Recognisable: PSNR above 20 dB (for 28x28 digits, the stroke shape is clearly legible)."""


def run(args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    model, accuracy = trained_relu_cnn(args.epochs, args.seed)
    log(f"trained relu cnn: test accuracy {accuracy:.3f}")
    x_all, y_all = mnist("train")
    options = {"iterations": args.iterations, "restarts": args.restarts, "tv": args.tv}
    peer_status = breaching_status() if args.peer else "not run (--no-peer)"
    have_peer = peer_status.startswith("ok")
    pictures: dict[str, Any] = {}
    batch_rows = []
    for b in args.batches:
        rows = pick_rows(b, args.seed + b)
        x, y = x_all[rows], y_all[rows]
        res = attack("ig", model, x, y, options=options, seed=args.seed)
        entry = {"batch_size": b, "rows": rows, **result_row(res)}
        if have_peer:
            out = breaching_attack(
                "invertinggradients", model, plain_update(model, x, y), x.shape, labels=y,
                seed=args.seed, overrides={"optim.max_iterations": args.iterations,
                                           "restarts.num_trials": args.restarts,
                                           "optim.callback": 10**9},
            )  # fmt: skip
            entry["breaching"] = {**scores(out["x"], x), "seconds": out["seconds"]}
        batch_rows.append(entry)
        pictures[f"B={b}"] = (res.truth, res.x, res.order)
        peer = entry.get("breaching", {}).get("psnr")
        log(f"batch {b}: ours {res.psnr:.1f} dB ({res.seconds:.0f}s), breaching {fmt(peer)} dB")
    step_rows = []
    rows = pick_rows(args.steps_batch, args.seed + 1000)
    x, y = x_all[rows], y_all[rows]
    for s in args.steps:
        training = LocalTraining("fedavg", epochs=s, batch_size=None, lr=0.1)
        res = attack("ig", model, x, y, training=training, options=options, seed=args.seed)
        step_rows.append(
            {
                "local_steps": training.steps(len(rows)),
                "batch_size": len(rows),
                "rows": rows,
                **result_row(res),
            }
        )
        pictures[f"S={s}"] = (res.truth, res.x, res.order)
        log(f"local steps {s}: {res.psnr:.1f} dB ({res.seconds:.0f}s)")
    payload = {
        "benchmark": "ig_batch_steps",
        "setting": {
            "model": f"cnn (relu), trained {args.epochs} epochs on mnist5k, seed {args.seed}",
            "test_accuracy": accuracy,
            "attack": f"our ig, {args.iterations} iterations, {args.restarts} restarts, "
            f"tv {args.tv:g}, labels known",
            "fedavg": f"{args.steps_batch} row(s), S full-batch local steps, lr 0.1",
            "recognisable": f"PSNR > {SUCCESS:g} dB",
            "seed": args.seed,
            "torch_threads": torch.get_num_threads(),
        },
        "breaching": peer_status,
        "batch_size": batch_rows,
        "local_steps": step_rows,
        "plot": None,
        "grid": None,
    }
    if args.plot:
        payload["plot"] = plot(payload, Path(args.plot))
    if args.grid:
        payload["grid"] = grid(pictures, Path(args.grid))
    payload["seconds"] = time.perf_counter() - start
    return payload


def plot(payload: dict[str, Any], path: Path) -> str:
    """PSNR vs batch size and vs local steps, with the dummy-init baseline, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    bs = payload["batch_size"]
    left.plot([r["batch_size"] for r in bs], [r["psnr"] for r in bs], "o-", label="privacylab ig")
    if any("breaching" in r for r in bs):
        left.plot(
            [r["batch_size"] for r in bs if "breaching" in r],
            [r["breaching"]["psnr"] for r in bs if "breaching" in r],
            "s--",
            label="breaching IG",
        )
    left.plot([r["batch_size"] for r in bs], [r["baseline_psnr"] for r in bs], ":", c="grey",
              label="dummy init")  # fmt: skip
    left.axhline(SUCCESS, c="k", lw=0.5)
    left.set_xscale("log", base=2)
    left.set_xlabel("batch size (FedSGD)")
    left.set_ylabel("PSNR (dB)")
    left.set_title("PSNR vs batch size")
    left.legend()
    st = payload["local_steps"]
    right.plot([r["local_steps"] for r in st], [r["psnr"] for r in st], "o-", label="privacylab ig")
    right.plot([r["local_steps"] for r in st], [r["baseline_psnr"] for r in st], ":", c="grey",
               label="dummy init")  # fmt: skip
    right.axhline(SUCCESS, c="k", lw=0.5)
    right.set_xlabel(f"local steps (FedAvg, {st[0]['batch_size'] if st else '-'} image(s))")
    right.set_title("PSNR vs local steps")
    right.legend()
    fig.suptitle(payload["setting"]["model"], fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def grid(pictures: dict[str, Any], path: Path, per_row: int = 8) -> str:
    """Ground truth above each reconstruction (matched order), up to `per_row` per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(pictures)
    fig, axes = plt.subplots(2 * len(settings), per_row,
                             figsize=(per_row * 0.9, 2 * len(settings) * 0.95))  # fmt: skip
    axes = np.atleast_2d(axes)
    for i, name in enumerate(settings):
        truth, rec, order = pictures[name]
        for j in range(per_row):
            for k, source in enumerate((truth, rec)):
                ax = axes[2 * i + k, j]
                ax.axis("off")
                if j < len(truth):
                    image = source[j] if k == 0 else rec[order[j]] if order else rec[j]
                    ax.imshow(np.clip(image[0].numpy(), 0, 1), cmap="gray", vmin=0, vmax=1)
            axes[2 * i, 0].set_title(f"{name}: truth / ours", fontsize=7, loc="left")
    fig.tight_layout(pad=0.2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def print_tables(payload: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=130)
    s = payload["setting"]
    table = Table(title=f"IG vs batch size — {s['model']} (test acc {s['test_accuracy']:.3f})")
    for col in ("B", "PSNR dB", "SSIM", "baseline", "seconds", "breaching PSNR", "breaching s",
                "ratio PSNR"):  # fmt: skip
        table.add_column(col)
    for r in payload["batch_size"]:
        peer = r.get("breaching", {})
        ratio = r["psnr"] / peer["psnr"] if peer.get("psnr") else math.nan
        table.add_row(
            str(r["batch_size"]), fmt(r["psnr"]), fmt(r["ssim"], ".3f"), fmt(r["baseline_psnr"]),
            fmt(r["seconds"]), fmt(peer.get("psnr")), fmt(peer.get("seconds")), fmt(ratio, ".2f"),
        )  # fmt: skip
    console.print(table)
    steps = Table(title=f"IG vs local FedAvg steps — {s['fedavg']}")
    for col in ("steps", "PSNR dB", "SSIM", "baseline", "seconds"):
        steps.add_column(col)
    for r in payload["local_steps"]:
        steps.add_row(str(r["local_steps"]), fmt(r["psnr"]), fmt(r["ssim"], ".3f"),
                      fmt(r["baseline_psnr"]), fmt(r["seconds"]))  # fmt: skip
    console.print(steps)
    console.print(
        f"breaching: {payload['breaching']}; plot {payload['plot']}; grid {payload['grid']}; "
        f"{s['recognisable']}; total {payload['seconds']:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the curves; print tables, or one JSON object with --json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quick", action="store_true", help="B 1, 2; S 1, 2; few iterations")
    parser.add_argument("--plot", default=None, help="PNG of both curves")
    parser.add_argument("--grid", default=None, help="PNG of the reconstructions")
    parser.add_argument("--batches", type=int, nargs="*", default=None)
    parser.add_argument("--steps", type=int, nargs="*", default=None)
    parser.add_argument("--steps-batch", type=int, default=1, help="rows in the FedAvg client")
    parser.add_argument("--tv", type=float, default=IG_TV, help="our ig's TV weight")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--restarts", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None, help="CNN training epochs")
    parser.add_argument("--no-peer", dest="peer", action="store_false", help="skip breaching")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.batches = args.batches or ([1, 2] if args.quick else [1, 2, 4, 8, 16, 32])
    args.steps = args.steps or ([1, 2] if args.quick else [1, 2, 5])
    args.iterations = args.iterations or (50 if args.quick else 1000)
    args.restarts = args.restarts or (1 if args.quick else 2)
    args.epochs = args.epochs or (1 if args.quick else 2)
    if args.plot and not args.grid:
        args.grid = str(Path(args.plot).with_name(Path(args.plot).stem + "_grid.png"))
    if min(args.batches + args.steps + [args.steps_batch, args.iterations, args.restarts]) < 1:
        parser.error("batch sizes, steps, iterations and restarts must be >= 1")
    return finish(args, run, print_tables)


if __name__ == "__main__":
    raise SystemExit(main())
