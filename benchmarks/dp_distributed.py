"""Distributed DP-SGD (``DistributedDPSGD``) on W ranks against ``DPSGD.step`` in one process.

    python benchmarks/dp_distributed.py [--json] [--nproc W] [--steps S] [--warmup K]
                                        [--clipping ghost|per_sample] [--device cpu|cuda]

Setting: the 784-512-256-10 MLP of ``privacylab.models`` on random MNIST-shaped data
(N = 8192 examples, q = 512/N, σ = 1, C = 1, SGD), ``torch.set_num_threads(1)`` in every
process, so W ranks use W cores.  Both runs use the same seeds: the same Poisson batches and
the same noise, so besides the time per step the benchmark reports how far the distributed
model is from the single-process one after the run (``max_abs_diff``; float32 summation
order only) and whether the two ledgers give the same ε (RDP accountant, δ = 1e-5).  The time
of a step is the median wall-clock time of rank 0 (ranks run in lock-step) over the steps after
``--warmup``; ``comm_ms`` is the median time of an all-reduce of a gradient-sized float32
tensor alone.  ``--device cuda`` uses NCCL and one GPU per rank (W ≤ the number of GPUs).
On a machine whose cores are shared with other work the speed-up says little; the equality
does not depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.nn import functional as F

from privacylab.accounting import RdpAccountant
from privacylab.models.dense import mlp
from privacylab.training.dp import DPSGD, PoissonSampler
from privacylab.training.dp.distributed import DistributedDPSGD

N, BATCH, SIGMA, CLIP, LR, DELTA = 8192, 512, 1.0, 1.0, 0.1, 1e-5
SAMPLE_SEED, NOISE_SEED = 1, 2


def _loss(outputs: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def _setup(clipping: str, device: torch.device) -> tuple[DPSGD, Tensor, Tensor]:
    torch.manual_seed(0)
    model = mlp((1, 28, 28), 10).to(device)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(N, 1, 28, 28, generator=generator).to(device)
    y = torch.randint(0, 10, (N,), generator=generator).to(device)
    engine = DPSGD(
        model,
        torch.optim.SGD(model.parameters(), lr=LR),
        _loss,
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        expected_batch_size=BATCH,
        clipping=clipping,  # type: ignore[arg-type]
        generator=torch.Generator(device=device).manual_seed(NOISE_SEED),
        sample_rate=BATCH / N,
    )
    return engine, x, y


def _params(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


def _epsilon(engine: DPSGD) -> float:
    return RdpAccountant().compose(engine.privacy_event).guarantee(DELTA).epsilon


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(
    draw: Callable[[], Tensor], step: Callable[[Tensor], object], device: torch.device, count: int
) -> list[float]:
    """Wall-clock seconds of each of ``count`` steps ``step(draw())``; the draw is not timed."""
    times = []
    for _ in range(count):
        batch = draw().to(device)
        _sync(device)
        start = time.perf_counter()
        step(batch)
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=300))
    try:
        engine, x, y = _setup(args.clipping, device)
        trainer = DistributedDPSGD(engine, N, seed=SAMPLE_SEED)
        times = _time_steps(
            trainer.next_share,
            lambda share: trainer.step(x[share], y[share]),
            device,
            args.warmup + args.steps,
        )
        size = sum(p.numel() for p in engine.params.values())
        buffer = torch.zeros(size, device=device)
        comm = []
        for _ in range(10):
            _sync(device)
            start = time.perf_counter()
            dist.all_reduce(buffer)
            _sync(device)
            comm.append(time.perf_counter() - start)
        if rank == 0:
            result = {
                "step_ms": 1e3 * statistics.median(times[args.warmup :]),
                "comm_ms": 1e3 * statistics.median(comm),
                "epsilon": _epsilon(engine),
                "params": _params(engine.model).tolist(),
            }
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _single(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    engine, x, y = _setup(args.clipping, device)
    sampler = PoissonSampler(N, BATCH / N, generator=torch.Generator().manual_seed(SAMPLE_SEED))
    times = _time_steps(
        sampler.sample,
        lambda batch: engine.step(x[batch], y[batch]),
        device,
        args.warmup + args.steps,
    )
    return {
        "step_ms": 1e3 * statistics.median(times[args.warmup :]),
        "epsilon": _epsilon(engine),
        "params": _params(engine.model),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--clipping", choices=["ghost", "per_sample"], default="ghost")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < args.nproc:
        sys.exit(f"--device cuda needs {args.nproc} GPUs, found {torch.cuda.device_count()}")
    torch.set_num_threads(1)
    single = _single(args)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "rank0.json"))
        mp.spawn(_rank, args=(args.nproc, _free_port(), args, out), nprocs=args.nproc)
        distributed = json.loads(Path(out).read_text())
    diff = (torch.tensor(distributed.pop("params")) - single.pop("params")).abs().max().item()
    result = {
        "setting": {
            "model": "mlp 784-512-256-10",
            "N": N,
            "expected_batch": BATCH,
            "clipping": args.clipping,
            "device": args.device,
            "nproc": args.nproc,
            "steps": args.steps,
        },
        "single_step_ms": round(single["step_ms"], 2),
        "distributed_step_ms": round(distributed["step_ms"], 2),
        "speedup": round(single["step_ms"] / distributed["step_ms"], 3),
        "comm_ms": round(distributed["comm_ms"], 3),
        "max_abs_diff": diff,
        "same_epsilon": single["epsilon"] == distributed["epsilon"],
        "epsilon": single["epsilon"],
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value}")


if __name__ == "__main__":
    main()
