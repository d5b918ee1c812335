"""A text corpus whose memorisation can be measured: documents, which of them a model trains on,
and every planted string with where it was planted.

The truth of the language-model family lives here. A `Corpus` holds

- `documents`: short texts, each fitting one context window of the model with its BOS/EOS
  markers (`context` tokens of `tokenizer`);
- `members`: which documents are training members (split by a seed); the rest are held out
  (the attacker's public text, the non-members of membership inference);
- `records`: synthetic personal records (name, email, phone, address) planted into `copies`
  distinct member documents each, so that the k of k-eidetic memorisation (Carlini et al. 2021,
  Def. 2: the number of training documents containing a string) is known exactly;
- `canaries`: Secret-Sharer canaries (Carlini et al. 2019): `prefix` + a random `secret` drawn
  from `alphabet` ** `length`, planted into `repeats` member documents.

It is written as one JSON file next to the model trained on it (`CORPUS_FILE`); attacks never
read it: their jobs hand them only what their threat model allows (held-out text, canary
formats) and attach the truth afterwards. `privacylab.data.corpus_build.build_corpus` makes one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privacylab.data.errors import DataError

CORPUS_FILE = "corpus.json"
FORMAT = "privacylab-corpus/1"

__all__ = ["CORPUS_FILE", "Canary", "Corpus", "Record", "load_corpus"]


@dataclass(frozen=True)
class Record:
    """A synthetic personal record planted verbatim into `copies` distinct member documents
    (`documents`, their indices). `fields`: its parts by name (name, email, phone, address)."""

    text: str
    fields: dict[str, str]
    copies: int
    documents: tuple[int, ...]


@dataclass(frozen=True)
class Canary:
    """A Secret-Sharer canary: `prefix + secret + suffix`, the secret a uniform draw from
    `alphabet ** length`, planted into `repeats` member documents (`documents`; 0 repeats: a
    control never trained on). `user` marks a canary the user supplied (`--canary`): its
    secret is the part it marked in braces (all digits or all lowercase letters, the alphabet
    then), or empty, with no candidate space, when it marked none."""

    prefix: str
    secret: str
    alphabet: str
    length: int
    repeats: int
    documents: tuple[int, ...]
    suffix: str = ""
    user: bool = False

    @property
    def text(self) -> str:
        """The canary as planted."""
        return self.prefix + self.secret + self.suffix

    @property
    def space_bits(self) -> float:
        """log2 of the number of candidate secrets, the largest exposure possible."""
        return self.length * math.log2(len(self.alphabet)) if self.alphabet else 0.0


@dataclass(eq=False)
class Corpus:
    """Documents, membership and planted strings (see the module docstring)."""

    documents: list[str]
    members: np.ndarray
    records: list[Record] = field(default_factory=list)
    canaries: list[Canary] = field(default_factory=list)
    context: int = 128
    tokenizer: str = "bytes"
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.members = np.asarray(self.members, dtype=bool).reshape(-1)
        if not self.documents:
            raise DataError("the corpus has no documents")
        if self.members.shape != (len(self.documents),):
            raise DataError(
                f"{len(self.documents)} documents but {self.members.size} membership flags"
            )
        if not self.members.any():
            raise DataError("the corpus has no member documents to train on")
        for planted in [*self.records, *self.canaries]:
            outside = [d for d in planted.documents if not 0 <= d < len(self.documents)]
            if outside:
                raise DataError(
                    f"a planted string names document {outside[0]}, which does not exist"
                )

    @property
    def member_indices(self) -> np.ndarray:
        """Indices of the training documents."""
        return np.flatnonzero(self.members)

    @property
    def heldout_indices(self) -> np.ndarray:
        """Indices of the documents not trained on."""
        return np.flatnonzero(~self.members)

    def texts(self, indices: Sequence[int] | np.ndarray) -> list[str]:
        """The documents at `indices`."""
        return [self.documents[int(i)] for i in indices]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "format": FORMAT,
            "context": self.context,
            "tokenizer": self.tokenizer,
            "config": dict(self.config),
            "documents": list(self.documents),
            "members": [int(m) for m in self.members],
            "records": [{**asdict(r), "documents": list(r.documents)} for r in self.records],
            "canaries": [{**asdict(c), "documents": list(c.documents)} for c in self.canaries],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Corpus:
        """The corpus `to_dict` wrote, or DataError naming what is wrong."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise DataError(f"not a privacylab corpus (format {FORMAT!r} expected)")
        try:
            return cls(
                documents=[str(d) for d in data["documents"]],
                members=np.asarray(data["members"], dtype=bool),
                records=[
                    Record(
                        text=str(r["text"]),
                        fields={str(k): str(v) for k, v in r["fields"].items()},
                        copies=int(r["copies"]),
                        documents=tuple(int(d) for d in r["documents"]),
                    )
                    for r in data.get("records", [])
                ],
                canaries=[
                    Canary(
                        prefix=str(c["prefix"]),
                        secret=str(c["secret"]),
                        alphabet=str(c["alphabet"]),
                        length=int(c["length"]),
                        repeats=int(c["repeats"]),
                        documents=tuple(int(d) for d in c["documents"]),
                        suffix=str(c.get("suffix", "")),
                        user=bool(c.get("user", False)),
                    )
                    for c in data.get("canaries", [])
                ],
                context=int(data["context"]),
                tokenizer=str(data.get("tokenizer", "bytes")),
                config=dict(data.get("config", {})),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise DataError(f"corpus file is malformed: {type(error).__name__}: {error}") from None

    def save(self, folder: str | Path) -> Path:
        """Write `folder/corpus.json` (atomically); returns its path."""
        path = Path(folder) / CORPUS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(self.to_dict(), ensure_ascii=False) + "\n", encoding="utf-8")
        partial.replace(path)
        return path


def load_corpus(path: str | Path) -> Corpus:
    """The corpus in `path` (a corpus.json or the folder holding one); DataError if unreadable."""
    file = Path(path)
    if file.is_dir():
        file = file / CORPUS_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"no corpus at {file}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"cannot read corpus {file}: {error}") from None
    return Corpus.from_dict(data)
