"""Reconstruction attacks, the shape they share, and the gradient-inversion instance of the
family-agnostic core (`privacylab.attacks.core`).

Three kinds of attack live in this family, each registered in `INVERSION_ATTACKS` with its
`kind`:

- "gradients": training examples from the update a federated client sent (Zhu et al. 2019,
  "Deep Leakage from Gradients"; Zhao et al. 2020, iDLG; Geiping et al. 2020, "Inverting
  Gradients"; analytic recovery from a fully connected layer). The attacker is the
  honest-but-curious server: a `Target` at `updates` access, carrying the observed updates
  (`privacylab.federated.ObservedUpdate`), and a `GradientTask` holding what else it knows
  (labels, BatchNorm statistics, the clients' local procedure: `SIDE_INFORMATION`), never the
  client's data. It returns a `Reconstruction`; `run_reconstruction` matches it with the true
  batch (`GradientTruth`) only afterwards and scores it in [0, 1] pixel space
  (`privacylab.stats.images`), building `ReconstructionResult`.
- "model": class representatives from a model's scores (Fredrikson et al. 2015, MI-Face).
- "property": a global property of the training set from the model (Ganju et al. 2018).

The attacker's replay of a client is `privacylab.federated.local_update` with
`create_graph=True`: the very function the simulated clients run.
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
from privacylab.attacks.core import number_option as core_number
from privacylab.attacks.core import whole_option as core_whole
from privacylab.errors import PrivacylabError
from privacylab.federated import LocalTraining, ObservedUpdate, local_update
from privacylab.federated.clients import split_evenly, weighted_mean
from privacylab.registry import Registry
from privacylab.stats.images import image_scores, label_accuracy
from privacylab.target import Access, Target

__all__ = [
    "INVERSION_ATTACKS",
    "KINDS",
    "SIDE_INFORMATION",
    "GradientAttack",
    "GradientTask",
    "GradientTruth",
    "InversionAttack",
    "InversionError",
    "Reconstruction",
    "ReconstructionResult",
    "client_steps",
    "inversion_class",
    "inversion_names",
    "make_inversion",
    "moved",
    "non_smooth_layer",
    "number_option",
    "register_inversion",
    "replay",
    "run_reconstruction",
    "whole_option",
]

KINDS = ("gradients", "model", "property")

SIDE_INFORMATION = ("labels", "bn-statistics", "local-training")
"""What a gradient task may give beyond the observed update: `labels`, the client's labels
(else the attack recovers them); `bn-statistics`, the batch's BatchNorm means and variances
(Geiping et al. 2020 and Yin et al. 2021 assume them; our zoo has no BatchNorm, so no attack
here needs them); `local-training`, the clients' local procedure (epochs, local batch size,
step size), without which a multi-step FedAvg update cannot be replayed."""


class InversionError(PrivacylabError, ValueError):
    """A reconstruction attack cannot run on this target or task; one line."""


def whole_option(attack: str, name: str, value: object, low: int = 1) -> int:
    """`value` as a whole number >= `low`, else a one-line InversionError (bools refused)."""
    return core_whole(InversionError, attack, name, value, low)


def number_option(attack: str, name: str, value: object, *, zero: bool = False) -> float:
    """`value` as a finite number > 0 (>= 0 with `zero`), else a one-line InversionError."""
    return core_number(InversionError, attack, name, value, zero=zero)


class InversionAttack(Attack[Any, Any]):
    """An attack of this family: `kind` says which task it takes ("gradients", "model",
    "property"); `paper` names what it follows."""

    name: ClassVar[str]
    kind: ClassVar[str] = "gradients"
    threat_model: ClassVar[ThreatModel]
    paper: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()


INVERSION_ATTACKS: Registry[type[InversionAttack]] = Registry(
    "reconstruction method", error=InversionError
)
"""Every reconstruction attack class by name (and its aliases), of all three kinds."""


def register_inversion(name: str) -> Callable[[type[InversionAttack]], type[InversionAttack]]:
    """Class decorator: make an attack buildable by `make_inversion(name, **options)`."""

    def decorate(cls: type[InversionAttack]) -> type[InversionAttack]:
        if cls.kind not in KINDS:
            raise InversionError(f"{name}: kind must be one of {', '.join(KINDS)}")
        cls.name = name
        return INVERSION_ATTACKS.register(name, cls, aliases=tuple(getattr(cls, "aliases", ())))

    return decorate


def inversion_names(kind: str | None = None) -> list[str]:
    """Registered reconstruction attacks (of `kind`, if given), sorted."""
    return sorted(n for n, c in INVERSION_ATTACKS.items() if kind is None or c.kind == kind)


def inversion_class(name: str, kind: str | None = None) -> type[InversionAttack]:
    """The class registered as `name`, or InversionError naming the choices (of `kind`)."""
    cls = INVERSION_ATTACKS.get(name)
    if kind is not None and cls.kind != kind:
        raise InversionError(
            f"{name} is a {cls.kind} attack; choose one of {', '.join(inversion_names(kind))}"
        )
    return cls


def make_inversion(name: str, kind: str | None = None, **options: Any) -> InversionAttack:
    """The registered attack `name` built with `options`, or InversionError."""
    return inversion_class(name, kind)(**options)


# ---------------------------------------------------------------------------------------------
# gradient inversion


@dataclass(eq=False)
class GradientTask:
    """The server's knowledge beyond the update. `input_shape`, `num_classes`: the model's
    input and output (the server built the model). `update`: which observed update to attack
    (index into `target.updates`). `bounds`: the pixel range (low, high) of the data.
    `labels`: the client's labels (side information "labels"). `bn_statistics`: per BatchNorm
    layer (mean, var) of the client's batch ("bn-statistics"). `local_training`: the clients'
    procedure ("local-training"; the update also carries it, but an attack that does not
    declare it must not use it). `seed` seeds the dummy data."""

    input_shape: tuple[int, ...]
    num_classes: int
    update: int = 0
    bounds: tuple[float, float] = (0.0, 1.0)
    labels: Tensor | None = None
    bn_statistics: dict[str, tuple[Tensor, Tensor]] | None = None
    local_training: LocalTraining | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        shape = tuple(self.input_shape)
        if not shape or any(isinstance(s, bool) or int(s) != s or s < 1 for s in shape):
            raise InversionError(f"input_shape must be whole numbers >= 1, got {shape!r}")
        self.input_shape = tuple(int(s) for s in shape)
        self.num_classes = whole_option("task", "num_classes", self.num_classes, 2)
        self.update = whole_option("task", "update", self.update, 0)
        self.seed = whole_option("task", "seed", self.seed, 0)
        low, high = (float(b) for b in self.bounds)
        if not (np.isfinite(low) and np.isfinite(high) and low < high):
            raise InversionError(f"bounds must be finite with low < high, got {self.bounds!r}")
        self.bounds = (low, high)
        if self.labels is not None:
            labels = torch.as_tensor(self.labels).long().reshape(-1)
            if labels.numel() and (labels.min() < 0 or labels.max() >= self.num_classes):
                raise InversionError(f"labels must lie in 0..{self.num_classes - 1}")
            self.labels = labels

    def restricted_to(self, side_information: Iterable[str]) -> GradientTask:
        """The task without the side information not named."""
        side = set(side_information)
        unknown = sorted(side - set(SIDE_INFORMATION))
        if unknown:
            raise InversionError(
                f"unknown side information {', '.join(unknown)}; "
                f"choose from {', '.join(SIDE_INFORMATION)}"
            )
        return replace(
            self,
            labels=self.labels if "labels" in side else None,
            bn_statistics=self.bn_statistics if "bn-statistics" in side else None,
            local_training=self.local_training if "local-training" in side else None,
        )


@dataclass
class Reconstruction:
    """What a gradient attack returns. `x`: the reconstructed batch (n, *input_shape) within
    the task's bounds, in the attack's order. `labels`: the labels it recovered or used (n,),
    or None. `initial`: the dummy data the kept run started from (the no-information
    baseline). `loss`: the kept run's final objective. `history`: (iteration, objective) of
    the kept run. `snapshots`: (iteration, x) for the picture over iterations. `restarts`:
    the final objective of every restart. `params`: settings and diagnostics."""

    x: Tensor
    labels: Tensor | None = None
    initial: Tensor | None = None
    loss: float = float("nan")
    history: list[tuple[int, float]] = field(default_factory=list)
    snapshots: list[tuple[int, Tensor]] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class GradientTruth:
    """What only the evaluator knows: the client's batch `x` (n, *input_shape) and labels
    `y` (n,) behind the attacked update."""

    x: Tensor
    y: Tensor


@dataclass
class ReconstructionResult:
    """One gradient-inversion attack on one observed update: the family's result type.

    `mse`, `psnr`, `ssim`: means over the batch after matching (`stats.images`), in [0, 1]
    pixel space; `per_example` the matched per-image scores; `order` the matching;
    `label_accuracy` the share of labels recovered (multisets; NaN when the attack returns
    none); `baseline_psnr` the PSNR of the dummy initialisation, matched to the batch the same
    way (what no leakage gives; NaN for an attack without one);
    `queries` the forward passes it ran through the target's model; `defense` the update
    defence (its spec; set by the caller). `x`, `truth` are kept for pictures, not in
    `to_dict`."""

    method: str
    access: str
    queries: int
    seconds: float
    batch_size: int
    mse: float
    psnr: float
    ssim: float
    label_accuracy: float
    baseline_psnr: float
    per_example: list[dict[str, float]]
    order: list[int]
    loss: float
    history: list[tuple[int, float]] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    defense: str | None = None
    x: Tensor | None = field(default=None, repr=False, compare=False)
    truth: Tensor | None = field(default=None, repr=False, compare=False)
    labels: Tensor | None = field(default=None, repr=False, compare=False)
    true_labels: Tensor | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form with the issue's keys at the top level (`method`, `psnr`, `ssim`,
        `mse`, `label_accuracy`, `batch_size`, `defense`)."""
        return {
            "method": self.method,
            "psnr": self.psnr,
            "ssim": self.ssim,
            "mse": self.mse,
            "label_accuracy": self.label_accuracy,
            "batch_size": self.batch_size,
            "defense": self.defense,
            "baseline_psnr": self.baseline_psnr,
            "access": self.access,
            "queries": self.queries,
            "seconds": self.seconds,
            "loss": self.loss,
            "per_example": self.per_example,
            "order": self.order,
            "restarts": self.restarts,
            "history": [[int(i), float(v)] for i, v in self.history],
            "params": self.params,
        }


