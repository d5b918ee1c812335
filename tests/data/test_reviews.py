"""The DP-Forward review corpus: planted structure, splits, learnability and strict files."""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chi2_contingency
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from privacylab.data.reviews import (
    CATEGORIES,
    GENERIC,
    LABELS,
    PRODUCTS,
    REVIEWS_FILE,
    SPECIFIC,
    SPLITS,
    ReviewConfig,
    ReviewError,
    Reviews,
    build_reviews,
    describe,
    load_reviews,
    save_reviews,
)
from privacylab.errors import PrivacylabError


@pytest.fixture(scope="module")
def reviews() -> Reviews:
    return build_reviews()


def _sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.!?])\s+", text)


@functools.cache
def _pattern(template: str) -> re.Pattern[str]:
    """A template of the phrase bank as a regex: each {slot} matches any text."""
    parts = re.split(r"\{\w+\}", template)
    return re.compile(".+?".join(re.escape(p) for p in parts) + r"\Z")


def _polarities(sentence: str, category: str) -> set[str]:
    return {
        polarity
        for polarity in LABELS
        for template in GENERIC[polarity] + SPECIFIC[category][polarity]
        if _pattern(template).match(sentence)
    }


def test_phrase_bank_is_rich_and_distinct() -> None:
    for category in CATEGORIES:
        assert len(set(PRODUCTS[category])) >= 12
        for polarity in LABELS:
            assert len(set(GENERIC[polarity] + SPECIFIC[category][polarity])) >= 25 + 8
    products = [p for c in CATEGORIES for p in PRODUCTS[c]]
    assert len(products) == len(set(products))
    assert not set(GENERIC["positive"]) & set(GENERIC["negative"])


