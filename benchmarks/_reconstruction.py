"""Shared helpers of the reconstruction benchmarks (issue 14): the rows, the models, one attacked
client update through privacylab's own path, the faithful re-run of the original DLG loop, and
`breaching` (Geiping et al.'s library) as a peer when it can be imported.

Our path is the one `privacylab attack gradients` takes: `federated.observe` (the simulated
client, defence applied by the client) -> `Target(model, "updates", ...)` -> `GradientTask`
-> `run_reconstruction` (scores in [0, 1] pixel space by `privacylab.stats.images`). The peers'
reconstructions are scored by the same `image_scores`, against the same images.

breaching on this machine. `pip install breaching` (0.1.2, the PyPI release) resolves its
dependency `torchvision` to a CUDA build of torch (torch 2.14 + ~3 GB of nvidia-* wheels) that
would replace the CPU torch every other part of privacylab runs on, so it is not in the `bench`
extra. Installed without dependencies (`pip install --no-deps breaching omegaconf
antlr4-python3-runtime==4.9.3`), its package `__init__` still fails: it imports
`breaching.cases`, whose data sets and model zoo import torchvision, and PyPI's torchvision wheel
links `libtorch_cuda.so` ("operator torchvision::nms does not exist" against CPU torch). Its
attack code (`breaching.attacks`) does not need torchvision: `breaching_module()` imports
exactly that sub-package (with empty parent packages standing in for `breaching` and
`breaching.cases`, whose `__init__` are the torchvision importers) and configures it from
breaching's own YAML files with OmegaConf, so the peer runs breaching's unmodified attack loop.
When that import fails, `breaching_status()` says why and the benchmarks report it.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.attacks.inversion import (
    GradientTask,
    GradientTruth,
    ReconstructionResult,
    make_inversion,
    run_reconstruction,
)
from privacylab.data import load_dataset
from privacylab.federated import ClientDefense, LocalTraining, ObservedUpdate
from privacylab.models import build_model
from privacylab.stats.images import PSNR_CAP, image_scores
from privacylab.target import Target

MNIST_TRAIN = 4000
"""mnist5k: the first 4,000 rows are the training part (the rest is held out)."""

NUM_CLASSES = 10

IG_TV = 0.05
"""TV weight the benchmarks give our ``ig`` on 28x28 mnist5k digits: the best of 1e-4 (the
attack's default), 1e-3, 1e-2, 5e-2 and 0.2 on one training image (row 1892, trained ReLU CNN,
1,000 iterations: 15.4, 18.8, 30.4, 31.4, 26.1 dB). Digits are flat strokes on a flat
background, so they take a stronger TV prior than the natural images Geiping et al. tuned on;
breaching keeps its own default (0.2 on a comparable mean-difference TV)."""


def log(message: str) -> None:
    """Progress to stderr (stdout is for the table or the JSON object)."""
    print(message, file=sys.stderr, flush=True)


def mnist(split: str = "train") -> tuple[Tensor, Tensor]:
    """mnist5k as float32 (n, 1, 28, 28) in [0, 1] and int64 labels: `split` "train" (rows
    0..3999) or "test" (4000..4999)."""
    x, y = load_dataset("mnist5k").to_tensors()
    x, y = x.float(), y.long()
    return (
        (x[:MNIST_TRAIN], y[:MNIST_TRAIN])
        if split == "train"
        else (x[MNIST_TRAIN:], y[MNIST_TRAIN:])
    )


def pick_rows(n: int, seed: int = 0, pool: int = MNIST_TRAIN) -> list[int]:
    """`n` distinct seeded training rows; the first k of n are the rows asked for k (a longer
    run extends a shorter one, and the result stores resume across sizes)."""
    return [int(r) for r in np.random.default_rng(seed).permutation(pool)[:n]]


def sigmoid_lenet(input_shape: Sequence[int] = (1, 28, 28), seed: int = 0) -> nn.Module:
    """DLG's model: the sigmoid LeNet of Zhu et al. 2019 with U(-0.5, 0.5) weights."""
    return build_model("lenet", tuple(input_shape), NUM_CLASSES, init="uniform", seed=seed)


