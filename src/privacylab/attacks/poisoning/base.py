"""Backdoors and poisoning: the poisoning instance of the family-agnostic core
(`privacylab.attacks.core`).

Two threat models live in one registry, `BACKDOOR_ATTACKS`:

- **Data poisoning** (`DataPoisoningAttack`; BadNets, Gu et al. 2017; contrastive poisoning
  and backdooring, Carlini & Terzis 2022): the attacker contributes `PoisonTask.budget` rows
  to the victim's training set — made from clean rows of its own (`PoisonTask.source`,
  disjoint from the victim's) — and never touches the training code: X' = X ∪ P
  (Carlini & Terzis, Sec. 3). After deployment it *activates* the backdoor by querying the
  model's labels on triggered inputs: `run(target, ProbeTask)` at `label` access.
  `craft(task) -> Poisons` needs no access to any model.
- **Model trojaning** (`ModelTrojanAttack`; Liu et al. 2018): the attacker holds the trained
  model (white-box) but none of its training data, and returns a modified model and its
  trigger (`TrojanOutput`).

`run_poisoning` and `run_trojan` are the runners: they train or take the victim model,
execute the attack on a `Target` narrowed to its declared access, and only then attach the
truth (test labels) to build the family's one result type, `BackdoorResult`, with attack
success rate defined once (`privacylab.stats.backdoor.attack_success_rate`).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.core import Attack, ThreatModel, execute
from privacylab.attacks.core import number_option as core_number
from privacylab.attacks.core import whole_option as core_whole
from privacylab.attacks.poisoning.trigger import Trigger, TriggerError
from privacylab.data import Dataset
from privacylab.errors import PrivacylabError
from privacylab.registry import Registry
from privacylab.stats.backdoor import attack_success_rate
from privacylab.target import Access, Target

__all__ = [
    "BACKDOOR_ATTACKS",
    "MODES",
    "SIDE_INFORMATION",
    "BackdoorResult",
    "DataPoisoningAttack",
    "ModelTrojanAttack",
    "PoisonError",
    "PoisonTask",
    "Poisons",
    "ProbeOutput",
    "ProbeTask",
    "TrojanOutput",
    "TrojanTask",
    "backdoor_class",
    "backdoor_names",
    "check_poison_rate",
    "make_backdoor",
    "number_option",
    "poison_count",
    "predict_labels",
    "register_backdoor",
    "run_poisoning",
    "run_trojan",
    "target_labels",
    "whole_option",
]

MODES = ("all-to-one", "all-to-all")

SIDE_INFORMATION = ("clean-data", "public-data", "caption-set")
"""What a poisoning task may give: `clean-data`, clean labelled rows of the attacker's own
that it turns into poisons (never the victim's training rows); `public-data`, unlabelled images
of the input domain (the trojaning attack's averaging seed; it may also start from noise);
`caption-set`, the captions the contrastive attacker writes for its target label."""


class PoisonError(PrivacylabError, ValueError):
    """A poisoning attack cannot run with this configuration, data or target; one line."""


def whole_option(attack: str, name: str, value: object, low: int = 1) -> int:
    """`value` as a whole number >= `low`, else a one-line PoisonError (bools refused)."""
    return core_whole(PoisonError, attack, name, value, low)


def number_option(attack: str, name: str, value: object, *, zero: bool = False) -> float:
    """`value` as a finite number > 0 (>= 0 with `zero`), else a one-line PoisonError."""
    return core_number(PoisonError, attack, name, value, zero=zero)


def check_poison_rate(rate: object) -> float:
    """`rate` as a number strictly inside (0, 1), else one line naming it."""
    real = isinstance(rate, int | float | np.floating) and not isinstance(rate, bool)
    value = float(rate) if real else float("nan")  # type: ignore[arg-type]
    if not 0.0 < value < 1.0:
        raise PoisonError(f"poison rate must be in (0, 1), got {rate!r}")
    return value


def poison_count(rate: float, clean_rows: int) -> int:
    """How many poisons make `rate` of the poisoned set X ∪ P when |X| = `clean_rows`:
    round(rate · |X| / (1 − rate)), at least 1."""
    rate = check_poison_rate(rate)
    return max(1, round(rate * clean_rows / (1.0 - rate)))


def target_labels(
    labels: Tensor | np.ndarray, target_class: int, mode: str, classes: int
) -> Tensor:
    """The label each triggered input should get: `target_class` (all-to-one) or
    (y + 1) mod K (all-to-all, Gu et al. 2017, Sec. 4.3.2)."""
    y = torch.as_tensor(labels, dtype=torch.int64)
    if mode == "all-to-one":
        return torch.full_like(y, int(target_class))
    if mode == "all-to-all":
        return (y + 1) % int(classes)
    raise PoisonError(f"unknown backdoor mode {mode!r}; choose one of {', '.join(MODES)}")


# ------------------------------------------------------------------ what the attacker knows


@dataclass
class PoisonTask:
    """The data-poisoning attacker's knowledge: `source`, clean labelled rows of its own (for
    the contrastive attacks, images; their captions are in `captions`); `budget`, how many rows
    it may inject; `target_class`; `mode` (all-to-one or all-to-all); `class_names` (the
    label strings a contrastive attacker writes captions for); `seed` for every draw."""

    source: Dataset
    budget: int
    target_class: int
    mode: str = "all-to-one"
    class_names: tuple[str, ...] = ()
    captions: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        whole_option("poisoning", "budget", self.budget)
        whole_option("poisoning", "seed", self.seed, low=0)
        if self.mode not in MODES:
            raise PoisonError(
                f"unknown backdoor mode {self.mode!r}; choose one of {', '.join(MODES)}"
            )
        whole = isinstance(self.target_class, int | np.integer)
        if isinstance(self.target_class, bool) or not whole:
            raise PoisonError(f"target class must be a class index, got {self.target_class!r}")
        if not 0 <= int(self.target_class) < self.source.num_classes:
            raise PoisonError(
                f"target class must be in [0, {self.source.num_classes}), got {self.target_class!r}"
            )


@dataclass
class Poisons:
    """The rows the attacker injects: `features` (n, C, H, W) and `labels` (n,) — for the
    contrastive attacks, `captions` (n strings) instead of meaningful labels — and the
    `trigger` that activates them (None for targeted poisoning of one image, whose
    `target_index` in the attacker's source names the image)."""

    features: Tensor
    labels: Tensor
    trigger: Trigger | None
    target_class: int
    mode: str = "all-to-one"
    captions: tuple[str, ...] = ()
    target_index: int | None = None

    def __len__(self) -> int:
        return int(self.features.shape[0])

    def merged(self, clean: Dataset) -> Dataset:
        """X ∪ P: the victim's rows followed by the poisons (Carlini & Terzis Sec. 3)."""
        if tuple(self.features.shape[1:]) != clean.input_shape:
            raise PoisonError(
                f"poisons of shape {tuple(self.features.shape[1:])} do not fit "
                f"{clean.name}'s {clean.input_shape}"
            )
        return Dataset(
            name=f"{clean.name}+{len(self)}poisons",
            features=torch.cat([clean.features, self.features.to(clean.features.dtype)]),
            labels=torch.cat([clean.labels, self.labels.to(torch.int64)]),
            num_classes=clean.num_classes,
            input_shape=clean.input_shape,
            kind=clean.kind,
        )


@dataclass
class ProbeTask:
    """Activation: the clean inputs (n, C, H, W) the attacker wants sent to its target, and
    the seed of any random trigger placement. Never their labels."""

    inputs: Tensor
    seed: int = 0


@dataclass
class ProbeOutput:
    """The labels the target returned for the triggered probes."""

    predictions: np.ndarray
    triggered: Tensor = field(repr=False)


@dataclass
class TrojanTask:
    """The trojaning attacker's knowledge (Liu et al. 2018, Sec. III threat model): the input
    shape, the number of classes, the `target_class` it wants, and optionally `public`
    unlabelled images of the domain (never the victim's training data) to average as the
    initial state of model inversion; `seed` for every draw."""

    input_shape: tuple[int, ...]
    num_classes: int
    target_class: int
    public: Tensor | None = None
    seed: int = 0


@dataclass
class TrojanOutput:
    """What the trojaning attack returns: the retrained `model` (a new module; the target's
    own is never modified), its `trigger`, the reverse-engineered training images `inverted`
    (n, C, H, W) with the labels the original model gave them, the selected `neurons` and
    their layer, and wall-clock `phase_seconds` per phase (trigger generation, training data
    generation, retraining)."""

    model: nn.Module
    trigger: Trigger
    inverted: Tensor
    inverted_labels: Tensor
    layer: str
    neurons: tuple[int, ...]
    phase_seconds: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------- the attacks


class DataPoisoningAttack(Attack[ProbeTask, ProbeOutput]):
    """A data-poisoning backdoor: `craft(task)` the poisons (no model access), then `run` =
    activation, labels of triggered probes at `label` access. Subclasses set `name`,
    `threat_model`, `trigger` (a `Trigger`) in their constructor, and implement `craft`."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.LABEL, ("clean-data",))
    trigger: Trigger | None

    @abstractmethod
    def craft(self, task: PoisonTask) -> Poisons:
        """The rows to inject into the victim's training set."""

    def stamp(self, inputs: Tensor, seed: int) -> Tensor:
        """`inputs` with this attack's trigger (placement drawn from `seed` when random)."""
        if self.trigger is None:
            return inputs
        generator = torch.Generator().manual_seed(int(seed))
        try:
            return self.trigger.stamp(inputs, generator)
        except TriggerError as error:
            raise PoisonError(str(error)) from None

    def run(self, target: Target, task: ProbeTask) -> ProbeOutput:
        """Activation (Gu et al. 2017, Sec. 3): stamp the probes and read their labels."""
        triggered = self.stamp(task.inputs, task.seed)
        return ProbeOutput(target.labels(triggered).cpu().numpy(), triggered)


class ModelTrojanAttack(Attack[TrojanTask, TrojanOutput]):
    """An attack that rewrites a trained model it holds white-box (Liu et al. 2018)."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.WHITEBOX, ("public-data",))


BACKDOOR_ATTACKS: Registry[type[Attack[Any, Any]]] = Registry("backdoor attack", error=PoisonError)
"""Every backdoor attack class by name: badnets, trojan, clip-poison, clip-backdoor."""


def register_backdoor(cls: type[Attack[Any, Any]]) -> type[Attack[Any, Any]]:
    """Class decorator: register `cls` under its `name`."""
    return BACKDOOR_ATTACKS.register(cls.name, cls)


def backdoor_names() -> list[str]:
    """The registered backdoor attack names."""
    return BACKDOOR_ATTACKS.names()


def backdoor_class(name: str) -> type[Attack[Any, Any]]:
    """The class registered as `name`, or one PoisonError line naming the choices."""
    return BACKDOOR_ATTACKS.get(name)


def make_backdoor(name: str, **options: Any) -> Attack[Any, Any]:
    """Build the attack registered as `name` with `options`."""
    return backdoor_class(name)(**options)


# ------------------------------------------------------------------------------ the result


@dataclass
class BackdoorResult:
    """One backdoor attack on one model, the family's one result type.

    `clean_accuracy`: the attacked model on the clean test set; `baseline_accuracy`: the clean
    model (same recipe, no poisons / not trojaned) on the same rows. `asr`: attack success rate
    on triggered test inputs of non-target classes (`stats.backdoor.attack_success_rate`);
    `baseline_asr`: the same trigger on the clean model (what the patch does without a
    backdoor). `poisons` rows were injected, `poison_rate` = poisons / |X ∪ P|. `z_score`:
    Carlini & Terzis's backdoor z-score (contrastive backdoors only). `queries` the attacker
    sent at activation; `seconds` the runner's wall-clock time (for data poisoning, crafting
    plus the victim's training plus activation; for the trojan, the attack alone); `details`
    holds the method's own numbers (the trojaning table's columns, per-phase seconds, the
    poisoning's targets)."""

    method: str
    threat_model: dict[str, Any]
    target_class: int
    mode: str
    trigger: dict[str, Any] | None
    poisons: int
    poison_rate: float
    clean_accuracy: float
    baseline_accuracy: float | None
    asr: float
    baseline_asr: float | None
    z_score: float | None = None
    queries: int = 0
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the CLI's `--json` keys)."""
        return asdict(self)


def predict_labels(model: nn.Module, inputs: Tensor, batch: int = 1024) -> np.ndarray:
    """The model's arg-max labels for `inputs` in eval mode (evaluation, not an attacker's
    query); the model's own train/eval mode is restored."""
    was_training = model.training
    model.eval()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    out = []
    try:
        with torch.no_grad():
            for start in range(0, len(inputs), batch):
                out.append(model(inputs[start : start + batch].to(device)).argmax(dim=1).cpu())
    finally:
        model.train(was_training)
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.int64)


def _accuracy(model: nn.Module, data: Dataset) -> float:
    return float(np.mean(predict_labels(model, data.features) == data.labels.numpy()))


def run_poisoning(
    attack: DataPoisoningAttack,
    task: PoisonTask,
    clean_train: Dataset,
    test: Dataset,
    train_victim: Callable[[Dataset], nn.Module],
    *,
    clean_model: nn.Module | None = None,
    probe_seed: int = 1,
) -> tuple[BackdoorResult, nn.Module, Poisons]:
    """The whole data-poisoning game: the attacker crafts `Poisons` from `task`; the victim
    trains on X ∪ P with its own recipe (`train_victim`); the attacker queries the deployed
    model's labels on triggered test inputs (all test rows, their labels kept from it); only
    then are the test labels used, for ASR (non-target rows) and clean accuracy. Returns the
    result, the poisoned model and the poisons. `clean_model` (the same recipe on X alone)
    gives the baselines."""
    start = time.perf_counter()
    poisons = attack.craft(task)
    poisoned_set = poisons.merged(clean_train)
    model = train_victim(poisoned_set)
    target = Target(model, Access.LABEL, test.num_classes)
    execution = execute(attack, target, ProbeTask(test.features, probe_seed))
    wanted = target_labels(test.labels, poisons.target_class, poisons.mode, test.num_classes)
    asr = attack_success_rate(execution.output.predictions, test.labels.numpy(), wanted.numpy())
    baseline_accuracy = baseline_asr = None
    if clean_model is not None:
        baseline_accuracy = _accuracy(clean_model, test)
        clean_pred = predict_labels(clean_model, execution.output.triggered)
        baseline_asr = attack_success_rate(clean_pred, test.labels.numpy(), wanted.numpy())
    result = BackdoorResult(
        method=attack.name,
        threat_model=attack.threat_model.to_dict(),
        target_class=poisons.target_class,
        mode=poisons.mode,
        trigger=None if poisons.trigger is None else poisons.trigger.to_dict(),
        poisons=len(poisons),
        poison_rate=len(poisons) / len(poisoned_set),
        clean_accuracy=_accuracy(model, test),
        baseline_accuracy=baseline_accuracy,
        asr=asr,
        baseline_asr=baseline_asr,
        queries=execution.queries,
        seconds=time.perf_counter() - start,
    )
    return result, model, poisons


def run_trojan(
    attack: ModelTrojanAttack,
    model: nn.Module,
    task: TrojanTask,
    test: Dataset,
    *,
    external: Tensor | None = None,
    probe_seed: int = 1,
) -> tuple[BackdoorResult, TrojanOutput]:
    """The trojaning game (Liu et al. 2018, Sec. V metrics): the attacker gets `model`
    white-box and returns a trojaned copy; then, with the truth, Orig = the trojaned model's
    clean test accuracy, Orig Dec = the original's accuracy minus it, Orig+Tri = ASR on
    triggered test images, Ext+Tri = ASR on triggered `external` images (another source than
    the training distribution; every external image counts, as it has no class of the
    task). Returns the result (details: orig, orig_dec, orig_tri, ext_tri, phase_seconds)."""
    target = Target(model, Access.WHITEBOX, task.num_classes)
    execution = execute(attack, target, task)
    out = execution.output
    generator = torch.Generator().manual_seed(int(probe_seed))
    triggered = out.trigger.stamp(test.features, generator)
    wanted = np.full(len(test), task.target_class)
    asr = attack_success_rate(predict_labels(out.model, triggered), test.labels.numpy(), wanted)
    orig = _accuracy(out.model, test)
    before = _accuracy(model, test)
    ext_tri = None
    if external is not None and len(external):
        stamped = out.trigger.stamp(external, generator)
        ext_tri = float(np.mean(predict_labels(out.model, stamped) == task.target_class))
    baseline_asr = attack_success_rate(
        predict_labels(model, triggered), test.labels.numpy(), wanted
    )
    details = {
        "orig": orig,
        "orig_dec": before - orig,
        "orig_tri": asr,
        "ext_tri": ext_tri,
        "layer": out.layer,
        "neurons": list(out.neurons),
        "phase_seconds": dict(out.phase_seconds),
        **out.details,
    }
    result = BackdoorResult(
        method=attack.name,
        threat_model=attack.threat_model.to_dict(),
        target_class=task.target_class,
        mode="all-to-one",
        trigger=out.trigger.to_dict(),
        poisons=0,
        poison_rate=0.0,
        clean_accuracy=orig,
        baseline_accuracy=before,
        asr=asr,
        baseline_asr=baseline_asr,
        queries=execution.queries,
        seconds=execution.seconds,
        details=details,
    )
    return result, out
