"""Defences that find and remove backdoors: the shape they share.

A `BackdoorDefense` is configured in its constructor and works in `inspect(model, evidence)`:
it receives the suspect model white-box (never modified in place: any change is made to a
copy) and `BackdoorEvidence`, what the defender has besides — a small clean held-out set
(Neural Cleanse, STRIP, fine-pruning), the training set as received, possibly poisoned
(activation clustering, spectral signatures), and a way to retrain (`retrain`) for the
defences that cleanse the data. It returns a `Detection`: whether the model is backdoored,
which class (Neural Cleanse), the anomaly index, which training rows or inputs look poisoned,
and a `Mitigation` (a repaired model, and/or an input filter). `evaluate_mitigation` measures
every mitigation the same way: clean accuracy and attack success rate after it, with ASR from
`privacylab.stats.backdoor` (one definition).

Each class declares what it needs (`needs`, names in `EVIDENCE`), the paper it follows
(`paper`) and is registered by name in `BACKDOOR_DEFENSES`, so the CLI (`privacylab defend
backdoor --method NAME`) and the contract test pick it up with no other edit.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.data import Dataset
from privacylab.errors import PrivacylabError
from privacylab.registry import Registry
from privacylab.stats.backdoor import attack_success_rate

__all__ = [
    "BACKDOOR_DEFENSES",
    "EVIDENCE",
    "BackdoorDefense",
    "BackdoorDefenseError",
    "BackdoorEvidence",
    "Detection",
    "Mitigation",
    "backdoor_defense_names",
    "check_layer",
    "check_number",
    "check_whole",
    "evaluate_mitigation",
    "feature_layer",
    "layer_activations",
    "make_backdoor_defense",
    "predicted_labels",
    "register_backdoor_defense",
]

EVIDENCE = ("clean-data", "training-data", "retrain")
"""What a backdoor defence may use besides the model: `clean-data`, a small clean labelled
held-out set; `training-data`, the (possibly poisoned) training set with its labels;
`retrain`, the training recipe, to train again on cleansed data."""


class BackdoorDefenseError(PrivacylabError, ValueError):
    """A backdoor defence cannot run with this configuration, model or evidence; one line."""


@dataclass
class BackdoorEvidence:
    """What the defender holds besides the model: `clean` (held-out clean rows), `training`
    (the training set as received), `retrain` (data -> a model trained by the victim's own
    recipe), `num_classes`, and `seed` for every draw."""

    num_classes: int
    clean: Dataset | None = None
    training: Dataset | None = None
    retrain: Callable[[Dataset], nn.Module] | None = None
    seed: int = 0

    def require(self, defense: str, needs: tuple[str, ...]) -> None:
        """One BackdoorDefenseError line naming the first missing piece of `needs`."""
        present = {
            "clean-data": self.clean is not None and len(self.clean) > 0,
            "training-data": self.training is not None and len(self.training) > 0,
            "retrain": self.retrain is not None,
        }
        for need in needs:
            if not present[need]:
                raise BackdoorDefenseError(f"{defense} needs {need}, which was not given")


@dataclass
class Mitigation:
    """What a defence does about a backdoor: a repaired `model` (None: the suspect model is
    kept) and/or `reject`, a filter returning True for inputs refused at run time (STRIP)."""

    model: nn.Module | None = None
    reject: Callable[[Tensor], np.ndarray] | None = None
    description: str = ""


@dataclass
class Detection:
    """The verdict of one defence on one model.

    `detected`: whether the model is judged backdoored (None for a method that only
    mitigates and gives no verdict, e.g. fine-pruning); `flagged_class`: the class named as
    the backdoor's target (None when none or when the method cannot tell); `anomaly_index`:
    Neural Cleanse's largest index among classes below the median (None for other methods);
    `scores`: per-class or per-row numbers the verdict rests on; `flagged_rows`: indices of
    training rows judged poisoned (data-inspecting defences); `mitigation`; `seconds`;
    `details`: the method's own numbers (reverse-engineered triggers, thresholds, seeds)."""

    method: str
    detected: bool | None
    flagged_class: int | None = None
    anomaly_index: float | None = None
    scores: dict[str, Any] = field(default_factory=dict)
    flagged_rows: np.ndarray | None = None
    mitigation: Mitigation | None = None
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form without the model and filter."""
        return {
            "method": self.method,
            "detected": None if self.detected is None else bool(self.detected),
            "flagged_class": self.flagged_class,
            "anomaly_index": self.anomaly_index,
            "scores": self.scores,
            "flagged_rows": None if self.flagged_rows is None else self.flagged_rows.tolist(),
            "mitigation": None if self.mitigation is None else self.mitigation.description,
            "seconds": self.seconds,
            "details": self.details,
        }


class BackdoorDefense(ABC):
    """A backdoor detector/mitigator: options in the constructor, work in `inspect`."""

    name: ClassVar[str]
    paper: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ("clean-data",)

    @abstractmethod
    def inspect(self, model: nn.Module, evidence: BackdoorEvidence) -> Detection:
        """The verdict on `model` (never modified in place) from `evidence`."""

    def copy_model(self, model: nn.Module) -> nn.Module:
        """A deep copy to repair, so the user's model is never rewritten."""
        return copy.deepcopy(model)


