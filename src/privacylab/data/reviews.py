"""Product reviews with a task label and a sensitive attribute: the DP-Forward corpus.

Du et al. 2023 ("DP-Forward", CCS'23, Sec. 6) fine-tune on sentiment data and attack the
embeddings users release with inversion and attribute inference. Nothing here reaches a network,
so the corpus is written offline: English product reviews from a phrase bank, with `faker`
(seeded) supplying author first names, cities, months, prices and store (company) names.

What is planted, and why:

- **Label** (the task, `LABELS`): the review's sentiment. A review is an opening sentence that
  names a product of its category (16 products and category-specific uses per category; neutral
  wording), then one or two sentiment sentences of its polarity (drawn from 26 generic and 8
  category-specific sentences per polarity), then, sometimes, a neutral closing with faker
  details: 2 to 4 sentences. The sentiment comes second, so it survives truncation to
  DP-Forward's 48 tokens.
- **Attribute** (the private property an attacker infers from an embedding, `CATEGORIES`): the
  product category. Categories and labels are balanced and independent: the (category, label)
  cells are filled equally, so the label carries no information about the attribute, while the
  words of a review carry much (the product and its details).
- **Mixed reviews** (a fraction `mixed`): one positive and one negative sentence in random order
  and a label drawn independently of the text (the star rating the words do not determine). A
  model fits them only by memorising them, which is what sequence-level membership inference
  detects (Shokri et al. 2017; Feldman 2020, atypical examples are the memorised ones).
- **Splits** (`SPLITS`): ``train`` (the members a model fine-tunes on), ``test`` (non-members:
  accuracy and the membership attack's non-members) and ``aux`` (the attacker's auxiliary data
  for attribute inference), disjoint and stratified on (category, label, mixed), seeded.

Every text is distinct (duplicates are redrawn). The same `ReviewConfig` gives the same corpus.
`save_reviews` writes one JSON file (`REVIEWS_FILE`); `load_reviews` reads it strictly.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from privacylab.data.errors import DataError

CATEGORIES: tuple[str, ...] = ("electronics", "books", "kitchen", "clothing")
"""The sensitive attribute: the product category of a review."""

LABELS: tuple[str, ...] = ("negative", "positive")
"""The task label: the sentiment of a review."""

SPLITS: tuple[str, ...] = ("train", "test", "aux")
REVIEWS_FILE = "reviews.json"
FORMAT = "privacylab-reviews/1"

__all__ = [
    "CATEGORIES",
    "FORMAT",
    "LABELS",
    "REVIEWS_FILE",
    "SPLITS",
    "ReviewConfig",
    "ReviewError",
    "Reviews",
    "build_reviews",
    "describe",
    "load_reviews",
    "save_reviews",
]


class ReviewError(DataError):
    """The review corpus cannot be built, split or read as asked; the message is one line."""


PRODUCTS: dict[str, tuple[str, ...]] = {
    "electronics": (
        "pair of wireless headphones",
        "bluetooth speaker",
        "laptop",
        "tablet",
        "smartwatch",
        "phone charger",
        "webcam",
        "mechanical keyboard",
        "gaming mouse",
        "portable power bank",
        "smart thermostat",
        "pair of noise cancelling earbuds",
        "external hard drive",
        "computer monitor",
        "wifi router",
        "action camera",
    ),
    "books": (
        "mystery novel",
        "cookbook",
        "biography",
        "fantasy series",
        "history book",
        "poetry collection",
        "travel guide",
        "science fiction novel",
        "self-help book",
        "picture book",
        "graphic novel",
        "memoir",
        "thriller",
        "statistics textbook",
        "short story collection",
        "romance novel",
    ),
    "kitchen": (
        "blender",
        "coffee maker",
        "chef's knife",
        "cast iron skillet",
        "toaster",
        "stand mixer",
        "air fryer",
        "rice cooker",
        "electric kettle",
        "cutting board",
        "food processor",
        "nonstick pan",
        "slow cooker",
        "spice grinder",
        "dish rack",
        "waffle maker",
    ),
    "clothing": (
        "winter jacket",
        "pair of jeans",
        "pair of running shoes",
        "wool sweater",
        "rain coat",
        "summer dress",
        "pair of hiking boots",
        "cotton t-shirt",
        "leather belt",
        "scarf",
        "hoodie",
        "dress shirt",
        "pair of yoga pants",
        "baseball cap",
        "pair of sneakers",
        "flannel pajama set",
    ),
}
"""Sixteen products per category, named in every opening sentence."""

USES: dict[str, tuple[str, ...]] = {
    "electronics": (
        "working from home",
        "my home office",
        "long business trips",
        "everyday use",
        "my college classes",
        "my daily routine",
    ),
    "books": (
        "my book club",
        "a long flight",
        "my daily commute",
        "reading before bed",
        "a beach holiday",
        "my literature class",
        "quiet Sunday afternoons",
    ),
    "kitchen": (
        "weeknight dinners",
        "everyday cooking",
        "meal prep on Sundays",
        "family breakfasts",
        "holiday cooking",
        "my small apartment kitchen",
    ),
    "clothing": (
        "the cold winter",
        "a friend's wedding",
        "everyday wear",
        "the office",
        "weekend trips",
        "a trip to the coast",
    ),
}
"""Category-specific uses, named in some openings and sentiment sentences."""

OPENINGS: tuple[str, ...] = (
    "I bought the {product} from {store} in {month} for ${price}.",
    "I ordered this {product} in {month} for {use}.",
    "My name is {name} and I picked up the {product} at {store} in {city}.",
    "Got this {product} for ${price} last {month}, mainly for {use}.",
    "I needed a new {product} for {use}, so I tried this one.",
    "{name} from {city} here, writing about the {product} I bought in {month}.",
    "This {product} was a gift from my {relative} in {month}.",
    "After reading other reviews I bought this {product} from {store}.",
    "I have used this {product} for {use} since {month}.",
    "Paid ${price} for this {product} at {store}.",
    "My {relative} recommended this {product} for {use}.",
    "I found the {product} on sale at {store} in {city}.",
)
"""Neutral opening sentences; each names the product."""

CLOSINGS: tuple[str, ...] = (
    "Bought from {store} for ${price}.",
    "Reviewed by {name} in {city}.",
    "Delivered to {city} in {month}.",
    "Posted by {name}, {month}.",
    "I shopped at {store} in {city}.",
    "Shipping to {city} took a few days.",
)
"""Neutral closing sentences with faker details."""

PRICES: dict[str, tuple[int, int]] = {
    "electronics": (20, 900),
    "books": (5, 40),
    "kitchen": (10, 300),
    "clothing": (10, 200),
}
"""Whole-dollar price ranges per category."""

RELATIVES = ("sister", "brother", "mother", "father", "aunt", "cousin", "neighbour", "friend")

GENERIC: dict[str, tuple[str, ...]] = {
    "positive": (
        "It works exactly as described and I love it.",
        "Honestly the best purchase I have made this year.",
        "The quality is excellent for the price.",
        "I would happily buy the {product} again.",
        "It exceeded all of my expectations.",
        "Five stars, I recommend it to everyone.",
        "It arrived early and was packed carefully.",
        "Great value and very well made.",
        "I am really pleased with this purchase.",
        "My whole family loves the {product}.",
        "It feels solid and looks even better in person.",
        "Customer service was friendly and quick to help.",
        "It has held up perfectly after months of use.",
        "Absolutely worth every penny.",
        "I was impressed from the moment I opened the box.",
        "It is easy to use and a real pleasure every day.",
        "I have already bought a second one as a gift.",
        "Everything about it is fantastic.",
        "It does its job beautifully.",
        "Simply wonderful, no complaints at all.",
        "I could not be happier with the {product}.",
        "A delightful product that I use all the time.",
        "The {product} is reliable and well designed.",
        "It made {use} so much more enjoyable.",
        "Highly recommended, it is a great buy.",
        "Superb quality and a fair price.",
    ),
    "negative": (
        "It broke after only two weeks.",
        "Honestly the worst purchase I have made this year.",
        "The quality is terrible for the price.",
        "I would never buy the {product} again.",
        "It fell far short of my expectations.",
        "One star, avoid it at all costs.",
        "It arrived late and the box was damaged.",
        "Poor value and very cheaply made.",
        "I am really disappointed with this purchase.",
        "I returned the {product} the next day.",
        "It feels flimsy and looks worse in person.",
        "Customer service was rude and never replied.",
        "It stopped working after a month of use.",
        "A complete waste of money.",
        "I was let down the moment I opened the box.",
        "It is awkward to use and a constant annoyance.",
        "I asked for a refund and I am still waiting.",
        "Everything about it is awful.",
        "It does its job badly, when it works at all.",
        "Simply dreadful, I regret buying it.",
        "I could not be more unhappy with the {product}.",
        "A frustrating product that I no longer use.",
        "The {product} is unreliable and poorly designed.",
        "It made {use} much more stressful.",
        "Not recommended, it is a bad buy.",
        "Shoddy quality and an unfair price.",
    ),
}
"""Generic sentiment sentences, 26 per polarity."""

SPECIFIC: dict[str, dict[str, tuple[str, ...]]] = {
    "electronics": {
        "positive": (
            "The battery lasts all day without a problem.",
            "The sound quality is crisp and clear.",
            "Setup took two minutes and the app is intuitive.",
            "The screen is bright and sharp even outdoors.",
            "The bluetooth connection never drops.",
            "It charges quickly and stays cool.",
            "The firmware updates made it even better.",
            "Video calls look and sound great with it.",
        ),
        "negative": (
            "The battery dies before lunch.",
            "The sound crackles and distorts at high volume.",
            "The app crashes every time I try to pair it.",
            "The screen flickers and has a dead pixel.",
            "The bluetooth connection keeps dropping.",
            "It overheats while charging.",
            "A firmware update bricked it completely.",
            "The charging port came loose within a week.",
        ),
    },
    "books": {
        "positive": (
            "The plot kept me turning pages late into the night.",
            "The characters feel real and the dialogue is sharp.",
            "The ending was moving and perfectly earned.",
            "The writing is elegant and a joy to read.",
            "I finished it in one weekend and want to read it again.",
            "The illustrations are gorgeous.",
            "The author explains difficult ideas clearly.",
            "Every chapter taught me something new.",
        ),
        "negative": (
            "The plot drags and goes nowhere.",
            "The characters are flat and the dialogue is wooden.",
            "The ending was rushed and made no sense.",
            "The writing is clumsy and full of typos.",
            "I gave up halfway through the second chapter.",
            "The pages started falling out of the binding.",
            "The author repeats the same point over and over.",
            "It was so dull that I fell asleep reading it.",
        ),
    },
    "kitchen": {
        "positive": (
            "The blades chop vegetables in seconds.",
            "It heats evenly and nothing sticks to it.",
            "Cleaning it takes less than a minute.",
            "My coffee has never tasted better.",
            "The handle stays cool and feels sturdy.",
            "It makes perfect rice every single time.",
            "Dinner prep is twice as fast now.",
            "It looks great on the counter and takes little space.",
        ),
        "negative": (
            "The blades went dull after a few uses.",
            "Food sticks and the coating is already peeling.",
            "It is a nightmare to clean.",
            "The coffee tastes burnt and bitter.",
            "The handle gets dangerously hot.",
            "It leaks water all over the counter.",
            "The motor smells like burning plastic.",
            "It takes up half the counter and is very loud.",
        ),
    },
    "clothing": {
        "positive": (
            "The fabric is soft and keeps me warm.",
            "It fits perfectly and the sizing is accurate.",
            "The stitching is neat and has survived many washes.",
            "The color stayed bright after washing.",
            "It is comfortable from the very first wear.",
            "The zipper is smooth and strong.",
            "I get compliments every time I wear it.",
            "It is light, breathable and looks sharp.",
        ),
        "negative": (
            "The fabric is scratchy and thin.",
            "It runs two sizes too small.",
            "The stitching came apart after one wash.",
            "The color faded and bled onto my other clothes.",
            "It gave me blisters on the first day.",
            "The zipper broke the second time I used it.",
            "It shrank badly in the dryer.",
            "It looks nothing like the photos online.",
        ),
    },
}
"""Category-specific sentiment sentences, 8 per category and polarity."""

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


@dataclass(frozen=True)
class ReviewConfig:
    """How many reviews, the share of `mixed` ones, the train and test shares (aux: the rest)
    and the seed of the text, the labels and the splits."""

    documents: int = 2400
    mixed: float = 0.15
    train: float = 0.4
    test: float = 0.3
    seed: int = 0

    def validate(self) -> ReviewConfig:
        """This config, or a one-line ReviewError naming the bad value."""
        for name in ("documents", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ReviewError(f"{name} must be a whole number, got {value!r}")
        if not 24 <= self.documents <= 200_000:
            raise ReviewError(f"documents must be in [24, 200000], got {self.documents}")
        if self.seed < 0:
            raise ReviewError(f"seed must be >= 0, got {self.seed}")
        for name in ("mixed", "train", "test"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
                raise ReviewError(f"{name} must be a number, got {value!r}")
            if not np.isfinite(value):
                raise ReviewError(f"{name} must be finite, got {value!r}")
        if not 0.0 <= self.mixed <= 1.0:
            raise ReviewError(f"mixed must be in [0, 1], got {self.mixed}")
        if not (0.0 < self.train < 1.0 and 0.0 < self.test < 1.0):
            raise ReviewError(
                f"train and test must be in (0, 1), got train={self.train}, test={self.test}"
            )
        if self.train + self.test >= 1.0:
            raise ReviewError(
                f"train + test must be below 1 (aux is the rest), got {self.train + self.test}"
            )
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReviewConfig:
        """The config `asdict` wrote (unknown keys refused), validated."""
        if not isinstance(data, Mapping):
            raise ReviewError("the review config must be a JSON object")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ReviewError(f"unknown review config key {unknown[0]!r}")
        return cls(**dict(data)).validate()


@dataclass
class Reviews:
    """The corpus (module docstring): `texts`, `labels` (int64, index of `LABELS`),
    `attributes` (int64, index of `CATEGORIES`), `split` (one of `SPLITS` per review), the
    `config` that built it and `mixed` (bool: the text mixes both polarities, the label is
    random)."""

    texts: list[str]
    labels: np.ndarray
    attributes: np.ndarray
    split: np.ndarray
    config: ReviewConfig
    mixed: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        n = len(self.texts)
        if not all(isinstance(t, str) for t in self.texts):
            raise ReviewError("every review text must be a string")
        self.texts = list(self.texts)
        self.labels = self._integers("labels", self.labels, len(LABELS), n)
        self.attributes = self._integers("attributes", self.attributes, len(CATEGORIES), n)
        split = np.asarray(self.split).reshape(-1)
        if split.shape != (n,):
            raise ReviewError(f"{n} texts but {split.size} split names")
        split = split.astype(str)
        bad = sorted(set(split.tolist()) - set(SPLITS))
        if bad:
            raise ReviewError(f"unknown split {bad[0]!r}; splits are {', '.join(SPLITS)}")
        self.split = split
        mixed = np.zeros(n, dtype=bool) if self.mixed is None else np.asarray(self.mixed)
        if mixed.shape != (n,) or mixed.dtype != bool:
            raise ReviewError(f"mixed must be {n} booleans")
        self.mixed = mixed
        if not isinstance(self.config, ReviewConfig):
            raise ReviewError("config must be a ReviewConfig")

    @staticmethod
    def _integers(name: str, values: Any, size: int, n: int) -> np.ndarray:
        array = np.asarray(values).reshape(-1)
        if array.shape != (n,):
            raise ReviewError(f"{n} texts but {array.size} {name}")
        if n and (array.dtype.kind not in "iu"):
            raise ReviewError(f"{name} must be whole numbers, got dtype {array.dtype}")
        array = array.astype(np.int64)
        if n and (array.min() < 0 or array.max() >= size):
            raise ReviewError(f"{name} must be in 0..{size - 1}")
        return array

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, split: str) -> Reviews:
        """The reviews of one split (`SPLITS`), in corpus order."""
        if split not in SPLITS:
            raise ReviewError(f"unknown split {split!r}; splits are {', '.join(SPLITS)}")
        keep = np.flatnonzero(self.split == split)
        assert self.mixed is not None
        return Reviews(
            texts=[self.texts[i] for i in keep],
            labels=self.labels[keep],
            attributes=self.attributes[keep],
            split=self.split[keep],
            config=self.config,
            mixed=self.mixed[keep],
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`from_dict` reads it back)."""
        assert self.mixed is not None
        return {
            "format": FORMAT,
            "config": asdict(self.config),
            "categories": list(CATEGORIES),
            "label_names": list(LABELS),
            "texts": list(self.texts),
            "labels": [int(v) for v in self.labels],
            "attributes": [int(v) for v in self.attributes],
            "split": [str(v) for v in self.split],
            "mixed": [bool(v) for v in self.mixed],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reviews:
        """The corpus `to_dict` wrote, or a one-line ReviewError naming what is wrong."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ReviewError(f"not a privacylab review corpus (format {FORMAT!r} expected)")
        if data.get("categories") != list(CATEGORIES) or data.get("label_names") != list(LABELS):
            raise ReviewError("the review file's categories or label names do not match")
        missing = [
            k
            for k in ("config", "texts", "labels", "attributes", "split", "mixed")
            if k not in data
        ]
        if missing:
            raise ReviewError(f"the review file lacks {missing[0]!r}")
        for key in ("texts", "labels", "attributes", "split", "mixed"):
            if not isinstance(data[key], list):
                raise ReviewError(f"the review file's {key!r} must be a list")
        if not all(isinstance(v, bool) for v in data["mixed"]):
            raise ReviewError("the review file's 'mixed' must hold booleans")
        for key in ("labels", "attributes"):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in data[key]):
                raise ReviewError(f"the review file's {key!r} must hold whole numbers")
        try:
            config = ReviewConfig.from_dict(data["config"])
        except TypeError as error:
            raise ReviewError(f"the review file's config is malformed: {error}") from None
        return cls(
            texts=data["texts"],
            labels=np.asarray(data["labels"], dtype=np.int64),
            attributes=np.asarray(data["attributes"], dtype=np.int64),
            split=np.asarray(data["split"], dtype=object),
            config=config,
            mixed=np.asarray(data["mixed"], dtype=bool),
        )


class _Details:
    """Pools of faker values (seeded, en_US, no network), drawn from with a numpy generator."""

    def __init__(self, seed: int) -> None:
        from faker import Faker

        fake = Faker("en_US")
        fake.seed_instance(seed)
        self.names = tuple(dict.fromkeys(fake.first_name() for _ in range(160)))
        self.cities = tuple(dict.fromkeys(fake.city() for _ in range(160)))
        self.stores = tuple(dict.fromkeys(fake.company() for _ in range(120)))


@functools.lru_cache(maxsize=4)
def _details(seed: int) -> _Details:
    return _Details(seed)


def _pick(rng: np.random.Generator, pool: tuple[str, ...]) -> str:
    return pool[int(rng.integers(len(pool)))]


def _review(
    rng: np.random.Generator, details: _Details, category: str, polarity: str | None
) -> str:
    """One review of `category`: an opening, sentiment sentences of `polarity` (None: one of
    each, in random order), sometimes a closing; 2 to 4 sentences."""
    values = {
        "product": _pick(rng, PRODUCTS[category]),
        "use": _pick(rng, USES[category]),
        "store": _pick(rng, details.stores),
        "name": _pick(rng, details.names),
        "city": _pick(rng, details.cities),
        "month": _pick(rng, MONTHS),
        "relative": _pick(rng, RELATIVES),
        "price": f"{int(rng.integers(*PRICES[category]))}.{int(rng.integers(0, 100)):02d}",
    }
    if polarity is None:
        polarities = ["positive", "negative"]
        rng.shuffle(polarities)
        chosen = [_pick(rng, GENERIC[p] + SPECIFIC[category][p]) for p in polarities]
    else:
        pool = GENERIC[polarity] + SPECIFIC[category][polarity]
        count = 1 + int(rng.integers(2))
        chosen = [pool[int(i)] for i in rng.choice(len(pool), size=count, replace=False)]
    sentences = [_pick(rng, OPENINGS), *chosen]
    if len(sentences) < 4 and rng.random() < 0.5:
        sentences.append(_pick(rng, CLOSINGS))
    return " ".join(s.format(**values) for s in sentences)


def _balanced(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """n values in 0..k-1, as equal in count as n allows, in random order."""
    values = np.arange(n) % k
    rng.shuffle(values)
    return values.astype(np.int64)


def _stratified_split(
    rng: np.random.Generator, strata: np.ndarray, train: float, test: float
) -> np.ndarray:
    """A split name per row: within each stratum, round(train·m) rows train, round(test·m)
    test, the rest aux, chosen at random."""
    split = np.empty(strata.shape[0], dtype="<U5")
    for value in np.unique(strata):
        rows = rng.permutation(np.flatnonzero(strata == value))
        m = rows.size
        n_train = round(train * m)
        n_test = min(round(test * m), m - n_train)
        split[rows[:n_train]] = "train"
        split[rows[n_train : n_train + n_test]] = "test"
        split[rows[n_train + n_test :]] = "aux"
    return split


def build_reviews(config: ReviewConfig | None = None) -> Reviews:
    """The seeded review corpus of `config` (module docstring): balanced (category, label)
    cells, a `mixed` share with labels the text does not determine, distinct texts and
    stratified train/test/aux splits."""
    config = (ReviewConfig() if config is None else config).validate()
    rng = np.random.default_rng(config.seed)
    details = _details(int(config.seed))
    n = int(config.documents)
    cells = _balanced(rng, n, len(CATEGORIES) * len(LABELS))
    attributes = cells // len(LABELS)
    labels = cells % len(LABELS)
    mixed = np.zeros(n, dtype=bool)
    mixed[rng.choice(n, size=round(config.mixed * n), replace=False)] = True
    texts: list[str] = []
    seen: set[str] = set()
    for i in range(n):
        polarity = None if mixed[i] else LABELS[labels[i]]
        for _ in range(100):
            text = _review(rng, details, CATEGORIES[attributes[i]], polarity)
            if text not in seen:
                break
        else:
            raise ReviewError(f"could not draw {n} distinct reviews; ask for fewer documents")
        seen.add(text)
        texts.append(text)
    strata = (cells * 2 + mixed).astype(np.int64)
    split = _stratified_split(rng, strata, float(config.train), float(config.test))
    return Reviews(
        texts=texts, labels=labels, attributes=attributes, split=split, config=config, mixed=mixed
    )


def describe(reviews: Reviews) -> dict[str, Any]:
    """Counts (JSON-ready): reviews per split, and per split the counts per label, per
    attribute (category) and of mixed reviews."""
    assert reviews.mixed is not None
    out: dict[str, Any] = {"documents": len(reviews), "splits": {}}
    for name in SPLITS:
        rows = reviews.split == name
        out["splits"][name] = {
            "documents": int(rows.sum()),
            "labels": {
                label: int((reviews.labels[rows] == i).sum()) for i, label in enumerate(LABELS)
            },
            "attributes": {
                cat: int((reviews.attributes[rows] == i).sum()) for i, cat in enumerate(CATEGORIES)
            },
            "mixed": int(reviews.mixed[rows].sum()),
        }
    out["mixed"] = int(reviews.mixed.sum())
    out["config"] = asdict(reviews.config)
    return out


def _file(path: str | Path) -> Path:
    file = Path(path)
    return file if file.suffix == ".json" else file / REVIEWS_FILE


def save_reviews(reviews: Reviews, path: str | Path) -> Path:
    """Write `reviews` as JSON to `path` (a .json file, or a folder that gets `REVIEWS_FILE`),
    atomically; returns the file written."""
    file = _file(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_name(file.name + ".partial")
    partial.write_text(json.dumps(reviews.to_dict(), ensure_ascii=False) + "\n", encoding="utf-8")
    partial.replace(file)
    return file


def load_reviews(path: str | Path) -> Reviews:
    """The corpus at `path` (a .json file or a folder holding `REVIEWS_FILE`); a one-line
    ReviewError when it is missing, unreadable or malformed."""
    file = Path(path)
    if file.is_dir() or file.suffix != ".json":
        file = file / REVIEWS_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReviewError(f"no review corpus at {file}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ReviewError(f"cannot read review corpus {file}: {message}") from None
    return Reviews.from_dict(data)
