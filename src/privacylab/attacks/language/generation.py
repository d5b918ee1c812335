"""Sampling text from a language target: the generation step of training-data extraction.

Carlini et al. 2021 ("Extracting Training Data from Large Language Models", Sec. 5.1) draw
many samples from the model and keep those a membership metric ranks highest. They improve on
plain top-n sampling (Sec. 4.1, n = 40) in two ways, and all three are `STRATEGIES` here:

- "top-n": start from the start-of-document token and, at every step, keep the n most likely
  next tokens, renormalise their probabilities and sample one (Sec. 4.1);
- "temperature": sample the full next-token distribution softmax(z / t) with a temperature
  decaying from t = 10 to t = 1 over the first 20 generated tokens, then t = 1 (Sec. 5.1.1):
  the high early temperature explores diverse beginnings, the low later one lets the model
  continue what it has memorised. Given log-probabilities log p = z - logsumexp(z),
  softmax(log p / t) equals softmax(z / t), so the served distribution is enough;
- "prefix": condition on short snippets of public text (Sec. 5.1.2, "Conditioning on Internet
  text"): each sample starts from BOS + the first p bytes (p uniform in `prefix_tokens`) of a
  random public document (all of it if shorter), then top-n sampling; the prefixes of one
  call are forced through the chooser token by token, so prefixes of different p share a call.

Every generation is one query of the target per sample (`LanguageTarget.sample`). Batches are
seeded from (seed, batch index) and written to a `ResultStore` as each finishes, so a killed run
resumes where it stopped and the result equals an uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from privacylab.attacks.language.base import LanguageError, number_option, whole_option
from privacylab.data.tokenizer import BOS, EOS, PAD, VOCAB_SIZE
from privacylab.execution.store import ResultStore, config_key
from privacylab.target.language import Chooser, LanguageTarget

__all__ = [
    "STRATEGIES",
    "Sample",
    "Sampling",
    "chooser",
    "generate_samples",
    "generation_namespace",
    "temperature_at",
]

STRATEGIES = ("top-n", "temperature", "prefix")

Progress = Callable[[str, float, float], None]

_NEVER_DRAWN = torch.tensor([BOS, PAD])


@dataclass(frozen=True)
class Sampling:
    """How samples are drawn (Carlini et al. 2021, Sec. 4.1 and 5.1). `length` counts the tokens
    generated after the prefix (the target stops earlier at its context or at EOS); `top_n` is
    the n of top-n sampling ("top-n" and "prefix"); the temperature decays linearly from
    `temperature_start` to `temperature_end` over the first `decay_tokens` generated tokens
    ("temperature"); `prefix_tokens` is the inclusive range of public-text prefix lengths in
    bytes ("prefix")."""

    strategy: str = "top-n"
    length: int = 127
    top_n: int = 40
    temperature_start: float = 10.0
    temperature_end: float = 1.0
    decay_tokens: int = 20
    prefix_tokens: tuple[int, int] = (5, 10)

    def validate(self) -> Sampling:
        """This configuration, checked: a one-line LanguageError names the first bad field."""
        if self.strategy not in STRATEGIES:
            raise LanguageError(
                f"unknown sampling strategy {self.strategy!r}; choose one of "
                f"{', '.join(STRATEGIES)}"
            )
        whole_option("sampling", "length", self.length)
        whole_option("sampling", "top_n", self.top_n)
        number_option("sampling", "temperature_start", self.temperature_start)
        number_option("sampling", "temperature_end", self.temperature_end)
        whole_option("sampling", "decay_tokens", self.decay_tokens, low=0)
        bounds = self.prefix_tokens
        if not isinstance(bounds, tuple | list) or len(bounds) != 2:
            raise LanguageError(
                f"sampling: prefix_tokens must be a (low, high) pair, got {bounds!r}"
            )
        low = whole_option("sampling", "prefix_tokens low", bounds[0])
        high = whole_option("sampling", "prefix_tokens high", bounds[1])
        if high < low:
            raise LanguageError(f"sampling: prefix_tokens {low}..{high} is an empty range")
        return self


def temperature_at(step: int, sampling: Sampling) -> float:
    """The temperature of generation step `step` (0 = the first generated token): linear from
    `temperature_start` at step 0 to `temperature_end` at step `decay_tokens`, then constant
    (Carlini et al. 2021, Sec. 5.1.1: 10 -> 1 over the first 20 tokens)."""
    if step >= sampling.decay_tokens:
        return float(sampling.temperature_end)
    fraction = max(step, 0) / sampling.decay_tokens
    start, end = float(sampling.temperature_start), float(sampling.temperature_end)
    return start + (end - start) * fraction


def chooser(sampling: Sampling, generator: torch.Generator) -> Chooser:
    """The `choose(log_probs, step)` of `sampling.strategy` for `LanguageTarget.sample`, drawing
    from `generator` (a CPU generator: the target serves log-probabilities on the CPU).

    "top-n" and "prefix": the n most likely tokens of each row, renormalised, sampled once;
    "temperature": the whole distribution softmax(log p / t(step)), sampled once. BOS and PAD
    are never drawn (over the byte vocabulary): no document continues with them, and a high
    temperature would otherwise pick them often, leaving samples whose decoded text is not the
    sequence generated."""
    sampling.validate()

    def text_tokens(log_probs: Tensor) -> Tensor:
        log_probs = log_probs.float()
        if log_probs.shape[-1] != VOCAB_SIZE:
            return log_probs
        return log_probs.index_fill(-1, _NEVER_DRAWN, float("-inf"))

    def top_n(log_probs: Tensor, step: int) -> Tensor:
        n = min(sampling.top_n, int(log_probs.shape[-1]))
        values, indices = text_tokens(log_probs).topk(n, dim=-1)
        picked = torch.multinomial(values.softmax(-1), 1, generator=generator)
        return indices.gather(-1, picked).squeeze(-1)

    def temperature(log_probs: Tensor, step: int) -> Tensor:
        scaled = text_tokens(log_probs) / temperature_at(step, sampling)
        return torch.multinomial(scaled.softmax(-1), 1, generator=generator).squeeze(-1)

    return temperature if sampling.strategy == "temperature" else top_n


@dataclass(frozen=True)
class Sample:
    """One generated text: `text` is the decoded bytes after BOS up to EOS, the conditioning
    `prefix` ("" unless the "prefix" strategy) included; `index` is its place among the run's
    samples."""

    text: str
    prefix: str
    strategy: str
    index: int


def _text_digest(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        encoded = text.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.hexdigest()


def generation_namespace(
    sampling: Sampling,
    count: int,
    *,
    seed: int = 0,
    batch_size: int = 64,
    public_text: Sequence[str] = (),
    key: Mapping[str, Any] | None = None,
) -> str:
    """The store namespace of one generation run: a config key of the sampling settings, seed,
    count, batch size, the public text ("prefix" only) and the caller's `key` (e.g. the
    target's folder), so runs that would produce different samples never share batches."""
    config: dict[str, Any] = {
        "sampling": asdict(sampling),
        "count": int(count),
        "seed": int(seed),
        "batch_size": int(batch_size),
        "public_text": _text_digest(public_text) if sampling.strategy == "prefix" else None,
        "key": dict(key or {}),
    }
    return f"lm-generation/{config_key(config)}"


