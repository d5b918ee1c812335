"""Build a `Corpus` whose memorisation can be measured exactly: documents cut from real text,
a member/held-out split, synthetic personal records planted a known number of times, and
Secret-Sharer canaries.

- **Text.** The English documentation shipped with CPython (`pydoc_data.topics.topics`, the text
  of `help("topic")`), topics in sorted order, or the user's texts (`read_text_corpus`). Each
  text is reduced to printable ASCII with whitespace runs folded to one space (`fold_text`) and
  cut at word boundaries into documents of at most `context - 2` bytes (`chunk_text`), so that a
  document with its BOS and EOS markers fills at most one context window of the byte tokenizer.
  A chunk that repeats an earlier one is dropped (the documentation repeats some passages): a
  held-out document identical to a member would be a training document all the same.
- **Records** (the PII of Carlini et al. 2021, "Extracting Training Data from Large Language
  Models", Sec. 6.5: names, emails, phone numbers, addresses), drawn with `faker` (seeded, no
  network): a record with `c` copies is planted into `c` distinct member documents, so that the
  k of k-eidetic memorisation (Def. 2: the number of training documents containing the string)
  equals `c` exactly; Fig. 3 / Table 3 of that paper relate extraction to that k.
- **Canaries** (Carlini et al. 2019, "The Secret Sharer", Sec. 3): `prefix + secret`, the secret
  a uniform draw from `alphabet ** length`, planted into `r` member documents for each `r` in
  `canary_repeats`; `r = 0` is a control the model never sees, whose exposure (Def. 4) should
  look like that of a random candidate. A canary opens its host document (the paper inserts the
  canary as a training sentence of its own), so the target scores `BOS + prefix + secret` in the
  very position it was trained on. Users add canaries of their own as "my PIN is {482913}".

Each host document hosts one planted string at most; it is shortened at a word boundary so that
host and string fit together. The build checks its own truth: every planted string occurs in
exactly its host documents, and nowhere else.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from privacylab.data.corpus import Canary, Corpus, Record
from privacylab.data.errors import DataError

__all__ = [
    "CorpusConfig",
    "build_corpus",
    "chunk_text",
    "fold_text",
    "parse_user_canary",
    "public_corpus",
    "pydoc_texts",
    "read_text_corpus",
]

DIGITS = "0123456789"
LOWERCASE = "abcdefghijklmnopqrstuvwxyz"
MARKERS = 2
"""Tokens a document spends on its BOS and EOS markers."""

_PRINTABLE = frozenset(string.printable)
_CONTROLS = {i: None for i in range(128) if chr(i) not in _PRINTABLE}
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")

_RECORD_FORMATS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Contact {name} at {email} or {phone}, {address}.", ("name", "email", "phone", "address")),
    ("Contact {name} at {email} or {phone}.", ("name", "email", "phone")),
    ("{name}, {email}", ("name", "email")),
    ("{name} {phone}", ("name", "phone")),
    ("{first}: {phone}", ("first", "phone")),
)
"""Record layouts, richest first, with the fields each shows (`first`: the first name alone,
reported as the record's "name"); a corpus uses the richest layout all its records fit."""

_CANARY_FORMATS = (
    "{name}'s PIN is ",
    "The door code of {name} is ",
    "{name}'s account number is ",
    "The passcode {name} chose is ",
    "{name}'s security answer is ",
)
"""Canary prefixes, cycled; the name makes each prefix distinct (no canary competes with
another's secret)."""

_SHORT_CANARY_FORMAT = "{name}'s PIN is "
_HOST_ROOM = 16
"""Bytes of host text a record leaves room for when its layout is chosen."""
_ADDRESS_LIMIT = 48


@dataclass(frozen=True)
class CorpusConfig:
    """What `build_corpus` builds (see the module docstring).

    context: tokens per document including BOS and EOS (at most `context - 2` bytes of text);
    documents: source chunks used (None: all of them), a seeded subset in source order;
    member_fraction: share of the documents the model trains on;
    record_copies / records_per_count: `records_per_count` records planted `c` times each, for
    every `c` in `record_copies`;
    canary_repeats / canaries_per_repeat: `canaries_per_repeat` canaries planted `r` times each
    for every `r` in `canary_repeats` (0: a control, never planted);
    secret_length / secret_alphabet: the secrets' candidate space, `alphabet ** length`;
    user_canaries: (text, repeats) pairs, a text as "my PIN is {482913}" (`parse_user_canary`);
    seed: the split, the subset, the records, the secrets and the placements.
    """

    context: int = 128
    documents: int | None = 2000
    member_fraction: float = 0.5
    record_copies: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    records_per_count: int = 4
    canary_repeats: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32)
    canaries_per_repeat: int = 1
    secret_length: int = 6
    secret_alphabet: str = DIGITS
    user_canaries: tuple[tuple[str, int], ...] = ()
    seed: int = 0

    def validate(self) -> CorpusConfig:
        """This config, or DataError (one line) naming the first bad value."""
        _whole("context", self.context, low=16)
        if self.documents is not None:
            _whole("documents", self.documents, low=1)
        fraction = self.member_fraction
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, (int, float))
            or not 0.0 < float(fraction) <= 1.0
        ):
            raise DataError(f"member_fraction must be in (0, 1], got {fraction!r}")
        _counts("record_copies", self.record_copies, low=1)
        _whole("records_per_count", self.records_per_count, low=0)
        _counts("canary_repeats", self.canary_repeats, low=0)
        _whole("canaries_per_repeat", self.canaries_per_repeat, low=0)
        _whole("secret_length", self.secret_length, low=1)
        alphabet = self.secret_alphabet
        if (
            not isinstance(alphabet, str)
            or len(alphabet) < 2
            or len(set(alphabet)) != len(alphabet)
            or any(c not in _PRINTABLE or c.isspace() for c in alphabet)
        ):
            raise DataError(
                "secret_alphabet must hold at least 2 distinct printable ASCII characters and "
                f"no whitespace, got {alphabet!r}"
            )
        if not isinstance(self.user_canaries, (tuple, list)):
            raise DataError("user_canaries must be a sequence of (text, repeats) pairs")
        for pair in self.user_canaries:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise DataError(f"a user canary must be a (text, repeats) pair, got {pair!r}")
            text, repeats = pair
            parse_user_canary(text)
            if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
                raise DataError(
                    f"user canary {text!r} must be planted at least once, got repeats {repeats!r}"
                )
        _whole("seed", self.seed, low=0)
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (tuples as lists, numbers as Python numbers)."""
        return {
            "context": int(self.context),
            "documents": None if self.documents is None else int(self.documents),
            "member_fraction": float(self.member_fraction),
            "record_copies": [int(c) for c in self.record_copies],
            "records_per_count": int(self.records_per_count),
            "canary_repeats": [int(r) for r in self.canary_repeats],
            "canaries_per_repeat": int(self.canaries_per_repeat),
            "secret_length": int(self.secret_length),
            "secret_alphabet": self.secret_alphabet,
            "user_canaries": [[text, int(repeats)] for text, repeats in self.user_canaries],
            "seed": int(self.seed),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CorpusConfig:
        """The config `to_dict` (or `Corpus.config`) holds, validated; unknown keys refused."""
        if not isinstance(data, Mapping):
            raise DataError(f"a corpus config is a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DataError(f"unknown corpus setting {unknown[0]!r}; known: {sorted(known)}")
        values = dict(data)
        for name in ("record_copies", "canary_repeats"):
            if name in values and isinstance(values[name], (list, tuple)):
                values[name] = tuple(values[name])
        if "user_canaries" in values and isinstance(values["user_canaries"], (list, tuple)):
            values["user_canaries"] = tuple(
                tuple(pair) if isinstance(pair, (list, tuple)) else pair
                for pair in values["user_canaries"]
            )
        return cls(**values).validate()


def _whole(name: str, value: Any, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise DataError(f"{name} must be a whole number >= {low}, got {value!r}")


def _counts(name: str, values: Any, *, low: int) -> None:
    if not isinstance(values, (tuple, list)):
        raise DataError(f"{name} must be a sequence of whole numbers, got {values!r}")
    for value in values:
        _whole(f"every entry of {name}", value, low=low)
    if len(set(values)) != len(values):
        raise DataError(f"{name} repeats a value: {list(values)}")


def fold_text(text: str) -> str:
    """`text` reduced to printable ASCII (other characters dropped) with every whitespace run
    folded to one space and no space at either end."""
    ascii_text = text.encode("ascii", "ignore").decode("ascii")
    return " ".join(ascii_text.translate(_CONTROLS).split())


def chunk_text(text: str, budget: int) -> list[str]:
    """The folded `text` (`fold_text`) cut at word boundaries into chunks of at most `budget`
    bytes, each as long as the next word allows; joined with single spaces, the chunks give back
    the folded text. A word longer than `budget` (rare: a URL, a long identifier) is cut into
    `budget`-byte pieces, each its own chunk."""
    if budget < 1:
        raise DataError(f"a chunk holds at least 1 byte, got a budget of {budget}")
    chunks: list[str] = []
    current = ""
    for word in fold_text(text).split(" "):
        if not word:
            continue
        if len(word) > budget:
            if current:
                chunks.append(current)
                current = ""
            pieces = [word[i : i + budget] for i in range(0, len(word), budget)]
            chunks.extend(pieces[:-1])
            current = pieces[-1]
        elif not current:
            current = word
        elif len(current) + 1 + len(word) <= budget:
            current = f"{current} {word}"
        else:
            chunks.append(current)
            current = word
    if current:
        chunks.append(current)
    return chunks


def pydoc_texts() -> list[str]:
    """The CPython documentation topics (`pydoc_data.topics.topics`), in sorted topic order."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def read_text_corpus(path: str | Path) -> list[str]:
    """The documents of a UTF-8 text file: its paragraphs, separated by blank lines (DataError
    if it cannot be read or holds no text)."""
    file = Path(path)
    try:
        raw = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"no text file at {file}") from None
    except IsADirectoryError:
        raise DataError(f"{file} is a folder, not a text file") from None
    except UnicodeDecodeError:
        raise DataError(f"{file} is not UTF-8 text") from None
    except OSError as error:
        raise DataError(f"cannot read {file}: {error.strerror or error}") from None
    documents = [part.strip() for part in _BLANK_LINE.split(raw.replace("\r\n", "\n"))]
    documents = [part for part in documents if part]
    if not documents:
        raise DataError(f"the corpus is empty: {file} holds no text")
    return documents