def test_default_corpus_counts_balance_and_independence(reviews: Reviews) -> None:
    n = 2400
    assert len(reviews) == n and len(set(reviews.texts)) == n
    assert reviews.labels.dtype == np.int64 and reviews.attributes.dtype == np.int64
    table = np.zeros((len(CATEGORIES), len(LABELS)), dtype=int)
    np.add.at(table, (reviews.attributes, reviews.labels), 1)
    assert (table == n // 8).all()
    assert chi2_contingency(table).pvalue > 0.99
    assert reviews.mixed.sum() == round(0.15 * n)
    facts = describe(reviews)
    json.dumps(facts)
    sizes = {s: facts["splits"][s]["documents"] for s in SPLITS}
    assert sizes == {"train": 960, "test": 720, "aux": 720}
    for name in SPLITS:
        part = facts["splits"][name]
        assert part["labels"] == {label: sizes[name] // 2 for label in LABELS}
        assert part["attributes"] == {c: sizes[name] // 4 for c in CATEGORIES}
        assert abs(part["mixed"] - 0.15 * sizes[name]) <= 8
    assert facts["mixed"] == 360


def test_every_review_is_planted_as_documented(reviews: Reviews) -> None:
    for text, label, attribute, mixed in zip(
        reviews.texts, reviews.labels, reviews.attributes, reviews.mixed, strict=True
    ):
        category = CATEGORIES[attribute]
        sentences = _sentences(text)
        assert 2 <= len(sentences) <= 4, text
        assert any(p in sentences[0] for p in PRODUCTS[category]), text
        others = [p for c in CATEGORIES if c != category for p in PRODUCTS[c]]
        assert not any(re.search(rf"\b{re.escape(p)}\b", text) for p in others), text
        found = [_polarities(s, category) for s in sentences[1:]]
        polar = [f for f in found if f]
        if mixed:
            assert sorted(next(iter(f)) for f in polar) == ["negative", "positive"], text
        else:
            assert 1 <= len(polar) <= 2 and all(f == {LABELS[label]} for f in polar), text


def test_splits_are_disjoint_stratified_and_seeded(reviews: Reviews) -> None:
    parts = {name: reviews.subset(name) for name in SPLITS}
    assert sum(len(p) for p in parts.values()) == len(reviews)
    texts = [set(p.texts) for p in parts.values()]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    for name, part in parts.items():
        assert (part.split == name).all() and part.config == reviews.config
        assert part.mixed.sum() == describe(reviews)["splits"][name]["mixed"]
    again = build_reviews()
    assert again.texts == reviews.texts
    assert (again.split == reviews.split).all() and (again.labels == reviews.labels).all()
    other = build_reviews(replace(reviews.config, seed=1))
    assert other.texts != reviews.texts
    with pytest.raises(ReviewError, match="unknown split"):
        reviews.subset("validation")


def test_label_and_attribute_are_learnable_and_independent(reviews: Reviews) -> None:
    """Bag-of-words logistic regression (scikit-learn) as the oracle of what the text plants."""
    train, test, aux = (reviews.subset(s) for s in SPLITS)
    vectorizer = CountVectorizer().fit(train.texts + aux.texts)
    x_train, x_test, x_aux = (vectorizer.transform(p.texts) for p in (train, test, aux))
    sentiment = LogisticRegression(max_iter=2000).fit(x_train, train.labels)
    correct = sentiment.predict(x_test) == test.labels
    assert correct[~test.mixed].mean() > 0.95
    assert correct[test.mixed].mean() < 0.65
    attribute = LogisticRegression(max_iter=2000).fit(x_aux, aux.attributes)
    assert (attribute.predict(x_test) == test.attributes).mean() > 0.95
    one_hot = np.eye(len(LABELS))[aux.labels]
    from_label = LogisticRegression().fit(one_hot, aux.attributes)
    accuracy = (from_label.predict(np.eye(len(LABELS))[test.labels]) == test.attributes).mean()
    assert accuracy == pytest.approx(1 / len(CATEGORIES), abs=0.01)


def test_mixed_reviews_are_the_memorised_ones(reviews: Reviews) -> None:
    """A model fits mixed members only by memorising them: a loss-threshold membership
    attack (Yeom et al. 2018) separates mixed members from mixed non-members far better than
    it separates the others (roc_auc_score as the oracle)."""
    train, test = reviews.subset("train"), reviews.subset("test")
    vectorizer = CountVectorizer(ngram_range=(1, 2)).fit(train.texts)
    model = LogisticRegression(C=1.0, max_iter=5000).fit(
        vectorizer.transform(train.texts), train.labels
    )

    def confidence(part: Reviews) -> np.ndarray:
        probabilities = model.predict_proba(vectorizer.transform(part.texts))
        return probabilities[np.arange(len(part)), part.labels]

    assert (model.predict(vectorizer.transform(train.texts)) == train.labels).mean() == 1.0
    scores = np.r_[confidence(train), confidence(test)]
    members = np.r_[np.ones(len(train)), np.zeros(len(test))]
    mixed = np.r_[train.mixed, test.mixed]
    auc_mixed = roc_auc_score(members[mixed], scores[mixed])
    auc_clean = roc_auc_score(members[~mixed], scores[~mixed])
    assert auc_mixed > 0.75 and auc_mixed > auc_clean + 0.15


def test_sentiment_survives_truncation_to_48_tokens(reviews: Reviews) -> None:
    from privacylab.models.minilm import load_tokenizer

    tokenizer = load_tokenizer()
    heads = [" ".join(_sentences(t)[:2]) for t in reviews.texts]
    lengths = [len(ids) for ids in tokenizer(heads)["input_ids"]]
    assert max(lengths) <= 48


def test_build_is_fast() -> None:
    build_reviews(ReviewConfig(seed=7, documents=100))
    start = time.perf_counter()
    build_reviews(ReviewConfig(seed=7))
    assert time.perf_counter() - start < 2.0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    documents=st.integers(24, 300),
    mixed=st.floats(0.0, 1.0),
    train=st.floats(0.1, 0.6),
    test=st.floats(0.1, 0.35),
    seed=st.integers(0, 3),
)
def test_any_config_gives_a_balanced_corpus_that_round_trips(
    documents: int, mixed: float, train: float, test: float, seed: int
) -> None:
    config = ReviewConfig(documents=documents, mixed=mixed, train=train, test=test, seed=seed)
    built = build_reviews(config)
    assert len(built) == documents and len(set(built.texts)) == documents
    counts = np.bincount(built.attributes * 2 + built.labels, minlength=8)
    assert counts.max() - counts.min() <= 1
    assert built.mixed.sum() == round(mixed * documents)
    strata = built.attributes * 4 + built.labels * 2 + built.mixed
    for stratum in np.unique(strata):
        rows = strata == stratum
        assert abs((built.split[rows] == "train").sum() - train * rows.sum()) <= 0.5 + 1e-9
    back = Reviews.from_dict(json.loads(json.dumps(built.to_dict())))
    assert back.texts == built.texts and back.config == built.config
    for key in ("labels", "attributes", "split", "mixed"):
        assert (getattr(back, key) == getattr(built, key)).all()


def test_save_and_load_round_trip(tmp_path, reviews: Reviews) -> None:
    small = build_reviews(ReviewConfig(documents=40, seed=3))
    folder_file = save_reviews(small, tmp_path / "model")
    assert folder_file == tmp_path / "model" / REVIEWS_FILE
    for path in (tmp_path / "model", folder_file):
        back = load_reviews(path)
        assert back.to_dict() == small.to_dict()
    named = save_reviews(small, tmp_path / "corpus.json")
    assert load_reviews(named).texts == small.texts


def _bad_files(good: dict) -> list[tuple[str, object]]:
    def edit(**changes: object) -> dict:
        return {**good, **changes}

    texts = good["texts"]
    return [
        ("format", edit(format="privacylab-corpus/1")),
        ("categories", edit(categories=["a", "b", "c", "d"])),
        ("lacks", {k: v for k, v in good.items() if k != "labels"}),
        ("must be a list", edit(texts="hello")),
        ("whole numbers", edit(labels=[True] * len(texts))),
        ("whole numbers", edit(labels=[0.5] * len(texts))),
        ("in 0..1", edit(labels=[2] * len(texts))),
        ("in 0..3", edit(attributes=[-1] * len(texts))),
        ("labels", edit(labels=good["labels"][:-1])),
        ("unknown split", edit(split=["validation"] * len(texts))),
        ("booleans", edit(mixed=[0] * len(texts))),
        ("string", edit(texts=[1] * len(texts))),
        ("unknown review config key", edit(config={**good["config"], "extra": 1})),
        ("documents", edit(config={**good["config"], "documents": "many"})),
        ("JSON object", edit(config=[1, 2])),
        ("format", [1, 2, 3]),
    ]


def test_bad_files_give_one_line_errors(tmp_path) -> None:
    good = build_reviews(ReviewConfig(documents=24, seed=5)).to_dict()
    for index, (message, data) in enumerate(_bad_files(good)):
        path = tmp_path / f"bad{index}.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ReviewError, match=message) as caught:
            load_reviews(path)
        assert "\n" not in str(caught.value)
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ')
    with pytest.raises(ReviewError, match="cannot read") as caught:
        load_reviews(broken)
    assert "\n" not in str(caught.value)
    with pytest.raises(ReviewError, match="no review corpus"):
        load_reviews(tmp_path / "missing")
    assert issubclass(ReviewError, PrivacylabError) and issubclass(ReviewError, ValueError)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"documents": 10}, "documents"),
        ({"documents": True}, "documents"),
        ({"documents": 2.5}, "documents"),
        ({"seed": -1}, "seed"),
        ({"mixed": -0.1}, "mixed"),
        ({"mixed": 1.5}, "mixed"),
        ({"mixed": float("nan")}, "finite"),
        ({"train": 0.0}, "train and test"),
        ({"test": 1.0}, "train and test"),
        ({"train": 0.6, "test": 0.4}, "below 1"),
        ({"train": "half"}, "number"),
    ],
)
def test_bad_configs_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(ReviewError, match=message) as caught:
        build_reviews(ReviewConfig(**changes))
    assert "\n" not in str(caught.value)
