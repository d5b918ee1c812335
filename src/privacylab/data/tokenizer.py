"""The byte-level tokenizer of the language-model family: no vocabulary file, nothing to
download, every string representable.

Token ids 0-255 are the UTF-8 bytes of the text (as GPT-2's byte-level BPE before any merge,
Radford et al. 2019, Sec. 2.2); three special ids follow: `BOS` (256) opens a document, `EOS`
(257) closes it, `PAD` (258) fills a batch row after `EOS` and is never a training target.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from privacylab.data.errors import DataError

BOS = 256
EOS = 257
PAD = 258
VOCAB_SIZE = 259

__all__ = ["BOS", "EOS", "PAD", "VOCAB_SIZE", "ByteTokenizer"]


class ByteTokenizer:
    """Text <-> token ids: UTF-8 bytes plus BOS/EOS/PAD (see the module docstring)."""

    name = "bytes"
    vocab_size = VOCAB_SIZE
    bos, eos, pad = BOS, EOS, PAD

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """The ids of `text`'s UTF-8 bytes, with BOS before and EOS after when asked."""
        if not isinstance(text, str):
            raise DataError(f"the tokenizer encodes strings, got {type(text).__name__}")
        return [BOS] * bos + list(text.encode("utf-8")) + [EOS] * eos

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """The text of `ids`: special ids dropped, the bytes decoded as UTF-8 (an invalid byte
        sequence, which sampling may produce, becomes U+FFFD)."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return bytes(int(i) for i in values if 0 <= int(i) < 256).decode("utf-8", "replace")

    def batch(
        self, texts: Sequence[str], length: int, *, bos: bool = True, eos: bool = True
    ) -> torch.Tensor:
        """`texts` encoded (with BOS/EOS as asked) and right-padded with PAD to `length`, shape
        (n, length) int64; DataError naming the first text that does not fit."""
        rows = torch.full((len(texts), length), PAD, dtype=torch.int64)
        for i, text in enumerate(texts):
            ids = self.encode(text, bos=bos, eos=eos)
            if len(ids) > length:
                raise DataError(
                    f"text {i} is {len(ids)} tokens long with its markers, more than the "
                    f"context of {length}: {text[:40]!r}..."
                )
            rows[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        return rows
