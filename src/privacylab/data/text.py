"""Text datasets shipped with the Python interpreter: usable with no network and no files.

- `pydoc_topics`: which of CPython's documentation topics (`pydoc_data.topics`, the text behind
  `help("topic")`) a fixed-length window of bytes comes from. Byte-level tokens (vocabulary 256),
  no tokenizer to download, small enough to train a transformer for a few epochs on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from privacylab.data.dataset import Dataset
from privacylab.data.errors import DataError
from privacylab.data.registry import register_dataset

TOPICS = (
    "specialnames",
    "compound",
    "types",
    "formatstrings",
    "string-methods",
    "debugger",
    "customization",
    "typesmapping",
)
"""The classes: eight long topics of distinct subject (special methods, compound statements,
built-in types, format strings, str methods, pdb, customisation, dict)."""

WINDOW = 32
"""Bytes per example (the transformer's sequence length)."""

WINDOWS_PER_TOPIC = 200
"""Examples per class; the shortest topic above holds more than 300 non-overlapping windows."""

TEST_FRACTION = 0.2
VOCAB_SIZE = 256


def topic_windows(text: str, window: int, count: int) -> np.ndarray:
    """The first `count` non-overlapping `window`-byte windows of `text` (UTF-8, whitespace runs
    folded to one space) as int64 byte ids, shape (count, window)."""
    data = np.frombuffer(" ".join(text.split()).encode("utf-8"), dtype=np.uint8)
    if len(data) < window * count:
        raise DataError(
            f"pydoc_topics: a topic of {len(data)} bytes holds fewer than {count} windows"
        )
    return data[: window * count].reshape(count, window).astype(np.int64)


@register_dataset("pydoc_topics")
def load_pydoc_topics(root: Path | None = None) -> Dataset:
    """Byte windows of 8 CPython documentation topics, 200 per topic; 1,280 train then 320 test.

    Each topic's text is cut into consecutive windows; the first 80% of each topic's windows are
    training rows and the last 20% test rows, so no test window overlaps or neighbours a training
    window of the same passage. The training rows are then shuffled under a fixed seed (so are the
    test rows): the same interpreter version gives the same rows on every machine.
    """
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover - every CPython ships it
        raise DataError("pydoc_topics needs CPython's pydoc_data module") from None
    n_test = round(WINDOWS_PER_TOPIC * TEST_FRACTION)
    train_x, train_y, test_x, test_y = [], [], [], []
    for label, name in enumerate(TOPICS):
        if name not in topics:
            raise DataError(f"pydoc_topics: this Python's pydoc_data has no topic {name!r}")
        rows = topic_windows(topics[name], WINDOW, WINDOWS_PER_TOPIC)
        train_x.append(rows[:-n_test])
        test_x.append(rows[-n_test:])
        train_y.append(np.full(len(rows) - n_test, label, np.int64))
        test_y.append(np.full(n_test, label, np.int64))
    rng = np.random.default_rng(0)
    train_order = rng.permutation(sum(len(y) for y in train_y))
    test_order = rng.permutation(sum(len(y) for y in test_y))
    features = np.concatenate(
        [np.concatenate(train_x)[train_order], np.concatenate(test_x)[test_order]]
    )
    labels = np.concatenate(
        [np.concatenate(train_y)[train_order], np.concatenate(test_y)[test_order]]
    )
    return Dataset(
        name="pydoc_topics",
        features=torch.from_numpy(features),
        labels=torch.from_numpy(labels),
        num_classes=len(TOPICS),
        input_shape=(WINDOW,),
        kind="text",
        train_size=len(train_order),
    )


def vocabulary_size(dataset: Dataset) -> int:
    """The token vocabulary a model needs for `dataset`: 256 for byte-level text datasets
    registered here, else one more than the largest token id."""
    if dataset.kind != "text":
        raise DataError(f"{dataset.name} is not a text dataset")
    if dataset.name == "pydoc_topics":
        return VOCAB_SIZE
    return int(dataset.features.max()) + 1 if len(dataset) else 1
