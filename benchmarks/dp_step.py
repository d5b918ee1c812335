"""Time and memory of one DP-SGD step: privacylab (ghost, per_sample) against Opacus 1.6.

    python benchmarks/dp_step.py [--json] [--repeats N] [--warmup W] [--models mlp,cnn,...]

Setting: one process, ``torch.set_num_threads(1)``, CPU, batch 256, σ = 1, C = 1, SGD.
Models: MLP 784-512-256-10 and the DP-literature CNN on MNIST-shaped inputs (1×28×28), a
2-block transformer classifier (vocabulary 1000, length 64, width 64, 4 heads; Linear,
Embedding and LayerNorm layers only, attention written out with matmul/softmax), an LSTM
classifier (vocabulary 1000, length 32, embedding 64, one DPLSTM layer of width 128: ours is
``privacylab.training.dp.modules.DPLSTM`` for plain, ghost and per_sample, Opacus's
``opacus.layers.DPLSTM`` for its two methods; skipped with a note if ours is not importable)
and a MobileNet-style depthwise-separable CNN on CIFAR-shaped inputs (3×32×32: a 3×3 stem,
then two blocks of a depthwise 3×3 convolution, groups = channels, and a pointwise 1×1 one).

Methods, each on its own copy of the model: ``plain`` (forward, ``loss.backward()``, SGD step,
no privacy); ``ghost`` and ``per_sample`` (``privacylab.training.dp.DPSGD``); ``opacus_hooks``
(``PrivacyEngine().make_private(grad_sample_mode="hooks", poisson_sampling=False)``, i.e.
``GradSampleModule`` hooks) and ``opacus_ghost`` (``grad_sample_mode="ghost"``, which returns a
criterion wrapper whose ``backward`` runs Opacus' two backward passes).  Every DP method
includes drawing the Gaussian noise.  Times are medians over ``--repeats`` steps after
``--warmup`` steps, the methods interleaved step by step so that drift of the machine affects
all alike.  A step's time is the CPU time of the process (``time.process_time``: user + system,
so page faults count) — with one thread this equals the wall-clock time on an idle machine, and
unlike wall-clock time it is not inflated by other programs sharing the cores; ``--wall``
measures wall-clock time instead.  ``noise_ms`` is the time to draw the N(0, σ²C²) noise for all
parameters alone: part of every DP step, and the floor of the DP overhead for models with many
parameters per unit of compute (the MLP); ``ghost_ratio_excl_noise`` is
``(ghost_ms − noise_ms) / plain_ms``, the cost of ghost clipping itself.

Peak memory: torch's CPU allocator bypasses ``tracemalloc``, so memory is the resident set
size.  Each (model, method) runs in a fresh subprocess with ``MALLOC_MMAP_THRESHOLD_=65536`` (so
every tensor above 64 KiB is its own mapping, returned to the OS when freed, and RSS tracks live
tensor memory).  After warm-up steps the kernel's RSS high-water mark is reset (``5`` written to
``/proc/self/clear_refs``) and one step runs; its peak memory is ``VmHWM − VmRSS`` before the
step (median of three such steps): what the step itself needs on top of the model, optimizer
state, data and libraries.  Where ``clear_refs`` is unavailable, the ``ru_maxrss`` increase of
the first measured step is used instead.  ``peak_mem_ratio_*`` divides that by the same number
for the plain step.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

BATCH = 256
SIGMA = 1.0
CLIP = 1.0
LR = 0.05
METHODS = ("plain", "ghost", "per_sample", "opacus_hooks", "opacus_ghost")
MODELS = ("mlp", "cnn", "transformer", "lstm", "depthwise")


class Attention(nn.Module):
    """Multi-head self-attention built from two Linear layers."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), -1)
        return self.out((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LayerNorm transformer block with a 4× GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TransformerClassifier(nn.Module):
    """Token and position embeddings, blocks, LayerNorm, mean pooling, linear head.

    Position ids are a contiguous (B, T) tensor: Opacus 1.6's ghost norm for embeddings calls
    ``.view`` on the ids and fails on an ``expand``-ed (stride-0) one.
    """

    def __init__(
        self, vocab: int = 1000, length: int = 64, dim: int = 64, heads: int = 4, blocks: int = 2
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(length, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(blocks)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, tokens: Tensor) -> Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device).repeat(len(tokens), 1)
        x = self.tokens(tokens) + self.positions(positions)
        return self.head(self.ln(self.blocks(x)).mean(1))


class LSTMClassifier(nn.Module):
    """Token embedding, one LSTM layer (a DP-compatible drop-in), last state, linear head."""

    def __init__(self, lstm: type[nn.Module], vocab: int = 1000, dim: int = 64, hidden: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = lstm(dim, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, tokens: Tensor) -> Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


def depthwise_separable(channels: int, out: int, stride: int) -> list[nn.Module]:
    """MobileNet block: depthwise 3×3 (groups = channels), ReLU, pointwise 1×1, ReLU."""
    return [
        nn.Conv2d(channels, channels, 3, stride=stride, padding=1, groups=channels),
        nn.ReLU(),
        nn.Conv2d(channels, out, 1),
        nn.ReLU(),
    ]


def mobilenet_block() -> nn.Module:
    """A 3×3 stem and two depthwise-separable blocks on 3×32×32 inputs, 10 classes."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        *depthwise_separable(32, 64, 1),
        *depthwise_separable(64, 128, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def our_lstm() -> type[nn.Module] | None:
    """privacylab's DPLSTM, imported lazily (``None`` if this checkout does not have it)."""
    try:
        from privacylab.training.dp.modules import DPLSTM
    except ImportError:
        return None
    return DPLSTM


def build(name: str, for_opacus: bool = False) -> tuple[nn.Module, Tensor, Tensor]:
    """Model and one batch for ``name`` (``for_opacus``: the variant Opacus's methods run)."""
    torch.manual_seed(0)
    y = torch.randint(0, 10, (BATCH,))
    if name in ("mlp", "cnn"):
        from privacylab.models.conv import cnn
        from privacylab.models.dense import mlp

        model = mlp((1, 28, 28), 10) if name == "mlp" else cnn((1, 28, 28), 10, activation="relu")
        return model, torch.randn(BATCH, 1, 28, 28), y
    if name == "transformer":
        return TransformerClassifier(), torch.randint(0, 1000, (BATCH, 64)), y
    if name == "lstm":
        if for_opacus:
            import opacus.layers

            lstm: type[nn.Module] | None = opacus.layers.DPLSTM
        else:
            lstm = our_lstm()
        if lstm is None:
            raise ModuleNotFoundError("privacylab.training.dp.modules.DPLSTM does not exist yet")
        return LSTMClassifier(lstm), torch.randint(0, 1000, (BATCH, 32)), y
    if name == "depthwise":
        return mobilenet_block(), torch.randn(BATCH, 3, 32, 32), y
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def per_example_ce(outputs: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy with reduction='none'."""
    return F.cross_entropy(outputs, targets, reduction="none")


def make_step(
    method: str, model: nn.Module, x: Tensor, y: Tensor, name: str = ""
) -> Callable[[], None]:
    """A closure doing one training step of ``method`` on its own copy of ``model``."""
    if method.startswith("opacus") and name == "lstm":
        model = build(name, for_opacus=True)[0]
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    if method == "plain":

        def plain() -> None:
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()

        return plain
    if method in ("ghost", "per_sample"):
        from privacylab.training.dp import DPSGD

        engine = DPSGD(
            model,
            optimizer,
            per_example_ce,
            noise_multiplier=SIGMA,
            max_grad_norm=CLIP,
            expected_batch_size=BATCH,
            clipping=method,  # type: ignore[arg-type]
            generator=torch.Generator().manual_seed(0),
        )

        def dp_step() -> None:
            engine.step(x, y)

        return dp_step
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = PrivacyEngine(accountant="rdp").make_private(
            module=model,
            optimizer=optimizer,
            criterion=nn.CrossEntropyLoss(),
            data_loader=loader,
            noise_multiplier=SIGMA,
            max_grad_norm=CLIP,
            poisson_sampling=False,
            grad_sample_mode="hooks" if method == "opacus_hooks" else "ghost",
        )
    if method == "opacus_hooks":
        private_model, private_optimizer, _ = made
        criterion: Callable[[Tensor, Tensor], Tensor] = nn.CrossEntropyLoss()
    else:
        private_model, private_optimizer, criterion, _ = made

    def opacus_step() -> None:
        criterion(private_model(x), y).backward()
        private_optimizer.step()
        private_optimizer.zero_grad()

    return opacus_step


def noise_time(model: nn.Module, repeats: int, clock: Callable[[], float]) -> float:
    """Median ms to draw N(0, σ²C²) for every parameter with a torch.Generator (part of DP)."""
    generator = torch.Generator().manual_seed(0)
    params = [torch.empty_like(p) for p in model.parameters()]
    times = []
    for _ in range(repeats + 3):
        start = clock()
        for p in params:
            p.normal_(0.0, SIGMA * CLIP, generator=generator)
        times.append(clock() - start)
    return statistics.median(times[3:]) * 1e3


def time_methods(
    name: str, repeats: int, warmup: int, clock: Callable[[], float] = time.process_time
) -> dict[str, object]:
    """Median step time of each method, interleaved."""
    model, x, y = build(name)
    steps: dict[str, Callable[[], None]] = {}
    result: dict[str, object] = {}
    for method in METHODS:
        try:
            steps[method] = make_step(method, model, x, y, name)
            for _ in range(warmup):
                steps[method]()
        except Exception as error:  # a peer that fails is reported, not fatal
            steps.pop(method, None)
            result[f"{method}_ms"] = None
            result[f"{method}_error"] = f"{type(error).__name__}: {error}".splitlines()[0]
    times: dict[str, list[float]] = {m: [] for m in steps}
    for _ in range(repeats):
        for method, step in steps.items():
            start = clock()
            step()
            times[method].append(clock() - start)
    for method, values in times.items():
        result[f"{method}_ms"] = round(statistics.median(values) * 1e3, 3)
    plain = result["plain_ms"]
    for method in METHODS[1:]:
        value = result.get(f"{method}_ms")
        result[f"{method}_ratio"] = None if value is None else round(value / plain, 3)
    for peer in ("opacus_hooks", "opacus_ghost"):
        ours, theirs = result.get("ghost_ms"), result.get(f"{peer}_ms")
        result[f"ghost_vs_{peer}"] = None if not ours or not theirs else round(ours / theirs, 3)
    result["noise_ms"] = round(noise_time(model, repeats, clock), 3)
    if result.get("ghost_ms") is not None:
        excl = (result["ghost_ms"] - result["noise_ms"]) / plain
        result["ghost_ratio_excl_noise"] = round(excl, 3)
    return result


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory_here(name: str, method: str) -> dict[str, float]:
    """Peak bytes of one step above the resident baseline (run in a fresh process)."""
    torch.set_num_threads(1)
    model, x, y = build(name)
    step = make_step(method, model, x, y, name)
    for _ in range(3):
        step()
    deltas = []
    for _ in range(3):
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")
            before = _status_kib("VmRSS")
            step()
            deltas.append(_status_kib("VmHWM") - before)
        except OSError:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            step()
            deltas.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
            break
    return {"peak_kib": statistics.median(deltas)}


def measure_memory(name: str, method: str) -> float | None:
    """Run :func:`measure_memory_here` in a fresh subprocess; KiB or None on failure."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, __file__, "--memory-child", name, method],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        return None
    return float(json.loads(done.stdout.strip().splitlines()[-1])["peak_kib"])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table or one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per method")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per method")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--wall", action="store_true", help="wall-clock instead of CPU time")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Full backward hook")
    if args.memory_child:
        print(json.dumps(measure_memory_here(*args.memory_child)))
        return 0
    report: dict[str, dict[str, object]] = {}
    for name in args.models.split(","):
        if name == "lstm" and our_lstm() is None:
            print("[dp_step] skipping lstm: privacylab's DPLSTM is not there yet", file=sys.stderr)
            report[name] = {"skipped": "privacylab.training.dp.modules.DPLSTM not found"}
            continue
        print(f"[dp_step] timing {name}", file=sys.stderr)
        clock = time.perf_counter if args.wall else time.process_time
        result = time_methods(name, args.repeats, args.warmup, clock)
        if not args.no_memory:
            print(f"[dp_step] memory {name}", file=sys.stderr)
            plain = measure_memory(name, "plain")
            result["peak_mem_mib_plain"] = None if plain is None else round(plain / 1024, 1)
            for method in METHODS[1:]:
                peak = measure_memory(name, method) if plain else None
                key = f"peak_mem_ratio_{method}"
                result[key] = None if peak is None or not plain else round(peak / plain, 3)
        report[name] = result
    if args.json:
        print(json.dumps(report))
        return 0
    columns = [
        "plain_ms",
        *[f"{m}_ratio" for m in METHODS[1:]],
        "ghost_vs_opacus_ghost",
        "noise_ms",
        "ghost_ratio_excl_noise",
    ]
    if not args.no_memory:
        columns += ["peak_mem_ratio_ghost", "peak_mem_ratio_per_sample"]
    width = max(len(c) for c in columns) + 2
    print(f"{'model':<12}" + "".join(f"{c:>{width}}" for c in columns))
    for name, result in report.items():
        cells = [result.get(c) for c in columns]
        print(f"{name:<12}" + "".join(f"{'-' if v is None else v:>{width}}" for v in cells))
        for key, value in result.items():
            if key.endswith("_error"):
                print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    raise SystemExit(main())
