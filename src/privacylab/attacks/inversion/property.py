"""Property inference: a global property of a model's training set, read from the model.

Ganju, Wang, Yang, Gunter & Borisov 2018, "Property Inference Attacks on Fully Connected
Neural Networks using Permutation Invariant Representations" (CCS), Sec. 4 (after Ateniese et
al. 2015). The attacker knows the architecture and the training recipe (Kerckhoffs) and owns a
data pool disjoint from the target's training rows. It draws training sets from its pool in
two worlds — without the property (world 0) and with it (world 1) — trains shadow models on
them exactly as the target was trained, and fits a meta-classifier that reads a model and says
which world it came from (their Alg. 1). The meta-classifier is then applied to the target.

Two meta-classifiers:

- `property-whitebox` (white-box access): the permutation-invariant network of Ganju et al.,
  Sec. 4.2, Fig. 3, Eq. 4-5 (a DeepSets network, Zaheer et al. 2017, per layer). Each neuron i
  of hidden layer l is represented by n_{l,i} = phi_l([w_{l,i}, b_{l,i}] ⊕ N_{l-1}) where
  N_{l-1} = sum_j n_{l-1,j} is the previous layer's representation, and the layer's
  representation is N_l = sum_i n_{l,i}; rho([N_1, ..., N_L]) gives the logit of world 1.
  The first layer's incoming weights are indexed by input features, which have a fixed order,
  so w_{1,i} is used as it is. A deeper layer's incoming weights are indexed by the previous
  layer's neurons, whose order is arbitrary; to make the representation exactly invariant to
  every hidden layer's permutation (which Eq. 4 is not when w_{l,i} is taken raw), neuron i of
  layer l >= 2 reads its incoming weights as the sorted vector sort(w_{l,i}) and the
  aligned sum sum_j w_{l,ij} n_{l-1,j} (its weights applied to the previous neurons'
  representations), beside b_{l,i} and N_{l-1}. The output layer's neurons are the classes,
  whose order is meaningful: they are represented the same way but kept in class order
  (concatenated, not summed) for rho. Refuses anything but a stack of Linear layers and
  element-wise activations, naming the layer.
- `property-blackbox` (scores access): the target's probability vectors on a fixed query set
  the attacker draws from its pool and keeps out of every shadow's training set
  (`shadow_positions`; every query counted), with their mean, into a logistic
  regression (sklearn; the meta-classifier of Ateniese et al. 2015 on outputs rather than
  weights).

Properties are registered by name (`PROPERTIES`, `parse_property`): `class-share:C:LOW:HIGH`
(class C makes up LOW of a training set in world 0 and HIGH in world 1) and `row-parity`, a
control the training data does not vary in (see `RowParity`).

`run_property_inference` fits the meta-classifier once (timed), scores every evaluation target
through `execute` (its queries counted), and only then compares with the targets' true worlds,
building `PropertyResult` (accuracy, AUC from `privacylab.stats.roc_auc`, chance, a
Clopper-Pearson interval and a binomial p-value against chance).
"""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.core import ThreatModel, execute
from privacylab.attacks.inversion.base import InversionAttack, InversionError, register_inversion
from privacylab.models import ModelSpec
from privacylab.registry import Registry
from privacylab.stats import clopper_pearson, roc_auc
from privacylab.target import Access, Target
from privacylab.training import TrainConfig, train

__all__ = [
    "PROPERTIES",
    "BlackBoxProperty",
    "ClassShare",
    "PermutationInvariantMeta",
    "Property",
    "PropertyAttack",
    "PropertyResult",
    "PropertyTask",
    "RowParity",
    "WhiteBoxProperty",
    "dense_layers",
    "draw_training_sets",
    "parse_property",
    "property_names",
    "query_positions",
    "run_property_inference",
    "shadow_positions",
    "split_pools",
    "train_property_model",
    "train_shadows",
]

WORLDS = (0, 1)


# ---------------------------------------------------------------------------------------------
# properties