def trained_relu_cnn(epochs: int = 2, seed: int = 0) -> tuple[nn.Module, float]:
    """The `cnn` model with ReLU trained `epochs` epochs on mnist5k's training rows by
    privacylab's trainer (SGD with momentum); returns it and its test accuracy."""
    from privacylab.training import TrainConfig, train

    model = build_model("cnn", (1, 28, 28), NUM_CLASSES, activation="relu", seed=seed)
    config = TrainConfig(epochs=epochs, batch_size=64, lr=0.05, seed=seed)
    result = train(model, mnist("train"), config, eval_data=mnist("test"))
    return result.model, float(result.eval_accuracy or math.nan)


_JUDGES: dict[int, nn.Module] = {}


def judge_labels(x: Tensor, seed: int = 1) -> Tensor:
    """The digits an independent judge reads in images `x`: the ReLU `cnn` trained 2 epochs on
    mnist5k with seed `seed` (test accuracy about 0.93; trained once per process)."""
    if seed not in _JUDGES:
        _JUDGES[seed] = trained_relu_cnn(2, seed)[0].eval()
    with torch.no_grad():
        return _JUDGES[seed](x.detach().float().clamp(0, 1)).argmax(1)


def recognised(x: Tensor, y: Tensor, seed: int = 1) -> list[bool]:
    """Whether the judge (`judge_labels`) labels each reconstruction as its true digit:
    recognisability measured as the issue measures MI-Face's inversions (chance: about 0.1).
    Used for DLG against the untrained sigmoid LeNet only: a reconstruction optimised against a
    trained CNN (IG with known labels) carries class evidence that transfers to a judge of the
    same kind (measured: a 7 dB IG noise image read as its digit), so it is not used there."""
    return [bool(p) for p in (judge_labels(x, seed) == y.reshape(-1)).tolist()]


def attack(
    method: str,
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    training: LocalTraining | None = None,
    defense: str | ClientDefense | None = None,
    clients: int = 1,
    rounds: int = 1,
    labels_known: bool = True,
    options: dict[str, Any] | None = None,
    seed: int = 0,
) -> ReconstructionResult:
    """privacylab's attack `method` on the update of a client holding (x, y), computed from
    `model`'s parameters with `training` and the client defence `defense` (a spec or a
    `ClientDefense`), as the
    honest-but-curious server sees it (`clients` > 1: secure aggregation over that many
    clients splitting the rows). Labels and the local procedure are given to the task;
    each attack keeps only the side information its threat model declares."""
    from privacylab.defenses.update import parse_update_defense
    from privacylab.federated import observe

    training = training or LocalTraining()
    if defense is None or isinstance(defense, str):
        shield = None if defense in (None, "none") else parse_update_defense(defense)
    else:
        shield = defense
    updates = observe(
        model,
        x,
        y,
        training=training,
        defense=shield,
        clients=clients,
        secure_aggregation=clients > 1,
        seed=seed,
        rounds=rounds,
    )
    target = Target(model, "updates", NUM_CLASSES, updates=updates)
    task = GradientTask(
        input_shape=tuple(x.shape[1:]),
        num_classes=NUM_CLASSES,
        labels=y if labels_known else None,
        local_training=training,
        seed=seed,
    )
    result = run_reconstruction(
        make_inversion(method, "gradients", **(options or {})),
        target,
        task,
        GradientTruth(x=x, y=y),
    )
    result.defense = "none" if shield is None else shield.spec
    return result


def plain_update(model: nn.Module, x: Tensor, y: Tensor) -> ObservedUpdate:
    """The FedSGD gradient a client holding (x, y) sends from `model`'s parameters, undefended
    (what every peer and our attacks see in the head-to-head comparisons)."""
    from privacylab.federated import local_update

    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    update = local_update(model, state, x, y, LocalTraining())
    return ObservedUpdate(0, (0,), state, update, int(x.shape[0]))


