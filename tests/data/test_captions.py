"""The scraped-like digit captions (Carlini & Terzis 2022's uncurated captions at toy scale):
seeded; the noisy share is exact and a noisy caption never names its image's class while a
clean one names exactly it; the prompt ensemble; the fixed word tokenizer's round trip and
[UNK]; the attacker's caption set is the captions containing the label string."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.data.captions import (
    CLASS_NAMES,
    DIGITS,
    FILLERS,
    JUNK,
    PROMPTS,
    TEMPLATES,
    CaptionTokenizer,
    build_captions,
    caption_class,
    captions_with,
    prompts,
    template_captions,
    words,
)
from privacylab.data.errors import DataError

LABELS = np.arange(600) % 10


def test_seeded_and_varied() -> None:
    a = build_captions(LABELS, noise=0.1, seed=3)
    assert a == build_captions(LABELS, noise=0.1, seed=3)
    assert a != build_captions(LABELS, noise=0.1, seed=4)
    assert len(set(a)) > 200
    assert len(TEMPLATES) >= 30 and len(PROMPTS) >= 8


def test_templates_name_only_their_class() -> None:
    for label in range(10):
        for text in template_captions(CLASS_NAMES[label]):
            assert caption_class(text) == label, text
    for text in [*FILLERS, *JUNK]:
        assert caption_class(text) is None, text


@pytest.mark.parametrize("noise", [0.0, 0.1, 0.37, 1.0])
def test_noise_share_is_exact(noise: float) -> None:
    captions = build_captions(LABELS, noise=noise, seed=0)
    named = np.array([caption_class(c) for c in captions], dtype=object)
    right = named == LABELS
    assert int((~right).sum()) == round(noise * len(LABELS))
    wrong_digit = [n is not None and n != y for n, y in zip(named, LABELS, strict=True)]
    none = [n is None for n in named]
    if noise > 0:
        assert sum(wrong_digit) > 0 and sum(none) > 0


def test_clean_captions_every_one_has_its_class() -> None:
    captions = build_captions(LABELS, noise=0.0, seed=1)
    assert [caption_class(c) for c in captions] == LABELS.tolist()
    fillers = sum(any(f in c for f in FILLERS) for c in captions)
    assert 0.1 < fillers / len(captions) < 0.4


def test_prompt_ensemble() -> None:
    ensemble = prompts("seven")
    assert len(ensemble) == len(PROMPTS) == len(set(ensemble))
    assert "a photo of the digit seven" in ensemble and "the digit 7" in ensemble
    assert all(caption_class(p) == 7 for p in ensemble)
    assert prompts("7") == ensemble
    assert all("{" not in p and "banana" in p for p in prompts("banana"))


def test_tokenizer_round_trip_and_unknown_words() -> None:
    tok = CaptionTokenizer()
    assert tok.vocabulary[:2] == ("[PAD]", "[UNK]")
    assert set(CLASS_NAMES) | set(DIGITS) <= set(tok.vocabulary)
    text = "Scan of a hand-written number 7!"
    ids = tok.encode([text, "zebra seven"], max_len=10)
    assert ids.dtype == torch.int64 and ids.shape == (2, 10)
    assert tok.decode(ids[0]) == " ".join(words(text)) == "scan of a hand written number 7"
    assert ids[1, 0] == tok.unk_id and tok.decode(ids[1]) == "[UNK] seven"
    assert (ids[1, 2:] == tok.pad_id).all()
    assert tok.encode(["a b c d e f"], max_len=3).shape == (1, 3)
    for text in template_captions("four") + prompts("four"):
        assert tok.unk_id not in tok.ids(text)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(CaptionTokenizer().vocabulary[2:]), min_size=1, max_size=12))
def test_tokenizer_round_trip_property(vocab_words: list[str]) -> None:
    tok = CaptionTokenizer()
    text = " ".join(vocab_words)
    assert tok.decode(tok.encode([text], max_len=12)[0]) == text


def test_caption_set_is_the_captions_holding_the_label_string() -> None:
    own = build_captions(np.arange(300) % 10, noise=0.2, seed=9)
    found = captions_with("three", own)
    assert found == [c for c in own if "three" in c.split()]
    assert found and all(caption_class(c) == 3 for c in found)
    assert captions_with("Three", own) == found


def test_bad_input_is_one_line() -> None:
    for call in (
        lambda: build_captions(LABELS, noise=1.5),
        lambda: build_captions(np.array([0.5, 1.0])),
        lambda: build_captions(np.array([3, 11])),
        lambda: CaptionTokenizer().encode("one string"),
        lambda: CaptionTokenizer().encode(["x"], max_len=0),
        lambda: captions_with("two words", ["a"]),
        lambda: template_captions("eleven"),
        lambda: build_captions(LABELS, seed=-1),
        lambda: CaptionTokenizer().decode(["a"]),
    ):
        with pytest.raises(DataError) as info:
            call()
        assert "\n" not in str(info.value)
