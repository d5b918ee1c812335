"""The corpus builder's truth: every planted string occurs in exactly the member documents it
names (k-eidetic k = copies, Carlini et al. 2021 Def. 2), canaries as planned (Carlini et al.
2019), every document fits its context, and the same config gives the same corpus."""

from __future__ import annotations

import itertools
import json
import re
import string
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from privacylab.data.corpus import Corpus, load_corpus
from privacylab.data.corpus_build import (
    CorpusConfig,
    build_corpus,
    chunk_text,
    fold_text,
    parse_user_canary,
    pydoc_texts,
    read_text_corpus,
)
from privacylab.data.errors import DataError
from privacylab.data.tokenizer import ByteTokenizer
from privacylab.errors import PrivacylabError

USER = (("my PIN is {482913}", 3), ("the vault word is {quokka}, remember", 2))


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return build_corpus(CorpusConfig(user_canaries=USER))


def containing(text: str, documents: list[str]) -> list[int]:
    return [i for i, d in enumerate(documents) if text in d]


def test_same_config_same_corpus_json(corpus: Corpus) -> None:
    again = build_corpus(CorpusConfig(user_canaries=USER))
    assert json.dumps(again.to_dict()) == json.dumps(corpus.to_dict())
    other = build_corpus(CorpusConfig(user_canaries=USER, seed=1))
    assert other.documents != corpus.documents
    assert [r.text for r in other.records] != [r.text for r in corpus.records]


def test_default_sizes_and_split(corpus: Corpus) -> None:
    config = CorpusConfig()
    assert len(corpus.documents) == config.documents
    assert corpus.members.sum() == round(config.member_fraction * config.documents)
    assert corpus.context == 128 and corpus.tokenizer == "bytes"
    assert len(corpus.records) == len(config.record_copies) * config.records_per_count
    assert sorted({r.copies for r in corpus.records}) == list(config.record_copies)
    assert len(corpus.canaries) == len(config.canary_repeats) + len(USER)


@pytest.mark.parametrize("context", [32, 64, 128])
def test_every_document_fits_its_context(context: int) -> None:
    built = corpus_at(context)
    lengths = [len(ByteTokenizer().encode(d, bos=True, eos=True)) for d in built.documents]
    assert max(lengths) <= context
    assert min(lengths) > 2
    ByteTokenizer().batch(built.documents, context)
    assert all(d == fold_text(d) for d in built.documents)
    hosts = {d for p in [*built.records, *built.canaries] for d in p.documents}
    source = [d for i, d in enumerate(built.documents) if i not in hosts]
    assert len(set(source)) == len(source)


def test_repeated_chunks_are_one_document() -> None:
    """A held-out copy of a member document would be trained on: repeats are dropped."""
    texts = ["the same passage", "other words", "the  same\npassage", "other words"]
    built = build_corpus(
        CorpusConfig(records_per_count=0, canary_repeats=(), documents=None), texts=texts
    )
    assert built.documents == ["the same passage", "other words"]


_BUILT: dict[int, Corpus] = {}


def corpus_at(context: int) -> Corpus:
    if context not in _BUILT:
        _BUILT[context] = build_corpus(CorpusConfig(context=context, documents=1500))
    return _BUILT[context]


@pytest.mark.parametrize("context", [32, 64, 128])
def test_records_occur_in_exactly_copies_member_documents(context: int) -> None:
    built = corpus_at(context) if context != 128 else build_corpus()
    for record in built.records:
        hosts = containing(record.text, built.documents)
        assert hosts == list(record.documents)
        assert len(hosts) == record.copies
        assert built.members[hosts].all()
        assert not any(record.text in d for d in built.texts(built.heldout_indices))
        assert set(record.fields) <= {"name", "email", "phone", "address"}
        assert all(value in record.text for value in record.fields.values())
    assert len({r.text for r in built.records}) == len(built.records)


