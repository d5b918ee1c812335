"""What every defence is: a named, parameterised change to either a model's *outputs* or its
*training*, registered by name and built from a spec string (`topk:1`, `memguard:budget=0.5`).

Two kinds, one base each (the shape of ART's `defences/postprocessor/`, but seeded, never
rewriting the user's model in place, and measured by privacylab's one metrics path):

- `OutputDefense` post-processes the probability vectors a deployed model returns. It plugs into
  `Target`'s output hook (`OutputDefense.defend(target)` returns a *view* of the target served
  at `serves` access with the defence applied), so a defended model is a `Target` like any
  other and every attack runs on it unchanged. Some fit state first on the defender's data
  (`fit`: MemGuard's defender classifier, Jia et al. 2019).
- `TrainingDefense` changes how the model is trained: the trainer's configuration (`configure`:
  L2, label smoothing, DP-SGD), the model's options (`model_options`: dropout), trainer hooks
  (`regularizer`, `callbacks`: adversarial regularisation, early stopping) or the whole
  procedure (`fit`: stacking, distillation). The attacker who knows the recipe (Kerckhoffs)
  trains reference models with the same `fit`, which is what makes the evaluation adaptive.

Each class declares what it changes (`changes`), its parameters (`parameters`, checked in the
constructor: bad values are one-line `DefenseError`s), the paper it follows (`paper`) and for
output defences the access it serves (`serves`). `parse_defense("topk:1")` builds one from the
CLI's spec grammar: `name`, then `:`-separated values, positional in `parameters` order or
`key=value`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from privacylab.data import Dataset
from privacylab.errors import PrivacylabError
from privacylab.models import ModelSpec, load_model, save_model
from privacylab.registry import Registry
from privacylab.target import Access, Target
from privacylab.training import TrainConfig, train
from privacylab.training.hooks import Callback, Regularizer

__all__ = [
    "DEFENSES",
    "Defense",
    "DefenseData",
    "DefenseError",
    "Fitted",
    "ModelBuilder",
    "NoDefense",
    "OutputDefense",
    "Parameter",
    "QueryDefense",
    "TrainingDefense",
    "defense_names",
    "make_defense",
    "parse_defense",
    "parse_defenses",
    "register_defense",
]


class DefenseError(PrivacylabError, ValueError):
    """An unknown defence, a bad parameter, or a defence that does not apply; one line."""


@dataclass(frozen=True)
class Parameter:
    """One parameter of a defence: its `name`, `kind` (int, float or str), `default`, and the
    closed/open bounds a value must respect (`low`, `high`; `low_open`: value > low;
    `high_open`: value < high) or the `choices` of a str; `doc` says what it does."""

    name: str
    kind: type
    default: Any
    doc: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()

    def check(self, defense: str, value: Any) -> Any:
        """`value` converted to `kind` and checked, or one-line DefenseError."""
        where = f"{defense}: {self.name}"
        if self.kind is str:
            text = str(value).strip()
            if self.choices and text not in self.choices:
                raise DefenseError(
                    f"{where} must be one of {', '.join(self.choices)}, got {value!r}"
                )
            return text
        if isinstance(value, bool):
            raise DefenseError(f"{where} must be a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise DefenseError(f"{where} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise DefenseError(f"{where} must be finite, got {value!r}")
        if self.kind is int:
            if number != int(number):
                raise DefenseError(f"{where} must be a whole number, got {value!r}")
            number = int(number)
        if self.low is not None and (number < self.low or (self.low_open and number == self.low)):
            sign = ">" if self.low_open else ">="
            raise DefenseError(f"{where} must be {sign} {self.low:g}, got {value!r}")
        if self.high is not None and (
            number > self.high or (self.high_open and number == self.high)
        ):
            sign = "<" if self.high_open else "<="
            raise DefenseError(f"{where} must be {sign} {self.high:g}, got {value!r}")
        return number


class Defense(ABC):
    """A defence against membership inference, configured in the constructor.

    Subclasses declare `name`, `kind` ("none", "output", "training" or "query"), `changes` (what it
    touches: "outputs", "training"), `parameters` and `paper`. `params` holds the checked
    values; `spec` is the canonical spec string (`topk:k=1`), which also keys the result store.
    """

    name: ClassVar[str]
    kind: ClassVar[str]
    changes: ClassVar[tuple[str, ...]]
    parameters: ClassVar[tuple[Parameter, ...]] = ()
    paper: ClassVar[str] = ""

    def __init__(self, **params: Any) -> None:
        known = {p.name: p for p in self.parameters}
        unknown = sorted(set(params) - set(known))
        if unknown:
            choices = ", ".join(known) or "none"
            raise DefenseError(
                f"{self.name}: unknown parameter {unknown[0]!r}; its parameters: {choices}"
            )
        self.params: dict[str, Any] = {
            p.name: p.check(self.name, params[p.name]) if p.name in params else p.default
            for p in self.parameters
        }

    @property
    def spec(self) -> str:
        """Canonical spec: the name, then every parameter as `key=value` (defaults included)."""
        parts = [self.name, *(f"{k}={_fmt(v)}" for k, v in self.params.items())]
        return ":".join(parts)

    @property
    def label(self) -> str:
        """Short display name: the spec as the user wrote it (`l2:1e-3`, from `parse_defense`),
        else the name and the non-default parameter values."""
        written = getattr(self, "written", None)
        if written:
            return str(written)
        values = [
            _fmt(self.params[p.name]) for p in self.parameters if self.params[p.name] != p.default
        ]
        return ":".join([self.name, *values]) if values else self.name

    def to_dict(self) -> dict[str, Any]:
        """JSON form: name, label, spec, kind, what it changes, parameters and the paper."""
        return {
            "name": self.name,
            "label": self.label,
            "spec": self.spec,
            "kind": self.kind,
            "changes": list(self.changes),
            "params": dict(self.params),
            "paper": self.paper,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(eq=False)
class DefenseData:
    """What the defender owns besides the private training set.

    `holdout`: labelled examples the model does not train on (early stopping's validation set,
    AdvReg's reference set D' of Nasr et al. 2018, MemGuard's defender non-members).
    `public`: an unlabelled-in-spirit pool a distillation defence may label with its teacher
    (DMP's reference set X_ref, Shejwalkar & Houmansadr 2021); its labels are never used.
    """

    holdout: Dataset | None = None
    public: Dataset | None = None


ModelBuilder = Callable[[int], nn.Module]
"""`build(seed) -> a fresh, untrained model of the recipe's architecture`."""


@dataclass
class Fitted:
    """A model trained by a defence and what the run recorded: accuracy on its own training
    set (None where meaningless), ε spent (DP only), and any defence-specific notes."""

    model: nn.Module
    train_accuracy: float | None = None
    epsilon: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)


class NoDefense(Defense):
    """No defence: the undefended baseline every frontier starts from."""

    name = "none"
    kind = "none"
    changes = ()
    paper = ""


class OutputDefense(Defense):
    """A post-processor of probability vectors, applied by `Target` before answering.

    `transform(probs)` maps (n, classes) probability rows to what the deployed model returns;
    it keeps every row's arg-max unless the class says `keeps_label = False`, and draws any
    randomness from its own seeded generator. `serves` is the access level of the defended
    deployment (scores; label for label-only). `fit` sees the defender's model and data once,
    before any query (a no-op unless the defence learns something, as MemGuard does).
    """

    kind = "output"
    changes = ("outputs",)
    serves: ClassVar[Access] = Access.SCORES
    keeps_label: ClassVar[bool] = True
    requires_holdout: ClassVar[bool] = False
    """Whether `fit` needs the defender's holdout data (MemGuard's non-members)."""

    def fit(self, model: nn.Module, train_data: Dataset, extra: DefenseData) -> None:
        """Learn whatever the defence needs from the defender's model and data (default:
        nothing)."""

    @abstractmethod
    def transform(self, probs: Tensor) -> Tensor:
        """The returned rows for probability rows `probs` (n, classes)."""

    def __call__(self, probs: Tensor) -> Tensor:
        return self.transform(probs)

    def check_applies(self, access: Access | str) -> None:
        """DefenseError unless a deployment served at `access` can be defended by this:
        an output defence post-processes probability vectors, so the target must serve scores
        or logits (a white-box attacker reads the model itself, a label-only one never sees
        the vectors)."""
        access = Access.parse(access)
        if access.allows(Access.WHITEBOX):
            raise DefenseError(
                f"{self.label} post-processes outputs; it cannot defend a target served at "
                "white-box access (the attacker reads the model itself)"
            )
        if access is Access.LABEL:
            raise DefenseError(
                f"{self.label} post-processes probability vectors; a target served at label "
                "access returns none (choose a training-time defence)"
            )

    def defend(self, target: Target) -> Target:
        """A view of `target` served at `serves` access (never wider than the target's) whose
        answers pass through this defence (after any defence the target already has)."""
        self.check_applies(target.access)
        return target.with_output_defense(self, self.serves)


class QueryDefense(Defense):
    """A watch on the query stream of one client: a query budget or a stateful detector (PRADA,
    Juuti et al. 2019). `defend(target)` returns a view of `target` that shows every query
    batch of that client to `observe` (which may raise to refuse it; `QueryBudgetError` for a
    spent budget) and answers as the target does. `verdict()` is the JSON-ready finding
    after the client's run: at least `detected` (bool) and `queries_until_detection` (int or
    None). One instance watches one client; `fresh()` is an unused copy for another."""

    kind = "query"
    changes = ("queries",)

    @abstractmethod
    def observe(self, x: Tensor) -> None:
        """See one query batch `x` before it is answered; raise to refuse it."""

    @abstractmethod
    def verdict(self) -> dict[str, Any]:
        """What the watch found so far: `detected`, `queries_until_detection`, and more."""

    def defend(self, target: Target) -> Target:
        """A view of `target` whose queries this watch sees first."""
        return target.with_monitor(self.observe)

    def fresh(self) -> QueryDefense:
        """An unused instance with the same parameters (another client's watch)."""
        return type(self)(**self.params)


class TrainingDefense(Defense):
    """A change to how the model is trained; the trained model is then deployed as it is.

    The default `fit` trains `build(seed)` with the project's trainer under `configure(config)`,
    `regularizer(...)` and `callbacks(...)`; a defence that changes the whole procedure
    (stacking, distillation) overrides `fit`. `needs` names the parts of `DefenseData` it uses
    ("holdout", "public"); `fit` raises DefenseError when one is missing.
    """

    kind = "training"
    changes = ("training",)
    needs: ClassVar[tuple[str, ...]] = ()

    def configure(self, config: TrainConfig) -> TrainConfig:
        """The trainer configuration under this defence (default: unchanged)."""
        return config

    def model_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The model options under this defence (default: unchanged)."""
        return options

    def check_model(self, model: str) -> None:
        """DefenseError when the zoo model `model` cannot take this defence (default: any
        model can); called before any training."""

    def regularizer(self, data: Dataset, extra: DefenseData, seed: int) -> Regularizer | None:
        """A per-example loss term for the trainer (default: none)."""
        return None

    def callbacks(self, data: Dataset, extra: DefenseData, seed: int) -> list[Callback]:
        """Trainer callbacks (default: none)."""
        return []

    def require(self, extra: DefenseData) -> None:
        """DefenseError when a part of `extra` named in `needs` is missing or empty."""
        for part in self.needs:
            value = getattr(extra, part)
            if value is None or len(value) == 0:
                raise DefenseError(f"{self.label} needs the defender's {part} data")

    def fit(
        self,
        build: ModelBuilder,
        data: Dataset,
        config: TrainConfig,
        extra: DefenseData,
        *,
        seed: int,
        folder: Path,
    ) -> Fitted:
        """Train a model on `data` under this defence; `folder` is for checkpoints (a killed
        run resumes from them)."""
        self.require(extra)
        model = build(seed)
        result = train(
            model,
            data,
            self.configure(config),
            eval_data=extra.holdout,
            checkpoint_dir=folder / "checkpoint",
            regularizer=self.regularizer(data, extra, seed),
            callbacks=self.callbacks(data, extra, seed),
        )
        last = result.history[-1] if result.history else None
        notes = {"stopped": result.stopped} if result.stopped else {}
        return Fitted(
            model=result.model,
            train_accuracy=last.train_accuracy if last else None,
            epsilon=result.privacy.epsilon if result.privacy else None,
            notes=notes,
        )

    def save(
        self, model: nn.Module, folder: Path, spec: ModelSpec, metadata: dict[str, Any]
    ) -> None:
        """Write a model `fit` returned (default: `save_model`, safetensors + JSON sidecar);
        a defence whose model is not one of `spec`'s architecture (an ensemble) overrides this
        and `load`."""
        save_model(model, folder, spec, metadata)

    def load(self, folder: Path) -> nn.Module:
        """Read back what `save` wrote (eval mode)."""
        return load_model(folder)[0]


DEFENSES: Registry[type[Defense]] = Registry("defense", error=DefenseError)
"""Every defence class by name."""

DEFENSES.register("none", NoDefense)


def register_defense(cls: type[Defense]) -> type[Defense]:
    """Class decorator: make a defence buildable by name (`cls.name`) and by spec string."""
    return DEFENSES.register(cls.name, cls)


def defense_names() -> list[str]:
    """Registered defences, in registration order."""
    return DEFENSES.names()


def make_defense(name: str, **params: Any) -> Defense:
    """The defence `name` with `params`, or DefenseError."""
    return DEFENSES.make(name, **params)


def parse_defense(spec: str, registry: Registry[type[Defense]] | None = None) -> Defense:
    """A defence from its spec: `name[:value|:key=value]...` (values positional in the class's
    `parameters` order, e.g. `topk:1`, `memguard:budget=0.5`, `advreg:3:k=1`), looked up in
    `registry` (default `DEFENSES`; the update defences of federated clients keep their own)."""
    if not isinstance(spec, str) or not spec.strip():
        raise DefenseError("empty defence spec; write e.g. topk:1 or l2:1e-3")
    name, *values = [part.strip() for part in spec.strip().split(":")]
    cls = (DEFENSES if registry is None else registry).get(name)
    params: dict[str, Any] = {}
    order = [p.name for p in cls.parameters]
    position = 0
    for value in values:
        if not value:
            raise DefenseError(f"{spec!r}: empty parameter")
        if "=" in value:
            key, _, text = value.partition("=")
            key = key.strip().replace("-", "_")
        else:
            if position >= len(order):
                most = f"at most {len(order)} positional parameter" if order else "no parameters"
                raise DefenseError(f"{spec!r}: {cls.name} takes {most}{'s' * (len(order) > 1)}")
            key, text = order[position], value
            position += 1
        if key in params:
            raise DefenseError(f"{spec!r}: parameter {key!r} given twice")
        params[key] = text.strip()
    defense = cls(**params)
    defense.written = ":".join([cls.name, *values])
    return defense


def parse_defenses(specs: str | Iterable[str]) -> list[Defense]:
    """Defences from a comma-separated list (or an iterable) of specs; duplicates (same
    canonical spec) are kept once; DefenseError for an empty list or a bad spec."""
    items: Sequence[str] = specs.split(",") if isinstance(specs, str) else list(specs)
    out: list[Defense] = []
    seen: set[str] = set()
    for item in items:
        if not str(item).strip():
            continue
        defense = parse_defense(str(item))
        if defense.spec not in seen:
            seen.add(defense.spec)
            out.append(defense)
    if not out:
        raise DefenseError("no defences given; write e.g. none,topk:1,l2:1e-3")
    return out


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator for a defence's own randomness."""
    return torch.Generator().manual_seed(int(seed))


def accuracy(model: nn.Module, data: Dataset, chunk: int = 4096) -> float:
    """Fraction of `data` that `model` labels correctly: evaluation mode (then restored), no
    gradients, on whatever device the model is."""
    if len(data) == 0:
        return float("nan")
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    with torch.no_grad():
        for i in range(0, len(data), chunk):
            out = model(data.features[i : i + chunk].to(device))
            correct += int((out.argmax(1).cpu() == data.labels[i : i + chunk]).sum())
    model.train(was)
    return correct / len(data)
