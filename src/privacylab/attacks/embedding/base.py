"""Attacks on released text embeddings and the shape they share: the embedding instance of the
family-agnostic core (`privacylab.attacks.core`).

Du et al. 2023 ("DP-Forward", CCS'23, Sec. 6.1): the adversary — the untrusted service
provider or an eavesdropper — observes the embeddings users release at the pipeline's cut
(clear f(X), or f(X) + Z under DP-Forward), knows the public pretrained encoder (and, for
DP-Forward, f(·)'s weights: the provider distributes them), and may hold auxiliary labelled
sequences whose embeddings it obtains by querying f(·). Two kinds live in one registry,
`EMBEDDING_ATTACKS`:

- "inversion" (Sec. 6.3): the victims' tokens from their embeddings (`InversionOutput`),
  scored by `run_inversion` with token recall (`privacylab.stats.embedding.token_recall`);
- "attribute" (Sec. 6.4): a sensitive attribute of each victim (`AttributeOutput`), scored by
  `run_attribute` with accuracy beside the majority share.

Each attack receives an `EmbeddingTarget` narrowed to `logits` access (what
`EmbeddingTarget.embeddings` needs) and an `EmbeddingTask` holding only the observed
embeddings and its declared side information (`SIDE_INFORMATION`), never the victims' ids or
attributes; the runners attach those only after the attack returns.
"""

from __future__ import annotations

import time
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
from privacylab.registry import Registry
from privacylab.stats.embedding import majority_share, token_recall
from privacylab.target import Target

__all__ = [
    "EMBEDDING_ATTACKS",
    "KINDS",
    "SIDE_INFORMATION",
    "AttributeOutput",
    "AttributeResult",
    "EmbeddingAttack",
    "EmbeddingError",
    "EmbeddingTask",
    "InversionOutput",
    "InversionResult",
    "embedding_class",
    "embedding_names",
    "make_embedding",
    "number_option",
    "register_embedding",
    "run_attribute",
    "run_inversion",
    "whole_option",
]

KINDS = ("inversion", "attribute")

SIDE_INFORMATION = ("public-encoder", "auxiliary-data")
"""What an embedding task may give beyond the observed embeddings: `public-encoder`, the public
pretrained encoder (a transformers BertModel: its embedding table and layers; for DP-Forward
the provider's own f(·)); `auxiliary-data`, labelled sequences of the attacker's own (token ids
with their sensitive attributes), disjoint from the victims."""


class EmbeddingError(PrivacylabError, ValueError):
    """An embedding attack cannot run with this configuration, target or task; one line."""


def whole_option(attack: str, name: str, value: object, low: int = 1) -> int:
    """`value` as a whole number >= `low`, else a one-line EmbeddingError (bools refused)."""
    return core_whole(EmbeddingError, attack, name, value, low)


def number_option(attack: str, name: str, value: object, *, zero: bool = False) -> float:
    """`value` as a finite number > 0 (>= 0 with `zero`), else a one-line EmbeddingError."""
    return core_number(EmbeddingError, attack, name, value, zero=zero)


