"""Time and peak memory of one fine-tuning step of the real MiniLM: DP-Forward against DP-SGD
(ours and Opacus) and non-private fine-tuning, one run.

    python benchmarks/dpforward.py [--json] [--quick] [--batch 32] [--length 48]
        [--repeats N] [--warmup W] [--layers K] [--methods a,b,...] [--threads 1] [--wall]
        [--no-memory] [--epsilon 8] [--device cpu]

Du et al. 2023 ("DP-Forward: Fine-tuning and Inference on Language Models with Differential
Privacy in Forward Pass", CCS'23, abstract and Sec. 7) report that DP-Forward "saves 3× time and
memory costs compared to DP-SGD with the latest high-speed library" (Opacus, Yousefpour et al.
2021, "a high-speed library for training PyTorch models with differential privacy"). DP-Forward
adds one noise draw per sequence in the forward pass and back-propagates as usual; DP-SGD needs
every example's gradient norm (and, in Opacus's hooks mode, every example's gradient).

Model: all-MiniLM-L6-v2 (`privacylab.models.minilm.load_minilm`, 6 layers, 384 wide, 22.7M
parameters, all trained) inside `privacylab.models.encoder.EncoderClassifier` with 2 classes, in
training mode (dropout on); one batch of ``--batch`` product reviews
(`privacylab.data.reviews`) tokenised to ``--length`` tokens; Adam, lr 5e-5, cross-entropy.

Methods, each on its own copy of the model:

- ``non-private``: forward, backward, Adam step.
- ``dp-forward-<position>`` (``output`` and ``input`` by default; any ``layer:K`` may be named):
  the model cut at the position with the release layer
  `privacylab.training.dpforward.ForwardNoise` (normalise each sequence's matrix to Frobenius
  norm C = 1, add aMGM noise calibrated by `forward_mechanism` for ε = ``--epsilon``, δ = 1e-5
  over 3 epochs), then the same backward and Adam step.
- ``dp-sgd-ghost``: privacylab's DP-SGD engine (`privacylab.training.dp.DPSGD`, the one
  trainer's engine) with ghost clipping and book-keeping (Li et al. 2022; Bu et al. 2023),
  σ = 1, C = 1, Adam on the privatised gradient.
- ``opacus-hooks`` (the seed's peer): Opacus 1.6 ``PrivacyEngine.make_private`` with
  ``grad_sample_mode="hooks"`` (``GradSampleModule``: every example's gradient is materialised,
  the word-embedding table's included), σ = 1, C = 1, no Poisson sampling, Adam.
- ``opacus-ghost``: the same with ``grad_sample_mode="ghost"`` (Opacus's ghost clipping).
  Opacus 1.6's ghost norm of an embedding calls ``.view`` on the ids and fails on the stride-0
  position ids `EncoderClassifier.before` passes (``arange(L).expand_as(ids)``); this benchmark
  makes them contiguous with a forward pre-hook on the copy's embedding module (same values).

Every DP method includes drawing its noise. Time: the median over ``--repeats`` steps after
``--warmup`` untimed steps, the methods interleaved step by step so that drift of the machine
affects all alike; a step's time is the CPU time of the process (``time.process_time``) with
one torch thread (``--threads 1``), which is its wall-clock time on an idle machine and is not
inflated by other programs sharing the cores; ``--wall`` (implied by ``--threads`` > 1 and by
CUDA, where the clock follows ``torch.cuda.synchronize``) measures wall-clock time instead.

Peak memory (CPU): ``tracemalloc`` does not see torch's CPU allocations, so memory is the
process's resident set size read from the kernel. Each method runs in a fresh subprocess with
``MALLOC_MMAP_THRESHOLD_=65536`` (every tensor above 64 KiB is its own mapping, returned to the
OS when freed, so RSS tracks live tensors). After the warm-up steps the RSS high-water mark is
reset (``5`` written to ``/proc/self/clear_refs``) and one step runs: ``step_peak_mib`` is
``VmHWM`` after it minus ``VmRSS`` before it (median of three steps), the memory the step needs
on top of the model, optimizer state, data and libraries; ``process_peak_mib`` is the process's
``VmHWM`` during the step (everything: libraries, model, Adam state, the method's persistent
buffers and the step) and ``resident_mib`` its ``VmRSS`` between steps (all but the step). The
step alone can mislead: privacylab's DP-SGD engine keeps its gradient buffers between steps
(resident), while a plain step allocates fresh gradients (``zero_grad(set_to_none=True)``);
the process peak counts both alike. Where ``clear_refs`` cannot be written,
the ``ru_maxrss`` increase of the first measured step is used (``ru_maxrss`` is inherited
across ``exec``, so it is not a process peak unless cleared). On CUDA: ``max_memory_allocated``
above ``memory_allocated`` before the step, and the process's peak allocated memory.

Ratios: DP-SGD (each of the three) / DP-Forward (each position) for time, step memory and
process memory, Opacus / ours (``dp-sgd-ghost``), and every method / non-private, with the
seed's ≈ 3× beside them.

Measured (2 shared CPU cores, 1 thread, torch 2.13, transformers 5.23, Opacus 1.6; full MiniLM,
batch 32, length 48, median of 10 steps; ``python benchmarks/dpforward.py --json``): step time
non-private 1.50 s, DP-Forward output 1.54 s / input 1.51 s, DP-SGD ghost (ours) 1.85 s, Opacus
hooks 5.91 s, Opacus ghost 2.92 s; process peak memory 1020, 1023 / 1025, 1124, 4959 and
1135 MiB. DP-SGD / DP-Forward (output): Opacus hooks 3.8× time and 4.9× memory (13× the step's
own memory), the seed's ≈ 3× reproduced against the seed's library; Opacus ghost 1.9× / 1.1×;
ours 1.2× / 1.1×: with ghost clipping DP-SGD costs little more than DP-Forward, which costs
what non-private fine-tuning does (1.0×).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

METHODS = (
    "non-private",
    "dp-forward-output",
    "dp-forward-input",
    "dp-sgd-ghost",
    "opacus-hooks",
    "opacus-ghost",
)
DP_SGD = ("dp-sgd-ghost", "opacus-hooks", "opacus-ghost")
OURS_DP_SGD = "dp-sgd-ghost"
SEED_RATIO = 3.0
SEED_CLAIM = (
    "DP-Forward saves 3x time and memory compared to DP-SGD with the latest high-speed library "
    "(Du et al. 2023, abstract; the library is Opacus)"
)
LR = 5e-5
SIGMA = 1.0
CLIP = 1.0
DELTA = 1e-5
EPOCHS = 3
NUM_CLASSES = 2


def log(message: str) -> None:
    """Progress on stderr (stdout is for the table or the JSON object)."""
    print(f"[dpforward-bench] {message}", file=sys.stderr, flush=True)


def batch_ids(batch: int, length: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """`batch` training reviews (`privacylab.data.reviews`, split "train") as MiniLM token ids
    (batch, `length`) and their sentiment labels."""
    from privacylab.data.reviews import ReviewConfig, build_reviews
    from privacylab.models.minilm import encode_texts, load_tokenizer

    documents = max(200, 4 * batch)
    train = build_reviews(ReviewConfig(documents=documents, seed=seed)).subset("train")
    texts = [train.texts[i % len(train)] for i in range(batch)]
    labels = torch.as_tensor([int(train.labels[i % len(train)]) for i in range(batch)])
    return encode_texts(load_tokenizer(), texts, length), labels


def per_example_ce(outputs: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy with reduction='none' (the DP-SGD engine's per-example loss)."""
    return F.cross_entropy(outputs, targets, reduction="none")