def parse_user_canary(text: str) -> tuple[str, str, str, str]:
    """(prefix, secret, suffix, alphabet) of a user canary "my PIN is {482913}": the secret is
    the text in braces, drawn from the digits if it is all digits, from the lowercase letters if
    it is all lowercase letters. Without braces the whole text is the prefix and there is no
    secret (secret and alphabet empty). DataError (one line) for anything else."""
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"a canary is a non-empty text, got {text!r}")
    if text != text.strip():
        raise DataError(f"canary {text!r} begins or ends with whitespace")
    opens, closes = text.count("{"), text.count("}")
    if opens == 0 and closes == 0:
        return text, "", "", ""
    start, end = text.find("{"), text.find("}")
    if opens != 1 or closes != 1 or end < start:
        raise DataError(
            f"canary {text!r} must mark its secret with one pair of braces, "
            "as 'my PIN is {482913}'"
        )
    secret = text[start + 1 : end]
    if not secret:
        raise DataError(f"canary {text!r} has an empty secret between its braces")
    if all(c in DIGITS for c in secret):
        alphabet = DIGITS
    elif all(c in LOWERCASE for c in secret):
        alphabet = LOWERCASE
    else:
        raise DataError(
            f"the secret {secret!r} of canary {text!r} must be all digits or all lowercase letters"
        )
    return text[:start], secret, text[end + 1 :], alphabet


