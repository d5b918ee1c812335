"""The Secret-Sharer exposure attack (Carlini et al. 2019, "The Secret Sharer", Sec. 4): the
log-perplexity, under the target, of every candidate `prefix + r + suffix` for r in
`alphabet ** length` (enumeration) or of a uniform sample of them with a fitted skew-normal law
(extrapolation). The task holds canary FORMATS only (`canary-formats` side information): the
job ranks the true secret among the candidates afterwards (`privacylab.lm_exposure`).

Enumeration walks the candidate tree (Sec. 4.3, "Efficiently computing exposure"; the paper
uses a shortest-path search over the same tree): every candidate shares the prefix, so a
candidate's log-perplexity is -(prefix + secret + suffix token log-probs) / n with one n for
all. The secret's log-prob is the sum, along its path, of one next-token distribution per tree
node: one query (a `distributions` row `BOS + prefix + partial secret`) for each of the
|A|^0 + ... + |A|^(L-1) inner nodes scores all |A|^L leaves, about |A|-1 times fewer queries
than scoring |A|^L full texts. A non-empty suffix still needs the leaves scored (|A|^L
queries more: the suffix depends on the whole secret). The server side of the walk keeps each
node's key/value cache and runs only the node's last character through the model (`_Walk`);
the queries and served distributions are counted as the uncached rows would be. Values equal
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
import torch
import torch.nn.functional as F
from torch import Tensor

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.language.base import (
    LanguageAttack,
    LanguageError,
    register_language,
    whole_option,
)
from privacylab.attacks.language.scoring import score_texts
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

_CACHE_BYTES = 1 << 26
"""Key/value cache of one block of tree nodes at most (64 MiB; one block per depth is held)."""


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
            _fits(target, fmt)
            rng = np.random.default_rng([self.seed, number])
            before = target.queries
            method = self.method_for(fmt)
            secrets = None
            if method == "enumerate":
                if fmt.space_size > 10**9:
                    raise LanguageError(
                        f"secret-sharer: {fmt.space_size} candidates are too many to enumerate; "
                        "use extrapolate"
                    )
                values = enumerate_values(target, fmt, self.batch_size, self.progress)
                count = min(self.samples, values.size)
                sample = values[rng.choice(values.size, size=count, replace=False)]
            else:
                picks = rng.integers(0, len(fmt.alphabet), size=(self.samples, fmt.length))
                secrets = ["".join(fmt.alphabet[i] for i in row) for row in picks]
                values = sample = sample_values(
                    target, fmt, secrets, self.batch_size, self.progress
                )
            out.append(
                FormatScores(
                    fmt, method, values, secrets, _fit(sample), target.queries - before, sample.size
                )
            )
        return out


def _fit(values: np.ndarray) -> SkewNormal | None:
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


def _fits(target: LanguageTarget, fmt: CanaryFormat) -> None:
    tokens = 1 + len(fmt.text(fmt.alphabet[0] * fmt.length).encode("utf-8"))
    if tokens > target.context:
        raise LanguageError(
            f"canary format {fmt.prefix!r}... is {tokens - 1} tokens after BOS; the "
            f"model's context holds {target.context - 1}"
        )


def _select(cache: Any, index: Tensor) -> Any:
    """The rows `index` of every tensor of a key/value cache (batch first)."""
    if isinstance(cache, Tensor):
        return cache.index_select(0, index)
    return type(cache)(_select(part, index) for part in cache)


def _nbytes(cache: Any) -> int:
    if isinstance(cache, Tensor):
        return cache.numel() * cache.element_size()
    return sum(_nbytes(part) for part in cache)


class _Walk:
    """The served side of the tree walk: forward passes that extend each node's key/value cache
    by the tokens after it (`CausalLM.step`; a model without `step` re-runs the whole row, its
    cache being the tokens so far). Every node's query is counted on `target` as the
    `distributions` row `BOS + prefix + partial secret + lead` it stands for, and the same
    next-token distributions are added to `tokens_served`: the ledger is the uncached walk's;
    only the server's arithmetic is shared."""

    def __init__(self, target: LanguageTarget) -> None:
        target.require(Access.SCORES)
        self.target = target
        self.model = target._model
        self.cached = callable(getattr(self.model, "step", None))

    def count(self, rows: np.ndarray) -> None:
        self.target._count(torch.as_tensor(rows))
        self.target._served[0] += int(rows.shape[0]) * int(rows.shape[1])

    @torch.no_grad()
    def extend(self, tokens: np.ndarray, cache: Any) -> tuple[Tensor, Any]:
        """Next-token log-probabilities after each of `tokens` (n, l) appended to the rows of
        `cache` (None: rows start here), float64 on the CPU, and the extended cache."""
        target = self.target
        feed = torch.tensor(np.asarray(tokens), dtype=torch.int64, device=target.device)
        if self.cached:
            logits, cache = self.model.step(feed, cache)
        else:
            cache = feed if cache is None else torch.cat([cache, feed], 1)
            logits = self.model(cache)[:, -feed.shape[1] :]
        logits = logits.to(target.dtype)
        target._check_logits(logits, int(feed.shape[0]), int(feed.shape[1]))
        return F.log_softmax(logits, dim=-1).double().cpu(), cache


