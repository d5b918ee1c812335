"""Training-data extraction from a language model: Carlini et al. 2021, "Extracting Training
Data from Large Language Models" (USENIX Security), Sec. 4-6.

The attack (`CarliniExtraction`, registered "carlini-extraction") is the paper's two steps:

1. generate many samples from the target (Sec. 5.1: top-n from BOS, a decaying temperature,
   or prefixes of public text; `privacylab.attacks.language.generation`);
2. rank them by a membership metric (Sec. 5.2: perplexity, the ratio to a smaller reference
   model, zlib, lowercase, a sliding window; `privacylab.stats.language.extraction_metrics`)
   and keep the top `top` (100) per metric after de-duplication (Sec. 5.3: exact duplicates,
   then near-duplicates whose word-trigram multisets overlap by half or more).

It returns `ExtractionCandidates` and knows nothing of the training set. The evaluator
`check_extractions` receives the truth (a `TrainingIndex` of the member documents, the
`Corpus`) afterwards and decides which ranked samples are TRUE memorised samples: the paper
verified each of its 1,800 candidates by hand and by searching the training data; here a
sample is memorised when its longest verbatim match with the member documents is at least
`min_match` bytes (default 50: the paper's 50-token window, counted in bytes because the
target's tokens are bytes), holds at least `TRIVIAL_DISTINCT` distinct characters (a run of
dashes is a pattern, not a memory) and occurs in no held-out document (a string every document
shares is trivial, not memorised). k of k-eidetic memorisation (Def. 2) is the number
of member documents containing the match.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.language.base import (
    LanguageAttack,
    LanguageError,
    register_language,
    whole_option,
)
from privacylab.attacks.language.generation import Sampling, generate_samples
from privacylab.attacks.language.index import TrainingIndex
from privacylab.attacks.language.scoring import lowercased, score_texts
from privacylab.data.corpus import Corpus
from privacylab.stats.language import extraction_metrics
from privacylab.target import Access
from privacylab.target.language import LanguageTarget

if TYPE_CHECKING:
    from privacylab.execution.store import ResultStore

__all__ = [
    "CarliniExtraction",
    "ExtractionCandidates",
    "ExtractionTask",
    "check_extractions",
    "find_pii",
    "metric_names",
    "near_duplicate",
    "rank_texts",
    "sample_metrics",
    "select_top",
    "trigrams",
]

MIN_MATCH = 50
"""Bytes of verbatim overlap with a member document that make a sample memorised (the paper's
50-token window; this family's tokens are bytes)."""

TRIVIAL_DISTINCT = 10
"""A match of fewer distinct characters (a run of dashes, one repeated digit) is trivial
memorisation (Carlini et al. 2021, Sec. 5.2: repeated strings a model continues from the
pattern alone), not counted, however rare in the held-out documents."""

IDENTIFYING = ("email", "phone")
"""Record fields whose verbatim appearance counts as extracting the record."""

Progress = Callable[[str, float, float], None]


@dataclass
class ExtractionTask:
    """What the extraction attacker has (Carlini et al. 2021, Sec. 3.1 and 5): `public_text`
    (documents the target never trained on, prefixes of the "prefix" strategy), `references`
    (its own smaller models by metric name, e.g. "small", "tiny"; white-box, its queries not the
    target's), a result `store` where generations are kept as they are produced (a re-run
    resumes; `store_key`, e.g. the target's folder, keeps runs on different targets apart) and a
    `progress(stage, done, total)` callback."""

    public_text: list[str] = field(default_factory=list)
    references: dict[str, nn.Module] = field(default_factory=dict)
    store: ResultStore | None = None
    progress: Progress | None = None
    store_key: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExtractionCandidates:
    """What the attack outputs, without any truth: the distinct scored `texts` (after exact
    de-duplication; `generated[i]` samples produced `texts[i]`), the value of every metric per
    text (`metrics[name][i]`, higher = more likely memorised), and per metric the indices of the
    top `top` texts, best first (`ranking`). `samples`: how many were generated, `empty` of
    them with no text (EOS first), `fresh` of them sampled by this run (the others read from
    the result store); `generation_seconds`: the time spent sampling; `tokens_served`:
    next-token distributions the target served (sampling and scoring)."""

    strategy: str
    texts: list[str]
    generated: list[int]
    metrics: dict[str, np.ndarray]
    ranking: dict[str, list[int]]
    top: int
    samples: int = 0
    empty: int = 0
    fresh: int = 0
    generation_seconds: float = 0.0
    tokens_served: int = 0


def metric_names(references: Sequence[str] = ()) -> list[str]:
    """The metrics ranked, in the paper's order (Table 2): perplexity, one per reference model,
    zlib, lowercase, window."""
    names = ["perplexity", *references, "zlib", "lowercase", "window"]
    if len(set(names)) != len(names):
        raise LanguageError(
            "reference models need distinct names other than perplexity, zlib, lowercase, window"
        )
    return names


def trigrams(text: str) -> Counter[tuple[str, ...]]:
    """tri(s) of Carlini et al. 2021, Sec. 5.3: the multiset of word trigrams of `text`, words
    split on whitespace and punctuation."""
    words = re.findall(r"\w+", text)
    return Counter(zip(words, words[1:], words[2:], strict=False))


def near_duplicate(candidate: str, kept: str) -> bool:
    """Whether `candidate` duplicates `kept` (Sec. 5.3): |tri(s1) ∩ tri(s2)| >= |tri(s1)| / 2
    with s1 the candidate; texts of fewer than three words are duplicates only when their
    (non-empty) word sequences are equal."""
    return _duplicate(_Words(candidate), _Words(kept))


class _Words:
    """A text's words and word trigrams, computed once."""

    def __init__(self, text: str) -> None:
        self.words = re.findall(r"\w+", text)
        self.trigrams = trigrams(text)
        self.size = sum(self.trigrams.values())


def _duplicate(candidate: _Words, kept: _Words) -> bool:
    if not candidate.size:
        return bool(candidate.words) and candidate.words == kept.words
    return sum((candidate.trigrams & kept.trigrams).values()) >= candidate.size / 2


def select_top(
    texts: Sequence[str], values: np.ndarray, top: int, *, dedupe: bool = True
) -> list[int]:
    """Indices of the `top` highest `values` (ties: the earlier text), walking down the
    ranking and skipping a text that near-duplicates one already kept (`dedupe`)."""
    scores = np.asarray(values, dtype=np.float64)
    order = np.lexsort((np.arange(scores.size), -np.nan_to_num(scores, nan=-np.inf)))
    kept: list[int] = []
    words: dict[int, _Words] = {}
    for i in order.tolist():
        if len(kept) >= top:
            break
        if dedupe:
            words[i] = _Words(texts[i])
            if any(_duplicate(words[i], words[j]) for j in kept):
                continue
        kept.append(i)
    return kept


def sample_metrics(
    texts: Sequence[str],
    log_probs: Sequence[np.ndarray],
    *,
    lowercase_log_probs: Sequence[np.ndarray] | None = None,
    references: Mapping[str, Sequence[np.ndarray]] | None = None,
    window: int = 50,
) -> dict[str, np.ndarray]:
    """Every ranking metric of every text (`extraction_metrics`), as arrays by metric name."""
    references = references or {}
    rows = [
        extraction_metrics(
            text,
            log_probs[i],
            lowercase_log_probs=None if lowercase_log_probs is None else lowercase_log_probs[i],
            references={name: values[i] for name, values in references.items()},
            window=window,
        )
        for i, text in enumerate(texts)
    ]
    names = [n for n in metric_names(list(references)) if not rows or n in rows[0]]
    return {n: np.asarray([row[n] for row in rows], dtype=np.float64) for n in names}


def _fit(text: str, budget: int) -> str:
    """`text` cut to at most `budget` UTF-8 bytes (a broken last character dropped)."""
    raw = text.encode("utf-8")
    return text if len(raw) <= budget else raw[:budget].decode("utf-8", "ignore")


def rank_texts(
    target: LanguageTarget,
    texts: Sequence[str],
    references: Mapping[str, nn.Module] | None = None,
    *,
    top: int = 100,
    window: int = 50,
    dedupe: bool = True,
    strategy: str = "",
) -> ExtractionCandidates:
    """Step 2 of the attack on given texts: score each distinct text (cut to the contexts)
    under `target`, its lowercase under `target` and under each reference model (a white-box
    `LanguageTarget` of the attacker's own), compute the metrics and select the top per metric."""
    references = dict(references or {})
    refs = {
        name: LanguageTarget(model, Access.WHITEBOX, target.vocab_size, device=target.device)
        for name, model in references.items()
    }
    metric_names(list(refs))
    budget = min([target.context, *(r.context for r in refs.values())]) - 1
    counts: Counter[str] = Counter()
    empty = 0
    for text in texts:
        fitted = _fit(text, budget)
        if fitted:
            counts[fitted] += 1
        else:
            empty += 1
    distinct = list(counts)
    lowered = [lowercased(t) for t in distinct]
    if distinct:
        own = [s.log_probs for s in score_texts(target, distinct)]
        lower = [s.log_probs for s in score_texts(target, lowered)]
        ref_scores = {
            name: [s.log_probs for s in score_texts(ref, distinct)] for name, ref in refs.items()
        }
        metrics = sample_metrics(
            distinct, own, lowercase_log_probs=lower, references=ref_scores, window=window
        )
    else:
        metrics = {n: np.zeros(0) for n in metric_names(list(refs))}
    ranking = {n: select_top(distinct, v, top, dedupe=dedupe) for n, v in metrics.items()}
    return ExtractionCandidates(
        strategy=strategy,
        texts=distinct,
        generated=[counts[t] for t in distinct],
        metrics=metrics,
        ranking=ranking,
        top=top,
        samples=len(texts),
        empty=empty,
    )


@register_language("carlini-extraction")
class CarliniExtraction(LanguageAttack):
    """Carlini et al. 2021's extraction attack (module docstring): `samples` generations with
    `sampling`, ranked by each metric, the top `top` kept per metric (near-duplicates skipped
    when `dedupe`); `window` tokens for the sliding-window metric."""

    kind = "extraction"
    threat_model = ThreatModel(Access.SCORES, ("public-text", "reference-models"))
    paper = "Carlini et al. 2021, Extracting Training Data from Large Language Models"

    def __init__(
        self,
        sampling: Sampling | None = None,
        samples: int = 1000,
        top: int = 100,
        window: int = 50,
        dedupe: bool = True,
        seed: int = 0,
        batch_size: int = 64,
    ) -> None:
        name = "carlini-extraction"
        if sampling is not None and not isinstance(sampling, Sampling):
            raise LanguageError(f"{name}: sampling must be a Sampling")
        self.sampling = (sampling or Sampling()).validate()
        self.samples = whole_option(name, "samples", samples)
        self.top = whole_option(name, "top", top)
        self.window = whole_option(name, "window", window)
        self.dedupe = bool(dedupe)
        self.seed = whole_option(name, "seed", seed, low=0)
        self.batch_size = whole_option(name, "batch_size", batch_size)

    def run(self, target: LanguageTarget, task: ExtractionTask) -> ExtractionCandidates:  # type: ignore[override]
        """Generate, score, rank (module docstring); queries counted on `target`."""
        served, queries = target.tokens_served, target.queries
        start = time.perf_counter()
        samples = generate_samples(
            target,
            self.sampling,
            self.samples,
            public_text=list(task.public_text),
            seed=self.seed,
            batch_size=self.batch_size,
            store=task.store,
            progress=task.progress,
            key=task.store_key,
        )
        seconds = time.perf_counter() - start
        fresh = target.queries - queries
        if task.progress is not None:
            task.progress(f"{self.sampling.strategy}: scoring", 0, 1)
        candidates = rank_texts(
            target,
            [s.text for s in samples],
            task.references,
            top=self.top,
            window=self.window,
            dedupe=self.dedupe,
            strategy=self.sampling.strategy,
        )
        if task.progress is not None:
            task.progress(f"{self.sampling.strategy}: scoring", 1, 1)
        candidates.generation_seconds = seconds
        candidates.fresh = fresh
        candidates.tokens_served = target.tokens_served - served
        return candidates


def find_pii(text: str, corpus: Corpus) -> list[dict[str, Any]]:
    """The planted strings found verbatim in `text`: a whole record ({"kind": "record"}), else
    each of its fields (kind = the field's name), and each canary's prefix + secret
    ({"kind": "canary"}); `copies` is how many member documents it was planted into."""
    found: list[dict[str, Any]] = []
    for record in corpus.records:
        if record.text and record.text in text:
            found.append({"kind": "record", "text": record.text, "copies": record.copies})
            continue
        for name, value in record.fields.items():
            if value and value in text:
                found.append({"kind": name, "text": value, "copies": record.copies})
    for canary in corpus.canaries:
        planted = canary.prefix + canary.secret
        if canary.repeats > 0 and planted and planted in text:
            found.append({"kind": "canary", "text": planted, "copies": canary.repeats})
    return found


def _record_extracted(record: Any, texts: Sequence[str]) -> bool:
    parts = [record.text, *(record.fields.get(f, "") for f in IDENTIFYING)]
    return any(p and p in t for p in parts for t in texts)


def check_extractions(
    candidates: ExtractionCandidates | Sequence[ExtractionCandidates],
    index: TrainingIndex,
    corpus: Corpus,
    *,
    min_match: int = MIN_MATCH,
    heldout: TrainingIndex | None = None,
) -> dict[str, Any]:
    """The truth of an extraction run (schemas.md "extraction run", less the target facts and
    costs): per strategy and metric the number of TRUE memorised samples among the top
    (`table`) and that number over `top` (`precision_at_100`); the true samples once each
    (`extracted`, best rank first, with k, the match and the PII in it); planted records per
    copy count and how many were extracted (`records`), and the smallest copy count with a
    record extracted (`extraction_begins_at`).

    `index` holds the member documents; `heldout` the held-out ones (built from `corpus` when
    None). A sample is true when its longest match in the members has >= `min_match` UTF-8
    bytes, is not trivial (`TRIVIAL_DISTINCT`) and occurs in no held-out document (module
    docstring)."""
    runs = [candidates] if isinstance(candidates, ExtractionCandidates) else list(candidates)
    if not runs:
        raise LanguageError("check_extractions needs the candidates of at least one strategy")
    min_match = whole_option("check_extractions", "min_match", min_match)
    if heldout is None:
        heldout = TrainingIndex(corpus.texts(corpus.heldout_indices))
    strategies = [c.strategy for c in runs]
    if len(set(strategies)) != len(strategies):
        raise LanguageError("one set of candidates per strategy")
    top = runs[0].top
    table: dict[str, dict[str, int]] = {}
    precision: dict[str, dict[str, float]] = {}
    found: dict[str, dict[str, Any]] = {}
    for run in runs:
        verdicts: dict[int, dict[str, Any] | None] = {}
        table[run.strategy] = {}
        for metric, ranked in run.ranking.items():
            hits = 0
            for rank, i in enumerate(ranked, start=1):
                if i not in verdicts:
                    verdicts[i] = _verdict(run.texts[i], index, heldout, min_match)
                verdict = verdicts[i]
                if verdict is None:
                    continue
                hits += 1
                score = float(run.metrics[metric][i])
                entry = {
                    "text": run.texts[i],
                    **verdict,
                    "metric": metric,
                    "strategy": run.strategy,
                    "rank": rank,
                    "score": score if math.isfinite(score) else None,
                }
                known = found.get(run.texts[i])
                if known is None or rank < known["rank"]:
                    found[run.texts[i]] = entry
            table[run.strategy][metric] = hits
        precision[run.strategy] = {m: n / top for m, n in table[run.strategy].items()}
    extracted = sorted(found.values(), key=lambda e: (e["rank"], -e["k"], e["text"]))
    for entry in extracted:
        entry["pii"] = find_pii(entry["text"], corpus)
    true_texts = [e["text"] for e in extracted]
    records: dict[str, dict[str, int]] = {}
    for record in sorted(corpus.records, key=lambda r: r.copies):
        row = records.setdefault(str(record.copies), {"records": 0, "extracted": 0})
        row["records"] += 1
        row["extracted"] += int(_record_extracted(record, true_texts))
    begins = [int(c) for c, row in records.items() if row["extracted"]]
    metrics = list(runs[0].ranking)
    return {
        "strategies": strategies,
        "metrics": metrics,
        "table": table,
        "precision_at_100": precision,
        "top": top,
        "extracted": extracted,
        "records": records,
        "extraction_begins_at": min(begins) if begins else None,
        "min_match": min_match,
    }


def _verdict(
    text: str, index: TrainingIndex, heldout: TrainingIndex, min_match: int
) -> dict[str, Any] | None:
    """{"k", "match"} when `text` is a true memorised sample, else None."""
    start, end = index.longest_match(text)
    match = text[start:end]
    if len(match.encode("utf-8")) < min_match or len(set(match)) < TRIVIAL_DISTINCT:
        return None
    if heldout.occurs(match):
        return None
    return {"k": index.documents_containing(match), "match": match}
