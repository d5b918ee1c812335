"""The Secret-Sharer exposure attack (Carlini et al. 2019, "The Secret Sharer", Sec. 4): the
log-perplexity, under the target, of every candidate `prefix + r + suffix` for r in
`alphabet ** length` (enumeration) or of a uniform sample of them with a fitted skew-normal law
(extrapolation). The task holds canary FORMATS only (`canary-formats` side information): the
job ranks the true secret among the candidates afterwards (`privacylab.lm_exposure`).

Enumeration walks the candidate tree (Sec. 4.3, "Efficiently computing exposure"; the paper
uses a shortest-path search over the same tree): every candidate shares the prefix, so a
candidate's log-perplexity is -(prefix + secret + suffix token log-probs) / n with one n for
all. The secret's log-prob is the sum, along its path, of one next-token distribution per tree
node: querying `target.distributions` once on `BOS + prefix + partial secret` for each of the
|A|^0 + ... + |A|^(L-1) inner nodes (one query each) scores all |A|^L leaves, about |A|-1
times fewer forward passes than scoring |A|^L full texts. A non-empty suffix still needs the
leaves scored (|A|^L queries more: the suffix depends on the whole secret). Values equal
`score_texts` + `stats.language.log_perplexity` of each full text (the same scored tokens
BOS + prefix + secret + suffix, no EOS), up to float32 rounding of the forward passes.

Candidates are numbered in base |A|, first character most significant (`CanaryFormat.index`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.language.base import (
    LanguageAttack,
    LanguageError,
    register_language,
    whole_option,
)
from privacylab.attacks.language.scoring import score_texts
from privacylab.data.tokenizer import PAD
from privacylab.stats._checks import StatisticsError
from privacylab.stats.exposure import SkewNormal, fit_skew_normal
from privacylab.stats.language import log_perplexity
from privacylab.target import Access, Target
from privacylab.target.language import LanguageTarget

__all__ = [
    "METHODS",
    "CanaryFormat",
    "ExposureTask",
    "FormatScores",
    "SecretSharer",
    "enumerate_values",
    "sample_values",
]

METHODS = ("auto", "enumerate", "extrapolate")

Progress = Callable[[int, int], None]
"""`progress(done, total)`: candidates (or tree nodes) scored so far of one format."""

_ROW_FLOATS = 1 << 25
"""Next-token log-probabilities fetched per `distributions` call at most (rows x positions x
vocabulary; 128 MiB of float32)."""


@dataclass(frozen=True)
class CanaryFormat:
    """What the attacker knows of a canary: `prefix + r + suffix`, r drawn uniformly from
    `alphabet ** length` (Carlini et al. 2019, Sec. 3: the format s[.] and the randomness
    space R); never the secret."""

    prefix: str
    alphabet: str
    length: int
    suffix: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.alphabet, str) or not self.alphabet:
            raise LanguageError("a canary format needs a non-empty alphabet")
        if len(set(self.alphabet)) != len(self.alphabet):
            raise LanguageError(f"the alphabet {self.alphabet!r} repeats a character")
        if len({len(c.encode("utf-8")) for c in self.alphabet}) != 1:
            raise LanguageError(
                f"the alphabet {self.alphabet!r} mixes characters of different UTF-8 lengths"
            )
        whole_option("canary format", "length", self.length)
        if not isinstance(self.prefix, str) or not isinstance(self.suffix, str):
            raise LanguageError("a canary format's prefix and suffix must be text")

    @property
    def space_size(self) -> int:
        """|R| = |alphabet| ** length (exact)."""
        return len(self.alphabet) ** self.length

    @property
    def space_bits(self) -> float:
        """log2 |R|, the largest exposure possible."""
        return self.length * math.log2(len(self.alphabet))

    def text(self, secret: str) -> str:
        """The candidate text with `secret` filled in."""
        return self.prefix + secret + self.suffix

    def secret(self, index: int) -> str:
        """The candidate secret numbered `index` (base |A|, first character most significant)."""
        base = len(self.alphabet)
        chars = []
        for _ in range(self.length):
            index, digit = divmod(int(index), base)
            chars.append(self.alphabet[digit])
        return "".join(reversed(chars))

    def index(self, secret: str) -> int:
        """The number of `secret` among the candidates; LanguageError if it is not one."""
        if len(secret) != self.length or any(c not in self.alphabet for c in secret):
            raise LanguageError(
                f"{secret!r} is not {self.length} characters of the alphabet {self.alphabet!r}"
            )
        number = 0
        for c in secret:
            number = number * len(self.alphabet) + self.alphabet.index(c)
        return number

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "prefix": self.prefix,
            "suffix": self.suffix,
            "alphabet": self.alphabet,
            "length": self.length,
        }


@dataclass(frozen=True)
class ExposureTask:
    """The canary formats whose candidates to score (side information `canary-formats`)."""

    formats: list[CanaryFormat] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.formats:
            raise LanguageError("secret-sharer: the task has no canary formats")
        for fmt in self.formats:
            if not isinstance(fmt, CanaryFormat):
                raise LanguageError("secret-sharer: task formats must be CanaryFormat objects")


@dataclass
class FormatScores:
    """One format's candidate log-perplexities: `values[i]` of candidate i (`method`
    "enumerate": all |R| of them, in `CanaryFormat.index` order) or of `secrets[i]` (method
    "extrapolate": a uniform sample with replacement); `fit`, the skew-normal law fitted to a
    uniform sample of them (None when fewer than 3 distinct values); `queries` sent."""

    format: CanaryFormat
    method: str
    values: np.ndarray
    secrets: list[str] | None
    fit: SkewNormal | None
    queries: int
    samples: int


@register_language("secret-sharer")
class SecretSharer(LanguageAttack):
    """Candidate log-perplexities of each canary format (module docstring). `method`: "auto"
    enumerates spaces of at most `enumerate_limit` candidates and extrapolates larger ones;
    `samples` candidates (drawn with `seed`) feed the skew-normal fit; `batch_size` rows per
    target call; `progress(done, total)` is told as a format's scoring advances."""

    kind: ClassVar[str] = "exposure"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.SCORES, ("canary-formats",))
    paper: ClassVar[str] = "Carlini et al. 2019, The Secret Sharer, Sec. 4"
    aliases: ClassVar[tuple[str, ...]] = ("exposure",)

    def __init__(
        self,
        method: str = "auto",
        enumerate_limit: int = 10**6,
        samples: int = 5000,
        batch_size: int = 1024,
        seed: int = 0,
        progress: Progress | None = None,
    ) -> None:
        if method not in METHODS:
            raise LanguageError(
                f"secret-sharer: method must be one of {', '.join(METHODS)}, got {method!r}"
            )
        self.method = method
        self.enumerate_limit = whole_option(self.name, "enumerate_limit", enumerate_limit)
        self.samples = whole_option(self.name, "samples", samples, low=3)
        self.batch_size = whole_option(self.name, "batch_size", batch_size)
        self.seed = whole_option(self.name, "seed", seed, low=0)
        self.progress = progress

    def method_for(self, fmt: CanaryFormat) -> str:
        """The method `fmt` gets under this configuration: enumerate or extrapolate."""
        if self.method != "auto":
            return self.method
        return "enumerate" if fmt.space_size <= self.enumerate_limit else "extrapolate"

    def run(self, target: Target, task: ExposureTask) -> list[FormatScores]:
        """`FormatScores` of every format of `task`, in order."""
        if not isinstance(target, LanguageTarget):
            raise LanguageError("secret-sharer needs a language-model target")
        if not isinstance(task, ExposureTask):
            raise LanguageError("secret-sharer takes an ExposureTask")
        out = []
        for number, fmt in enumerate(task.formats):
            tokens = 1 + len(fmt.text(fmt.alphabet[0] * fmt.length).encode("utf-8"))
            if tokens > target.context:
                raise LanguageError(
                    f"canary format {fmt.prefix!r}... is {tokens - 1} tokens after BOS; the "
                    f"model's context holds {target.context - 1}"
                )
            rng = np.random.default_rng([self.seed, number])
            before = target.queries
            if self.method_for(fmt) == "enumerate":
                if fmt.space_size > 10**9:
                    raise LanguageError(
                        f"secret-sharer: {fmt.space_size} candidates are too many to enumerate; "
                        "use extrapolate"
                    )
                values = enumerate_values(target, fmt, self.batch_size, self.progress)
                count = min(self.samples, values.size)
                sample = values[rng.choice(values.size, size=count, replace=False)]
                out.append(
                    FormatScores(
                        fmt, "enumerate", values, None, _fit(sample), target.queries - before, count
                    )
                )
            else:
                picks = rng.integers(0, len(fmt.alphabet), size=(self.samples, fmt.length))
                secrets = ["".join(fmt.alphabet[i] for i in row) for row in picks]
                values = sample_values(target, fmt, secrets, self.batch_size, self.progress)
                out.append(
                    FormatScores(
                        fmt,
                        "extrapolate",
                        values,
                        secrets,
                        _fit(values),
                        target.queries - before,
                        len(secrets),
                    )
                )
        return out