def scores(x: Tensor, truth: Tensor) -> dict[str, Any]:
    """Our one metrics path for a peer's reconstruction: PSNR/SSIM/MSE after matching, in
    [0, 1] pixel space. A non-finite reconstruction (a diverged run) is scored as blank
    (zeros) and flagged."""
    x = x.detach().cpu().float()
    diverged = not bool(torch.isfinite(x).all())
    if diverged:
        x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    out = image_scores(x.numpy(), truth.detach().cpu().numpy(), (0.0, 1.0))
    return {
        "psnr": float(out["psnr"]),
        "ssim": float(out["ssim"]),
        "mse": float(out["mse"]),
        "diverged": diverged,
    }


def original_dlg(
    model: nn.Module,
    update: ObservedUpdate,
    shape: Sequence[int],
    *,
    lr: float = 1.0,
    iterations: int = 300,
    seed: int = 0,
) -> dict[str, Any]:
    """The original DLG loop, written from Zhu, Liu & Han 2019 ("Deep Leakage from Gradients",
    Alg. 1 and Sec. 4's setting), not from privacylab's attack: dummy data x' ~ N(0, 1) and
    dummy label logits y' ~ N(0, 1); the dummy gradient of the cross-entropy between the model's
    output on x' and softmax(y'); D = sum over parameters of ||grad W' - grad W||^2; and
    `iterations` steps of `torch.optim.LBFGS([x', y'], lr=lr)` with PyTorch's other defaults
    (max_iter 20 evaluations per step, no line search), the optimiser and 300 iterations of the
    authors' setting. No box constraint, no restarts, no NaN guard: what diverges stays
    diverged. Returns x', the argmax labels, D, seconds and whether it went non-finite."""
    net = copy.deepcopy(model)
    names = [n for n, _ in net.named_parameters()]
    with torch.no_grad():
        for name, param in net.named_parameters():
            param.copy_(update.state[name])
    params = list(net.parameters())
    observed = [update.update[n].detach() for n in names]
    gen = torch.Generator().manual_seed(seed)
    dummy_x = torch.randn(tuple(shape), generator=gen).requires_grad_(True)
    dummy_y = torch.randn((int(shape[0]), NUM_CLASSES), generator=gen).requires_grad_(True)
    optimizer = torch.optim.LBFGS([dummy_x, dummy_y], lr=lr)

    def closure() -> Tensor:
        optimizer.zero_grad()
        logits = net(dummy_x)
        loss = torch.mean(torch.sum(-F.softmax(dummy_y, dim=-1) * F.log_softmax(logits, -1), 1))
        grads = torch.autograd.grad(loss, params, create_graph=True)
        distance = sum(((g - o) ** 2).sum() for g, o in zip(grads, observed, strict=True))
        distance.backward(inputs=[dummy_x, dummy_y])
        return distance

    start = time.perf_counter()
    distance = math.nan
    for _ in range(iterations):
        distance = float(optimizer.step(closure))
    seconds = time.perf_counter() - start
    return {
        "x": dummy_x.detach(),
        "labels": dummy_y.detach().argmax(1),
        "loss": distance,
        "seconds": seconds,
    }


# ---------------------------------------------------------------------------------------------
# breaching (Geiping et al.'s library) as a peer


