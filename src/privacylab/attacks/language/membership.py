"""Membership inference on language models: was this document in the training set?

Six scores of one document x, higher = more likely a member (formulas in
`privacylab.stats.language.membership_scores`), as compared by Duan et al. 2024 ("Do Membership
Inference Attacks Work on Large Language Models?", the mimir benchmark):

- "loss": -log P(x), the mean token log-likelihood (Yeom et al. 2018);
- "zlib": -log P(x) / zlib entropy of x (Carlini et al. 2021, Sec. 5.2);
- "reference": log P_ref(x) - log P(x), calibrated by a reference model the attacker owns and
  trained on similar public data (Carlini et al. 2021's "Small"/"Medium" metric in difference
  form; Mireshghallah et al. 2022's likelihood ratio; mimir's reference attack);
- "lowercase": log P(lower(x)) / log P(x) (Carlini et al. 2021, Sec. 5.2);
- "min-k": Min-K% Prob, the mean of the k% lowest token log-probabilities (Shi et al. 2024,
  Eq. 1-2; k = 0.2 as recommended there);
- "min-k++": Min-K%++, the same over (log p(x_t|x_<t) - mu_t) / sigma_t with mu_t and sigma_t
  the mean and standard deviation of log p(z|x_<t) over the FULL next-token distribution
  (Zhang et al. 2024, Eq. 3-4; k = 0.2).

Differences from mimir (iamgroot42/mimir, `mimir/attacks/*.py`): mimir's scores are lower =
member, ours their negation (same ROC); "k%" of n tokens is max(1, floor(k n)) here, int(k n)
in mimir (empty for short texts); zlib is counted in bits here, bytes in mimir (a factor 8);
tokens are bytes after a BOS, scored without EOS (`privacylab.attacks.language.scoring`).

One scoring pass, counted per attack. Every attack needs the same token log-probabilities of
the same texts, so `LMMembershipTask` keeps the answers of the first pass on a target (with the
next-token moments, so that Min-K%++ needs no second pass) and the token batches that pass
sent, per text set and batch size. An attack served from that cache is charged the same
batches again on its own view of the target (`Target._count`: budget, query monitors and the
query count see exactly what a fresh pass would have sent; `tokens_served` grows by the same
amount) without running the model. So each attack's `queries` is what it would have sent
alone: n documents (2n for "lowercase", which also scores the lowercased texts), while the
model runs once per distinct text set. The reference model is the attacker's own (white-box on
its own ledger): its forward passes are not target queries and are reported as
`params["reference_queries"]`; only the attack that declares "reference-models" receives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
from torch import Tensor, nn

from privacylab.attacks.core import ThreatModel, execute
from privacylab.attacks.language.base import (
    LanguageAttack,
    LanguageError,
    fraction_option,
    register_language,
    whole_option,
)
from privacylab.attacks.language.scoring import TextScores, lowercased, score_texts
from privacylab.attacks.membership.result import MembershipResult
from privacylab.stats.language import membership_scores
from privacylab.target import Access
from privacylab.target.language import LanguageTarget

__all__ = [
    "LMMembershipAttack",
    "LMMembershipOutput",
    "LMMembershipTask",
    "run_lm_membership",
]


@dataclass
class _Pass:
    """One scoring pass on one target (identified by its shared query ledger) of one text set
    ("text" or "lowercase") in batches of one size: the answers and the token batches sent,
    replayed to charge an attack served from the cache."""

    ledger: object
    variant: str
    batch_size: int
    scores: list[TextScores]
    batches: list[Tensor]


@dataclass(frozen=True)
class LMMembershipTask:
    """What the membership attacker holds: the candidate `texts` (members and non-members,
    unlabelled; a tuple, fixed with the cache) and, for "reference", its own `reference`
    language model (same tokenizer and vocabulary as the target). The cache of scoring passes
    is the attacker's record of answers it already received (module docstring)."""

    texts: tuple[str, ...]
    reference: nn.Module | None = None
    _passes: list[_Pass] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.texts, str) or not isinstance(self.texts, Sequence):
            raise LanguageError("the membership task needs a list of texts")
        object.__setattr__(self, "texts", tuple(self.texts))
        if not self.texts:
            raise LanguageError("the membership task has no texts to score")
        bad = [i for i, t in enumerate(self.texts) if not isinstance(t, str) or not t]
        if bad:
            raise LanguageError(f"text {bad[0]} is not a non-empty string")
        if self.reference is not None and not isinstance(self.reference, nn.Module):
            raise LanguageError("the reference model must be a torch module (a causal LM)")

    def scores(
        self, target: LanguageTarget, variant: str = "text", *, batch_size: int = 64
    ) -> list[TextScores]:
        """`TextScores` (with moments) of the task's texts ("text") or of their lowercased
        forms ("lowercase") under `target`, from the cache when this target's ledger already
        answered them, charging `target` the same queries either way."""
        target.require(Access.SCORES)
        ledger = target._ledger
        for done in self._passes:
            if done.ledger is ledger and (done.variant, done.batch_size) == (variant, batch_size):
                for batch in done.batches:
                    target._count(batch)
                    target._served[0] += int(batch.numel())
                return done.scores
        texts = self.texts if variant == "text" else [lowercased(t) for t in self.texts]
        batches: list[Tensor] = []
        recording = target.with_monitor(lambda x: batches.append(x.clone()))
        scores = score_texts(recording, texts, moments=True, batch_size=batch_size)
        self._passes.append(_Pass(ledger, variant, batch_size, scores, batches))
        return scores