def _fit(values: np.ndarray) -> SkewNormal | None:
    if np.unique(values).size < 3:
        return None
    try:
        return fit_skew_normal(values)
    except StatisticsError:
        return None


def sample_values(
    target: LanguageTarget,
    fmt: CanaryFormat,
    secrets: list[str],
    batch_size: int = 1024,
    progress: Progress | None = None,
) -> np.ndarray:
    """Log-perplexity of each `fmt.text(secret)` (full texts scored by `score_texts`; one query
    each)."""
    values = np.empty(len(secrets))
    for start in range(0, len(secrets), batch_size):
        chunk = secrets[start : start + batch_size]
        scores = score_texts(target, [fmt.text(s) for s in chunk], batch_size=batch_size)
        values[start : start + len(chunk)] = [log_perplexity(s.log_probs) for s in scores]
        if progress is not None:
            progress(start + len(chunk), len(secrets))
    return values


def enumerate_values(
    target: LanguageTarget,
    fmt: CanaryFormat,
    batch_size: int = 1024,
    progress: Progress | None = None,
) -> np.ndarray:
    """Log-perplexity of every candidate of `fmt`, in index order, by the depth-by-depth tree
    walk of the module docstring: one `distributions` query per inner node (per distinct
    leading byte string of the alphabet's characters when they are multi-byte), plus one
    `token_log_probs` query per leaf when there is a suffix."""
    tokenizer = target.tokenizer
    head = tokenizer.encode(fmt.prefix, bos=True)
    chars = [list(c.encode("utf-8")) for c in fmt.alphabet]
    width = len(chars[0])
    leads: dict[tuple[int, ...], list[int]] = {}
    for k, b in enumerate(chars):
        leads.setdefault(tuple(b[:-1]), []).append(k)
    tail = list(fmt.suffix.encode("utf-8"))
    base = len(chars)
    total_nodes = sum(base**d for d in range(fmt.length)) * len(leads)
    total = total_nodes + (base**fmt.length if tail else 0)
    done = 0

    partial = np.zeros((1, 0), dtype=np.int64)
    sums = np.zeros(1)
    prefix_sum = 0.0
    char_bytes = np.asarray(chars, dtype=np.int64)
    for depth in range(fmt.length):
        nodes = partial.shape[0]
        stem = len(head) + depth * width
        step = np.zeros((nodes, base))
        for lead, members in leads.items():
            rows = np.concatenate(
                [
                    np.broadcast_to(np.asarray(head, dtype=np.int64), (nodes, len(head))),
                    partial,
                    np.broadcast_to(np.asarray(lead, dtype=np.int64), (nodes, len(lead))),
                    np.full((nodes, 1), PAD, dtype=np.int64),
                ],
                axis=1,
            )
            chunk = max(1, min(batch_size, _ROW_FLOATS // (rows.shape[1] * target.vocab_size)))
            for start in range(0, nodes, chunk):
                dist = target.distributions(rows[start : start + chunk]).numpy()
                if depth == 0 and start == 0 and lead == next(iter(leads)):
                    picked = dist[0, np.arange(len(head) - 1), head[1:]].astype(np.float64)
                    prefix_sum = float(picked.sum())
                for k in members:
                    positions = stem - 1 + np.arange(width)
                    picks = dist[:, positions, char_bytes[k]].astype(np.float64)
                    step[start : start + chunk, k] = picks.sum(-1)
                done += dist.shape[0]
                if progress is not None:
                    progress(done, total)
        sums = (sums[:, None] + step).reshape(-1)
        partial = np.concatenate(
            [np.repeat(partial, base, axis=0), np.tile(char_bytes, (nodes, 1))], axis=1
        )
    if tail:
        whole = np.concatenate(
            [
                np.broadcast_to(np.asarray(head, dtype=np.int64), (partial.shape[0], len(head))),
                partial,
                np.broadcast_to(np.asarray(tail, dtype=np.int64), (partial.shape[0], len(tail))),
            ],
            axis=1,
        )
        chunk = max(1, min(batch_size, _ROW_FLOATS // whole.shape[1]))
        for start in range(0, whole.shape[0], chunk):
            logp = target.token_log_probs(whole[start : start + chunk]).double().numpy()
            sums[start : start + chunk] += logp[:, -len(tail) :].sum(-1)
            done += logp.shape[0]
            if progress is not None:
                progress(done, total)
    scored = len(head) - 1 + fmt.length * width + len(tail)
    return -(prefix_sum + sums) / scored