def _contiguous_positions(encoder: nn.Module) -> None:
    """Give Opacus's ghost embedding norm contiguous position ids (module docstring)."""

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        ids = kwargs.get("position_ids")
        if ids is not None:
            kwargs["position_ids"] = ids.contiguous()
        return args, kwargs

    encoder.embeddings.register_forward_pre_hook(hook, with_kwargs=True)  # type: ignore[union-attr]


def forward_release(position: str, length: int, dim: int, epsilon: float) -> nn.Module:
    """DP-Forward's release layer at `position`: `ForwardNoise` with the aMGM of
    `forward_mechanism` (S₂ = 2C, 3 epochs of releases composed to (ε, δ))."""
    from privacylab.training.dpforward import ForwardNoise, forward_mechanism

    rows = 1 if position == "output" else length
    mechanism = forward_mechanism(epsilon, DELTA, CLIP, rows, dim, releases=EPOCHS)
    return ForwardNoise(CLIP, mechanism, seed=0)


def make_step(
    method: str, encoder: nn.Module, ids: Tensor, y: Tensor, epsilon: float
) -> Callable[[], None]:
    """A closure doing one fine-tuning step of `method` on its own copy of `encoder`."""
    from privacylab.models.encoder import EncoderClassifier

    encoder = copy.deepcopy(encoder)
    device = ids.device
    if method.startswith("dp-forward-"):
        position = method.removeprefix("dp-forward-")
        release = forward_release(position, ids.shape[1], int(encoder.config.hidden_size), epsilon)
        model = EncoderClassifier(encoder, NUM_CLASSES, position=position, release=release)
    else:
        model = EncoderClassifier(encoder, NUM_CLASSES, position="output")
    model = model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    if method == "non-private" or method.startswith("dp-forward-"):

        def plain() -> None:
            F.cross_entropy(model(ids), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return plain
    if method == "dp-sgd-ghost":
        from privacylab.training.dp import DPSGD

        engine = DPSGD(
            model,
            optimizer,
            per_example_ce,
            noise_multiplier=SIGMA,
            max_grad_norm=CLIP,
            expected_batch_size=len(y),
            clipping="ghost",
            generator=torch.Generator(device=device).manual_seed(0),
        )

        def dp_sgd() -> None:
            engine.step(ids, y)

        return dp_sgd
    if method not in ("opacus-hooks", "opacus-ghost"):
        raise SystemExit(f"error: unknown method {method!r}; choose from {', '.join(METHODS)}")
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    if method == "opacus-ghost":
        _contiguous_positions(model.encoder)
    loader = DataLoader(TensorDataset(ids, y), batch_size=len(y))
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
            grad_sample_mode="hooks" if method == "opacus-hooks" else "ghost",
        )
    if method == "opacus-hooks":
        private_model, private_optimizer, _ = made
        criterion: Callable[[Tensor, Tensor], Tensor] = nn.CrossEntropyLoss()
    else:
        private_model, private_optimizer, criterion, _ = made

    def opacus_step() -> None:
        criterion(private_model(ids), y).backward()
        private_optimizer.step()
        private_optimizer.zero_grad(set_to_none=True)

    return opacus_step


