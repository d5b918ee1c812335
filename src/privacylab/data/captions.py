"""A scraped-like caption set for the embedded digits, CLIP-style prompts, and a word tokenizer:
the text side of the contrastive poisoning game of Carlini & Terzis 2022 ("Poisoning and
Backdooring Contrastive Learning", ICLR'22) played on `mnist5k`.

- `build_captions(labels, noise=, seed=)`: one caption per image, drawn from dozens of
  templates ("handwritten 7 on paper", "my daughter wrote a seven", ...), sometimes with
  unrelated words around it; a share `noise` of the rows is what an uncurated web scrape holds
  (Sec. 2: no human review): a caption about the wrong digit, one about no digit at all, or the
  digit's word misspelled. A clean caption names exactly its image's class
  (`caption_class`); a noisy one never names it.
- `prompts(class_name)`: the zero-shot prompt ensemble (Radford et al. 2021, Sec. 3.1.4: the
  class embedding is the mean over many "prompt-engineered" descriptions).
- `captions_with(label, captions)`: the attacker's caption set (Carlini & Terzis Sec. 4.1,
  "search the training dataset for all sequences that contain this label string") — searched
  in captions the attacker holds itself, never in the victim's rows.
- `CaptionTokenizer`: word-level, a fixed vocabulary built from the templates, prompts,
  filler words and digits (nothing fitted on anybody's data); out-of-vocabulary words are [UNK].
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from privacylab.data.errors import DataError

__all__ = [
    "CLASS_NAMES",
    "DIGITS",
    "FILLERS",
    "JUNK",
    "PAD",
    "PROMPTS",
    "TEMPLATES",
    "UNK",
    "CaptionTokenizer",
    "build_captions",
    "caption_class",
    "captions_with",
    "prompts",
    "template_captions",
    "words",
]

CLASS_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGITS = tuple(str(d) for d in range(10))

TEMPLATES = (
    "a photo of the digit {w}",
    "handwritten {d} on paper",
    "my daughter wrote a {w}",
    "my son wrote the number {w}",
    "scan of a hand-written number {w}",
    "a {w} written in pencil",
    "the number {d} in black ink",
    "a messy {w} from a school worksheet",
    "close up of a handwritten {w}",
    "digit {d} from a postal code",
    "handwriting sample of the numeral {w}",
    "i wrote a {w} on the whiteboard",
    "a neat {d} drawn with a marker",
    "an old scan showing the digit {w}",
    "number {w} written by hand",
    "grayscale image of a handwritten {d}",
    "a child practising how to write {w}",
    "the figure {w} on a math test",
    "little sketch of a {w}",
    "a shaky {d} written quickly",
    "a bold {w} on white paper",
    "cropped picture of the number {d}",
    "my handwriting of a {w} looks bad",
    "teacher wrote a big {w}",
    "zip code digit {w}",
    "a thin stroke {d}",
    "homework page with a single {w}",
    "a {w} written with my left hand",
    "the numeral {d} scanned at low resolution",
    "practice sheet number {w}",
    "an ink drawing of the digit {d}",
    "a slanted handwritten {w}",
    "photo of a {w} on a sticky note",
    "lottery ticket digit {d}",
    "the digit {w} on a bank cheque",
    "centered handwritten {w}",
)
"""Caption templates: `{w}` is the class word, `{d}` its numeral."""

FILLERS = (
    "lol",
    "vintage",
    "#handwriting",
    "so cute",
    "throwback",
    "found this today",
    "nice",
    "blurry",
    "old notebook",
    "for my blog",
    "art",
    "please share",
)
"""Unrelated words a scraped caption may carry around its content."""

JUNK = (
    "check out my new notebook",
    "a picture i took yesterday",
    "random scan from the office",
    "untitled image",
    "my desk this morning",
    "paper texture background",
    "a white sheet with some marks",
    "img upload from my phone",
)
"""Captions about no digit at all (scraped noise)."""

PROMPTS = (
    "a photo of the digit {w}",
    "a photo of the number {w}",
    "a handwritten {w}",
    "a drawing of the digit {w}",
    "the number {w}",
    "a blurry photo of the digit {w}",
    "a scan of a handwritten {w}",
    "the digit {d}",
    "a handwritten {d}",
    "a photo of the number {d}",
)
"""The zero-shot prompt ensemble (Radford et al. 2021, Sec. 3.1.4), `{w}` word, `{d}` numeral."""

PAD = "[PAD]"
UNK = "[UNK]"

_WORD = re.compile(r"[a-z]+|\d")


def words(text: str) -> list[str]:
    """The lower-case words of `text` (letters; each numeral its own word; punctuation and `#`
    dropped): the one split of the tokenizer, `caption_class` and `captions_with`."""
    if not isinstance(text, str):
        raise DataError(f"captions must be strings, got {type(text).__name__}")
    return _WORD.findall(text.lower())


def _class_index(class_name: str) -> int | None:
    key = str(class_name).strip().lower()
    if key in CLASS_NAMES:
        return CLASS_NAMES.index(key)
    if key in DIGITS:
        return int(key)
    return None


def _fill(template: str, label: int) -> str:
    return template.format(w=CLASS_NAMES[label], d=DIGITS[label])


def template_captions(class_name: str) -> list[str]:
    """Every template filled with one class (a word of CLASS_NAMES or a numeral): what an
    attacker can write for a label by itself."""
    index = _class_index(class_name)
    if index is None:
        raise DataError(
            f"unknown digit class {class_name!r}; choose one of {', '.join(CLASS_NAMES)}"
        )
    return [_fill(t, index) for t in TEMPLATES]


def prompts(class_name: str) -> list[str]:
    """The prompt ensemble for one class (word or numeral): CLIP's zero-shot classifier
    averages the embeddings of these (Radford et al. 2021, Sec. 3.1.4). A name outside the
    digits gets the word-only prompts."""
    index = _class_index(class_name)
    if index is not None:
        return [_fill(t, index) for t in PROMPTS]
    if not str(class_name).strip():
        raise DataError("a class name must not be empty")
    return [t.format(w=class_name) for t in PROMPTS if "{d}" not in t]


def caption_class(text: str) -> int | None:
    """The one digit class a caption names (by word or numeral), None when it names none or
    several."""
    found = {_class_index(w) for w in words(text)} - {None}
    return found.pop() if len(found) == 1 else None  # type: ignore[return-value]


def _typo(word: str, rng: np.random.Generator) -> str:
    """`word` with one letter dropped, doubled or two neighbours swapped, never left intact
    nor turned into another class word."""
    for _ in range(20):
        i = int(rng.integers(0, len(word)))
        kind = int(rng.integers(0, 3))
        if kind == 0 and len(word) > 2:
            out = word[:i] + word[i + 1 :]
        elif kind == 1:
            out = word[:i] + word[i] + word[i:]
        else:
            j = min(i + 1, len(word) - 1)
            chars = list(word)
            chars[i], chars[j] = chars[j], chars[i]
            out = "".join(chars)
        if out != word and out not in CLASS_NAMES:
            return out
    return word + word[-1]


def build_captions(
    labels: Sequence[int] | np.ndarray | torch.Tensor, *, noise: float = 0.1, seed: int = 0
) -> list[str]:
    """One scraped-like caption per label (seeded). Exactly round(noise · n) rows, drawn at
    random, are noisy, a third each (in turn) of: a caption about another digit, a caption
    about no digit (`JUNK`), the class word misspelled (`_typo`). Every other row names its
    class and only it; a quarter of all captions carry an unrelated `FILLERS` phrase."""
    y = np.asarray(
        torch.as_tensor(labels).cpu().numpy() if isinstance(labels, torch.Tensor) else labels
    )
    if y.ndim != 1 or (y.size and not np.issubdtype(y.dtype, np.integer)):
        raise DataError("caption labels must be a 1-D array of integer digit classes")
    if y.size and (y.min() < 0 or y.max() > 9):
        raise DataError("caption labels must be digits in [0, 9]")
    real = isinstance(noise, int | float | np.floating) and not isinstance(noise, bool)
    if not real or not 0.0 <= float(noise) <= 1.0:
        raise DataError(f"caption noise must be a share in [0, 1], got {noise!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise DataError(f"caption seed must be a whole number >= 0, got {seed!r}")
    rng = np.random.default_rng(seed)
    n = int(y.size)
    noisy = np.zeros(n, dtype=np.int64)
    chosen = rng.permutation(n)[: round(float(noise) * n)]
    noisy[chosen] = 1 + np.arange(len(chosen)) % 3
    out = []
    for label, kind in zip(y.tolist(), noisy.tolist(), strict=True):
        template = TEMPLATES[int(rng.integers(0, len(TEMPLATES)))]
        if kind == 1:
            other = (label + int(rng.integers(1, 10))) % 10
            text = _fill(template, other)
        elif kind == 2:
            text = JUNK[int(rng.integers(0, len(JUNK)))]
        elif kind == 3:
            word = template.replace("{d}", "{w}")
            text = word.format(w=_typo(CLASS_NAMES[label], rng))
        else:
            text = _fill(template, label)
        if rng.random() < 0.25:
            filler = FILLERS[int(rng.integers(0, len(FILLERS)))]
            text = f"{text} {filler}" if rng.random() < 0.5 else f"{filler} {text}"
        out.append(text)
    return out


def captions_with(label: str, captions: Iterable[str]) -> list[str]:
    """The attacker's caption set Y' for `label` (Carlini & Terzis 2022, Sec. 4.1): every
    caption of `captions` (the attacker's own) that contains the label string as a word, in
    order."""
    key = words(str(label))
    if len(key) != 1:
        raise DataError(f"a label string is one word, got {label!r}")
    return [c for c in captions if key[0] in words(c)]


def _vocabulary() -> tuple[str, ...]:
    texts = [*TEMPLATES, *PROMPTS, *FILLERS, *JUNK]
    found = {w for t in texts for w in words(t.replace("{w}", " ").replace("{d}", " "))}
    found.update(CLASS_NAMES)
    found.update(DIGITS)
    return (PAD, UNK, *sorted(found))


class CaptionTokenizer:
    """Word-level caption tokenizer with a fixed vocabulary: [PAD] (id 0), [UNK] (id 1), then
    the words of the templates, prompts, fillers, junk captions, class words and numerals,
    sorted. Nothing is fitted on data, so victim and attacker share it without either
    revealing rows."""

    def __init__(self) -> None:
        self.vocabulary = _vocabulary()
        self._ids = {w: i for i, w in enumerate(self.vocabulary)}
        self.pad_id = 0
        self.unk_id = 1

    @property
    def vocab_size(self) -> int:
        """The number of ids."""
        return len(self.vocabulary)

    def ids(self, text: str) -> list[int]:
        """The ids of `text`'s words (unknown ones [UNK])."""
        return [self._ids.get(w, self.unk_id) for w in words(text)]

    def encode(self, texts: Sequence[str], max_len: int = 16) -> torch.Tensor:
        """(n, max_len) int64 ids, each row truncated to `max_len` words and padded with [PAD]."""
        if isinstance(texts, str):
            raise DataError("encode takes a sequence of captions, not one string")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise DataError(f"max_len must be a whole number >= 1, got {max_len!r}")
        out = torch.full((len(texts), max_len), self.pad_id, dtype=torch.int64)
        for row, text in enumerate(texts):
            ids = self.ids(text)[:max_len]
            if ids:
                out[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        return out

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The words of `ids` joined by spaces, [PAD] dropped."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        whole = all(isinstance(i, int | np.integer) and not isinstance(i, bool) for i in values)
        if not whole or any(not 0 <= int(i) < self.vocab_size for i in values):
            raise DataError(f"token ids must lie in [0, {self.vocab_size})")
        return " ".join(self.vocabulary[int(i)] for i in values if int(i) != self.pad_id)