class GradientAttack(InversionAttack):
    """A gradient-inversion attack: configured in the constructor, run by `reconstruct`.
    `needs_smooth` says it differentiates through the activations' second derivatives
    (DLG-style matching of gradients under L-BFGS; Zhu et al. 2019 replace ReLU by sigmoid)
    and refuses a model with ReLU-like activations."""

    kind: ClassVar[str] = "gradients"
    needs_smooth: ClassVar[bool] = False

    @abstractmethod
    def reconstruct(self, target: Target, task: GradientTask) -> Reconstruction:
        """The reconstructed batch, using only `target` and `task`."""

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        """One-line InversionError when this attack cannot run on `model`: one that needs
        second derivatives refuses a piecewise-linear activation, naming the layer."""
        if cls.needs_smooth:
            layer = non_smooth_layer(model)
            if layer is not None:
                raise InversionError(
                    f"{cls.name} needs twice-differentiable activations (sigmoid, tanh) but "
                    f"layer {layer} is piecewise linear; use ig, or a sigmoid model"
                )

    def run(self, target: Target, task: GradientTask) -> Reconstruction:
        """The core's entry point: `check_model`, then `reconstruct`."""
        self.check_model(target.model)
        return self.reconstruct(target, task)

    def observed(self, target: Target, task: GradientTask) -> ObservedUpdate:
        """The update the task points at, or InversionError."""
        updates = target.updates
        if not 0 <= task.update < len(updates):
            raise InversionError(
                f"update {task.update} was not observed; the target carries {len(updates)}"
            )
        return updates[task.update]

    def training(self, update: ObservedUpdate, task: GradientTask) -> LocalTraining:
        """The local procedure to replay: FedSGD needs nothing more; a FedAvg update needs the
        task's `local_training` (declared side information), else InversionError."""
        if update.training.algorithm == "fedsgd":
            return update.training
        if task.local_training is None:
            raise InversionError(
                f"{self.name} cannot replay a multi-step FedAvg update without knowing the "
                "clients' local training (side information 'local-training')"
            )
        return task.local_training


