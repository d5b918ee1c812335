"""`TrainingIndex` against brute force: the suffix array is the sorted order of all suffixes,
k (Carlini et al. 2021, Def. 2) is `sum(s in d for d in docs)` (distinct documents, not
occurrences), the longest match is the longest substring of the text found in any document,
and building the index of 1000 documents of 128 bytes takes seconds at most (no quadratic
build; the bound leaves room for a loaded machine)."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.attacks.language import LanguageError
from privacylab.attacks.language.index import TrainingIndex, suffix_array

ALPHABET = "ab c\x00é"
docs_strategy = st.lists(st.text(alphabet=ALPHABET, max_size=12), min_size=0, max_size=6)


def brute_longest(text: str, docs: list[str]) -> int:
    return max(
        (
            j - i
            for i in range(len(text))
            for j in range(i + 1, len(text) + 1)
            if any(text[i:j] in d for d in docs)
        ),
        default=0,
    )


@given(st.lists(st.integers(0, 3), max_size=40))
def test_suffix_array_is_the_sorted_suffixes(values: list[int]) -> None:
    expected = sorted(range(len(values)), key=lambda i: values[i:])
    assert suffix_array(np.asarray(values)).tolist() == expected


@settings(max_examples=80, deadline=None)
@given(docs_strategy, st.text(alphabet=ALPHABET, min_size=1, max_size=5))
def test_k_counts_distinct_documents(docs: list[str], s: str) -> None:
    index = TrainingIndex(docs)
    assert index.documents_containing(s) == sum(s in d for d in docs)
    assert index.occurs(s) == any(s in d for d in docs)


@settings(max_examples=80, deadline=None)
@given(docs_strategy, st.text(alphabet=ALPHABET, max_size=16))
def test_longest_match_is_the_longest_common_substring(docs: list[str], text: str) -> None:
    start, end = TrainingIndex(docs).longest_match(text)
    assert end - start == brute_longest(text, docs)
    if end > start:
        assert any(text[start:end] in d for d in docs)


def test_repeats_inside_one_document_count_once_and_nothing_spans_documents() -> None:
    index = TrainingIndex(["abab abab", "xab", "zzz"])
    assert index.documents_containing("ab") == 2
    assert index.documents_containing("abab") == 1
    assert index.documents_containing("abxab") == 0
    assert index.documents_containing("abab" + index.separator + "xab") == 0
    assert index.longest_match("qqabab abqq") == (2, 9)
    assert TrainingIndex([]).documents_containing("a") == 0
    assert TrainingIndex([]).longest_match("abc") == (0, 0)
    with pytest.raises(LanguageError, match="non-empty"):
        index.documents_containing("")


def test_builds_a_thousand_documents_quickly() -> None:
    rng = random.Random(0)
    docs = ["".join(rng.choice("etaoin shrdlu") for _ in range(128)) for _ in range(1000)]
    docs[17] = docs[17][:40] + "PLANTED-RECORD" + docs[17][54:]
    docs[900] = "PLANTED-RECORD" + docs[900][14:]
    start = time.perf_counter()
    index = TrainingIndex(docs)
    assert time.perf_counter() - start < 5.0
    assert index.documents_containing("PLANTED-RECORD") == 2
    sample = "????" + docs[512][30:100] + "!!!!"
    assert index.longest_match(sample) == (4, 74)
