"""The `pydoc_topics` text dataset: byte windows of CPython's documentation topics."""

from __future__ import annotations

from pydoc_data.topics import topics

import torch

from privacylab.data import available_datasets, load_dataset, split_train_test
from privacylab.data.text import TOPICS, WINDOW, WINDOWS_PER_TOPIC, vocabulary_size


def test_registered_balanced_and_deterministic() -> None:
    assert "pydoc_topics" in available_datasets()
    data = load_dataset("pydoc_topics")
    again = load_dataset("pydoc_topics")
    assert torch.equal(data.features, again.features)
    assert torch.equal(data.labels, again.labels)
    assert data.kind == "text"
    assert data.input_shape == (WINDOW,)
    assert data.features.dtype == torch.int64
    assert int(data.features.min()) >= 0
    assert vocabulary_size(data) == 256 > int(data.features.max())
    train, test = split_train_test(data)
    per_class = torch.bincount(train.labels, minlength=len(TOPICS))
    assert per_class.tolist() == [len(train) // len(TOPICS)] * len(TOPICS)
    assert len(train) + len(test) == len(TOPICS) * WINDOWS_PER_TOPIC


def test_rows_are_consecutive_windows_and_test_follows_train() -> None:
    data = load_dataset("pydoc_topics")
    train, test = split_train_test(data)
    n_test = len(test) // len(TOPICS)
    for label, name in enumerate(TOPICS):
        text = " ".join(topics[name].split()).encode()
        windows = [text[i * WINDOW : (i + 1) * WINDOW] for i in range(WINDOWS_PER_TOPIC)]
        train_rows = sorted(bytes(r.tolist()) for r in train.features[train.labels == label])
        test_rows = sorted(bytes(r.tolist()) for r in test.features[test.labels == label])
        # The first windows of each topic train, the last ones test: no window straddles both.
        assert train_rows == sorted(windows[:-n_test])
        assert test_rows == sorted(windows[-n_test:])