def setup(args: argparse.Namespace) -> tuple[nn.Module, Tensor, Tensor]:
    """MiniLM (``--layers`` of its layers, all by default) and one batch on ``--device``."""
    from privacylab.models.minilm import load_minilm

    torch.manual_seed(args.seed)
    encoder = load_minilm(layers=args.layers)
    ids, y = batch_ids(args.batch, args.length, args.seed)
    return encoder, ids.to(args.device), y.to(args.device)


def _clock(args: argparse.Namespace) -> Callable[[], float]:
    if args.device.startswith("cuda"):

        def cuda_clock() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()

        return cuda_clock
    return time.perf_counter if args.wall or args.threads > 1 else time.process_time


def time_methods(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Median step time of each method, interleaved step by step (module docstring)."""
    encoder, ids, y = setup(args)
    clock = _clock(args)
    steps: dict[str, Callable[[], None]] = {}
    result: dict[str, dict[str, Any]] = {m: {} for m in args.methods}
    for method in args.methods:
        log(f"building and warming up {method}")
        try:
            steps[method] = make_step(method, encoder, ids, y, args.epsilon)
            for _ in range(args.warmup):
                steps[method]()
        except Exception as error:  # a method that cannot run is reported, not fatal
            steps.pop(method, None)
            result[method]["error"] = f"{type(error).__name__}: {error}".splitlines()[0]
            log(f"{method} failed: {result[method]['error']}")
    times: dict[str, list[float]] = {m: [] for m in steps}
    for r in range(args.repeats):
        for method, step in steps.items():
            start = clock()
            step()
            times[method].append(clock() - start)
        log(
            f"repeat {r + 1}/{args.repeats}: "
            + ", ".join(f"{m} {t[-1]:.2f}s" for m, t in times.items())
        )
    for method, values in times.items():
        result[method]["step_ms"] = statistics.median(values) * 1e3
        result[method]["step_ms_all"] = [v * 1e3 for v in values]
    return result


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory_here(args: argparse.Namespace, method: str) -> dict[str, float]:
    """Peak memory of one step of `method` in this (fresh) process, MiB (module docstring)."""
    encoder, ids, y = setup(args)
    step = make_step(method, encoder, ids, y, args.epsilon)
    del encoder
    for _ in range(max(args.warmup, 1)):
        step()
    deltas: list[float] = []
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        for _ in range(3):
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            deltas.append((torch.cuda.max_memory_allocated() - before) / 2**20)
        return {
            "step_peak_mib": statistics.median(deltas),
            "process_peak_mib": (before + max(deltas) * 2**20) / 2**20,
            "resident_mib": before / 2**20,
            "source": "torch.cuda.max_memory_allocated",
        }
    residents: list[float] = []
    peaks: list[float] = []
    source = "VmHWM - VmRSS (clear_refs)"
    for _ in range(3):
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")
            before = _status_kib("VmRSS")
            step()
            peaks.append(_status_kib("VmHWM") / 1024)
        except OSError:
            source = "ru_maxrss increase"
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            step()
            peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            deltas.append(peaks[-1] - before / 1024)
            residents.append(before / 1024)
            break
        residents.append(before / 1024)
        deltas.append(peaks[-1] - residents[-1])
    return {
        "step_peak_mib": statistics.median(deltas),
        "process_peak_mib": statistics.median(peaks),
        "resident_mib": statistics.median(residents),
        "source": source,
    }


def measure_memory(args: argparse.Namespace, method: str) -> dict[str, Any]:
    """`measure_memory_here` in a fresh subprocess (MiB), or {"error": ...}."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(args.threads))
    child = [
        sys.executable,
        os.path.abspath(__file__),
        "--memory-child",
        method,
        "--batch",
        str(args.batch),
        "--length",
        str(args.length),
        "--warmup",
        str(args.warmup),
        "--threads",
        str(args.threads),
        "--epsilon",
        str(args.epsilon),
        "--seed",
        str(args.seed),
        "--device",
        args.device,
    ]
    if args.layers is not None:
        child += ["--layers", str(args.layers)]
    done = subprocess.run(child, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or not b:
        return None
    return float(a) / float(b)


def ratios(methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """DP-SGD / DP-Forward, Opacus / ours and method / non-private, for each measured quantity
    (step time, step peak memory, process peak memory)."""
    quantities = ("step_ms", "step_peak_mib", "process_peak_mib")
    forward = [m for m in methods if m.startswith("dp-forward-")]
    out: dict[str, Any] = {
        "dp_sgd_over_dp_forward": {},
        "opacus_over_ours": {},
        "over_non_private": {},
    }
    for sgd in DP_SGD:
        if sgd not in methods:
            continue
        for fwd in forward:
            out["dp_sgd_over_dp_forward"][f"{sgd} / {fwd}"] = {
                q: _ratio(methods[sgd].get(q), methods[fwd].get(q)) for q in quantities
            }
        if sgd != OURS_DP_SGD and OURS_DP_SGD in methods:
            out["opacus_over_ours"][f"{sgd} / {OURS_DP_SGD}"] = {
                q: _ratio(methods[sgd].get(q), methods[OURS_DP_SGD].get(q)) for q in quantities
            }
    if "non-private" in methods:
        for method in methods:
            if method != "non-private":
                out["over_non_private"][method] = {
                    q: _ratio(methods[method].get(q), methods["non-private"].get(q))
                    for q in quantities
                }
    return out


def seed_check(methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The seed's ≈ 3× against the like-for-like pair (Opacus hooks, the library the seed used,
    over DP-Forward at each position) and against ours; `at_least_seed` says whether the
    measured ratio reaches 3."""
    forward = [m for m in methods if m.startswith("dp-forward-")]
    rows = {}
    for sgd in ("opacus-hooks", OURS_DP_SGD):
        for fwd in forward:
            for q in ("step_ms", "process_peak_mib"):
                value = _ratio(methods.get(sgd, {}).get(q), methods[fwd].get(q))
                rows[f"{q}: {sgd} / {fwd}"] = {
                    "measured": value,
                    "seed": SEED_RATIO,
                    "at_least_seed": None if value is None else value >= SEED_RATIO,
                }
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    import opacus
    import transformers

    start = time.perf_counter()
    torch.set_num_threads(args.threads)
    methods = time_methods(args)
    if not args.no_memory:
        for method in args.methods:
            if "error" in methods[method]:
                continue
            log(f"memory of {method} (fresh process)")
            memory = measure_memory(args, method)
            if "error" in memory:
                memory["memory_error"] = memory.pop("error")
            methods[method].update(memory)
    from privacylab.models.minilm import load_minilm

    parameters = sum(p.numel() for p in load_minilm(layers=args.layers).parameters())
    return {
        "benchmark": "dpforward",
        "quick": args.quick,
        "setting": {
            "encoder": "all-MiniLM-L6-v2",
            "layers": args.layers or 6,
            "encoder_parameters": parameters,
            "batch": args.batch,
            "length": args.length,
            "optimizer": f"Adam lr {LR}",
            "dp_sgd": {"noise_multiplier": SIGMA, "max_grad_norm": CLIP},
            "dp_forward": {"epsilon": args.epsilon, "delta": DELTA, "clip": CLIP, "epochs": EPOCHS},
            "threads": args.threads,
            "device": args.device,
            "clock": "cuda wall"
            if args.device.startswith("cuda")
            else ("wall" if args.wall or args.threads > 1 else "process CPU time"),
            "memory": None
            if args.no_memory
            else (
                "torch.cuda.max_memory_allocated"
                if args.device.startswith("cuda")
                else "RSS high-water mark of a fresh subprocess per method (/proc VmHWM)"
            ),
            "repeats": args.repeats,
            "warmup": args.warmup,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "opacus": opacus.__version__,
        },
        "methods": methods,
        "ratios": ratios(methods),
        "seed": {"claim": SEED_CLAIM, "checks": seed_check(methods)},
        "seconds": time.perf_counter() - start,
    }


def _fmt(value: Any, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def show(payload: dict[str, Any]) -> None:
    setting = payload["setting"]
    print(
        f"MiniLM ({setting['layers']} layers, {setting['encoder_parameters']:,} parameters), batch "
        f"{setting['batch']}, length {setting['length']}, {setting['threads']} thread(s), "
        f"{setting['device']}, clock: {setting['clock']}, median of {setting['repeats']} steps"
    )
    print(
        f"{'method':<22}{'step ms':>10}{'step peak MiB':>15}{'process MiB':>13}{'resident MiB':>14}"
    )
    for method, got in payload["methods"].items():
        print(
            f"{method:<22}{_fmt(got.get('step_ms')):>10}{_fmt(got.get('step_peak_mib')):>15}"
            f"{_fmt(got.get('process_peak_mib')):>13}{_fmt(got.get('resident_mib')):>14}"
        )
        for key in ("error", "memory_error"):
            if key in got:
                print(f"  {key}: {got[key]}")
    print(f"\nseed: {payload['seed']['claim']}")
    for pair, got in payload["seed"]["checks"].items():
        if got["measured"] is not None:
            mark = "✓" if got["at_least_seed"] else "✗"
            print(f"  {mark} {pair}: {got['measured']:.2f} (seed ≈ {got['seed']:.0f})")
    for group, rows in payload["ratios"].items():
        if not rows:
            continue
        print(f"\n{group.replace('_', ' ')}:")
        print(f"  {'pair':<40}{'time':>8}{'step mem':>10}{'process mem':>13}{'seed':>6}")
        for pair, got in rows.items():
            seed = f"{SEED_RATIO:.0f}x" if group == "dp_sgd_over_dp_forward" else ""
            print(
                f"  {pair:<40}{_fmt(got['step_ms'], '.2f'):>8}"
                f"{_fmt(got['step_peak_mib'], '.2f'):>10}"
                f"{_fmt(got['process_peak_mib'], '.2f'):>13}{seed:>6}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="2 layers, 3 repeats, 1 warm-up")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per method")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per method")
    parser.add_argument("--layers", type=int, default=None, help="MiniLM layers kept (all: 6)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--wall", action="store_true", help="wall-clock instead of CPU time")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--epsilon", type=float, default=8.0, help="DP-Forward's ε (3 epochs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if args.quick and args.layers is None:
        args.layers = 2
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for method in args.methods:
        if method not in METHODS and not method.startswith("dp-forward-"):
            parser.error(
                f"unknown method {method!r}; choose from {', '.join(METHODS)} or dp-forward-layer:K"
            )
    for name in ("batch", "length", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    if args.memory_child:
        print(json.dumps(measure_memory_here(args, args.memory_child)))
        return 0
    payload = run(args)
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        show(payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
