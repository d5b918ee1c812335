"""What every membership attack receives and how it is run: the membership instance of the
family-agnostic core (`privacylab.attacks.core`).

An attack sees a `Target` at exactly its declared access level and a `MembershipTask`: the
examples to judge (never their membership), data the attacker owns (`population`, never trained
on by the target) and reference/shadow models trained like the target on known subsets of the
candidates and the population (Shokri et al. 2017; Carlini et al. 2022). Each attack declares
its `ThreatModel` (access and the side information it uses: "population", "references");
`run_attack` narrows the target and the task to it, times the attack, counts its queries
(`core.execute`) and only then attaches the truth to build the `MembershipResult`.

An attack class also says how `privacylab run` uses it: `in_default_suite`, `suite_order` (the
suite's order), `subsampled` (expensive attacks run on a balanced subsample) and `aliases`.
Registering it (`@register_attack(name)` in a module of this package, which is discovered
automatically) is all it takes to join the suite.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.core import Attack, ThreatModel, execute
from privacylab.attacks.membership.result import AttackError, MembershipResult
from privacylab.data import Dataset
from privacylab.registry import Registry
from privacylab.target import Access, Outputs, Target
from privacylab.target.target import OutputDefense

SIDE_INFORMATION = ("population", "references")
"""The parts of a `MembershipTask` an attack may declare it uses beyond the candidates."""


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
    references_return: Outputs = "logits"
    """What the reference models return, "logits" or "probabilities" (as `Target`'s
    `outputs`)."""
    reference_defense: OutputDefense | None = None
    """The output defence the attacker knows the target applies (Kerckhoffs): the references
    are queried through it too (`reference_targets`), so calibrations see what the target
    shows. Part of the task's key in `reference_outputs`: a task with another defence needs
    its own cache."""

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

    @classmethod
    def from_rows(
        cls,
        data: Dataset,
        candidates: np.ndarray,
        population: np.ndarray,
        references: list[nn.Module],
        keep: np.ndarray,
        reference_defense: OutputDefense | None = None,
    ) -> MembershipTask:
        """The task whose candidates and population are the dataset rows `candidates` and
        `population` (`keep` indexes candidates then population)."""
        return cls(
            data.features[candidates],
            data.labels[candidates],
            data.num_classes,
            data.features[population],
            data.labels[population],
            references,
            keep,
            reference_defense=reference_defense,
        )

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
            references_return=self.references_return,
            reference_defense=self.reference_defense,
        )

    def restricted_to(self, side_information: Iterable[str]) -> MembershipTask:
        """The task without the side information not named (population data, references):
        what an attack with that threat model is given. Itself when nothing is removed."""
        side = set(side_information)
        unknown = sorted(side - set(SIDE_INFORMATION))
        if unknown:
            raise AttackError(
                f"unknown side information {', '.join(unknown)}; "
                f"choose from {', '.join(SIDE_INFORMATION)}"
            )
        drop_population = "population" not in side and self.m > 0
        drop_references = "references" not in side and bool(self.references)
        if not (drop_population or drop_references):
            return self
        references = [] if drop_references else self.references
        keep = None
        if references:
            assert self.keep is not None
            keep = self.keep[:, : self.n] if drop_population else self.keep
        task = MembershipTask(
            self.x,
            self.y,
            self.num_classes,
            None if drop_population else self.population_x,
            None if drop_population else self.population_y,
            references,
            keep,
            references_return=self.references_return,
            reference_defense=self.reference_defense,
        )
        if not drop_population:
            task.reference_outputs = self.reference_outputs
        return task

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
        return [
            Target(
                m,
                access,
                self.num_classes,
                outputs=self.references_return,
                output_defense=self.reference_defense,
            )
            for m in self.references
        ]

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


class MembershipAttack(Attack[MembershipTask, AttackScores]):
    """A membership inference attack: configured in the constructor, run by `score`.

    Subclasses declare `threat_model` (or only `access`, meaning no side information) and may
    set the suite attributes below; `access` always equals `threat_model.access`.
    """

    name: ClassVar[str]
    access: ClassVar[Access]
    threat_model: ClassVar[ThreatModel]
    in_default_suite: ClassVar[bool] = True
    """Whether `privacylab run` runs it by default."""
    suite_order: ClassVar[float] = 1000.0
    """Its place in the default suite (ties: registration order)."""
    subsampled: ClassVar[bool] = False
    """Costs thousands of queries per example: run on a balanced subsample of candidates."""
    aliases: ClassVar[tuple[str, ...]] = ()
    """Other names accepted for it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        if "threat_model" in own:
            cls.access = cls.threat_model.access
        elif "access" in own:
            cls.threat_model = ThreatModel(cls.access, SIDE_INFORMATION)

    @abstractmethod
    def score(self, target: Target, task: MembershipTask) -> AttackScores:
        """Per-candidate membership scores, using only `target` and `task`."""

    def run(self, target: Target, task: MembershipTask) -> AttackScores:
        """The core's entry point: `score`."""
        return self.score(target, task)


ATTACKS: Registry[type[MembershipAttack]] = Registry("membership attack", error=AttackError)
"""Every membership attack class by name (and its aliases)."""


def register_attack(name: str) -> Callable[[type[MembershipAttack]], type[MembershipAttack]]:
    """Class decorator: make an attack buildable by `make_attack(name, **options)` and, unless
    its class says otherwise, part of the default suite of `privacylab run`."""

    def decorate(cls: type[MembershipAttack]) -> type[MembershipAttack]:
        return ATTACKS.register(name, cls, aliases=tuple(getattr(cls, "aliases", ())))

    return decorate


def attack_names() -> list[str]:
    """Registered membership attacks, sorted."""
    return sorted(ATTACKS.names())


def attack_class(name: str) -> type[MembershipAttack]:
    """The class registered as `name` (or an alias), or AttackError naming the choices."""
    return ATTACKS.get(name)


def make_attack(name: str, **options: Any) -> MembershipAttack:
    """The registered attack `name` built with `options`, or AttackError naming the choices."""
    return ATTACKS.make(name, **options)


def default_suite() -> tuple[str, ...]:
    """The attacks `privacylab run` runs by default, in `suite_order`."""
    chosen = [n for n in ATTACKS.names() if ATTACKS.get(n).in_default_suite]
    return tuple(sorted(chosen, key=lambda n: ATTACKS.get(n).suite_order))


def subsampled_attacks() -> set[str]:
    """Attacks that run on a balanced subsample (their class sets `subsampled`)."""
    return {n for n in ATTACKS.names() if ATTACKS.get(n).subsampled}


def attack_aliases() -> dict[str, str]:
    """Alias -> attack name, as declared by the attack classes."""
    return ATTACKS.aliases()


def run_attack(
    attack: MembershipAttack, target: Target, task: MembershipTask, membership: np.ndarray
) -> MembershipResult:
    """Run `attack` against `target` at its declared access level, on the task narrowed to
    its declared side information, and score it against the truth `membership` (1 member, 0
    non-member), which the attack never sees. `queries` counts the examples the attack sent
    to the target (white-box forward passes included)."""
    narrowed = task.restricted_to(attack.threat_model.side_information)
    done = execute(attack, target, narrowed)
    out = done.output
    return MembershipResult(
        attack=attack.name,
        scores=out.scores,
        membership=membership,
        access=attack.access.value,
        queries=done.queries,
        seconds=done.seconds,
        predictions=out.predictions,
        params=out.params,
    )