def _tokens(text: str) -> int:
    return len(text.encode("utf-8")) + MARKERS


def _subset(chunks: list[str], count: int | None, rng: np.random.Generator) -> list[str]:
    if count is None or count >= len(chunks):
        return chunks
    keep = np.sort(rng.choice(len(chunks), size=count, replace=False))
    return [chunks[int(i)] for i in keep]


class _People:
    """Distinct synthetic people from faker (seeded; en_US; no network)."""

    def __init__(self, seed: int) -> None:
        from faker import Faker

        self.fake = Faker("en_US")
        self.fake.seed_instance(seed)
        self.names: set[str] = set()
        self.firsts: set[str] = set()
        self.phones: set[str] = set()
        self.emails: set[str] = set()

    def name(self, *, new_first: bool = False, remember: bool = True) -> tuple[str, str]:
        """A (first, last) name not given before (with `new_first`, a first name too)."""
        for _ in range(10_000):
            first, last = self.fake.first_name(), self.fake.last_name()
            if f"{first} {last}" in self.names or (new_first and first in self.firsts):
                continue
            if remember:
                self.names.add(f"{first} {last}")
                self.firsts.add(first)
            return first, last
        raise DataError("faker ran out of distinct names")

    def record_fields(self, layout: str, limit: int) -> dict[str, str] | None:
        """A new person whose record in `layout` takes at most `limit` bytes (None if 100
        draws give none)."""
        for _ in range(100):
            person = self._person()
            if len(layout.format(**person)) <= limit:
                self.names.add(person["name"])
                self.firsts.add(person["first"])
                self.emails.add(person["email"])
                self.phones.add(person["phone"])
                return person
        return None

    def _person(self) -> dict[str, str]:
        fake = self.fake
        first, last = self.name(remember=False)
        email = ""
        while not email or email in self.emails:
            user = f"{first}.{last}".lower().replace("'", "").replace(" ", "")
            if email:
                user = f"{user}{fake.random_int(2, 99)}"
            email = f"{user}@{fake.safe_domain_name()}"
        phone = ""
        while not phone or phone in self.phones:
            phone = f"({fake.random_int(201, 989)}) 555-{fake.random_int(100, 199):04d}"
        address = ""
        while not address or len(address) > _ADDRESS_LIMIT:
            address = (
                f"{fake.building_number()} {fake.street_name()}, {fake.city()}, "
                f"{fake.state_abbr(False, False)} {fake.zipcode()}"
            )
        return {
            "name": f"{first} {last}",
            "first": first,
            "email": email,
            "phone": phone,
            "address": address,
        }