def enumerate_values(
    target: LanguageTarget,
    fmt: CanaryFormat,
    batch_size: int = 1024,
    progress: Progress | None = None,
) -> np.ndarray:
    """Log-perplexity of every candidate of `fmt`, in index order, by the tree walk of the
    module docstring: one query per inner node (per distinct leading byte string of the
    alphabet's characters when they are multi-byte), plus one per leaf when there is a
    suffix. The walk goes depth first over blocks of at most `batch_size` nodes, each block
    extending its parents' key/value cache by one character (`_Walk`): a node costs the
    forward pass of its last character, not of the whole row."""
    _fits(target, fmt)
    walk = _Walk(target)
    head = target.tokenizer.encode(fmt.prefix, bos=True)
    chars = np.asarray([list(c.encode("utf-8")) for c in fmt.alphabet], dtype=np.int64)
    base, width = chars.shape
    leads: dict[tuple[int, ...], list[int]] = {}
    for k, row in enumerate(chars.tolist()):
        leads.setdefault(tuple(row[:-1]), []).append(k)
    tail = np.asarray(list(fmt.suffix.encode("utf-8")), dtype=np.int64)
    total = sum(base**d for d in range(fmt.length)) * len(leads)
    total += base**fmt.length if tail.size else 0
    done = 0
    values = np.empty(base**fmt.length)

    opening, cache = walk.extend(np.asarray([head]), None)
    prefix_sum = float(opening[0, np.arange(len(head) - 1), head[1:]].sum())
    full = len(head) + fmt.length * width + tail.size
    per_row = max(1, _nbytes(cache) * full // len(head))
    block = max(base, min(batch_size, walk.target.batch_size, _CACHE_BYTES // per_row))

    def tell(rows: int) -> None:
        nonlocal done
        done += rows
        if progress is not None:
            progress(done, total)

    def rows_of(secrets: np.ndarray, after: np.ndarray) -> np.ndarray:
        n = secrets.shape[0]
        return np.concatenate(
            [np.broadcast_to(np.asarray(head), (n, len(head))), secrets,
             np.broadcast_to(after, (n, after.size))], axis=1,
        )  # fmt: skip

    def visit(first: int, secrets: np.ndarray, sums: np.ndarray, last: Tensor, cache: Any) -> None:
        """Nodes `first`.. of depth secrets.shape[1] // width (their secrets so far, the sums
        of those secrets' log-probs, the distribution after each, their cache)."""
        depth = secrets.shape[1] // width
        nodes = secrets.shape[0]
        step = np.empty((nodes, base))
        for lead, members in leads.items():
            walk.count(rows_of(secrets, np.asarray(lead, dtype=np.int64)))
            tell(nodes)
            dist = last[:, None]
            if lead:
                more, _ = walk.extend(np.broadcast_to(np.asarray(lead), (nodes, len(lead))), cache)
                dist = torch.cat([dist, more], 1)
            lead_sum = sum(dist[:, j, b] for j, b in enumerate(lead)) if lead else 0.0
            for k in members:
                step[:, k] = (lead_sum + dist[:, -1, int(chars[k, -1])]).numpy()
        child_sums = (sums[:, None] + step).reshape(-1)
        if depth + 1 == fmt.length and not tail.size:
            values[first * base : (first + nodes) * base] = child_sums
            return
        span = max(1, block // base)
        for lo in range(0, nodes, span):
            hi = min(nodes, lo + span)
            parents = torch.arange(lo, hi).repeat_interleave(base).to(walk.target.device)
            grown = np.concatenate(
                [np.repeat(secrets[lo:hi], base, axis=0), np.tile(chars, (hi - lo, 1))], axis=1
            )
            cut = child_sums[lo * base : hi * base]
            start = (first + lo) * base
            if depth + 1 < fmt.length:
                logp, grown_cache = walk.extend(grown[:, -width:], _select(cache, parents))
                visit(start, grown, cut, logp[:, -1], grown_cache)
                continue
            walk.count(rows_of(grown, tail[:-1]))
            tell(grown.shape[0])
            feed = np.concatenate(
                [grown[:, -width:], np.broadcast_to(tail[:-1], (grown.shape[0], tail.size - 1))],
                axis=1,
            )
            logp, _ = walk.extend(feed, _select(cache, parents))
            picked = logp[:, width - 1 :].gather(
                -1, torch.as_tensor(tail)[None, :, None].expand(grown.shape[0], -1, 1)
            )
            values[start : start + grown.shape[0]] = cut + picked.sum((1, 2)).numpy()

    visit(0, np.zeros((1, 0), dtype=np.int64), np.zeros(1), opening[:, -1], cache)
    scored = len(head) - 1 + fmt.length * width + tail.size
    return -(prefix_sum + values) / scored