PIECEWISE_LINEAR = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.ReLU6,
    nn.RReLU,
    nn.PReLU,
    nn.Hardtanh,
    nn.Hardsigmoid,
    nn.Hardshrink,
    nn.Softshrink,
    nn.Threshold,
)
"""Activations whose second derivative is zero almost everywhere (ReLU6 and Hardtanh share
a base class; listed for the reader). Max-pooling is piecewise linear too but only routes
values, so it is not here."""


def non_smooth_layer(model: nn.Module) -> str | None:
    """The first activation of `model` in `PIECEWISE_LINEAR`, as "'name' (Type)", or None
    when every activation is smooth."""
    for name, module in model.named_modules():
        if isinstance(module, PIECEWISE_LINEAR):
            return f"'{name.removeprefix('inner.')}' ({type(module).__name__})"
    return None


def moved(update: ObservedUpdate, device: torch.device, dtype: torch.dtype) -> ObservedUpdate:
    """`update` with its state and update detached on `device` in `dtype` (the target
    model's), for an attack that replays it."""
    return replace(
        update,
        state={k: v.detach().to(device=device, dtype=dtype) for k, v in update.state.items()},
        update={k: v.detach().to(device=device, dtype=dtype) for k, v in update.update.items()},
    )


def client_steps(update: ObservedUpdate, training: LocalTraining) -> int:
    """The local steps each client behind `update` took: on all its rows, or under secure
    aggregation on its share of them (rows cut near-evenly among the k clients, the largest
    share)."""
    rows = update.num_examples
    if update.aggregated:
        rows = -(-rows // max(1, len(update.clients)))
    return training.steps(rows)


def replay(
    model: nn.Module, update: ObservedUpdate, x: Tensor, y: Tensor, training: LocalTraining
) -> dict[str, Tensor]:
    """The update a client holding (`x`, `y`) would have sent from `update.state`,
    differentiable in `x` and `y` (soft labels allowed): the attacker's side of
    `federated.local_update`. A securely aggregated FedAvg update is replayed as the protocol
    made it: the rows cut in order among its k clients (`split_evenly`), each client's local
    steps on its own rows, then the example-weighted mean (`weighted_mean`); for FedSGD that
    mean is the gradient over all rows, one call."""
    clients = len(update.clients)
    if not update.aggregated or clients < 2 or training.algorithm == "fedsgd":
        return local_update(model, update.state, x, y, training, create_graph=True)
    parts = split_evenly(int(x.shape[0]), clients)
    deltas = [
        local_update(model, update.state, x[rows], y[rows], training, create_graph=True)
        for rows in map(torch.as_tensor, parts)
    ]
    return weighted_mean(deltas, [len(rows) for rows in parts])


def run_reconstruction(
    attack: GradientAttack, target: Target, task: GradientTask, truth: GradientTruth
) -> ReconstructionResult:
    """Run `attack` on `target` (updates access) with the task narrowed to its declared side
    information, then score the reconstruction against `truth`, which the attack never sees."""
    target.require(Access.UPDATES)
    narrowed = task.restricted_to(attack.threat_model.side_information)
    done = execute(attack, target, narrowed)
    rec: Reconstruction = done.output
    true_x = torch.as_tensor(truth.x).detach().cpu()
    rec_x = rec.x.detach().cpu()
    if tuple(rec_x.shape) != tuple(true_x.shape):
        raise InversionError(
            f"{attack.name} returned {tuple(rec_x.shape)} images for a batch of "
            f"{tuple(true_x.shape)}"
        )
    scores = image_scores(rec_x.numpy(), true_x.numpy(), task.bounds)
    labels = None if rec.labels is None else rec.labels.detach().cpu().long()
    accuracy = float("nan") if labels is None else label_accuracy(labels.numpy(), truth.y)
    baseline = float("nan")
    if rec.initial is not None and tuple(rec.initial.shape) == tuple(true_x.shape):
        initial = rec.initial.detach().cpu().numpy()
        baseline = float(image_scores(initial, true_x.numpy(), task.bounds)["psnr"])  # type: ignore[arg-type]
    return ReconstructionResult(
        method=attack.name,
        access=done.access.value,
        queries=done.queries,
        seconds=done.seconds,
        batch_size=int(true_x.shape[0]),
        mse=float(scores["mse"]),  # type: ignore[arg-type]
        psnr=float(scores["psnr"]),  # type: ignore[arg-type]
        ssim=float(scores["ssim"]),  # type: ignore[arg-type]
        label_accuracy=accuracy,
        baseline_psnr=baseline,
        per_example=scores["per_example"],  # type: ignore[arg-type]
        order=scores["order"],  # type: ignore[arg-type]
        loss=float(rec.loss),
        history=list(rec.history),
        restarts=list(rec.restarts),
        params=dict(rec.params),
        x=rec_x,
        truth=true_x,
        labels=labels,
        true_labels=torch.as_tensor(truth.y).long(),
    )
