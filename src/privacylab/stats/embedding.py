"""Success measures of the attacks on released text embeddings (numpy only).

Du et al. 2023 ("DP-Forward", CCS'23, Sec. 6.3) score embedding inversion by its *recall*: the
share of a sequence's tokens that the attacker recovers, over the tokens that carry content
(special tokens such as [PAD], [CLS] and [SEP] are not counted). Recall is on token *sets*: a
recovered token counts once whatever its position, so a bag of words recovered from a pooled
sentence embedding is scored the same way as a token-by-token recovery. Attribute inference
(Sec. 6.4) is scored by accuracy against the majority-class share (`majority_share`), what
always guessing the most frequent attribute achieves.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from privacylab.stats._checks import StatisticsError

__all__ = ["SPECIAL_TOKENS", "majority_share", "token_recall"]

SPECIAL_TOKENS = (0, 101, 102)
"""BERT's [PAD], [CLS] and [SEP] ids: not content, never counted by `token_recall`."""


def _rows(tokens: object, what: str) -> list[np.ndarray]:
    if isinstance(tokens, list | tuple):
        rows = [np.asarray(row) for row in tokens]
    else:
        array = np.asarray(tokens)
        if array.ndim != 2:
            raise StatisticsError(f"{what} must be token ids of shape (m, L), got {array.shape}")
        rows = list(array)
    for row in rows:
        if row.ndim != 1 or (row.size and not np.issubdtype(row.dtype, np.integer)):
            raise StatisticsError(f"{what} must be integer token ids, one row per sequence")
    return rows


def token_recall(
    recovered: object, truth: object, ignore: Iterable[int] = SPECIAL_TOKENS
) -> np.ndarray:
    """Per-sequence recall |set(recovered) ∩ set(truth)| / |set(truth)| over the tokens not in
    `ignore` (Du et al. 2023, Sec. 6.3): float array (m,) in [0, 1]; NaN for a sequence whose
    truth holds no counted token. `recovered` and `truth` are (m, L) integer ids (rows may
    differ in length when given as lists)."""
    got = _rows(recovered, "recovered tokens")
    true = _rows(truth, "true tokens")
    if len(got) != len(true):
        raise StatisticsError(
            f"recovered and true tokens hold {len(got)} and {len(true)} sequences"
        )
    skip = {int(t) for t in ignore}
    out = np.full(len(true), np.nan)
    for i, (mine, theirs) in enumerate(zip(got, true, strict=True)):
        wanted = {int(t) for t in theirs} - skip
        if wanted:
            out[i] = len(wanted & {int(t) for t in mine}) / len(wanted)
    return out


def majority_share(labels: object) -> float:
    """The share of the most frequent value of `labels` (m,): the accuracy of always guessing
    it, the chance level of attribute inference (Du et al. 2023, Sec. 6.4)."""
    array = np.asarray(labels).reshape(-1)
    if array.size == 0:
        raise StatisticsError("majority share of no labels")
    _, counts = np.unique(array, return_counts=True)
    return float(counts.max() / array.size)