class Property:
    """A property of a training set: `draw` picks a training set of `size` rows from a pool's
    labels in `world` 0 (without) or 1 (with). `spec` is the canonical text form."""

    name: ClassVar[str]
    spec: str
    description: str

    @abstractmethod
    def draw(
        self, labels: np.ndarray, size: int, world: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Positions into the pool (`labels` are its labels) of one training set of `size`
        rows in `world`; InversionError when the pool cannot supply them."""

    def share(self, labels: np.ndarray) -> float | None:
        """The property's measured value on a training set's labels (None when it has none)."""
        return None

    def check(self, num_classes: int) -> None:
        """InversionError when the property cannot hold for a dataset of `num_classes`."""


PROPERTIES: Registry[Callable[..., Property]] = Registry("property", error=InversionError)
"""Property builders by name: `builder(*fields)` from the spec's ':'-separated fields."""


def _fraction(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InversionError(f"{spec}: {what} must be a number in [0, 1], got {text!r}") from None
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InversionError(f"{spec}: {what} must be a number in [0, 1], got {text!r}")
    return value


class ClassShare(Property):
    """`class-share:C:LOW:HIGH`: class C makes up round(LOW·n) of a training set of n rows in
    world 0 and round(HIGH·n) in world 1; the other rows are drawn uniformly from the other
    classes (Ganju et al. 2018, Sec. 5: a share of the training set with some attribute).
    """

    name = "class-share"

    def __init__(self, cls: int, low: float, high: float) -> None:
        if low == high:
            raise InversionError(f"class-share:{cls}: LOW and HIGH must differ, both are {low:g}")
        self.cls, self.low, self.high = int(cls), float(low), float(high)
        self.spec = f"class-share:{self.cls}:{self.low:g}:{self.high:g}"
        self.description = (
            f"share of class {self.cls} in the training set: {self.low:g} (world 0) "
            f"vs {self.high:g} (world 1)"
        )

    def draw(
        self, labels: np.ndarray, size: int, world: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Without replacement: round(share·size) rows of class C, the rest of other classes."""
        share = self.high if world == 1 else self.low
        inside = np.flatnonzero(labels == self.cls)
        outside = np.flatnonzero(labels != self.cls)
        k = round(share * size)
        if k > len(inside) or size - k > len(outside):
            raise InversionError(
                f"{self.spec}: a training set of {size} rows needs {k} rows of class "
                f"{self.cls} and {size - k} others, but the pool has {len(inside)} and "
                f"{len(outside)}; use a smaller training set"
            )
        rows = np.concatenate(
            [rng.choice(inside, k, replace=False), rng.choice(outside, size - k, replace=False)]
        )
        return rng.permutation(rows)

    def check(self, num_classes: int) -> None:
        """Class C must be one of the dataset's classes."""
        if self.cls >= num_classes:
            raise InversionError(
                f"{self.spec}: the dataset has classes 0..{num_classes - 1}, not {self.cls}"
            )

    def share(self, labels: np.ndarray) -> float | None:
        """The measured share of class C."""
        return float(np.mean(np.asarray(labels) == self.cls)) if len(labels) else None


class RowParity(Property):
    """`row-parity`: a control property the training data does not vary in. For each
    training set the pool is put in a fresh random order (from the draw's own generator) and
    world 0 draws from its even positions, world 1 from its odd ones. Either way the set is a
    uniform random subset of one pool, independent of the world: a model carries no signal of
    its world, and a sound attack stays at chance, its correct count Binomial(n, 1/2).

    (A parity fixed once for the pool would not do: every world-0 model would then train on
    rows of one half-pool, the models of a world would share rows and their scores would be
    correlated, so a meta-classifier's accuracy over n targets would not be binomial.)"""

    name = "row-parity"
    spec = "row-parity"
    description = "even (world 0) vs odd (world 1) positions of a freshly shuffled pool"

    def draw(
        self, labels: np.ndarray, size: int, world: int, rng: np.random.Generator
    ) -> np.ndarray:
        """`size` rows without replacement from the world's half of the shuffled pool."""
        half = rng.permutation(len(labels))[world::2]
        if size > len(half):
            raise InversionError(
                f"row-parity: a training set of {size} rows needs that many rows in each half "
                f"of the pool, which has {len(half)}; use a smaller training set"
            )
        return rng.choice(half, size, replace=False)


def _class_share(*fields: str) -> Property:
    if len(fields) != 3:
        raise InversionError(
            f"class-share takes C:LOW:HIGH (e.g. class-share:0:0.1:0.5), got {':'.join(fields)!r}"
        )
    try:
        cls = int(fields[0])
    except ValueError:
        raise InversionError(f"class-share: C must be a class index, got {fields[0]!r}") from None
    if cls < 0:
        raise InversionError(f"class-share: C must be a class index >= 0, got {cls}")
    spec = "class-share:" + ":".join(fields)
    return ClassShare(cls, _fraction(fields[1], "LOW", spec), _fraction(fields[2], "HIGH", spec))


def _row_parity(*fields: str) -> Property:
    if fields:
        raise InversionError(f"row-parity takes no parameters, got {':'.join(fields)!r}")
    return RowParity()


PROPERTIES.register("class-share", _class_share)
PROPERTIES.register("row-parity", _row_parity)


def property_names() -> list[str]:
    """Registered property names, sorted."""
    return sorted(PROPERTIES.names())


def parse_property(spec: str | Property) -> Property:
    """The property a spec names (`class-share:0:0.1:0.5`, `row-parity`), or one-line
    InversionError naming the choices."""
    if isinstance(spec, Property):
        return spec
    text = str(spec).strip()
    if not text:
        raise InversionError(f"empty property; choose one of {', '.join(property_names())}")
    name, *fields = text.split(":")
    return PROPERTIES.get(name)(*[f.strip() for f in fields])


# ---------------------------------------------------------------------------------------------
# data and shadow models


def split_pools(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a dataset of `n` rows split in two disjoint halves by a seeded permutation:
    (the attacker's pool, the pool the targets' owners draw their training sets from)."""
    if n < 4:
        raise InversionError(f"a dataset of {n} rows is too small to split into two pools")
    order = np.random.default_rng([seed, 7]).permutation(n)
    half = n // 2
    return np.sort(order[:half]), np.sort(order[half:])


def draw_training_sets(
    prop: Property, labels: np.ndarray, size: int, count: int, seed: int, stream: int
) -> list[tuple[int, int, np.ndarray, int]]:
    """`count` training sets per world drawn from a pool with `labels`: a list of
    (world, index, pool positions, model seed), world 0 first; `stream` separates the
    attacker's draws (0) from the owners' (1)."""
    if count < 1:
        raise InversionError(f"need >= 1 model per world, got {count}")
    if size < 1:
        raise InversionError(f"a training set needs >= 1 row, got {size}")
    out = []
    for world in WORLDS:
        for index in range(count):
            rng = np.random.default_rng([seed, stream, world, index])
            rows = prop.draw(np.asarray(labels), size, world, rng)
            model_seed = int(
                np.random.default_rng([seed, stream, world, index, 1]).integers(2**31 - 1)
            )
            out.append((world, index, rows, model_seed))
    return out


def query_positions(n: int, queries: int, seed: int) -> np.ndarray:
    """The black-box query set: `queries` of a pool's `n` positions (seeded, without
    replacement, sorted); InversionError when it would leave no row to train shadows on."""
    if not 1 <= queries < n:
        raise InversionError(
            f"a query set of {queries} rows needs an attacker's pool of more rows, which has {n}; "
            "use fewer queries"
        )
    return np.sort(np.random.default_rng([seed, 3]).choice(n, queries, replace=False))


def shadow_positions(n: int, queries: int, seed: int) -> np.ndarray:
    """Pool positions the shadows train on: all but the query set. The targets never train on
    the query rows (they come from the attacker's pool), so neither may the shadows: a query
    row in a shadow's training set would give its answers a membership signal (more often in
    the world that oversamples the row's class) that no target's answers carry."""
    return np.setdiff1d(np.arange(n), query_positions(n, queries, seed))


def train_property_model(
    spec: ModelSpec,
    training: dict[str, Any],
    x: Tensor,
    y: Tensor,
    seed: int,
    device: str = "cpu",
) -> tuple[nn.Module, float]:
    """One model built from `spec` (seeded) and trained by the project's trainer with the
    recipe `training` (`TrainConfig` fields) on (x, y): (model in eval mode, train accuracy)."""
    config = TrainConfig.from_dict({**training, "seed": int(seed), "device": device})
    model = spec.build(seed=int(seed))
    result = train(model, (x, y), config)
    model.eval()
    return model, float(result.history[-1].train_accuracy or 0.0)


@dataclass(eq=False)
class PropertyTask:
    """What the property-inference attacker knows (Ganju et al. 2018, Sec. 3: the adversary
    knows the architecture and the training algorithm and has data of the distribution).

    `pool_x`, `pool_y`: its own labelled rows, disjoint from the target's training rows.
    `architecture`: the target's `ModelSpec`. `training`: the target's training recipe
    (`TrainConfig` fields). `property`: what it infers (a `Property` or its spec).
    `shadows`: shadow models per world. `train_size`: rows per training set. `queries`:
    size of the black-box query set drawn from the pool. `seed` seeds everything.
    `shadow_models`, `shadow_worlds`: shadows already trained (e.g. durably by
    `privacylab.infer_property`), else the attack trains them (`train_shadows`)."""

    pool_x: Tensor
    pool_y: Tensor
    architecture: ModelSpec
    training: dict[str, Any]
    property: Property | str
    shadows: int = 8
    train_size: int = 200
    queries: int = 64
    seed: int = 0
    device: str = "cpu"
    shadow_models: list[nn.Module] | None = None
    shadow_worlds: list[int] | None = None

    def __post_init__(self) -> None:
        self.property = parse_property(self.property)
        self.pool_x = torch.as_tensor(self.pool_x).float()
        self.pool_y = torch.as_tensor(self.pool_y).long().reshape(-1)
        if len(self.pool_x) != len(self.pool_y) or len(self.pool_y) == 0:
            raise InversionError(
                f"the pool needs as many labels as rows (>= 1), got {len(self.pool_x)} rows "
                f"and {len(self.pool_y)} labels"
            )
        for name in ("shadows", "train_size", "queries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InversionError(f"{name} must be a whole number >= 1, got {value!r}")
        query_positions(len(self.pool_y), self.queries, self.seed)
        if (self.shadow_models is None) != (self.shadow_worlds is None):
            raise InversionError("give shadow_models and shadow_worlds together")
        if self.shadow_models is not None:
            worlds = [int(w) for w in self.shadow_worlds or []]
            if len(worlds) != len(self.shadow_models) or set(worlds) != set(WORLDS):
                raise InversionError(
                    "shadow_worlds must give 0 or 1 for every shadow model, both worlds present"
                )
            self.shadow_worlds = worlds

    @property
    def prop(self) -> Property:
        """The parsed property."""
        assert isinstance(self.property, Property)
        return self.property

    def plan(self) -> list[tuple[int, int, np.ndarray, int]]:
        """The attacker's shadow training sets, drawn from its pool less the query set
        (`shadow_positions`): (world, index, pool positions, model seed)."""
        free = shadow_positions(len(self.pool_y), self.queries, self.seed)
        sets = draw_training_sets(
            self.prop, self.pool_y.numpy()[free], self.train_size, self.shadows, self.seed, 0
        )
        return [(w, i, free[rows], seed) for w, i, rows, seed in sets]

    def query_rows(self) -> np.ndarray:
        """The black-box query set: `queries` pool positions (`query_positions`)."""
        return query_positions(len(self.pool_y), self.queries, self.seed)

    def query_inputs(self) -> Tensor:
        """The black-box query set's rows of the pool (`query_rows`)."""
        return self.pool_x[torch.as_tensor(self.query_rows(), dtype=torch.long)]


def train_shadows(task: PropertyTask) -> tuple[list[nn.Module], list[int]]:
    """The task's shadow models and their worlds: as given, or trained here in order."""
    if task.shadow_models is not None:
        return list(task.shadow_models), list(task.shadow_worlds or [])
    models, worlds = [], []
    for world, _, rows, seed in task.plan():
        index = torch.as_tensor(rows, dtype=torch.long)
        model, _ = train_property_model(
            task.architecture,
            task.training,
            task.pool_x[index],
            task.pool_y[index],
            seed,
            task.device,
        )
        models.append(model)
        worlds.append(world)
    return models, worlds


# ---------------------------------------------------------------------------------------------
# the white-box meta-classifier

ELEMENTWISE = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.GELU,
    nn.ELU,
    nn.SiLU,
    nn.Softplus,
    nn.Identity,
    nn.Dropout,
    nn.Flatten,
    nn.Sequential,
)


def _plain(model: nn.Module) -> nn.Module:
    inner = getattr(model, "inner", None)
    return inner if isinstance(inner, nn.Module) else model


def dense_layers(model: nn.Module) -> list[nn.Linear]:
    """The Linear layers of a fully connected network, input to output, or InversionError
    naming the first layer that is neither Linear nor element-wise (a convolution, a norm)."""
    plain = _plain(model)
    layers: list[nn.Linear] = []
    for name, module in plain.named_modules():
        if isinstance(module, nn.Linear):
            layers.append(module)
        elif isinstance(module, ELEMENTWISE):
            continue
        elif module is plain:
            raise InversionError(
                f"property-whitebox reads fully connected networks (nn.Sequential of Linear "
                f"layers) only, not {type(module).__name__}; use property-blackbox"
            )
        else:
            raise InversionError(
                f"property-whitebox reads fully connected networks only; layer '{name}' "
                f"({type(module).__name__}) is not Linear; use property-blackbox"
            )
    if len(layers) < 2:
        raise InversionError(
            f"property-whitebox needs a network with a hidden layer, got {len(layers)} Linear"
        )
    for a, b in pairwise(layers):
        if a.out_features != b.in_features:
            raise InversionError("property-whitebox: the Linear layers are not a chain")
    return layers


def _parameters(model: nn.Module) -> list[tuple[Tensor, Tensor]]:
    """(weight (out, in), bias (out,)) of every Linear layer, detached, float32, on CPU."""
    out = []
    for layer in dense_layers(model):
        bias = layer.bias if layer.bias is not None else torch.zeros(layer.out_features)
        out.append((layer.weight.detach().float().cpu(), bias.detach().float().cpu()))
    return out


def _mlp(sizes: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class PermutationInvariantMeta(nn.Module):
    """Ganju et al. 2018's meta-classifier (Sec. 4.2, Fig. 3, Eq. 4-5), exactly invariant to
    the order of every hidden layer's neurons (see the module docstring for the reading of a
    deeper layer's incoming weights). `shapes`: (out, in) of each Linear layer of the
    networks it reads. Input: per layer (weights (M, out, in), biases (M, out)) of M
    networks. Output: (M,) logits of world 1."""

    def __init__(self, shapes: Sequence[tuple[int, int]], width: int = 32, dim: int = 8) -> None:
        super().__init__()
        self.shapes = [tuple(int(s) for s in shape) for shape in shapes]
        self.dim = dim
        phis = []
        for position, (_, fan_in) in enumerate(self.shapes):
            size = fan_in + 1 if position == 0 else 1 + fan_in + 2 * dim
            phis.append(_mlp((size, width, dim)))
        self.phis = nn.ModuleList(phis)
        hidden = dim * (len(self.shapes) - 1)
        classes = self.shapes[-1][0] * dim
        self.rho = _mlp((hidden + classes, width, 1))

    def forward(self, params: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        """Logits of world 1, one per network."""
        previous: Tensor | None = None
        summed: Tensor | None = None
        layers = []
        for position, ((weight, bias), phi) in enumerate(zip(params, self.phis, strict=True)):
            if previous is None or summed is None:
                rep = torch.cat([weight, bias.unsqueeze(-1)], -1)
            else:
                aligned = torch.bmm(weight, previous)
                ordered = torch.sort(weight, dim=-1).values
                context = summed.unsqueeze(1).expand(-1, weight.shape[1], -1)
                rep = torch.cat([bias.unsqueeze(-1), ordered, aligned, context], -1)
            nodes = torch.relu(phi(rep))
            if position == len(self.phis) - 1:
                layers.append(nodes.flatten(1))
            else:
                summed = nodes.sum(1)
                layers.append(summed)
            previous = nodes
        return self.rho(torch.cat(layers, -1)).squeeze(-1)


def _stack(params: Sequence[list[tuple[Tensor, Tensor]]]) -> list[tuple[Tensor, Tensor]]:
    return [
        (torch.stack([p[k][0] for p in params]), torch.stack([p[k][1] for p in params]))
        for k in range(len(params[0]))
    ]


# ---------------------------------------------------------------------------------------------
# attacks


class PropertyAttack(InversionAttack):
    """A property-inference attack: `fit(task)` trains (or takes) the shadow models and fits
    the meta-classifier once; `run(target, task)` returns the target's probability of world 1.
    `shadow_features` / `target_features` are what the meta-classifier reads."""

    kind: ClassVar[str] = "property"
    paper: ClassVar[str] = "Ganju et al. 2018, Property Inference Attacks on Fully Connected NNs"

    def __init__(self) -> None:
        self._fitted_for: PropertyTask | None = None
        self.fit_seconds = 0.0
        self.meta_train_accuracy = float("nan")
        self.shadow_count = 0

    def fit(self, task: PropertyTask) -> PropertyAttack:
        """Train the shadows (unless the task holds them) and the meta-classifier."""
        start = time.perf_counter()
        models, worlds = train_shadows(task)
        self._fit(models, np.asarray(worlds, dtype=np.int64), task)
        self._fitted_for = task
        self.shadow_count = len(models)
        self.fit_seconds = time.perf_counter() - start
        return self

    def run(self, target: Target, task: PropertyTask) -> float:
        """The target's probability of world 1 (the meta-classifier is fitted on first use)."""
        if self._fitted_for is not task:
            self.fit(task)
        return float(self._score(target, task))

    @abstractmethod
    def _fit(self, models: list[nn.Module], worlds: np.ndarray, task: PropertyTask) -> None: ...

    @abstractmethod
    def _score(self, target: Target, task: PropertyTask) -> float: ...

    def params(self) -> dict[str, Any]:
        """Settings and diagnostics for the result."""
        return {
            "shadows": self.shadow_count,
            "fit_seconds": self.fit_seconds,
            "meta_train_accuracy": self.meta_train_accuracy,
        }


@register_inversion("property-whitebox")
class WhiteBoxProperty(PropertyAttack):
    """Ganju et al. 2018's attack with the permutation-invariant meta-classifier (Sec. 4.2)
    on the target's weights. Options: `width`, `dim` of the phi/rho networks, `epochs` of
    full-batch Adam at `lr` with `weight_decay`, `seed`."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(
        Access.WHITEBOX, ("pool", "architecture", "training", "property")
    )
    aliases: ClassVar[tuple[str, ...]] = ("ganju",)

    def __init__(
        self,
        width: int = 32,
        dim: int = 8,
        epochs: int = 300,
        lr: float = 1e-2,
        weight_decay: float = 1e-3,
        seed: int = 0,
    ) -> None:
        super().__init__()
        for name, value in (("width", width), ("dim", dim), ("epochs", epochs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InversionError(f"property-whitebox: {name} must be >= 1, got {value!r}")
        if not (math.isfinite(lr) and lr > 0) or not (
            math.isfinite(weight_decay) and weight_decay >= 0
        ):
            raise InversionError("property-whitebox: lr must be > 0 and weight_decay >= 0")
        self.width, self.dim, self.epochs = width, dim, epochs
        self.lr, self.weight_decay, self.seed = float(lr), float(weight_decay), seed
        self.meta: PermutationInvariantMeta | None = None
        self.scales: list[tuple[float, float]] = []
        self.shapes: list[tuple[int, ...]] = []

    def _normalised(self, params: list[tuple[Tensor, Tensor]]) -> list[tuple[Tensor, Tensor]]:
        """Each layer's weights and biases divided by the shadows' scalar standard deviation
        of that tensor (a scalar per tensor keeps the permutation invariance)."""
        return [(w / sw, b / sb) for (w, b), (sw, sb) in zip(params, self.scales, strict=True)]

    def _fit(self, models: list[nn.Module], worlds: np.ndarray, task: PropertyTask) -> None:
        per_model = [_parameters(m) for m in models]
        shapes = [tuple(w.shape) for w, _ in per_model[0]]
        for p in per_model[1:]:
            if [tuple(w.shape) for w, _ in p] != shapes:
                raise InversionError("property-whitebox: the shadow models differ in shape")
        stacked = _stack(per_model)
        self.scales = [(float(w.std()) or 1.0, float(b.std()) or 1.0) for w, b in stacked]
        inputs = self._normalised(stacked)
        y = torch.as_tensor(worlds, dtype=torch.float32)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            meta = PermutationInvariantMeta(shapes, self.width, self.dim)
            optimiser = torch.optim.Adam(
                meta.parameters(), lr=self.lr, weight_decay=self.weight_decay
            )
            loss_fn = nn.BCEWithLogitsLoss()
            for _ in range(self.epochs):
                optimiser.zero_grad()
                loss = loss_fn(meta(inputs), y)
                loss.backward()
                optimiser.step()
        meta.eval()
        with torch.no_grad():
            predicted = (meta(inputs) > 0).float()
        self.meta_train_accuracy = float((predicted == y).float().mean())
        self.meta = meta
        self.shapes = shapes

    def _score(self, target: Target, task: PropertyTask) -> float:
        params = _parameters(target.model)
        shapes = [tuple(w.shape) for w, _ in params]
        if shapes != self.shapes:
            raise InversionError(
                f"property-whitebox: the target's layers {shapes} differ from the "
                f"architecture its shadows were trained with {self.shapes}"
            )
        return float(self.probability([params])[0])

    def probability(self, params: Sequence[list[tuple[Tensor, Tensor]]]) -> np.ndarray:
        """The fitted meta-classifier's probability of world 1 for networks given as
        per-layer (weight, bias) lists."""
        if self.meta is None:
            raise InversionError("property-whitebox: fit the meta-classifier first")
        with torch.no_grad():
            logits = self.meta(self._normalised(_stack(list(params))))
        return torch.sigmoid(logits.double()).numpy()


@register_inversion("property-blackbox")
class BlackBoxProperty(PropertyAttack):
    """The black-box variant: a logistic regression (sklearn, standardised features, L2 with
    inverse strength `C`) on a model's probability vectors on the attacker's query set and
    their mean over the set (Ganju et al. 2018 Sec. 7 and Ateniese et al. 2015 read the
    model; here only its answers are read). Each target costs `task.queries` queries."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(
        Access.SCORES, ("pool", "architecture", "training", "property")
    )

    def __init__(self, C: float = 0.1, seed: int = 0) -> None:
        super().__init__()
        if not (math.isfinite(C) and C > 0):
            raise InversionError(f"property-blackbox: C must be > 0, got {C!r}")
        self.C, self.seed = float(C), seed
        self.meta: Any = None

    @staticmethod
    def _features(probabilities: Tensor) -> np.ndarray:
        p = probabilities.detach().double().cpu()
        return torch.cat([p.flatten(), p.mean(0)]).numpy()

    def _fit(self, models: list[nn.Module], worlds: np.ndarray, task: PropertyTask) -> None:
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        queries = task.query_inputs()
        features = []
        for model in models:
            with torch.no_grad():
                device = next(model.parameters()).device
                logits = model(queries.to(device))
            features.append(self._features(torch.softmax(logits.double(), -1)))
        x = np.stack(features)
        self.meta = make_pipeline(
            StandardScaler(), LogisticRegression(C=self.C, max_iter=2000, random_state=self.seed)
        ).fit(x, worlds)
        self.meta_train_accuracy = float(np.mean(self.meta.predict(x) == worlds))

    def _score(self, target: Target, task: PropertyTask) -> float:
        queries = task.query_inputs()
        features = self._features(target.probabilities(queries))
        return float(self.meta.predict_proba(features[None])[0, 1])


# ---------------------------------------------------------------------------------------------
# result


@dataclass
class PropertyResult:
    """One property-inference attack over evaluation targets of known worlds.

    `scores`: each target's predicted probability of world 1; `worlds`: their true worlds.
    `accuracy`: share of targets whose world the meta-classifier gets right (threshold 0.5);
    `auc`: ROC AUC of the scores (`privacylab.stats.roc_auc`; NaN with one world only);
    `chance`: the accuracy of always guessing the commoner world; `interval`: 95%
    Clopper-Pearson interval of the accuracy; `p_value`: two-sided binomial test of the
    correct count against chance; `queries`: queries sent to all targets; `seconds`: the
    shadow training and meta-classifier fit plus scoring."""

    method: str
    property: str
    access: str
    scores: list[float]
    worlds: list[int]
    accuracy: float
    auc: float
    chance: float
    interval: tuple[float, float]
    p_value: float
    queries: int
    seconds: float
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form with the issue's keys at the top level."""
        return {
            "method": self.method,
            "property": self.property,
            "accuracy": self.accuracy,
            "auc": self.auc,
            "chance": self.chance,
            "accuracy_interval": list(self.interval),
            "p_value": self.p_value,
            "targets": len(self.scores),
            "access": self.access,
            "queries": self.queries,
            "seconds": self.seconds,
            "scores": list(self.scores),
            "worlds": list(self.worlds),
            "params": dict(self.params),
        }


def run_property_inference(
    attack: PropertyAttack, targets: Sequence[Target], worlds: Sequence[int], task: PropertyTask
) -> PropertyResult:
    """Fit `attack` on `task`, score every target through `execute` (its declared access, its
    queries counted), then compare with the true `worlds`, which the attack never sees."""
    from scipy.stats import binomtest

    truth = np.asarray([int(w) for w in worlds], dtype=np.int64)
    if len(truth) != len(targets) or len(truth) == 0:
        raise InversionError(
            f"need one world per target (>= 1), got {len(truth)} for {len(targets)}"
        )
    if not np.isin(truth, WORLDS).all():
        raise InversionError("every world must be 0 or 1")
    start = time.perf_counter()
    attack.fit(task)
    scores, queries, access = [], 0, attack.threat_model.access
    for target in targets:
        done = execute(attack, target, task)
        scores.append(float(done.output))
        queries += done.queries
        access = done.access
    seconds = time.perf_counter() - start
    s = np.asarray(scores)
    correct = int(np.sum((s > 0.5).astype(np.int64) == truth))
    n = len(truth)
    chance = float(max(truth.mean(), 1 - truth.mean()))
    both = 0 < truth.sum() < n
    return PropertyResult(
        method=attack.name,
        property=task.prop.spec,
        access=access.value,
        scores=[float(v) for v in s],
        worlds=[int(w) for w in truth],
        accuracy=correct / n,
        auc=float(roc_auc(s, truth)) if both else float("nan"),
        chance=chance,
        interval=tuple(float(v) for v in clopper_pearson(correct, n)),  # type: ignore[arg-type]
        p_value=float(binomtest(correct, n, chance).pvalue),
        queries=int(queries),
        seconds=seconds,
        params=attack.params(),
    )