def test_records_are_realistic_and_distinct(corpus: Corpus) -> None:
    fields = [r.fields for r in corpus.records]
    assert all(set(f) == {"name", "email", "phone", "address"} for f in fields)
    for key in ("name", "email", "phone"):
        assert len({f[key] for f in fields}) == len(fields)
    for f in fields:
        assert re.fullmatch(r"\(\d{3}\) 555-01\d\d", f["phone"])
        assert re.fullmatch(r"[a-z.]+\d*@example\.(com|org|net)", f["email"])
        assert re.search(r", [A-Z]{2} \d{5}$", f["address"])
    sides = {corpus.documents[d].startswith(r.text) for r in corpus.records for d in r.documents}
    assert sides == {True, False}


def test_records_and_canaries_are_absent_from_the_source(corpus: Corpus) -> None:
    source = " ".join(fold_text(t) for t in pydoc_texts())
    for planted in [r.text for r in corpus.records] + [c.text for c in corpus.canaries]:
        assert planted not in source


def test_canaries_planted_exactly_their_repeats(corpus: Corpus) -> None:
    config = CorpusConfig()
    generated = [c for c in corpus.canaries if not c.user]
    assert [c.repeats for c in generated] == list(config.canary_repeats)
    for canary in corpus.canaries:
        hosts = containing(canary.text, corpus.documents)
        assert hosts == list(canary.documents)
        assert len(hosts) == canary.repeats
        assert corpus.members[hosts].all()
        assert all(corpus.documents[d].startswith(canary.text) for d in hosts)
    for canary in generated:
        assert len(canary.secret) == canary.length == config.secret_length
        assert set(canary.secret) <= set(config.secret_alphabet)
        assert canary.alphabet == config.secret_alphabet and canary.suffix == ""
        assert canary.space_bits == pytest.approx(6 * np.log2(10))
    assert len({c.prefix for c in corpus.canaries}) == len(corpus.canaries)


def test_controls_are_never_planted(corpus: Corpus) -> None:
    controls = [c for c in corpus.canaries if c.repeats == 0]
    assert controls and all(c.documents == () for c in controls)
    for control in controls:
        assert containing(control.text, corpus.documents) == []
        assert containing(control.prefix, corpus.documents) == []


def test_each_host_hosts_one_planted_string(corpus: Corpus) -> None:
    hosts = [d for p in [*corpus.records, *corpus.canaries] for d in p.documents]
    assert len(hosts) == len(set(hosts))
    assert len(hosts) == sum(CorpusConfig().record_copies) * 4 + sum(
        CorpusConfig().canary_repeats
    ) + sum(r for _, r in USER)


def test_non_hosts_are_source_chunks(corpus: Corpus) -> None:
    topics = [fold_text(t) for t in pydoc_texts()]
    hosts = {d for p in [*corpus.records, *corpus.canaries] for d in p.documents}
    others = [d for i, d in enumerate(corpus.documents) if i not in hosts]
    rng = np.random.default_rng(0)
    for index in rng.choice(len(others), 50, replace=False):
        assert any(others[index] in topic for topic in topics)


def test_secrets_are_uniform() -> None:
    built = build_corpus(
        CorpusConfig(
            documents=200, records_per_count=0, canary_repeats=(0,), canaries_per_repeat=120
        )
    )
    digits = "".join(c.secret for c in built.canaries)
    counts = np.bincount([int(d) for d in digits], minlength=10)
    assert len(digits) == 720
    assert stats.chisquare(counts).pvalue > 1e-3
    letters = build_corpus(
        CorpusConfig(
            documents=50,
            records_per_count=0,
            canary_repeats=(0,),
            canaries_per_repeat=5,
            secret_alphabet="abc",
            secret_length=4,
        )
    )
    assert all(set(c.secret) <= set("abc") and len(c.secret) == 4 for c in letters.canaries)
    assert letters.canaries[0].space_bits == pytest.approx(4 * np.log2(3))


def test_user_canaries(corpus: Corpus) -> None:
    users = [c for c in corpus.canaries if c.user]
    assert [(c.prefix, c.secret, c.suffix, c.alphabet, c.length, c.repeats) for c in users] == [
        ("my PIN is ", "482913", "", string.digits, 6, 3),
        ("the vault word is ", "quokka", ", remember", string.ascii_lowercase, 6, 2),
    ]
    assert users[0].text == "my PIN is 482913"
    assert users[1].text == "the vault word is quokka, remember"


