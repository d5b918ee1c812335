"""The shape every attack family keeps, whatever it infers (membership, a model's weights, a
training example, a secret string, a backdoor).

1. A *task* holds what the attacker knows (its own data, reference or shadow models, a
   public prior) and never the truth being attacked.
2. Each attack declares its `ThreatModel`: the access level it needs of the target and the
   side information of the task it uses (e.g. `ThreatModel(Access.SCORES,
   ("population", "references"))`).
3. `execute` narrows the `Target` to exactly that access (a view: one budget, one query
   counter and one query monitor with the target) — or, for an attack that declares
   `uses_up_to`, to what the target offers up to that — times the attack and counts its
   queries.
4. The attack returns its outputs (scores, a reconstruction...); the family's runner attaches
   the truth only afterwards and builds the family's one result type (for membership,
   `run_attack` -> `MembershipResult`), so no attack can look at the answer.

This is the decision/threat-model split of the attack literature made explicit: Shokri et al.
2017 and Carlini et al. 2022 (membership: task = candidates, population, references), Tramèr
et al. 2016 (extraction: task = a query distribution), breaching's server/user/attacker cases
(reconstruction: task = what the protocol sends).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from privacylab.target import Access, Target

TaskT = TypeVar("TaskT")
OutputT = TypeVar("OutputT")

__all__ = ["Attack", "Execution", "ThreatModel", "execute", "number_option", "whole_option"]


@dataclass(frozen=True)
class ThreatModel:
    """What an attack may use: `access` to the target (label < scores < logits < white-box)
    and the named parts of its task (`side_information`) beyond the examples attacked."""

    access: Access
    side_information: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "access", Access.parse(self.access))
        object.__setattr__(self, "side_information", tuple(self.side_information))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"access": self.access.value, "side_information": list(self.side_information)}


class Attack(ABC, Generic[TaskT, OutputT]):
    """An attack of any family: configured in the constructor, run by `run(target, task)` on
    a target already narrowed to `threat_model.access`."""

    name: ClassVar[str]
    threat_model: ClassVar[ThreatModel]
    uses_up_to: ClassVar[Access | None] = None
    """The most the attack can use when the target offers more than it needs (a learning
    extraction attack needs labels and trains on probability vectors when served them):
    `execute` serves it min(target's access, uses_up_to) instead of the least it needs. None:
    always exactly `threat_model.access`."""

    @abstractmethod
    def run(self, target: Target, task: TaskT) -> OutputT:
        """The attack's outputs, using only `target` and `task`."""


@dataclass
class Execution(Generic[OutputT]):
    """One run of an attack: its `output`, the examples it sent to the target (`queries`,
    white-box forward passes included), wall-clock `seconds` and the `access` it ran under."""

    output: OutputT
    queries: int
    seconds: float
    access: Access


def execute(attack: Attack[TaskT, OutputT], target: Target, task: TaskT) -> Execution[OutputT]:
    """Run `attack` on a view of `target` at the attack's declared access (up to its
    `uses_up_to` where the target offers more): AccessError when the target offers less; the
    view shares the target's budget, monitor and query count; `Execution.access` is the level
    it was served."""
    access = attack.threat_model.access
    target.require(access)
    ceiling = attack.uses_up_to
    if ceiling is not None and target.access.rank > access.rank:
        access = target.access if ceiling.allows(target.access) else Access.parse(ceiling)
    view = target.with_access(access)
    start = time.perf_counter()
    output = attack.run(view, task)
    seconds = time.perf_counter() - start
    return Execution(output=output, queries=view.queries, seconds=seconds, access=access)


def whole_option(
    error: type[Exception], attack: str, name: str, value: object, low: int = 1
) -> int:
    """`value` as a whole number >= `low`, else a one-line `error` naming `attack`'s option
    `name` (bools refused): the check every family's attack options share."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise error(f"{attack}: {name} must be a whole number >= {low}, got {value!r}")
    return int(value)


def number_option(
    error: type[Exception], attack: str, name: str, value: object, *, zero: bool = False
) -> float:
    """`value` as a finite number > 0 (>= 0 with `zero`), else a one-line `error` naming
    `attack`'s option `name` (bools refused)."""
    real = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    number = float(value) if real else math.nan  # type: ignore[arg-type]
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise error(f"{attack}: {name} must be a finite number {bound}, got {value!r}")
    return number