@dataclass(eq=False)
class EmbeddingTask:
    """What the attacker knows. `observed`: the victims' released embeddings (m, r, d), as the
    target releases them; `length`: the fixed sequence length L users send; `public_encoder`:
    side information "public-encoder"; `auxiliary_ids` (a, L) with `auxiliary_attributes` (a,)
    indexing `attribute_names`: side information "auxiliary-data"; `seed` seeds the attack."""

    observed: Tensor
    length: int
    public_encoder: nn.Module | None = None
    auxiliary_ids: Tensor | None = None
    auxiliary_attributes: np.ndarray | None = None
    attribute_names: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        observed = torch.as_tensor(self.observed)
        if observed.ndim != 3 or not observed.dtype.is_floating_point:
            raise EmbeddingError(
                f"observed embeddings must be a float tensor (m, r, d), got {tuple(observed.shape)}"
            )
        if not bool(torch.isfinite(observed).all()):
            raise EmbeddingError("observed embeddings hold NaN or infinite values")
        self.observed = observed.detach().float()
        self.length = whole_option("task", "length", self.length)
        self.seed = whole_option("task", "seed", self.seed, 0)
        self.attribute_names = tuple(str(a) for a in self.attribute_names)
        if (self.auxiliary_ids is None) != (self.auxiliary_attributes is None):
            raise EmbeddingError("auxiliary data needs both token ids and attributes")
        if self.auxiliary_ids is not None:
            ids = torch.as_tensor(self.auxiliary_ids)
            if ids.ndim != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
                raise EmbeddingError("auxiliary ids must be integer token ids of shape (a, L)")
            labels = np.asarray(self.auxiliary_attributes).reshape(-1)
            if labels.shape[0] != ids.shape[0] or not np.issubdtype(labels.dtype, np.integer):
                raise EmbeddingError("auxiliary attributes must be one integer per aux sequence")
            if labels.size and labels.min() < 0:
                raise EmbeddingError("auxiliary attributes must be >= 0")
            if labels.size and self.attribute_names and labels.max() >= len(self.attribute_names):
                raise EmbeddingError("auxiliary attributes must index attribute_names")
            self.auxiliary_ids = ids.to(torch.int64)
            self.auxiliary_attributes = labels.astype(np.int64)

    @property
    def classes(self) -> int:
        """Number of attribute values (named, else seen in the auxiliary data)."""
        if self.attribute_names:
            return len(self.attribute_names)
        if self.auxiliary_attributes is None or not len(self.auxiliary_attributes):
            return 0
        return int(np.max(self.auxiliary_attributes)) + 1

    def restricted_to(self, side_information: Iterable[str]) -> EmbeddingTask:
        """The task without the side information not named."""
        side = set(side_information)
        unknown = sorted(side - set(SIDE_INFORMATION))
        if unknown:
            raise EmbeddingError(
                f"unknown side information {', '.join(unknown)}; "
                f"choose from {', '.join(SIDE_INFORMATION)}"
            )
        aux = "auxiliary-data" in side
        return replace(
            self,
            public_encoder=self.public_encoder if "public-encoder" in side else None,
            auxiliary_ids=self.auxiliary_ids if aux else None,
            auxiliary_attributes=self.auxiliary_attributes if aux else None,
        )


@dataclass
class InversionOutput:
    """What an inversion attack returns: `tokens` (m, L) int64, the recovered ids (PAD_ID =
    none), and `params` (settings, diagnostics)."""

    tokens: Tensor
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class AttributeOutput:
    """What an attribute attack returns: `predictions` (m,) attribute indices and
    `probabilities` (m, k)."""

    predictions: np.ndarray
    probabilities: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)


class EmbeddingAttack(Attack[EmbeddingTask, Any]):
    """An attack of this family: `kind` says what it returns ("inversion":
    `InversionOutput`, "attribute": `AttributeOutput`); `paper` names what it follows."""

    name: ClassVar[str]
    kind: ClassVar[str] = "inversion"
    threat_model: ClassVar[ThreatModel]
    paper: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()


EMBEDDING_ATTACKS: Registry[type[EmbeddingAttack]] = Registry(
    "embedding attack", error=EmbeddingError
)
"""Every embedding attack class by name (and its aliases), of both kinds."""


def register_embedding(name: str) -> Callable[[type[EmbeddingAttack]], type[EmbeddingAttack]]:
    """Class decorator: make an attack buildable by `make_embedding(name, **options)`."""

    def decorate(cls: type[EmbeddingAttack]) -> type[EmbeddingAttack]:
        if cls.kind not in KINDS:
            raise EmbeddingError(f"{name}: kind must be one of {', '.join(KINDS)}")
        unknown = set(cls.threat_model.side_information) - set(SIDE_INFORMATION)
        if unknown:
            raise EmbeddingError(f"{name}: unknown side information {', '.join(sorted(unknown))}")
        cls.name = name
        return EMBEDDING_ATTACKS.register(name, cls, aliases=tuple(getattr(cls, "aliases", ())))

    return decorate