def _record_people(
    count: int, seed: int, budget: int
) -> tuple[_People, list[dict[str, str]], str, tuple[str, ...]]:
    """`count` distinct people and the richest record layout in which every one of them fits
    `budget` bytes with room for some host text; people whose record is too long are redrawn."""
    limit = budget - min(_HOST_ROOM, budget // 4)
    for layout, names in _RECORD_FORMATS:
        people = _People(seed)
        chosen: list[dict[str, str]] = []
        while len(chosen) < count:
            person = people.record_fields(layout, limit)
            if person is None:
                break
            chosen.append(person)
        else:
            return people, chosen, layout, names
    raise DataError(
        f"records do not fit a context of {budget + MARKERS} tokens (even a record as "
        f"'Ann: (201) 555-0100' needs more); use a longer context or records_per_count 0"
    )


def _canary_prefix(people: _People, index: int, context: int, secret_length: int) -> str:
    """A canary prefix naming a new person (first name new too): the `index`-th layout of
    `_CANARY_FORMATS`, or the short layout with the first name alone when the context is small,
    such that BOS + prefix + secret + EOS fit `context` tokens."""
    for _ in range(100):
        first, last = people.name(new_first=True)
        for form, name in (
            (_CANARY_FORMATS[index % len(_CANARY_FORMATS)], f"{first} {last}"),
            (_SHORT_CANARY_FORMAT, first),
        ):
            prefix = form.format(name=name)
            if _tokens(prefix) + secret_length <= context:
                return prefix
    shortest = _SHORT_CANARY_FORMAT.format(name="Ann") + "#" * secret_length
    raise DataError(
        f"canary {shortest!r} is {_tokens(shortest)} tokens; the context holds {context}"
    )


def _secrets(rng: np.random.Generator, alphabet: str, length: int, count: int) -> list[str]:
    """`count` secrets, each `length` characters drawn uniformly and independently from
    `alphabet` (Carlini et al. 2019, Sec. 3: the secret is a uniform draw from the randomness
    space)."""
    draws = rng.integers(0, len(alphabet), size=(count, length))
    return ["".join(alphabet[int(i)] for i in row) for row in draws]


def _plant(host: str, planted: str, budget: int, *, first: bool) -> str:
    room = budget - len(planted.encode("utf-8")) - 1
    kept: list[str] = []
    used = -1
    for word in host.split(" ") if host else []:
        if used + 1 + len(word) > room:
            break
        kept.append(word)
        used += 1 + len(word)
    if not kept:
        return planted
    rest = " ".join(kept)
    return f"{planted} {rest}" if first else f"{rest} {planted}"


def _occurrences(text: str, documents: Sequence[str]) -> list[int]:
    return [i for i, document in enumerate(documents) if text in document]


def build_corpus(
    config: CorpusConfig | None = None, *, texts: Sequence[str] | None = None
) -> Corpus:
    """The corpus `config` describes, cut from `texts` (default: `pydoc_texts()`); same config
    and texts, same corpus. DataError (one line) when the source is empty, a planted string does
    not fit the context, or there are too few member documents for every planted copy."""
    config = (config or CorpusConfig()).validate()
    budget = config.context - MARKERS
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(config.seed).spawn(5)]
    subset_rng, split_rng, host_rng, side_rng, secret_rng = streams

    user: list[tuple[str, str, str, str, str, int]] = []
    for given, repeats in config.user_canaries:
        prefix, secret, suffix, alphabet = parse_user_canary(given)
        text = prefix + secret + suffix
        if _tokens(text) > config.context:
            raise DataError(
                f"canary {text[:40]!r}{'...' if len(text) > 40 else ''} is {_tokens(text)} "
                f"tokens; the context holds {config.context}"
            )
        user.append((prefix, secret, suffix, alphabet, text, repeats))

    source = pydoc_texts() if texts is None else list(texts)
    if any(not isinstance(t, str) for t in source):
        raise DataError("the corpus texts must be strings")
    chunks = list(dict.fromkeys(chunk for text in source for chunk in chunk_text(text, budget)))
    if not chunks:
        raise DataError("the corpus is empty: its source holds no printable ASCII text")
    documents = _subset(chunks, config.documents, subset_rng)
    total = len(documents)
    member_count = max(1, round(config.member_fraction * total))
    members = np.zeros(total, dtype=bool)
    members[split_rng.permutation(total)[:member_count]] = True

    copies = [c for c in config.record_copies for _ in range(config.records_per_count)]
    repeats = [r for r in config.canary_repeats for _ in range(config.canaries_per_repeat)]
    needed = sum(copies) + sum(repeats) + sum(r for *_, r in user)
    if needed > member_count:
        raise DataError(
            f"the planted strings need {needed} distinct member documents; the corpus has "
            f"{member_count} (of {total} documents)"
        )

    if copies:
        people, record_people, layout, field_keys = _record_people(len(copies), config.seed, budget)
    else:
        people, record_people, layout, field_keys = _People(config.seed), [], "", ()
    canary_texts = [
        (_canary_prefix(people, index, config.context, config.secret_length), secret)
        for index, secret in enumerate(
            _secrets(secret_rng, config.secret_alphabet, config.secret_length, len(repeats))
        )
    ]

    record_texts = [layout.format(**p) for p in record_people]

    hosts = iter(host_rng.permutation(np.flatnonzero(members)).tolist())
    planted_documents = list(documents)

    def plant(text: str, count: int, *, first: bool | None) -> tuple[int, ...]:
        chosen = tuple(sorted(next(hosts) for _ in range(count)))
        for d in chosen:
            opens = bool(side_rng.integers(2)) if first is None else first
            planted_documents[d] = _plant(planted_documents[d], text, budget, first=opens)
        return chosen

    records = [
        Record(
            text=text,
            fields={"name" if key == "first" else key: p[key] for key in field_keys},
            copies=c,
            documents=plant(text, c, first=None),
        )
        for text, p, c in zip(record_texts, record_people, copies, strict=True)
    ]
    canaries = [
        Canary(
            prefix=prefix,
            secret=secret,
            alphabet=config.secret_alphabet,
            length=config.secret_length,
            repeats=r,
            documents=plant(prefix + secret, r, first=True),
        )
        for (prefix, secret), r in zip(canary_texts, repeats, strict=True)
    ]
    canaries += [
        Canary(
            prefix=prefix,
            secret=secret,
            alphabet=alphabet,
            length=len(secret),
            repeats=r,
            documents=plant(text, r, first=True),
            suffix=suffix,
            user=True,
        )
        for prefix, secret, suffix, alphabet, text, r in user
    ]
    _check_truth(planted_documents, records, canaries)
    return Corpus(
        documents=planted_documents,
        members=members,
        records=records,
        canaries=canaries,
        context=config.context,
        tokenizer="bytes",
        config=config.to_dict(),
    )