def _batch_seed(seed: int, batch: int) -> int:
    return int(np.random.SeedSequence([seed, batch]).generate_state(1, np.uint64)[0] >> 1)


def _decode(target: LanguageTarget, row: Tensor) -> str:
    ids = row.tolist()[1:]
    if EOS in ids:
        ids = ids[: ids.index(EOS)]
    return target.tokenizer.decode(ids)


def _forcing(choose: Chooser, prefixes: list[list[int]], length: int) -> Chooser:
    """`choose`, except that row i takes its prefix token at steps < len(prefixes[i]) and ends
    (EOS) once `length` tokens follow its prefix: prefixes of different lengths share one call
    of the target, whose served distributions after a forced token are those of a prefilled
    prefix (the model is causal and cached generation equals a forward pass)."""
    widths = torch.tensor([len(p) for p in prefixes], dtype=torch.int64)
    table = torch.zeros(len(prefixes), max(1, int(widths.max())), dtype=torch.int64)
    for i, prefix in enumerate(prefixes):
        table[i, : len(prefix)] = torch.tensor(prefix, dtype=torch.int64)

    def pick(log_probs: Tensor, step: int) -> Tensor:
        chosen = torch.as_tensor(choose(log_probs, step)).to(torch.int64).clone()
        forced = step < widths
        if bool(forced.any()):
            chosen[forced] = table[forced, step]
        chosen[step >= widths + length] = EOS
        return chosen

    return pick


