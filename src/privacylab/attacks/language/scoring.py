"""Token log-probabilities of texts under a `LanguageTarget`: what every language-model attack
scores with (formulas in `privacylab.stats.language`).

A text is scored as BOS + its UTF-8 bytes (no EOS: generated samples are cut, not ended), so
its n bytes give n scored tokens, the first conditioned on BOS alone. Texts are batched by
length (fewer padded positions); each text is one query of the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from privacylab.attacks.language.base import LanguageError
from privacylab.stats.language import distribution_moments
from privacylab.target.language import LanguageTarget

__all__ = ["TextScores", "lowercased", "score_texts"]


@dataclass(frozen=True)
class TextScores:
    """One text's scored tokens: `log_probs[t]` = log f(x_t | BOS, x_<t) (natural log), and with
    moments the mean `mu[t]` and standard deviation `sigma[t]` of log f(z | BOS, x_<t) under the
    model's own next-token distribution (Min-K%++)."""

    log_probs: np.ndarray
    mu: np.ndarray | None = None
    sigma: np.ndarray | None = None


def score_texts(
    target: LanguageTarget,
    texts: Sequence[str],
    *,
    moments: bool = False,
    batch_size: int = 64,
) -> list[TextScores]:
    """`TextScores` of each of `texts` under `target` (needs scores access), in order. A text
    longer than the context (with its BOS) or empty is a LanguageError naming it."""
    tokenizer = target.tokenizer
    encoded = [tokenizer.encode(text, bos=True) for text in texts]
    for i, ids in enumerate(encoded):
        if len(ids) < 2:
            raise LanguageError(f"text {i} is empty: nothing to score")
        if len(ids) > target.context:
            raise LanguageError(
                f"text {i} is {len(ids) - 1} tokens long; the model's context holds "
                f"{target.context - 1} after BOS: {texts[i][:40]!r}..."
            )
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    out: list[TextScores | None] = [None] * len(texts)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(len(encoded[i]) for i in rows)
        ids = [encoded[i] + [tokenizer.pad] * (width - len(encoded[i])) for i in rows]
        tokens = np.asarray(ids, dtype=np.int64)
        if moments:
            dist = target.distributions(tokens).double().numpy()
            nxt = tokens[:, 1:]
            picked = np.take_along_axis(dist, np.minimum(nxt, dist.shape[-1] - 1)[..., None], -1)[
                ..., 0
            ]
            mu, sigma = distribution_moments(dist)
        else:
            picked = target.token_log_probs(tokens).double().numpy()
            mu = sigma = None
        for j, i in enumerate(rows):
            n = len(encoded[i]) - 1
            out[i] = TextScores(
                picked[j, :n].copy(),
                None if mu is None else mu[j, :n].copy(),
                None if sigma is None else sigma[j, :n].copy(),
            )
    return [s for s in out if s is not None]


def lowercased(text: str) -> str:
    """`text.lower()` (Carlini et al. 2021's lowercase metric), except characters whose
    lowercase form has more UTF-8 bytes (e.g. "İ"), kept as they are so that the lowercased
    text fits the same context as the original."""
    low = text.lower()
    if len(low.encode("utf-8")) <= len(text.encode("utf-8")):
        return low
    return "".join(c if len(c.lower().encode()) > len(c.encode()) else c.lower() for c in text)
