"""What every membership attack receives and how it is run.

An attack sees a `Target` at exactly its declared access level and a `MembershipTask`: the
examples to judge (never their membership), data the attacker owns (`population`, never trained
on by the target) and reference/shadow models trained like the target on known subsets of the
candidates and the population (Shokri et al. 2017; Carlini et al. 2022). `run_attack` times the
attack, counts its queries and attaches the truth to build the `MembershipResult`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.membership.result import AttackError, MembershipResult
from privacylab.target import Access, Target


@dataclass(eq=False)
class MembershipTask:
    """The attacker's knowledge for one membership game.

    `x`, `y`: the n candidate examples whose membership is guessed. `population_x`,
    `population_y`: m examples the attacker owns that the target never trained on (may be
    empty). `references`: R models trained with the target's recipe; `keep` is a bool array of
    shape (R, n + m) whose entry [j, i] says whether reference j trained on example i, indexing
    the candidates first and then the population. The attacker owns the references (white-box).
    """

    x: Tensor
    y: Tensor
    num_classes: int
    population_x: Tensor | None = None
    population_y: Tensor | None = None
    references: list[nn.Module] = field(default_factory=list)
    keep: np.ndarray | None = None
    reference_outputs: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """The references' outputs on `all_x()`, filled once per kind of query by the attacks that
    need them (see `outputs.reference_probabilities`), so several attacks share one pass."""

    def __post_init__(self) -> None:
        self.y = torch.as_tensor(self.y, dtype=torch.int64)
        if self.x.shape[0] != self.y.shape[0]:
            raise AttackError(f"{self.x.shape[0]} candidate examples but {self.y.shape[0]} labels")
        if self.population_x is None:
            self.population_x = self.x[:0]
            self.population_y = self.y[:0]
        assert self.population_y is not None
        self.population_y = torch.as_tensor(self.population_y, dtype=torch.int64)
        if self.population_x.shape[0] != self.population_y.shape[0]:
            raise AttackError("population features and labels differ in length")
        if self.references:
            if self.keep is None:
                raise AttackError("reference models need their keep mask")
            self.keep = np.asarray(self.keep, dtype=bool)
            expected = (len(self.references), self.n + self.m)
            if self.keep.shape != expected:
                raise AttackError(f"keep mask has shape {self.keep.shape}, expected {expected}")

    @property
    def n(self) -> int:
        """Number of candidate examples."""
        return int(self.x.shape[0])

    @property
    def m(self) -> int:
        """Number of population examples."""
        assert self.population_x is not None
        return int(self.population_x.shape[0])

    def subset(self, rows: np.ndarray) -> MembershipTask:
        """The same attacker knowledge with only the candidates at `rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        keep = None
        if self.keep is not None:
            keep = np.concatenate([self.keep[:, rows], self.keep[:, self.n :]], 1)
        return MembershipTask(
            self.x[rows],
            self.y[rows],
            self.num_classes,
            self.population_x,
            self.population_y,
            self.references,
            keep,
        )

    def all_x(self) -> Tensor:
        """Candidates then population, the order of `keep`'s columns."""
        assert self.population_x is not None
        return torch.cat([self.x, self.population_x])

    def all_y(self) -> Tensor:
        """Labels of `all_x()`."""
        assert self.population_y is not None
        return torch.cat([self.y, self.population_y])

    def reference_targets(self, access: Access | str) -> list[Target]:
        """The references behind `access`, for attacks that calibrate on them as on the target."""
        return [Target(m, access, self.num_classes) for m in self.references]

    def require_references(self, attack: str, minimum: int = 1) -> None:
        """AttackError unless at least `minimum` reference models are given."""
        if len(self.references) < minimum:
            raise AttackError(
                f"{attack} needs at least {minimum} reference models, got {len(self.references)}"
            )


@dataclass
class AttackScores:
    """What an attack returns: a membership score per candidate (higher: more likely member),
    hard decisions when it chose a threshold without the candidates' truth, and its settings."""

    scores: np.ndarray
    predictions: np.ndarray | None = None
    params: dict[str, Any] = field(default_factory=dict)


class MembershipAttack(ABC):
    """A membership inference attack: configured in the constructor, run by `score`."""

    name: ClassVar[str]
    access: ClassVar[Access]

    @abstractmethod
    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        """Per-candidate membership scores, using only `target` and `task`."""


_ATTACKS: dict[str, Callable[..., MembershipAttack]] = {}


def register_attack(name: str) -> Callable[[type[MembershipAttack]], type[MembershipAttack]]:
    """Class decorator: make an attack buildable by `make_attack(name, **options)`."""

    def decorate(cls: type[MembershipAttack]) -> type[MembershipAttack]:
        if name in _ATTACKS:
            raise ValueError(f"membership attack {name!r} registered twice")
        _ATTACKS[name] = cls
        return cls

    return decorate


def attack_names() -> list[str]:
    """Registered membership attacks, sorted."""
    return sorted(_ATTACKS)


def make_attack(name: str, **options: Any) -> MembershipAttack:
    """The registered attack `name` built with `options`, or AttackError naming the choices."""
    if name not in _ATTACKS:
        raise AttackError(
            f"unknown membership attack {name!r}; choose one of {', '.join(attack_names())}"
        )
    return _ATTACKS[name](**options)


def run_attack(
    attack: MembershipAttack, target: Target, task: MembershipTask, membership: np.ndarray
) -> MembershipResult:
    """Run `attack` against `target` at its declared access level and score it against the
    truth `membership` (1 member, 0 non-member), which the attack never sees."""
    target.require(attack.access)
    view = target.with_access(attack.access)
    start = time.perf_counter()
    out = attack.score(view, task)
    seconds = time.perf_counter() - start
    return MembershipResult(
        attack=attack.name,
        scores=out.scores,
        membership=membership,
        access=attack.access.value,
        queries=view.queries,
        seconds=seconds,
        predictions=out.predictions,
        params=out.params,
    )
