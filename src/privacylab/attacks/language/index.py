"""`TrainingIndex`: a suffix array over a set of documents, to decide what a generated sample
copied from them.

Carlini et al. 2021 ("Extracting Training Data from Large Language Models", Def. 2) call a
string s k-eidetic memorised when it is extractable and occurs in k training examples:
k = |{x in X : s is a substring of x}|, DISTINCT documents, however often s repeats inside one.
Their verification searched the training set for each sample; here the documents (as Unicode
code points) are joined with a separator that occurs in none of them and indexed by a suffix
array (Manber & Myers 1993, "Suffix arrays: a new method for on-line string searches", built
by prefix doubling with numpy sorts). Then

- `documents_containing(s)`: the suffixes starting with s form one contiguous range of the
  suffix array (two binary searches); k = the number of distinct documents those suffixes lie
  in. A query never matches across documents: it cannot contain the separator.
- `longest_match(text)`: the longest substring of `text` that occurs in some document, from the
  matching statistics of `text` (the longest prefix of each suffix text[i:] that occurs; the
  statistic at i + 1 is at least the one at i minus one, so each start extends the previous
  match: O(|text|) occurrence tests, each a binary search).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np

from privacylab.attacks.language.base import LanguageError

__all__ = ["TrainingIndex", "suffix_array"]


def suffix_array(codes: np.ndarray) -> np.ndarray:
    """The suffix array of the integer sequence `codes`: start positions of its suffixes in
    lexicographic order (a shorter suffix first when it is a prefix of a longer one). Prefix
    doubling (Manber & Myers 1993): suffixes ranked by their first 2^j symbols, then sorted by
    the pair (rank of the first 2^j, rank of the next 2^j), O(n log^2 n) in numpy sorts."""
    values = np.asarray(codes, dtype=np.int64).reshape(-1)
    n = values.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, rank = np.unique(values, return_inverse=True)
    rank = rank.astype(np.int64) + 1
    order = np.argsort(rank, kind="stable")
    step = 1
    while True:
        second = np.zeros(n, dtype=np.int64)
        if step < n:
            second[: n - step] = rank[step:]
        key = rank * (n + 1) + second
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        fresh = np.empty(n, dtype=np.int64)
        fresh[order] = np.cumsum(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
        rank = fresh
        if int(rank.max()) == n or step >= n:
            return order
        step *= 2


class TrainingIndex:
    """Substring search over `documents` (see the module docstring); the empty set of
    documents is allowed (nothing occurs in it)."""

    def __init__(self, documents: Sequence[str]) -> None:
        docs = list(documents)
        if not all(isinstance(d, str) for d in docs):
            raise LanguageError("a training index holds documents as strings")
        used = set().union(*map(set, docs)) if docs else set()
        code = 0
        while chr(code) in used:
            code += 1
        self.separator = chr(code)
        self.documents = docs
        self._joined = self.separator.join(docs) + self.separator
        codes = np.frombuffer(self._joined.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        lengths = np.asarray([len(d) + 1 for d in docs], dtype=np.int64)
        self._doc_of = np.repeat(np.arange(len(docs), dtype=np.int64), lengths)
        self._suffixes = suffix_array(codes)
        self._starts = self._suffixes.tolist()

    def __len__(self) -> int:
        return len(self.documents)

    def _range(self, s: str) -> tuple[int, int]:
        """[lo, hi) of the suffix-array entries whose suffix starts with `s`."""
        joined, m = self._joined, len(s)

        def head(p: int) -> str:
            return joined[p : p + m]

        lo = bisect_left(self._starts, s, key=head)
        hi = bisect_right(self._starts, s, lo=lo, key=head)
        return lo, hi

    def occurs(self, s: str) -> bool:
        """Whether `s` (non-empty) is a substring of some document."""
        if not s or self.separator in s:
            return False
        lo, hi = self._range(s)
        return hi > lo

    def documents_containing(self, s: str) -> int:
        """k of Carlini et al. 2021, Def. 2: the number of DISTINCT documents containing `s`
        (a non-empty string; LanguageError otherwise)."""
        if not isinstance(s, str) or not s:
            raise LanguageError("documents_containing needs a non-empty string")
        if self.separator in s:
            return 0
        lo, hi = self._range(s)
        if hi <= lo:
            return 0
        return int(np.unique(self._doc_of[self._suffixes[lo:hi]]).size)

    def longest_match(self, text: str) -> tuple[int, int]:
        """(start, end) of the longest substring text[start:end] occurring in some document
        (the leftmost of the longest; (0, 0) when no character of `text` occurs)."""
        if not isinstance(text, str):
            raise LanguageError("longest_match needs a string")
        best = (0, 0)
        length = 0
        for i in range(len(text)):
            length = max(length - 1, 0)
            while i + length < len(text) and self.occurs(text[i : i + length + 1]):
                length += 1
            if length > best[1] - best[0]:
                best = (i, i + length)
            if i + (best[1] - best[0]) >= len(text):
                break
        return best