def _check_truth(
    documents: list[str], records: Iterable[Record], canaries: Iterable[Canary]
) -> None:
    for kind, text, hosts in [
        *(("record", r.text, r.documents) for r in records),
        *(("canary", c.text, c.documents) for c in canaries),
    ]:
        found = _occurrences(text, documents)
        if found != list(hosts):
            extra = sorted(set(found) - set(hosts))
            raise DataError(
                f"{kind} {text!r} occurs in {len(found)} documents but was planted in "
                f"{len(hosts)}" + (f" (it is already in document {extra[0]})" if extra else "")
            )


def public_corpus(config: CorpusConfig | None = None) -> Corpus:
    """The public text of `config`'s corpus: the pydoc chunks (same chunking, dedupe and
    context as `build_corpus`) that the seeded subset of `config.documents` chunks does not
    take, all of them members, with no records and no canaries; the pretraining data of a
    model later fine-tuned on the private corpus (Li et al. 2022, "Large Language Models Can
    Be Strong Differentially Private Learners", Sec. 3: DP fine-tuning of a publicly
    pretrained model). A chunk that holds a string planted in the private corpus is dropped
    too (when `config`'s planted strings fit its members; else the faker-made records and
    canaries of a smaller fitted corpus are left unchecked). Same config, same corpus;
    DataError when no chunk is left (e.g. `documents` None)."""
    config = (config or CorpusConfig()).validate()
    budget = config.context - MARKERS
    subset_rng = np.random.default_rng(np.random.SeedSequence(config.seed).spawn(5)[0])
    chunks = list(
        dict.fromkeys(chunk for text in pydoc_texts() for chunk in chunk_text(text, budget))
    )
    used = set(_subset(chunks, config.documents, subset_rng))
    rest = [chunk for chunk in chunks if chunk not in used]
    if rest:
        try:
            private = build_corpus(config)
        except DataError:
            private = None
        if private is not None:
            planted = [r.text for r in private.records] + [c.text for c in private.canaries]
            rest = [chunk for chunk in rest if not any(text in chunk for text in planted)]
    if not rest:
        raise DataError(
            f"no public text is left: the private corpus takes all {len(chunks)} source chunks "
            f"(documents={config.documents}); use fewer documents"
        )
    return Corpus(
        documents=rest,
        members=np.ones(len(rest), dtype=bool),
        records=[],
        canaries=[],
        context=config.context,
        tokenizer="bytes",
        config={**config.to_dict(), "public": True},
    )
