"""What every model-extraction attack receives and how it is run: the extraction instance of
the family-agnostic core (`privacylab.attacks.core`).

The thief sees a `Target` at exactly its declared access level and an `ExtractionTask`: the
input domain, the number of classes, the data it owns (unlabelled: in-distribution rows, or
out-of-distribution ones), the architecture it trains its copy with, and the query budget it
plans to spend — never the victim's weights or its test data (Tramèr et al. 2016, Sec. 3; Orekondy
et al. 2019, Sec. 3; Jagielski et al. 2020, Sec. 3: "task accuracy" and "fidelity" are measured
by the defender, not by the thief). Each attack declares its `ThreatModel` (access and the side
information it uses, from `SIDE_INFORMATION`). `run_extraction` narrows the target and the task
to it, runs the attack (`core.execute`: timed, queries counted) and only then compares the
stolen model with the victim on held-out data (`Truth`), building the family's one result type,
`ExtractionResult`.

An attack returns `Stolen`: the final copy, snapshots of the copy at growing query counts (the
accuracy/fidelity-against-queries curve), and — for the exact attacks (equation solving,
functionally-equivalent ReLU extraction) — the recovered layers as float64 arrays, which
`run_extraction` aligns with the victim's (`Truth.layers`) to report weight errors.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.core import Attack, ThreatModel, execute
from privacylab.errors import PrivacylabError
from privacylab.models import ModelSpec
from privacylab.registry import Registry
from privacylab.target import Target

__all__ = [
    "EXTRACTION_ATTACKS",
    "SIDE_INFORMATION",
    "CurvePoint",
    "ExtractionAttack",
    "ExtractionError",
    "ExtractionResult",
    "ExtractionTask",
    "Layer",
    "Stolen",
    "Truth",
    "agreement",
    "extraction_class",
    "extraction_names",
    "layers_module",
    "make_extraction",
    "predicted_labels",
    "register_extraction",
    "relu_layers",
    "run_extraction",
]

SIDE_INFORMATION = ("pool", "architecture", "bounds")
"""What an extraction task may give beyond the input shape and class count: `pool`, unlabelled
data the thief owns; `architecture`, the victim's architecture (the thief trains that, or, for
the exact attacks, knows the layer widths are not needed: they recover them); `bounds`, the
input domain."""

Layer = tuple[np.ndarray, np.ndarray]
"""One affine layer as float64 arrays: weight (out, in) and bias (out,)."""


class ExtractionError(PrivacylabError, ValueError):
    """An extraction attack cannot run on this target or task; one line."""


@dataclass(eq=False)
class ExtractionTask:
    """The thief's knowledge.

    `input_shape`, `num_classes`: the API's input and output (always known to a user of the
    API). `pool`: unlabelled examples the thief owns (`pool_kind` says what they are:
    "in-distribution" or "out-of-distribution"), never the victim's training rows in the
    experiments here. `architecture`: the model the thief trains (default: the victim's,
    Kerckhoffs). `bounds`: the input domain (low, high) each feature lies in. `budget`: the
    queries the thief plans to spend (the target may allow fewer: the attack stops at
    QueryBudgetError with what it has). `checkpoints`: query counts at which a learning
    attack snapshots its copy (the curve). `seed` seeds every random choice.
    """

    input_shape: tuple[int, ...]
    num_classes: int
    pool: Tensor | None = None
    pool_kind: str = "in-distribution"
    architecture: ModelSpec | None = None
    bounds: tuple[float, float] = (0.0, 1.0)
    budget: int = 10_000
    checkpoints: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(s) for s in self.input_shape)
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1:
            raise ExtractionError(f"query budget must be a whole number >= 1, got {self.budget!r}")
        low, high = (float(b) for b in self.bounds)
        if not (np.isfinite(low) and np.isfinite(high) and low < high):
            raise ExtractionError(f"bounds must be finite with low < high, got {self.bounds!r}")
        self.bounds = (low, high)
        if self.pool is not None:
            self.pool = torch.as_tensor(self.pool)
            if tuple(self.pool.shape[1:]) != self.input_shape:
                raise ExtractionError(
                    f"pool examples have shape {tuple(self.pool.shape[1:])}, "
                    f"expected {self.input_shape}"
                )
        if self.pool_kind not in ("in-distribution", "out-of-distribution"):
            raise ExtractionError(
                f'pool_kind must be "in-distribution" or "out-of-distribution", '
                f"got {self.pool_kind!r}"
            )
        points = sorted({int(c) for c in self.checkpoints if 0 < int(c) <= self.budget})
        self.checkpoints = tuple(points) if points else (self.budget,)

    @property
    def input_dim(self) -> int:
        """Number of input features."""
        return int(np.prod(self.input_shape))

    def restricted_to(self, side_information: Iterable[str]) -> ExtractionTask:
        """The task without the side information not named: what an attack with that threat
        model is given (no pool: None; no architecture: None; no bounds: the attack must not
        rely on them, they are kept as (0, 1) only as a default domain to draw from)."""
        side = set(side_information)
        unknown = sorted(side - set(SIDE_INFORMATION))
        if unknown:
            raise ExtractionError(
                f"unknown side information {', '.join(unknown)}; "
                f"choose from {', '.join(SIDE_INFORMATION)}"
            )
        return replace(
            self,
            pool=self.pool if "pool" in side else None,
            architecture=self.architecture if "architecture" in side else None,
        )

    def require_pool(self, attack: str) -> Tensor:
        """The pool, or ExtractionError naming the attack."""
        if self.pool is None or len(self.pool) == 0:
            raise ExtractionError(f"{attack} needs data the attacker owns (a pool); none given")
        return self.pool


@dataclass
class Stolen:
    """What an extraction attack returns.

    `model`: the final copy (returns logits, or log-probabilities: only its arg-max and
    `forward` are used). `snapshots`: (queries spent, copy) pairs in increasing query order for
    the curve (may be empty; the final copy is added as the last point). `layers`: for exact
    attacks, the recovered affine layers in float64, input to output (`Layer`). `neurons`:
    per hidden layer, which recovered neuron is which (exact attacks fill it when they can
    say: a neuron they failed to recover is reported, never dropped). `stopped`: why the
    attack stopped early ("budget", "refused") or None. `params`: settings and diagnostics."""

    model: nn.Module
    snapshots: list[tuple[int, nn.Module]] = field(default_factory=list)
    layers: list[Layer] | None = None
    neurons: list[dict[str, Any]] | None = None
    stopped: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CurvePoint:
    """The copy after `queries` queries: its test `accuracy` and `fidelity` (agreement with
    the victim's labels on the same held-out inputs)."""

    queries: int
    accuracy: float
    fidelity: float


@dataclass
class ExtractionResult:
    """One extraction attack against one target: the family's one result type.

    `queries` is what the attack sent (the runner's count, not the attack's claim);
    `accuracy`/`fidelity` are the final copy's on held-out data; `victim_accuracy` the
    victim's there; `curve` the snapshots'. Exact attacks add `exact` (weight and output
    errors after alignment, neuron counts: see `privacylab.attacks.extraction.metrics`). A
    monitor's verdict is added by the caller (`defense`). `stolen` is the attack's own output
    (the copy, for a watermark check or an offline attack), left out of `to_dict`."""

    method: str
    access: str
    queries: int
    seconds: float
    accuracy: float
    fidelity: float
    victim_accuracy: float
    curve: list[CurvePoint]
    stopped: str | None = None
    exact: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    defense: dict[str, Any] | None = None
    stolen: Stolen | None = field(default=None, repr=False, compare=False)
    """What the attack returned (the copy itself; not part of `to_dict`)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; the issue's keys at the top level (`method`, `queries`,
        `accuracy`, `fidelity`, `victim_accuracy`, and for exact attacks their metrics)."""
        out: dict[str, Any] = {
            "method": self.method,
            "access": self.access,
            "queries": self.queries,
            "seconds": self.seconds,
            "accuracy": self.accuracy,
            "fidelity": self.fidelity,
            "victim_accuracy": self.victim_accuracy,
            "curve": [vars(p) for p in self.curve],
            "stopped": self.stopped,
            "params": self.params,
        }
        if self.exact is not None:
            out.update(self.exact)
        if self.defense is not None:
            out.update(self.defense)
        return out


@dataclass(eq=False)
class Truth:
    """What only the evaluator knows: the victim `model` (logits), held-out inputs `x` with
    labels `y` for accuracy and fidelity, and, for exact attacks, the victim's affine layers
    in float64 (`layers`, None when the victim is not a fully connected ReLU network)."""

    model: nn.Module
    x: Tensor
    y: Tensor
    layers: list[Layer] | None = None
    bounds: tuple[float, float] = (0.0, 1.0)


class ExtractionAttack(Attack[ExtractionTask, Stolen]):
    """A model-extraction attack: configured in the constructor, run by `steal`.

    Subclasses declare `threat_model`; `exact` says whether it returns recovered layers;
    `needs_float64` that it needs a target answering in float64 (Carlini et al. 2020)."""

    name: ClassVar[str]
    threat_model: ClassVar[ThreatModel]
    exact: ClassVar[bool] = False
    needs_float64: ClassVar[bool] = False
    paper: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def steal(self, target: Target, task: ExtractionTask) -> Stolen:
        """The stolen copy, using only `target` and `task`."""

    def run(self, target: Target, task: ExtractionTask) -> Stolen:
        """The core's entry point: `steal`, after checking the target's precision."""
        if self.needs_float64 and target.precision != "float64":
            raise ExtractionError(
                f"{self.name} needs a target that answers in float64 (Target(precision="
                f'"float64")); this one answers in {target.precision}'
            )
        return self.steal(target, task)


EXTRACTION_ATTACKS: Registry[type[ExtractionAttack]] = Registry(
    "extraction method", error=ExtractionError
)
"""Every extraction attack class by name (and its aliases)."""


def register_extraction(
    name: str,
) -> Callable[[type[ExtractionAttack]], type[ExtractionAttack]]:
    """Class decorator: make an attack buildable by `make_extraction(name, **options)`."""

    def decorate(cls: type[ExtractionAttack]) -> type[ExtractionAttack]:
        cls.name = name
        return EXTRACTION_ATTACKS.register(name, cls, aliases=tuple(getattr(cls, "aliases", ())))

    return decorate


def extraction_names() -> list[str]:
    """Registered extraction attacks, sorted."""
    return sorted(EXTRACTION_ATTACKS.names())


def extraction_class(name: str) -> type[ExtractionAttack]:
    """The class registered as `name`, or ExtractionError naming the choices."""
    return EXTRACTION_ATTACKS.get(name)


def make_extraction(name: str, **options: Any) -> ExtractionAttack:
    """The registered attack `name` built with `options`, or ExtractionError."""
    return EXTRACTION_ATTACKS.make(name, **options)


@torch.no_grad()
def predicted_labels(model: nn.Module, x: Tensor, chunk: int = 4096) -> Tensor:
    """Labels of `model` on `x`, in chunks, in the model's own dtype: the arg-max, or for a
    model with one output (a binary classifier's logit) whether it is positive."""
    model = model.eval()
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    out = []
    for i in range(0, len(x), chunk):
        logits = model(x[i : i + chunk].to(device, dtype)).cpu()
        out.append((logits[:, 0] > 0).long() if logits.shape[1] == 1 else logits.argmax(1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


def agreement(a: Tensor, b: Tensor) -> float:
    """Fraction of equal labels (NaN when empty)."""
    if len(a) == 0:
        return float("nan")
    return float((a == b).double().mean())


def run_extraction(
    attack: ExtractionAttack, target: Target, task: ExtractionTask, truth: Truth
) -> ExtractionResult:
    """Run `attack` against `target` at its declared access, on the task narrowed to its
    declared side information, then compare what it stole with the victim on `truth`'s
    held-out data, which the attack never sees. Exact attacks' layers are aligned with the
    victim's (`metrics.exact_report`)."""
    narrowed = task.restricted_to(attack.threat_model.side_information)
    done = execute(attack, target, narrowed)
    stolen = done.output
    victim_labels = predicted_labels(truth.model, truth.x)
    y = torch.as_tensor(truth.y)
    snapshots = [*stolen.snapshots]
    if not snapshots or snapshots[-1][1] is not stolen.model:
        snapshots.append((done.queries, stolen.model))
    curve = []
    for queries, model in snapshots:
        labels = predicted_labels(model, truth.x)
        curve.append(
            CurvePoint(int(queries), agreement(labels, y), agreement(labels, victim_labels))
        )
    exact = None
    if attack.exact:
        from privacylab.attacks.extraction.metrics import exact_report

        exact = exact_report(stolen, truth)
    return ExtractionResult(
        method=attack.name,
        access=done.access.value,
        queries=done.queries,
        seconds=done.seconds,
        accuracy=curve[-1].accuracy,
        fidelity=curve[-1].fidelity,
        victim_accuracy=agreement(victim_labels, y),
        curve=curve,
        stopped=stolen.stopped,
        exact=exact,
        params=stolen.params,
        stolen=stolen,
    )


def relu_layers(model: nn.Module) -> list[Layer]:
    """The affine layers of a fully connected ReLU network (`nn.Flatten`, then `nn.Linear`
    and `nn.ReLU` alternating, a `nn.Linear` last; `nn.Dropout`/`nn.Identity` ignored) as
    float64 arrays, or ExtractionError naming the first layer that is not of that shape."""
    layers: list[Layer] = []
    expect_linear = True
    for name, module in model.named_modules():
        if module is model or isinstance(module, nn.Sequential):
            continue
        if isinstance(module, nn.Flatten | nn.Dropout | nn.Identity):
            continue
        if isinstance(module, nn.Linear) and expect_linear:
            weight = module.weight.detach().cpu().double().numpy().copy()
            bias = (
                module.bias.detach().cpu().double().numpy().copy()
                if module.bias is not None
                else np.zeros(module.out_features)
            )
            layers.append((weight, bias))
            expect_linear = False
        elif isinstance(module, nn.ReLU) and not expect_linear:
            expect_linear = True
        else:
            raise ExtractionError(
                f"layer {name!r} ({type(module).__name__}) is not part of a fully connected "
                "ReLU network (Flatten, then Linear and ReLU alternating, Linear last)"
            )
    if not layers or expect_linear:
        raise ExtractionError(
            "the model is not a fully connected ReLU network ending in a Linear layer"
        )
    return layers


def layers_module(layers: list[Layer], input_shape: tuple[int, ...] | None = None) -> nn.Module:
    """A float64 `nn.Sequential` (Flatten, Linear, ReLU, ..., Linear) computing `layers`."""
    modules: list[nn.Module] = [nn.Flatten()]
    for i, (weight, bias) in enumerate(layers):
        linear = nn.Linear(weight.shape[1], weight.shape[0]).double()
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.asarray(weight, dtype=np.float64)))
            linear.bias.copy_(torch.from_numpy(np.asarray(bias, dtype=np.float64)))
        modules.append(linear)
        if i < len(layers) - 1:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules).eval()