BACKDOOR_DEFENSES: Registry[type[BackdoorDefense]] = Registry(
    "backdoor defence", error=BackdoorDefenseError
)
"""neural-cleanse, strip, activation-clustering, spectral, fine-pruning."""


def register_backdoor_defense(cls: type[BackdoorDefense]) -> type[BackdoorDefense]:
    """Class decorator: register `cls` under its `name`."""
    return BACKDOOR_DEFENSES.register(cls.name, cls)


def backdoor_defense_names() -> list[str]:
    """The registered backdoor defence names."""
    return BACKDOOR_DEFENSES.names()


def make_backdoor_defense(name: str, **options: Any) -> BackdoorDefense:
    """Build the defence registered as `name` (one error line naming the choices if unknown)."""
    return BACKDOOR_DEFENSES.get(name)(**options)


# ----------------------------------------------------------------------- option checks


def check_number(
    defense: str,
    name: str,
    value: object,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = True,
    high_open: bool = False,
) -> float:
    """`value` as a finite number in the interval (low, high] (ends chosen by the flags), else
    a one-line BackdoorDefenseError naming the option."""
    real = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    number = float(value) if real else math.nan  # type: ignore[arg-type]
    inside = math.isfinite(number) and (number > low if low_open else number >= low)
    if high is not None:
        inside = inside and (number < high if high_open else number <= high)
    if not inside:
        left = "(" if low_open else "["
        right = "inf)" if high is None else (f"{high})" if high_open else f"{high}]")
        raise BackdoorDefenseError(
            f"{defense}: {name} must be a number in {left}{low}, {right}, got {value!r}"
        )
    return number