@dataclass
class LMMembershipOutput:
    """What an attack returns: one score per text (higher = member) and facts of the run."""

    scores: np.ndarray
    details: dict[str, Any] = field(default_factory=dict)


class LMMembershipAttack(LanguageAttack):
    """A membership score of `privacylab.stats.language.membership_scores` (`score`), computed
    for every text of an `LMMembershipTask` at scores access. Options: `k` (the Min-K% fraction,
    used by "min-k" and "min-k++"), `batch_size` (texts per forward pass)."""

    kind: ClassVar[str] = "membership"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.SCORES, ())
    score: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, k: float = 0.2, batch_size: int = 64) -> None:
        self.k = fraction_option(self.name, "k", k)
        self.batch_size = whole_option(self.name, "batch_size", batch_size)

    def params(self) -> dict[str, Any]:
        """The configuration recorded with the result."""
        out: dict[str, Any] = {"batch_size": self.batch_size}
        if self.score in ("min-k", "min-k++"):
            out["k"] = self.k
        return out

    def run(self, target: LanguageTarget, task: LMMembershipTask) -> LMMembershipOutput:
        """One score per text of `task`, from the target's token log-probabilities."""
        if not isinstance(task, LMMembershipTask):
            raise LanguageError(f"{self.name}: needs an LMMembershipTask")
        main = task.scores(target, batch_size=self.batch_size)
        lower = None
        if "lowercase" in self.needs:
            lower = task.scores(target, "lowercase", batch_size=self.batch_size)
        details: dict[str, Any] = {}
        reference = None
        if "reference" in self.needs:
            reference, details["reference_queries"] = self._reference(target, task)
        values = []
        for i, text in enumerate(task.texts):
            s = main[i]
            values.append(
                membership_scores(
                    text,
                    s.log_probs,
                    reference_log_probs=None if reference is None else reference[i].log_probs,
                    lowercase_log_probs=None if lower is None else lower[i].log_probs,
                    mu=s.mu,
                    sigma=s.sigma,
                    k=self.k,
                )[self.score]
            )
        return LMMembershipOutput(np.asarray(values, dtype=np.float64), details)

    def _reference(
        self, target: LanguageTarget, task: LMMembershipTask
    ) -> tuple[list[TextScores], int]:
        if task.reference is None:
            raise LanguageError(f"{self.name}: the task has no reference model (give --reference)")
        own = LanguageTarget(task.reference, "white-box", target.vocab_size, device=target.device)
        try:
            return score_texts(own, task.texts, batch_size=self.batch_size), own.queries
        except LanguageError as exc:
            raise LanguageError(f"{self.name}: the reference model: {exc}") from None