def test_parse_user_canary() -> None:
    assert parse_user_canary("my PIN is {482913}") == ("my PIN is ", "482913", "", "0123456789")
    assert parse_user_canary("{abc} is mine") == ("", "abc", " is mine", string.ascii_lowercase)
    assert parse_user_canary("no braces here") == ("no braces here", "", "", "")
    for bad in ["pin {12a4}", "pin {ABC}", "pin {}", "pin {12} and {34}", "pin }12{", "pin {12"]:
        with pytest.raises(DataError) as error:
            parse_user_canary(bad)
        assert "\n" not in str(error.value)
    with pytest.raises(DataError, match="all digits or all lowercase"):
        parse_user_canary("code {12ab}")
    with pytest.raises(DataError, match="non-empty"):
        parse_user_canary("   ")


def test_unbraced_user_canary_is_the_whole_text() -> None:
    built = build_corpus(
        CorpusConfig(documents=1200, user_canaries=(("Zorblax Quint owes 9 florins", 2),))
    )
    canary = built.canaries[-1]
    assert canary.user and canary.prefix == "Zorblax Quint owes 9 florins"
    assert canary.secret == canary.alphabet == "" and canary.length == 0
    assert canary.space_bits == 0.0
    assert containing(canary.text, built.documents) == list(canary.documents)
    assert len(canary.documents) == 2


def test_user_canary_errors() -> None:
    long = "x" * 130 + " {123}"
    with pytest.raises(DataError, match=r"is 136 tokens; the context holds 128"):
        build_corpus(CorpusConfig(user_canaries=((long, 1),)))
    with pytest.raises(DataError, match="at least once"):
        build_corpus(CorpusConfig(user_canaries=(("pin {12}", 0),)))
    with pytest.raises(DataError, match="digits or all lowercase"):
        build_corpus(CorpusConfig(user_canaries=(("pin {X1}", 1),)))
    with pytest.raises(DataError, match="already in document"):
        build_corpus(CorpusConfig(documents=1200, user_canaries=(("the", 1),)))


def test_empty_corpus_is_refused() -> None:
    for texts in ([], ["", "   \n\t "], ["ééé ü"]):
        with pytest.raises(DataError, match="the corpus is empty"):
            build_corpus(CorpusConfig(records_per_count=0, canary_repeats=()), texts=texts)


def test_too_few_member_documents() -> None:
    with pytest.raises(DataError, match=r"need 571 distinct member documents; the corpus has 50"):
        build_corpus(CorpusConfig(documents=100))
    few = build_corpus(
        CorpusConfig(documents=40, record_copies=(1, 2), records_per_count=2, canary_repeats=(0, 3))
    )
    assert few.members.sum() == 20


def test_contexts_too_small() -> None:
    with pytest.raises(DataError, match=r"is 21 tokens; the context holds 20"):
        build_corpus(CorpusConfig(context=20, records_per_count=0))
    with pytest.raises(DataError, match="records do not fit a context of 24 tokens"):
        build_corpus(CorpusConfig(context=24, canary_repeats=()))
    tiny = corpus_at(32)
    assert all(len(r.text) <= 30 for r in tiny.records)
    assert all(len(c.text) + 2 <= 32 for c in tiny.canaries)


def test_user_texts_and_json_round_trip(tmp_path) -> None:
    words = " ".join(f"word{i}" for i in range(3000))
    (tmp_path / "mine.txt").write_text(
        f"First paragraph\nstill first.\n\n  \n{words}\n\nThird.\n", encoding="utf-8"
    )
    texts = read_text_corpus(tmp_path / "mine.txt")
    assert texts[0] == "First paragraph\nstill first." and texts[2] == "Third."
    config = CorpusConfig(
        context=64,
        documents=None,
        record_copies=(1, 3),
        records_per_count=2,
        canary_repeats=(0, 2),
        user_canaries=(("pin {4444}", 2),),
        seed=7,
    )
    built = build_corpus(config, texts=texts)
    assert "First paragraph still first." in " ".join(built.documents)
    assert built.config == config.to_dict()
    assert CorpusConfig.from_dict(json.loads(json.dumps(built.config))) == config
    loaded = load_corpus(built.save(tmp_path / "model"))
    assert loaded.to_dict() == built.to_dict()
    assert loaded.records == built.records and loaded.canaries == built.canaries
    np.testing.assert_array_equal(loaded.members, built.members)