def _generate_batch(
    target: LanguageTarget,
    sampling: Sampling,
    size: int,
    prefixes: list[list[int]],
    seed: int,
) -> dict[str, list[str]]:
    """`size` samples of one batch, drawn with a generator seeded by `seed`; `prefixes` holds
    the public-text byte ids of each sample ("prefix") or is empty. Every row starts from BOS
    alone and is forced through its prefix (`_forcing`), so each call of the target takes
    equal-length prefixes whatever the p of each sample; calls hold at most the target's
    `batch_size` rows, so the chooser always sees all rows of a call in order."""
    generator = torch.Generator().manual_seed(seed)
    choose = chooser(sampling, generator)
    heads = prefixes or [[] for _ in range(size)]
    texts: list[str] = []
    chunk = max(1, int(target.batch_size))
    for start in range(0, size, chunk):
        rows = heads[start : start + chunk]
        longest = max(len(p) for p in rows)
        pick = _forcing(choose, rows, sampling.length) if longest else choose
        tokens = torch.full((len(rows), 1), BOS, dtype=torch.int64)
        out = target.sample(tokens, longest + sampling.length, pick)
        texts.extend(_decode(target, row) for row in out)
    return {"texts": texts, "prefixes": [target.tokenizer.decode(p) for p in heads]}


def generate_samples(
    target: LanguageTarget,
    sampling: Sampling,
    count: int,
    *,
    public_text: Sequence[str] = (),
    seed: int = 0,
    batch_size: int = 64,
    store: ResultStore | None = None,
    progress: Progress | None = None,
    key: Mapping[str, Any] | None = None,
) -> list[Sample]:
    """`count` samples from `target` by `sampling` (Carlini et al. 2021, Sec. 5.1; module
    docstring), one query per sample. Batch b (of `batch_size` samples) draws from generators
    seeded by (seed, b) alone, so the samples do not depend on which batches ran before; each
    finished batch is put into `store` (namespace `generation_namespace(...)`, extended by
    `key`) at once, and a re-run with the same store and settings generates only the missing
    batches and returns the same samples as an uninterrupted run."""
    target.require("scores")
    sampling = sampling.validate()
    count = whole_option("generation", "count", count)
    batch_size = whole_option("generation", "batch_size", batch_size)
    seed = whole_option("generation", "seed", seed, low=0)
    documents: list[list[int]] = []
    if sampling.strategy == "prefix":
        documents = [target.tokenizer.encode(t)[: sampling.prefix_tokens[1]] for t in public_text]
        documents = [d for d in documents if d]
        if not documents:
            raise LanguageError(
                "the prefix strategy needs public text (non-empty documents to take prefixes from)"
            )
        if sampling.prefix_tokens[1] + 2 > target.context:
            raise LanguageError(
                f"prefix_tokens up to {sampling.prefix_tokens[1]} leave no room to generate in "
                f"the model's context of {target.context} (BOS + prefix + 1 token)"
            )
    namespace = generation_namespace(
        sampling, count, seed=seed, batch_size=batch_size, public_text=public_text, key=key
    )
    batches = math.ceil(count / batch_size)
    stage = f"sampling ({sampling.strategy})"
    samples: list[Sample] = []
    if progress is not None:
        progress(stage, 0, count)
    for b in range(batches):
        size = min(batch_size, count - b * batch_size)
        found = store.get(namespace, str(b)) if store is not None else None
        if found is None or len(found.get("texts", ())) != size:
            prefixes: list[list[int]] = []
            if documents:
                rng = np.random.default_rng([seed, b, 1])
                low, high = sampling.prefix_tokens
                picks = rng.integers(len(documents), size=size)
                lengths = rng.integers(low, high + 1, size=size)
                prefixes = [documents[d][:p] for d, p in zip(picks, lengths, strict=True)]
            found = _generate_batch(target, sampling, size, prefixes, _batch_seed(seed, b))
            if store is not None:
                store.put(namespace, str(b), found)
        start = b * batch_size
        samples.extend(
            Sample(text, prefix, sampling.strategy, start + i)
            for i, (text, prefix) in enumerate(zip(found["texts"], found["prefixes"], strict=True))
        )
        if progress is not None:
            progress(stage, len(samples), count)
    return samples