def check_whole(defense: str, name: str, value: object, low: int = 1) -> int:
    """`value` as a whole number >= `low` (bools refused), else one BackdoorDefenseError line."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise BackdoorDefenseError(
            f"{defense}: {name} must be a whole number >= {low}, got {value!r}"
        )
    return int(value)


def check_layer(defense: str, layer: object) -> str | None:
    """`layer` as None or a non-empty module name, else one BackdoorDefenseError line."""
    if layer is not None and (not isinstance(layer, str) or not layer):
        raise BackdoorDefenseError(f"{defense}: layer must be a module name, got {layer!r}")
    return layer


# ----------------------------------------------------------------------- activations, any model


def feature_layer(model: nn.Module) -> str:
    """The default layer to read: the module whose output feeds the last `nn.Linear` (the
    penultimate representation, Chen et al. 2019 Sec. 3 and Tran et al. 2018 Sec. 4 use the
    last hidden layer) — found by running no input: the name of the last module before the
    last Linear in `named_modules` order that is not a container. "" when no module comes
    before it (the model is that Linear, or starts with it): `layer_activations` then reads
    the input of the last Linear through a pre-hook."""
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise BackdoorDefenseError("no nn.Linear layer in the model: name the layer to read")
    names = [n for n, m in model.named_modules() if n and not list(m.children())]
    last = linears[-1]
    index = names.index(last) if last in names else 0
    return names[index - 1] if index > 0 else ""


def _device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _run(model: nn.Module, inputs: Tensor, batch: int) -> list[Tensor]:
    """`model`'s outputs on `inputs` in batches, in eval mode and without gradients; the
    model's training mode is restored after."""
    device = _device(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return [model(inputs[s : s + batch].to(device)) for s in range(0, len(inputs), batch)]
    finally:
        model.train(was_training)


def layer_activations(
    model: nn.Module, inputs: Tensor, layer: str | None = None, batch: int = 512
) -> Tensor:
    """The whole activation of `layer` (a name in `model.named_modules()`; None: the
    `feature_layer`) for `inputs`, flattened to (n, features), through a forward hook — every
    channel and position, for any `nn.Module` (not one channel of one conv layer). The layer
    "" is the input of the last `nn.Linear` (a forward pre-hook). The model is left as it was
    (hook removed, training mode restored)."""
    name = feature_layer(model) if layer is None else layer
    modules = dict(model.named_modules())
    captured: list[Tensor] = []

    def keep(value: Any) -> None:
        value = value[0] if isinstance(value, tuple) else value
        captured.append(value.detach().flatten(1).cpu())

    if name == "":
        linears = [m for m in modules.values() if isinstance(m, nn.Linear)]
        if not linears:
            raise BackdoorDefenseError("no nn.Linear layer in the model: name the layer to read")
        handle = linears[-1].register_forward_pre_hook(lambda _m, args: keep(args))
    elif name in modules:
        handle = modules[name].register_forward_hook(lambda _m, _i, output: keep(output))
    else:
        raise BackdoorDefenseError(f"no layer named {name!r} in the model")
    try:
        _run(model, inputs, batch)
    finally:
        handle.remove()
    return torch.cat(captured) if captured else torch.zeros(0, 0)


def predicted_labels(model: nn.Module, inputs: Tensor, batch: int = 1024) -> np.ndarray:
    """`model`'s argmax labels for `inputs` (eval mode, batched; its mode restored)."""
    outputs = _run(model, inputs, batch)
    if not outputs:
        return np.zeros(0, dtype=np.int64)
    return torch.cat([o.argmax(1).cpu() for o in outputs]).numpy()


def evaluate_mitigation(
    mitigation: Mitigation | None,
    model: nn.Module,
    test: Dataset,
    triggered: Tensor,
    wanted: np.ndarray,
) -> dict[str, float]:
    """Clean accuracy and ASR after `mitigation` (None: of `model` itself), on the clean
    `test` rows and their `triggered` copies whose backdoor label is `wanted`. A rejected input
    counts as neither correct (accuracy) nor a success (ASR): both are over all inputs, so a
    filter that refuses everything scores 0 and 0. Also the rejection rates."""
    repaired = model if mitigation is None or mitigation.model is None else mitigation.model
    clean_pred = predicted_labels(repaired, test.features)
    bad_pred = predicted_labels(repaired, triggered)
    clean_ok = clean_pred == test.labels.numpy()
    truth = test.labels.numpy()
    counted = truth != wanted
    success = bad_pred == wanted
    rejected_clean = np.zeros(len(test), dtype=bool)
    rejected_bad = np.zeros(len(triggered), dtype=bool)
    if mitigation is not None and mitigation.reject is not None:
        rejected_clean = np.asarray(mitigation.reject(test.features), dtype=bool)
        rejected_bad = np.asarray(mitigation.reject(triggered), dtype=bool)
    asr = attack_success_rate(np.where(rejected_bad, -1, bad_pred), truth, wanted)
    nan = float("nan")
    return {
        "accuracy": float(np.mean(clean_ok & ~rejected_clean)),
        "asr": asr,
        "rejected_clean": float(rejected_clean.mean()),
        "rejected_triggered": float(rejected_bad[counted].mean()) if counted.any() else nan,
        "asr_unfiltered": float(np.mean(success[counted])) if counted.any() else nan,
    }