def embedding_names(kind: str | None = None) -> list[str]:
    """Registered embedding attacks (of `kind`, if given), sorted."""
    return sorted(n for n, c in EMBEDDING_ATTACKS.items() if kind is None or c.kind == kind)


def embedding_class(name: str, kind: str | None = None) -> type[EmbeddingAttack]:
    """The class registered as `name`, or EmbeddingError naming the choices (of `kind`)."""
    if kind is not None and name not in EMBEDDING_ATTACKS:
        raise EmbeddingError(
            f"unknown {kind} attack {name!r}; choose one of {', '.join(embedding_names(kind))}"
        )
    cls = EMBEDDING_ATTACKS.get(name)
    if kind is not None and cls.kind != kind:
        raise EmbeddingError(
            f"{name} is an {cls.kind} attack; choose one of {', '.join(embedding_names(kind))}"
        )
    return cls


def make_embedding(name: str, kind: str | None = None, **options: Any) -> EmbeddingAttack:
    """The registered attack `name` built with `options`, or EmbeddingError."""
    return embedding_class(name, kind)(**options)


def _attack(attack: EmbeddingAttack | str, kind: str) -> EmbeddingAttack:
    built = make_embedding(attack, kind) if isinstance(attack, str) else attack
    if not isinstance(built, EmbeddingAttack) or built.kind != kind:
        raise EmbeddingError(f"{getattr(built, 'name', built)} is not an {kind} attack")
    return built


def _victims(task: EmbeddingTask) -> int:
    if not isinstance(task, EmbeddingTask):
        raise EmbeddingError("an embedding attack takes an EmbeddingTask")
    return int(task.observed.shape[0])


def _execute(attack: EmbeddingAttack, target: Target, task: EmbeddingTask) -> Any:
    if not isinstance(task, EmbeddingTask):
        raise EmbeddingError("an embedding attack takes an EmbeddingTask")
    return execute(attack, target, task.restricted_to(attack.threat_model.side_information))