class _Meta(dict):  # type: ignore[type-arg]
    """breaching reads its metadata both as `meta.shape` and `meta["labels"]`."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as err:
            raise AttributeError(name) from err


_BREACHING: dict[str, Any] = {}


def breaching_module() -> Any:
    """breaching's attack sub-package (`breaching.attacks`) and its config folder, imported
    without the package `__init__` (see the module docstring); raises ImportError with the
    reason when breaching or OmegaConf is missing."""
    if "attacks" in _BREACHING:
        return _BREACHING["attacks"]
    spec = importlib.util.find_spec("breaching")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "breaching is not installed (pip install --no-deps breaching omegaconf "
            "antlr4-python3-runtime==4.9.3; its own dependencies pull a CUDA torch)"
        )
    import omegaconf  # noqa: F401  (breaching's configs are OmegaConf objects)

    root = spec.submodule_search_locations[0]
    for name, sub in (("breaching", ""), ("breaching.cases", "cases"),
                      ("breaching.cases.models", "cases/models")):  # fmt: skip
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, sub)]
            sys.modules[name] = package
    import breaching.attacks as attacks  # type: ignore[import-not-found]

    _BREACHING.update(attacks=attacks, root=root)
    return attacks


def breaching_status() -> str:
    """The line "ok (breaching VERSION)" or the one-line reason it cannot run here."""
    try:
        breaching_module()
    except Exception as err:  # any import failure is the reason to report
        return f"unavailable: {type(err).__name__}: {str(err).splitlines()[0]}"
    from importlib.metadata import version

    return f"ok (breaching {version('breaching')}, attack code only)"


def breaching_config(name: str, overrides: dict[str, Any]) -> Any:
    """breaching's attack config `name` (config/attack/NAME.yaml over its
    `_default_optimization_attack.yaml`, as its hydra defaults list says) with `overrides`
    (dotted keys)."""
    from omegaconf import OmegaConf

    breaching_module()
    folder = Path(_BREACHING["root"]) / "config" / "attack"
    own = OmegaConf.load(folder / f"{name}.yaml")
    defaults = own.pop("defaults", [])
    parts = [OmegaConf.load(folder / f"{d}.yaml") for d in defaults if d != "_self_"]
    cfg = OmegaConf.merge(*parts, own)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def breaching_attack(
    name: str,
    model: nn.Module,
    update: ObservedUpdate,
    shape: Sequence[int],
    *,
    labels: Tensor | None,
    overrides: dict[str, Any],
    seed: int = 0,
) -> dict[str, Any]:
    """breaching's attack config `name` ("deepleakage", "invertinggradients", ...) on a FedSGD
    `update` of `model`, images in [0, 1] (no normalisation: mean 0, std 1), `labels` given
    (or None: the config's label strategy / joint optimisation). Its RGB-only total variation
    is set to the images' channel count (same filters). Returns x, labels, seconds."""
    attacks = breaching_module()
    cfg = breaching_config(name, overrides)
    names = [n for n, _ in model.named_parameters()]
    setup = {"dtype": torch.float, "device": torch.device("cpu")}
    attacker = attacks.prepare_attack(model, torch.nn.CrossEntropyLoss(), cfg, setup)
    channels = int(shape[1])
    for regularizer in getattr(attacker, "regularizers", []):
        # breaching's TotalVariation is written for RGB (a grouped conv with groups=3); for
        # other channel counts the same difference filters are kept, one pair per channel.
        if type(regularizer).__name__ == "TotalVariation" and not regularizer.double_opponents:
            regularizer.groups = channels
            regularizer.weight = regularizer.weight[: 2 * channels]
    meta = _Meta(shape=tuple(shape[1:]), modality="vision", task="classification",
                 classes=NUM_CLASSES)  # fmt: skip
    payload = [{"parameters": [update.state[n] for n in names], "buffers": None, "metadata": meta}]
    shared = [
        {
            "gradients": [update.update[n].detach().clone() for n in names],
            "buffers": None,
            "metadata": {
                "num_data_points": int(shape[0]),
                "labels": None if labels is None else labels.clone(),
                "local_hyperparams": None,
            },
        }
    ]
    torch.manual_seed(seed)
    start = time.perf_counter()
    out, _ = attacker.reconstruct(payload, shared, {}, dryrun=False)
    seconds = time.perf_counter() - start
    rec_labels = out.get("labels")
    if rec_labels is not None and rec_labels.ndim > 1:
        rec_labels = rec_labels.argmax(1)
    return {"x": out["data"].detach(), "labels": rec_labels, "seconds": seconds}


# ---------------------------------------------------------------------------------------------
# durable results and output


def clean(value: Any) -> Any:
    """`value` with NaN/inf floats as None and tensors/numpy scalars as Python values (JSON)."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, Tensor):
        return clean(value.tolist())
    if isinstance(value, np.generic):
        return clean(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def cached(
    store: Any, namespace: str, config: dict[str, Any], compute: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """`compute()` once per `config` in `store` (a `privacylab.execution.store.ResultStore`, or
    None: no cache): a re-run after a kill resumes where it stopped."""
    if store is None:
        return clean(compute())
    from privacylab.execution.store import config_key

    key = config_key(clean(config))
    found = store.get(namespace, key)
    if found is not None:
        return found
    value = clean(compute())
    store.put(namespace, key, value)
    return value


BENCH_CACHE = Path(__file__).resolve().parents[1] / "runs" / "bench-cache"
"""Where the full (non --quick) runs keep their result stores by default."""


def store_path(store: str | None, quick: bool, name: str) -> str | None:
    """The --store value: by default ``runs/bench-cache/NAME.sqlite`` for a full run and none
    with --quick; "none" or "" turns it off."""
    if store is None and not quick:
        store = str(BENCH_CACHE / f"{name}.sqlite")
    return None if store in ("none", "") else store


def open_store(path: str | None) -> Any:
    """A `privacylab.execution.store.ResultStore` at `path` (its folder created), or None."""
    if path is None:
        return None
    from privacylab.execution.store import ResultStore

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return ResultStore(path)


def finish(
    args: Any, run: Callable[[Any], dict[str, Any]], show: Callable[[dict[str, Any]], None]
) -> int:
    """The end of every benchmark's `main`: run with warnings silenced, then the JSON object
    (--json) or the tables."""
    warnings.filterwarnings("ignore")
    payload = run(args)
    if args.json:
        print(json.dumps(payload, indent=2, default=_jsonable))
    else:
        show(payload)
    return 0


def result_row(result: ReconstructionResult) -> dict[str, Any]:
    """The numbers of one of our reconstructions kept by the benchmarks."""
    return {
        "psnr": result.psnr,
        "ssim": result.ssim,
        "mse": result.mse,
        "label_accuracy": result.label_accuracy,
        "baseline_psnr": result.baseline_psnr,
        "seconds": result.seconds,
        "queries": result.queries,
        "loss": result.loss,
    }


def num(value: Any) -> float:
    """A stored number back as a float (None: NaN)."""
    return math.nan if value is None else float(value)


def mean(values: Iterable[Any]) -> float:
    """Mean of the finite values (None and NaN skipped), NaN if none."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.mean(vals)) if vals else math.nan


def success(psnr_values: Iterable[float], threshold: float) -> float:
    """Share of reconstructions with PSNR above `threshold` dB."""
    vals = [math.nan if v is None else float(v) for v in psnr_values]
    return float(np.mean([v > threshold for v in vals])) if vals else math.nan


def ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs and math.isfinite(theirs) and theirs != 0 else math.nan


def fmt(x: Any, spec: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


__all__ = [
    "BENCH_CACHE",
    "IG_TV",
    "MNIST_TRAIN",
    "PSNR_CAP",
    "attack",
    "breaching_attack",
    "breaching_status",
    "cached",
    "clean",
    "finish",
    "fmt",
    "judge_labels",
    "log",
    "mean",
    "mnist",
    "num",
    "open_store",
    "original_dlg",
    "pick_rows",
    "plain_update",
    "ratio",
    "recognised",
    "result_row",
    "scores",
    "sigmoid_lenet",
    "store_path",
    "success",
    "trained_relu_cnn",
]
