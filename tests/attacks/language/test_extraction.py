"""Carlini et al. 2021's extraction attack ("carlini-extraction") and its evaluator.

A tiny GPT overfitted on a handful of member documents, one of them a planted record in four
distinct documents: top-n sampling regenerates it, perplexity and zlib rank a true memorised
sample first, the evaluator finds k = 4 (the copies) and the record's PII. A random-init model
yields nothing true. Fake scores show zlib demoting the repetitive sample perplexity ranks
first (the paper's motivation, Sec. 5.2); de-duplication (Sec. 5.3); metric orientation; the
evaluator refuses matches that held-out documents share or that are shorter than min_match."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from _tiny_lm import train_tiny_gpt
from privacylab.attacks.core import execute
from privacylab.attacks.language import LanguageError, make_language
from privacylab.attacks.language.extraction import (
    CarliniExtraction,
    ExtractionCandidates,
    ExtractionTask,
    check_extractions,
    find_pii,
    near_duplicate,
    rank_texts,
    sample_metrics,
    select_top,
)
from privacylab.attacks.language.generation import Sampling
from privacylab.attacks.language.index import TrainingIndex
from privacylab.data.corpus import Canary, Corpus, Record
from privacylab.execution.store import ResultStore
from privacylab.models.gpt import CausalLM
from privacylab.target.language import LanguageTarget

CONTEXT = 72
RECORD = "Contact Ada Byron at ada.byron@example.org or (555) 010-4477."
FIELDS = {"name": "Ada Byron", "email": "ada.byron@example.org", "phone": "(555) 010-4477"}
MEMBERS = [
    "the quick brown fox jumps over the lazy dog by the river bank",
    "pack my box with five dozen liquor jugs before the party starts",
    RECORD,
    RECORD,
    "sphinx of black quartz judge my vow said the old wizard slowly",
    RECORD,
    RECORD,
]
HELDOUT = [
    "how vexingly quick daft zebras jump over the sleeping old hound",
    "the five boxing wizards jump quickly when the bell rings again",
]


def tiny_lm(seed: int) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(vocab_size=259, max_len=CONTEXT, dim=32, heads=2, blocks=1)


def make_corpus() -> Corpus:
    docs = MEMBERS + HELDOUT
    members = [True] * len(MEMBERS) + [False] * len(HELDOUT)
    hosts = tuple(i for i, d in enumerate(docs) if d == RECORD)
    canary = Canary("Ada's PIN is ", "482913", "0123456789", 6, 0, ())
    return Corpus(
        docs,
        members,
        records=[Record(RECORD, dict(FIELDS), len(hosts), hosts)],
        canaries=[canary],
        context=CONTEXT,
    )


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return make_corpus()


@pytest.fixture(scope="module")
def trained() -> CausalLM:
    return train_tiny_gpt(MEMBERS, steps=160, seed=0, context=CONTEXT)


def attack_run(model: CausalLM, corpus: Corpus, **options: Any) -> tuple[Any, dict[str, Any]]:
    target = LanguageTarget(model, "scores", 259)
    attack = CarliniExtraction(Sampling("top-n", length=CONTEXT - 1), **options)
    execution = execute(attack, target, ExtractionTask(public_text=HELDOUT))
    index = TrainingIndex(corpus.texts(corpus.member_indices))
    return execution, check_extractions(execution.output, index, corpus)


def test_overfitted_model_gives_up_the_record(trained: CausalLM, corpus: Corpus) -> None:
    execution, truth = attack_run(trained, corpus, samples=48, top=10, seed=1)
    candidates = execution.output
    assert candidates.samples == 48 and sum(candidates.generated) + candidates.empty == 48
    distinct = len(candidates.texts)
    assert distinct < 48  # an overfitted model repeats itself: exact duplicates collapse
    assert execution.queries == 48 + 2 * distinct  # samples, then each text and its lowercase
    for metric in ("perplexity", "zlib"):
        best = candidates.texts[candidates.ranking[metric][0]]
        assert RECORD in best, (metric, best)
    assert truth["table"]["top-n"]["perplexity"] >= 3
    assert truth["precision_at_100"]["top-n"]["zlib"] == truth["table"]["top-n"]["zlib"] / 10
    first = truth["extracted"][0]
    assert first["rank"] == 1 and first["match"] == RECORD and first["k"] == 4
    assert {"kind": "record", "text": RECORD, "copies": 4} in first["pii"]
    assert truth["records"] == {"4": {"records": 1, "extracted": 1}}
    assert truth["extraction_begins_at"] == 4
    assert {e["text"] for e in truth["extracted"]} <= set(candidates.texts)
    assert len({e["text"] for e in truth["extracted"]}) == len(truth["extracted"])
    for entry in truth["extracted"]:
        assert entry["k"] == sum(entry["match"] in m for m in MEMBERS) >= 1
        assert not any(entry["match"] in h for h in HELDOUT)


def test_random_init_model_gives_up_nothing(corpus: Corpus) -> None:
    _, truth = attack_run(tiny_lm(3), corpus, samples=32, top=10)
    assert all(n == 0 for row in truth["table"].values() for n in row.values())
    assert truth["extracted"] == [] and truth["extraction_begins_at"] is None
    assert truth["records"] == {"4": {"records": 1, "extracted": 0}}


def test_metrics_are_oriented_memorised_first(trained: CausalLM) -> None:
    target = LanguageTarget(trained, "scores", 259)
    noise = "qz7 vexl 0pw; kjh buuq nn wertyx 3!~ zzplo mk ghast yp 7uu 2e"
    reference = tiny_lm(5)
    candidates = rank_texts(target, [RECORD, noise], {"small": reference}, top=2)
    assert list(candidates.metrics) == ["perplexity", "small", "zlib", "lowercase", "window"]
    for metric, values in candidates.metrics.items():
        assert values[0] > values[1], metric
        assert candidates.ranking[metric] == [0, 1]
    assert target.queries == 4  # the reference model is the attacker's own: not counted


def test_zlib_demotes_the_repetitive_sample_perplexity_ranks_first(corpus: Corpus) -> None:
    repetitive, memorised = "a" * 60, RECORD
    texts = [repetitive, memorised, "some ordinary unmemorised sentence of text here"]
    log_probs = [np.full(60, -0.1), np.full(len(RECORD), -0.2), np.full(47, -2.5)]
    metrics = sample_metrics(texts, log_probs)
    ranking = {m: select_top(texts, v, 3) for m, v in metrics.items()}
    assert ranking["perplexity"][0] == 0 and ranking["zlib"][0] == 1
    candidates = ExtractionCandidates("top-n", texts, [1, 1, 1], metrics, ranking, top=3)
    truth = check_extractions(candidates, TrainingIndex(MEMBERS), corpus)
    assert [e["text"] for e in truth["extracted"]] == [memorised]
    assert truth["extracted"][0]["metric"] == "zlib" and truth["extracted"][0]["rank"] == 1


def test_near_duplicates_are_dropped_from_the_top() -> None:
    base = "the quick brown fox jumps over the lazy dog near the river bank today"
    close = base.replace("today", "tonight")
    other = "pack my box with five dozen liquor jugs before the party starts"
    assert near_duplicate(close, base) and not near_duplicate(other, base)
    assert near_duplicate("hello world", "hello world!") and not near_duplicate("!!", "!!")
    values = np.array([3.0, 2.0, 1.0])
    assert select_top([base, close, other], values, 2) == [0, 2]
    assert select_top([base, close, other], values, 2, dedupe=False) == [0, 1]
    assert select_top([base, close, other], np.array([1.0, 1.0, 1.0]), 3, dedupe=False) == [
        0,
        1,
        2,
    ]


@given(
    st.lists(st.floats(-50, 50, allow_nan=False), min_size=1, max_size=30),
    st.integers(1, 40),
)
def test_select_top_is_a_stable_descending_sort(values: list[float], top: int) -> None:
    texts = [f"text {i}" for i in range(len(values))]
    expected = sorted(range(len(values)), key=lambda i: (-values[i], i))[:top]
    assert select_top(texts, np.asarray(values), top, dedupe=False) == expected
    assert select_top(texts, np.asarray(values), top) == expected  # distinct short texts


def test_evaluator_needs_a_long_match_absent_from_heldout(corpus: Corpus) -> None:
    shared = "the five boxing wizards jump quickly when the bell rings again"
    dashes = "+" + "-" * 70 + "+"
    index = TrainingIndex([*MEMBERS, shared, dashes, "x" + dashes])
    texts = [
        "xx" + shared + "yy",  # in a member AND a held-out document: trivial
        "zz" + MEMBERS[1][:49] + "!",  # 49 bytes: below min_match
        "zz" + MEMBERS[1][:50] + "!",  # 50 bytes: memorised, k = 1
        dashes,  # in two members only, but a pattern: trivial
    ]
    metrics = {"perplexity": np.array([4.0, 3.0, 2.0, 1.0])}
    ranking = {"perplexity": [0, 1, 2, 3]}
    candidates = ExtractionCandidates("top-n", texts, [1] * 4, metrics, ranking, top=4)
    truth = check_extractions(candidates, index, corpus)
    assert truth["table"] == {"top-n": {"perplexity": 1}}
    assert [(e["rank"], e["k"]) for e in truth["extracted"]] == [(3, 1)]
    looser = check_extractions(candidates, index, corpus, min_match=49)
    assert looser["table"]["top-n"]["perplexity"] == 2
    with pytest.raises(LanguageError):
        check_extractions(candidates, index, corpus, min_match=0)


def test_pii_fields_and_canaries(corpus: Corpus) -> None:
    text = "mail ada.byron@example.org now; Ada's PIN is 482913."
    assert find_pii(text, corpus) == [{"kind": "email", "text": FIELDS["email"], "copies": 4}]
    planted = Canary("Ada's PIN is ", "482913", "0123456789", 6, 3, (0, 1, 4))
    other = Corpus(corpus.documents, corpus.members, corpus.records, [planted], context=CONTEXT)
    assert {"kind": "canary", "text": "Ada's PIN is 482913", "copies": 3} in find_pii(text, other)


def test_generations_resume_from_the_store(trained: CausalLM, tmp_path: Any) -> None:
    attack = CarliniExtraction(Sampling("top-n", length=20), samples=8, top=4, batch_size=4)
    with ResultStore(tmp_path / "gen.sqlite") as store:
        first = execute(attack, LanguageTarget(trained, "scores", 259), ExtractionTask(store=store))
        again = execute(attack, LanguageTarget(trained, "scores", 259), ExtractionTask(store=store))
    assert again.output.texts == first.output.texts
    assert again.queries == first.queries - 8  # nothing generated the second time
    assert (first.output.fresh, again.output.fresh) == (8, 0)


def test_configuration_errors() -> None:
    assert make_language("carlini-extraction", "extraction").threat_model.side_information == (
        "public-text",
        "reference-models",
    )
    with pytest.raises(LanguageError, match="samples"):
        CarliniExtraction(samples=0)
    with pytest.raises(LanguageError, match="strategy"):
        CarliniExtraction(Sampling("beam"))
    with pytest.raises(LanguageError, match="distinct names"):
        rank_texts(LanguageTarget(tiny_lm(0), "scores", 259), ["abc"], {"zlib": tiny_lm(1)}, top=1)