@dataclass
class InversionResult:
    """One inversion attack on m victims: mean token `recall` (NaN-free mean over victims with
    content tokens), `per_sequence` recall, up to `examples` recovered beside true sequences
    ({"truth", "recovered", "truth_ids", "recovered_ids", "recall"}), `queries`, `seconds`.

    `baseline_recall`: the mean recall of each victim's recovered tokens against ANOTHER
    victim's tokens (the next one, cyclically): what the attack scores without any
    victim-specific information — frequent words guessed from the public prior or the
    auxiliary data. Leakage about a victim is `recall` above it."""

    method: str
    recall: float
    baseline_recall: float
    per_sequence: list[float]
    examples: list[dict[str, Any]]
    queries: int
    seconds: float
    access: str
    params: dict[str, Any] = field(default_factory=dict)
    tokens: Tensor | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (without the recovered token tensor)."""
        return {
            "method": self.method,
            "recall": self.recall,
            "baseline_recall": self.baseline_recall,
            "per_sequence": self.per_sequence,
            "examples": self.examples,
            "queries": self.queries,
            "seconds": self.seconds,
            "access": self.access,
            "params": self.params,
        }


def _mean(values: np.ndarray) -> float:
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if finite.size else float("nan")


def run_inversion(
    attack: EmbeddingAttack | str,
    target: Target,
    task: EmbeddingTask,
    truth_ids: Tensor | np.ndarray,
    *,
    decode: Callable[[list[int]], str] | None = None,
    examples: int = 5,
) -> InversionResult:
    """Run an inversion attack on `target` and `task`, then score its tokens against the
    victims' true ids `truth_ids` (m, L), seen only now, with `token_recall`; `decode` turns
    ids into text for the examples (else they hold the ids' string)."""
    attack = _attack(attack, "inversion")
    examples = whole_option("run_inversion", "examples", examples, 0)
    truth = np.asarray(torch.as_tensor(truth_ids).cpu())
    if truth.ndim != 2 or truth.shape[0] != _victims(task):
        raise EmbeddingError(
            f"{truth.shape[0] if truth.ndim else 0} true sequences for "
            f"{_victims(task)} observed embeddings"
        )
    start = time.perf_counter()
    run = _execute(attack, target, task)
    output = run.output
    if not isinstance(output, InversionOutput):
        raise EmbeddingError(f"{attack.name} returned {type(output).__name__}, not tokens")
    tokens = np.asarray(torch.as_tensor(output.tokens).cpu())
    if tokens.ndim != 2 or tokens.shape[0] != truth.shape[0]:
        raise EmbeddingError(f"{attack.name} returned {tokens.shape} tokens for {truth.shape}")
    recall = token_recall(tokens, truth)
    others = token_recall(tokens, np.roll(truth, 1, axis=0)) if len(truth) > 1 else recall[:0]
    shown = []
    text = decode or (lambda ids: " ".join(map(str, ids)))
    for i in range(min(examples, len(truth))):
        true_ids = [int(t) for t in truth[i]]
        got_ids = [int(t) for t in tokens[i]]
        shown.append(
            {
                "truth": text(true_ids),
                "recovered": text(got_ids),
                "truth_ids": true_ids,
                "recovered_ids": got_ids,
                "recall": None if np.isnan(recall[i]) else float(recall[i]),
            }
        )
    return InversionResult(
        method=attack.name,
        recall=_mean(recall),
        baseline_recall=_mean(others),
        per_sequence=[float(r) for r in recall],
        examples=shown,
        queries=run.queries,
        seconds=time.perf_counter() - start,
        access=run.access.value,
        params=dict(output.params),
        tokens=torch.as_tensor(tokens),
    )


@dataclass
class AttributeResult:
    """One attribute-inference attack on m victims: `accuracy`, `chance` (the majority share
    of the victims' true attributes), `queries`, `seconds`."""

    method: str
    accuracy: float
    chance: float
    queries: int
    seconds: float
    access: str
    predictions: list[int]
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "method": self.method,
            "accuracy": self.accuracy,
            "chance": self.chance,
            "queries": self.queries,
            "seconds": self.seconds,
            "access": self.access,
            "predictions": self.predictions,
            "params": self.params,
        }


def run_attribute(
    attack: EmbeddingAttack | str,
    target: Target,
    task: EmbeddingTask,
    truth: np.ndarray,
) -> AttributeResult:
    """Run an attribute attack on `target` and `task`, then score its predictions against the
    victims' true attributes `truth` (m,), seen only now: accuracy beside `majority_share`."""
    attack = _attack(attack, "attribute")
    true = np.asarray(truth).reshape(-1)
    if true.shape[0] != _victims(task):
        raise EmbeddingError(
            f"{true.shape[0]} true attributes for {_victims(task)} observed embeddings"
        )
    start = time.perf_counter()
    run = _execute(attack, target, task)
    output = run.output
    if not isinstance(output, AttributeOutput):
        raise EmbeddingError(f"{attack.name} returned {type(output).__name__}, not attributes")
    predictions = np.asarray(output.predictions).reshape(-1)
    if predictions.shape != true.shape:
        raise EmbeddingError(f"{attack.name} returned {predictions.shape[0]} predictions")
    return AttributeResult(
        method=attack.name,
        accuracy=float(np.mean(predictions == true)) if true.size else float("nan"),
        chance=majority_share(true) if true.size else float("nan"),
        queries=run.queries,
        seconds=time.perf_counter() - start,
        access=run.access.value,
        predictions=[int(p) for p in predictions],
        params=dict(output.params),
    )