def test_read_text_corpus_errors(tmp_path) -> None:
    with pytest.raises(DataError, match="no text file"):
        read_text_corpus(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n \n\n", encoding="utf-8")
    with pytest.raises(DataError, match="the corpus is empty"):
        read_text_corpus(tmp_path / "empty.txt")
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(DataError, match="not UTF-8"):
        read_text_corpus(tmp_path / "latin.txt")
    with pytest.raises(DataError, match="folder"):
        read_text_corpus(tmp_path)


@pytest.mark.parametrize(
    "settings_",
    [
        {"context": 8},
        {"context": 64.0},
        {"documents": 0},
        {"member_fraction": 0.0},
        {"member_fraction": 1.5},
        {"member_fraction": float("nan")},
        {"record_copies": (0, 2)},
        {"record_copies": (2, 2)},
        {"records_per_count": -1},
        {"canary_repeats": (-1,)},
        {"canaries_per_repeat": True},
        {"secret_length": 0},
        {"secret_alphabet": "a"},
        {"secret_alphabet": "aab"},
        {"secret_alphabet": "a b"},
        {"user_canaries": (("pin {1}",),)},
        {"seed": -1},
    ],
)
def test_bad_config_one_line(settings_: dict) -> None:
    with pytest.raises(DataError) as error:
        CorpusConfig(**settings_).validate()
    assert isinstance(error.value, PrivacylabError)
    assert "\n" not in str(error.value)


def test_from_dict_refuses_unknown_settings() -> None:
    with pytest.raises(DataError, match="unknown corpus setting 'contxt'"):
        CorpusConfig.from_dict({"contxt": 64})


def test_default_build_is_fast() -> None:
    build_corpus()
    start = time.perf_counter()
    build_corpus()
    assert time.perf_counter() - start < 3.0


def test_fold_text() -> None:
    assert fold_text("  a\tb\n\nc\x00d é  ") == "a b cd"
    assert fold_text("") == ""


words = st.text(alphabet=string.ascii_letters + string.digits + ".,'()", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.tuples(words, st.sampled_from([" ", "  ", "\n", "\t", " é "])), max_size=60),
    budget=st.integers(12, 80),
)
def test_chunks_rebuild_the_folded_text(pieces: list[tuple[str, str]], budget: int) -> None:
    text = "".join(word + gap for word, gap in pieces)
    chunks = chunk_text(text, budget)
    assert all(0 < len(c.encode("utf-8")) <= budget for c in chunks)
    assert " ".join(chunks) == fold_text(text)
    for chunk, after in itertools.pairwise(chunks):
        assert len(chunk) + 1 + len(after.split(" ")[0]) > budget


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=300), budget=st.integers(1, 20))
def test_chunks_of_any_text_fit(text: str, budget: int) -> None:
    chunks = chunk_text(text, budget)
    assert all(0 < len(c.encode("utf-8")) <= budget for c in chunks)
    assert all(c == c.strip() and "  " not in c for c in chunks)
    assert "".join(chunks).replace(" ", "") == fold_text(text).replace(" ", "")


def test_user_canaries_leave_the_rest_unchanged(corpus: Corpus) -> None:
    plain = build_corpus()
    assert plain.records == corpus.records
    assert plain.canaries == corpus.canaries[: len(plain.canaries)]
    np.testing.assert_array_equal(plain.members, corpus.members)
    user_hosts = {d for c in corpus.canaries if c.user for d in c.documents}
    assert [d for i, d in enumerate(plain.documents) if i not in user_hosts] == [
        d for i, d in enumerate(corpus.documents) if i not in user_hosts
    ]