@register_language("loss")
class LossAttack(LMMembershipAttack):
    """Loss attack (Yeom et al. 2018, "Privacy Risk in Machine Learning", Sec. 3.2) on an LM:
    -log P(x), the mean token log-likelihood; mimir's LOSS, negated."""

    score = "loss"
    paper = "Yeom et al. 2018"
    aliases = ("perplexity",)


@register_language("zlib")
class ZlibAttack(LMMembershipAttack):
    """-log P(x) / zlib entropy (Carlini et al. 2021, "Extracting Training Data from Large
    Language Models", Sec. 5.2); mimir's zlib attack negated, entropy in bits not bytes."""

    score = "zlib"
    paper = "Carlini et al. 2021"


@register_language("reference")
class ReferenceAttack(LMMembershipAttack):
    """log P_ref(x) - log P(x) with a reference model the attacker owns (Carlini et al. 2021,
    Sec. 5.2, "Small"/"Medium" as a difference; Mireshghallah et al. 2022, "Quantifying
    Privacy Risks of Masked Language Models Using Membership Inference Attacks", Eq. 2);
    mimir's reference attack (loss - reference loss), negated."""

    score = "reference"
    paper = "Carlini et al. 2021; Mireshghallah et al. 2022"
    threat_model = ThreatModel(Access.SCORES, ("reference-models",))
    needs = ("reference",)
    aliases = ("ref",)


@register_language("lowercase")
class LowercaseAttack(LMMembershipAttack):
    """log P(lower(x)) / log P(x), both under the target (Carlini et al. 2021, Sec. 5.2);
    sends the lowercased texts too (2n queries)."""

    score = "lowercase"
    paper = "Carlini et al. 2021"
    needs = ("lowercase",)


@register_language("min-k")
class MinKAttack(LMMembershipAttack):
    """Min-K% Prob (Shi et al. 2024, "Detecting Pretraining Data from Large Language Models",
    Eq. 1-2), k = 0.2 by default as the paper recommends."""

    score = "min-k"
    paper = "Shi et al. 2024"
    aliases = ("mink", "min-k%")


@register_language("min-k++")
class MinKPlusPlusAttack(LMMembershipAttack):
    """Min-K%++ (Zhang et al. 2024, "Min-K%++: Improved Baseline for Detecting Pre-Training
    Data from Large Language Models", Eq. 3-4), mu and sigma over the full vocabulary, k = 0.2
    by default as the paper recommends."""

    score = "min-k++"
    paper = "Zhang et al. 2024"
    aliases = ("mink++", "min-k%++")


def run_lm_membership(
    attack: LMMembershipAttack,
    target: LanguageTarget,
    task: LMMembershipTask,
    membership: Sequence[int] | np.ndarray,
) -> MembershipResult:
    """Run `attack` on `target` through `privacylab.attacks.core.execute` (narrowed to its
    access, queries counted), on `task` without its reference model unless the attack declares
    "reference-models" (the cache stays shared), and attach the truth `membership` (1 member,
    0 not; one per text of `task`) only afterwards: the family's one `MembershipResult`."""
    truth = np.asarray(membership).reshape(-1)
    if truth.size != len(task.texts):
        raise LanguageError(
            f"{truth.size} membership labels for {len(task.texts)} texts of the task"
        )
    if "reference-models" not in attack.threat_model.side_information:
        task = replace(task, reference=None)
    execution = execute(attack, target, task)
    output = execution.output
    return MembershipResult(
        attack=attack.name,
        scores=output.scores,
        membership=truth,
        access=attack.threat_model.access.value,
        queries=execution.queries,
        seconds=execution.seconds,
        params={**attack.params(), **output.details},
    )
