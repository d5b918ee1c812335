"""Memorization attacks: the memorization instance of the family-agnostic core
(`privacylab.attacks.core`).

Threat model (Song, Ristenpart & Shmatikov, "Machine Learning Models that Remember Too Much",
CCS 2017, Sec. 3): the adversary is the *provider of the training code*. The data holder runs
that code on its own data and never shows the data to the provider; the provider then gets
the released model, white-box (its parameters) or black-box (labels of chosen inputs), and
decodes from it a chosen part of the training data — the *secret*.

An attack is therefore two halves of one object:

- `encode(secret, model, data, private)` is the malicious training algorithm: it returns a
  `MaliciousTraining` — the module to train, the data to train on (the holder's rows, plus
  synthetic rows for capacity abuse), a regulariser through the trainer's loss hook
  (correlated value and sign encoding, Sec. 4.2-4.3), a loss, and `release`, the
  post-processing of the trained model (LSB encoding, Sec. 4.1). It sees the secret because
  it runs on the holder's machine.
- `run(target, task)` is the decoder: it receives only the `Target` at the attack's declared
  access and a `MemorizationTask` — the public layout of what was hidden (how many items, their
  shape, bits per value) and the key of the synthetic inputs — never the secret's values.

`run_memorization` executes the decoder and only then attaches the truth, building the family's
one result type, `MemorizationResult`: bit accuracy, exact-match rate, MAE and PSNR for
images, items recovered (decoded nearer to the original than to any other candidate row),
queries, and the bits recovered per parameter or per query (bits times the capacity of the
binary symmetric channel the decoding is, 1 - h(bit error)).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.attacks.core import Attack, ThreatModel, execute
from privacylab.attacks.core import number_option as core_number
from privacylab.attacks.core import whole_option as core_whole
from privacylab.data import Dataset
from privacylab.errors import PrivacylabError
from privacylab.models.parameters import load_parameter_vector, parameter_count, parameter_vector
from privacylab.registry import Registry
from privacylab.stats.images import psnr
from privacylab.stats.memorization import (
    bit_accuracy,
    exact_match_rate,
    from_bits,
    mean_absolute_error,
    to_bits,
)
from privacylab.target import Access, Target

__all__ = [
    "KINDS",
    "MEMORIZATION_ATTACKS",
    "Decoded",
    "MaliciousTraining",
    "MemorizationAttack",
    "MemorizationError",
    "MemorizationResult",
    "MemorizationTask",
    "Secret",
    "SecretLayout",
    "channel_bits",
    "choose_secret",
    "load_parameter_vector",
    "make_memorization",
    "memorization_class",
    "memorization_names",
    "number_option",
    "parameter_count",
    "parameter_vector",
    "register_memorization",
    "run_memorization",
    "whole_option",
]

KINDS = ("image", "tabular")
"""What a secret item is: an image with values in [0, 1] quantised to `value_bits` bits, or a
tabular row of float32 values kept bit-exact (`value_bits` = 32)."""


class MemorizationError(PrivacylabError, ValueError):
    """Bad input to a memorization attack: one line."""


def whole_option(attack: str, name: str, value: object, low: int = 1) -> int:
    """`value` as a whole number >= `low`, else one MemorizationError line."""
    return core_whole(MemorizationError, attack, name, value, low)


def number_option(attack: str, name: str, value: object, *, zero: bool = False) -> float:
    """`value` as a finite number > 0 (>= 0 with `zero`), else one MemorizationError line."""
    return core_number(MemorizationError, attack, name, value, zero=zero)


@dataclass(frozen=True)
class SecretLayout:
    """The public shape of a secret: what the malicious code fixes and its decoder knows.

    `items` rows of shape `item_shape`, each value written in `value_bits` bits (images:
    v = round(x (2^b - 1)) for pixels x in [0, 1]; tabular: the float32's own 32 bits).
    """

    items: int
    item_shape: tuple[int, ...]
    value_bits: int
    kind: str = "image"

    def __post_init__(self) -> None:
        object.__setattr__(self, "item_shape", tuple(int(s) for s in self.item_shape))
        whole_option("secret", "items", self.items)
        whole_option("secret", "value_bits", self.value_bits)
        if self.kind not in KINDS:
            raise MemorizationError(
                f"secret kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        if self.kind == "image" and self.value_bits > 16:
            raise MemorizationError(f"image pixels take 1..16 bits, got {self.value_bits}")
        if self.kind == "tabular" and self.value_bits != 32:
            raise MemorizationError("tabular secrets are float32 values: value_bits must be 32")
        if not self.item_shape or any(s < 1 for s in self.item_shape):
            raise MemorizationError(f"secret item shape must be positive, got {self.item_shape}")

    @property
    def values_per_item(self) -> int:
        """Values in one item (pixels of an image, features of a row)."""
        return int(np.prod(self.item_shape))

    @property
    def bits_per_item(self) -> int:
        """Bits of one item."""
        return self.values_per_item * self.value_bits

    @property
    def total_bits(self) -> int:
        """Bits of the whole secret."""
        return self.items * self.bits_per_item

    @property
    def levels(self) -> int:
        """Largest quantised value, 2^value_bits - 1."""
        return (1 << self.value_bits) - 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "items": self.items,
            "item_shape": list(self.item_shape),
            "value_bits": self.value_bits,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SecretLayout:
        """Inverse of `to_dict`."""
        return cls(
            int(data["items"]), tuple(data["item_shape"]), int(data["value_bits"]), data["kind"]
        )

    def quantised(self, data: object) -> np.ndarray:
        """Rows of data (n, *item_shape) as this layout stores them: images rounded to the
        2^b levels, tabular rows cast to float32 — the space decodings are compared in."""
        x = np.asarray(data, dtype=np.float64).reshape(-1, *self.item_shape)
        if self.kind == "tabular":
            return x.astype(np.float32).astype(np.float64)
        return np.rint(np.clip(x, 0.0, 1.0) * self.levels) / self.levels

    def values_to_data(self, values: np.ndarray) -> np.ndarray:
        """Quantised values (items, values_per_item) back to data, shaped (items, *item_shape):
        images as pixels v / (2^b - 1) in [0, 1]; tabular rows as the float32 they encode."""
        v = np.asarray(values).reshape(-1, self.values_per_item)
        if self.kind == "tabular":
            data = v.astype(np.uint32).view(np.float32).astype(np.float64)
        else:
            data = np.clip(v.astype(np.float64), 0, self.levels) / self.levels
        return data.reshape(len(v), *self.item_shape)

    def bits_to_values(self, stream: np.ndarray) -> np.ndarray:
        """A decoded bit stream of `total_bits` bits as values (items, values_per_item)."""
        s = np.asarray(stream).ravel()
        if s.size != self.total_bits:
            raise MemorizationError(
                f"a decoded stream has {s.size} bits but the secret has {self.total_bits}"
            )
        return from_bits(s, self.value_bits).reshape(self.items, self.values_per_item)


@dataclass(frozen=True)
class Secret:
    """The part of the training data the malicious code hides: `values` (items,
    values_per_item), quantised by `layout`, of training rows `rows`."""

    layout: SecretLayout
    values: np.ndarray
    rows: np.ndarray

    def __post_init__(self) -> None:
        v = np.asarray(self.values)
        expected = (self.layout.items, self.layout.values_per_item)
        if v.shape != expected:
            raise MemorizationError(f"secret values must have shape {expected}, got {v.shape}")
        object.__setattr__(self, "values", v.astype(np.uint64))
        object.__setattr__(self, "rows", np.asarray(self.rows, dtype=np.int64))

    def bits(self) -> np.ndarray:
        """The secret as one bit stream, item by item, value by value, MSB first."""
        return to_bits(self.values, self.layout.value_bits)

    def data(self) -> np.ndarray:
        """The secret as data (items, *item_shape): what decoding is measured against."""
        return self.layout.values_to_data(self.values)


def choose_secret(data: Dataset, rows: object, value_bits: int | None = None) -> Secret:
    """The secret made of training rows `rows` of `data`: images (kind "image", pixels in
    [0, 1]) quantised to `value_bits` bits (default 8), tabular rows kept as float32 bits."""
    index = np.asarray(rows, dtype=np.int64).ravel()
    if index.size == 0:
        raise MemorizationError("a secret needs at least one training row")
    if index.min() < 0 or index.max() >= len(data):
        raise MemorizationError(
            f"secret rows must lie in [0, {len(data)}), got {index.min()}..{index.max()}"
        )
    x = data.features[torch.as_tensor(index)].detach().cpu().numpy()
    if data.kind == "image":
        bits = 8 if value_bits is None else value_bits
        layout = SecretLayout(len(index), tuple(data.input_shape), bits, "image")
        if x.min() < 0 or x.max() > 1:
            raise MemorizationError("image secrets need pixels in [0, 1]")
        values = np.rint(x.reshape(len(index), -1) * layout.levels).astype(np.uint64)
    else:
        if value_bits not in (None, 32):
            raise MemorizationError("tabular secrets are float32 values: value_bits must be 32")
        layout = SecretLayout(len(index), tuple(data.input_shape), 32, "tabular")
        values = x.reshape(len(index), -1).astype(np.float32).view(np.uint32).astype(np.uint64)
    return Secret(layout, values, index)


@dataclass(frozen=True)
class MemorizationTask:
    """What the decoder knows: the secret's public `layout`, the model's `input_shape` and
    `num_classes`, and `key`, the seed of the deterministic generator of synthetic inputs
    (capacity abuse; the same key the training code used)."""

    layout: SecretLayout
    input_shape: tuple[int, ...]
    num_classes: int
    key: int = 0


Regularizer = Callable[[nn.Module, Tensor, Tensor, Tensor], Tensor]
LossFn = Callable[[Tensor, Tensor], Tensor]


def _identity(model: nn.Module) -> nn.Module:
    return model


@dataclass
class MaliciousTraining:
    """What the provider's training code does in the holder's run (Song et al. 2017, Fig. 1).

    `model` is the module handed to the one trainer (`privacylab.training.train`) — the model
    itself, or a wrapper whose trained weights are the model's; `data` the training data
    (anything `train` accepts); `regularizer` and `loss_fn` the trainer's hooks (None: none /
    cross-entropy); `release(trained)` turns the trained module into the model released
    (unwraps, and writes LSBs); `clipping` the DP-SGD clipping mode it needs, if any
    (a wrapper that computes a term of its own weights needs per-example `vmap` gradients);
    `extra_rows` the synthetic rows appended to the holder's rows in `data` (capacity abuse,
    Sec. 5; 0: none)."""

    model: nn.Module
    data: Any
    regularizer: Regularizer | None = None
    loss_fn: LossFn | None = None
    release: Callable[[nn.Module], nn.Module] = _identity
    clipping: str | None = None
    extra_rows: int = 0


@dataclass
class Decoded:
    """The decoder's output: `values` (items, values_per_item) as quantised integers, and,
    for methods that decode bits, the raw decoded `bits` stream (else None: bits are read
    from `values`)."""

    values: np.ndarray
    bits: np.ndarray | None = None


class MemorizationAttack(Attack[MemorizationTask, Decoded]):
    """A memorization attack: configured in the constructor; `encode` is its training
    algorithm, `run` its decoder (see the module docstring); `capacity` the most secret bits it
    can hide in a model, refused above that by `check_capacity`."""

    name: ClassVar[str]
    threat_model: ClassVar[ThreatModel]
    private_ok: ClassVar[bool] = True
    """Whether `encode(..., private=True)` is supported (an encoding through training that
    DP-SGD's clipping and noise apply to)."""

    @abstractmethod
    def capacity(self, model: nn.Module, num_classes: int, train_rows: int) -> int:
        """The most secret bits this attack, as configured, can hide in `model` trained on
        `train_rows` rows of an n-class task."""

    @abstractmethod
    def encode(
        self,
        secret: Secret,
        model: nn.Module,
        data: Dataset,
        *,
        key: int = 0,
        private: bool = False,
    ) -> MaliciousTraining:
        """The malicious training of `model` on `data` hiding `secret` (`private`: the run is
        DP-SGD, so the encoding must go through per-example losses)."""

    @abstractmethod
    def run(self, target: Target, task: MemorizationTask) -> Decoded:
        """Decode the secret's values from `target` knowing only `task`."""

    def check_capacity(
        self, layout: SecretLayout, model: nn.Module, num_classes: int, train_rows: int
    ) -> None:
        """One MemorizationError line when `layout` needs more bits than `capacity`."""
        _refuse_above(self.name, layout, self.capacity(model, num_classes, train_rows))

    def to_dict(self) -> dict[str, Any]:
        """The attack's name and options, JSON-ready."""
        options = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        return {"name": self.name, **options}


def _refuse_above(name: str, layout: SecretLayout, room: int, why: str = "") -> None:
    """The one capacity refusal line: `layout` needs more than `room` bits (`why`: what else
    bounds the room, said in the parentheses)."""
    if layout.total_bits > room:
        raise MemorizationError(
            f"{name}: the secret needs {layout.total_bits} bits but this model can hold "
            f"at most {room} bits ({why}{room // max(layout.bits_per_item, 1)} items of "
            f"{layout.bits_per_item} bits)"
        )


MEMORIZATION_ATTACKS: Registry[type[MemorizationAttack]] = Registry(
    "memorization attack", error=MemorizationError
)
"""Every memorization attack class by name: lsb, correlation, sign, capacity."""


def register_memorization(cls: type[MemorizationAttack]) -> type[MemorizationAttack]:
    """Class decorator: register `cls` under its `name`."""
    return MEMORIZATION_ATTACKS.register(cls.name, cls)


def memorization_names() -> list[str]:
    """The registered memorization attack names."""
    return MEMORIZATION_ATTACKS.names()


def memorization_class(name: str) -> type[MemorizationAttack]:
    """The class registered as `name`, or one MemorizationError line naming the choices."""
    return MEMORIZATION_ATTACKS.get(name)


def make_memorization(name: str, **options: Any) -> MemorizationAttack:
    """Build the attack registered as `name` with `options` (an unknown option: one line)."""
    cls = memorization_class(name)
    try:
        return cls(**options)
    except TypeError as error:
        raise MemorizationError(f"{name}: {error}") from None


def channel_bits(bits: int, accuracy: float) -> float:
    """Information recovered through a decoding with bit accuracy `accuracy`: `bits` times the
    capacity of a binary symmetric channel, 1 - h(1 - accuracy) (Shannon 1948), so that a coin
    flip recovers nothing and exact decoding every bit."""
    error = min(max(1.0 - float(accuracy), 0.0), 1.0)
    error = min(error, 1.0 - error)
    if error <= 0.0:
        return float(bits)
    h = -error * math.log2(error) - (1 - error) * math.log2(1 - error)
    return float(bits) * (1.0 - h)


@dataclass
class MemorizationResult:
    """One memorization attack's outcome (what Song et al. 2017 tabulate per attack): the
    released model's clean test accuracy beside an honestly trained model's, and what was
    recovered.

    `recovered`: items decoded nearer (MSE) to their original than to any other candidate row
    (the training set), i.e. recognisable; `exact_match`: share decoded value-exact;
    `bit_accuracy` over the secret's bit stream; `mae`/`psnr` (images, pixels in [0, 1]) means
    over items, an exact item counting `stats.images.PSNR_CAP` = 100 dB (tabular: `psnr`
    None, `mae` with non-finite decoded values read as 0); `recovered_bits` = bits × (1 -
    h(bit error)); per parameter (white-box) or per query (black-box)."""

    method: str
    threat_model: ThreatModel
    access: Access
    clean_accuracy: float
    honest_accuracy: float
    items: int
    recovered: int
    bits_encoded: int
    bit_accuracy: float
    exact_match: float
    mae: float
    psnr: float | None
    queries: int
    parameters: int
    recovered_bits: float
    bits_per_parameter: float | None
    bits_per_query: float | None
    seconds: float
    options: dict[str, Any] = field(default_factory=dict)
    decoded: np.ndarray | None = field(default=None, repr=False)
    original: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (without the image arrays)."""
        return {
            "method": self.method,
            "clean_accuracy": self.clean_accuracy,
            "honest_accuracy": self.honest_accuracy,
            "recovered": self.recovered,
            "bit_accuracy": self.bit_accuracy,
            "psnr": self.psnr,
            "queries": self.queries,
            "items": self.items,
            "exact_match": self.exact_match,
            "mae": self.mae,
            "bits_encoded": self.bits_encoded,
            "recovered_bits": self.recovered_bits,
            "parameters": self.parameters,
            "bits_per_parameter": self.bits_per_parameter,
            "bits_per_query": self.bits_per_query,
            "access": self.access.value,
            "threat_model": self.threat_model.to_dict(),
            "options": self.options,
            "seconds": self.seconds,
        }


def _recognised(decoded: np.ndarray, original: np.ndarray, candidates: np.ndarray | None) -> int:
    """Items whose decoding is nearer (MSE) to their own original than to any other candidate;
    without candidates, the value-exact ones. With e = decoded - original, the gap
    MSE(d, c) - MSE(d, o) = mean((c - o)^2) - 2 mean(e (c - o)) is computed without squaring e,
    so a wild decoding (float32 rows read from noise: values up to 3e38) is compared exactly
    rather than through the cancellation of d^2 terms; a non-finite decoding is never
    recognised."""
    flat_d = decoded.reshape(len(decoded), -1).astype(np.float64)
    flat_o = original.reshape(len(original), -1).astype(np.float64)
    finite = np.all(np.isfinite(flat_d), axis=1)
    if candidates is None:
        return int(np.sum(finite & np.all(flat_d == flat_o, axis=1)))
    pool = np.asarray(candidates, dtype=np.float64).reshape(len(candidates), -1)
    width = pool.shape[1]
    pool_sq = (pool**2).mean(1)[None, :]
    count = 0
    for start in range(0, len(flat_d), 256):
        rows = slice(start, start + 256)
        o, ok = flat_o[rows], finite[rows]
        e = np.where(ok[:, None], flat_d[rows] - o, 0.0)
        spread = pool_sq - 2 * (o @ pool.T) / width + (o**2).mean(1)[:, None]
        pull = 2 * ((e @ pool.T) / width - (e * o).mean(1)[:, None])
        count += int(np.sum(ok & ((spread - pull).min(1) >= -1e-12)))
    return count


def run_memorization(
    attack: MemorizationAttack,
    target: Target,
    task: MemorizationTask,
    secret: Secret,
    *,
    clean_accuracy: float,
    honest_accuracy: float,
    candidates: np.ndarray | None = None,
) -> MemorizationResult:
    """Decode on a view of `target` at the attack's access, then — only then — compare with
    `secret` (the truth) and build the `MemorizationResult`. `candidates`: the rows
    (n, *item_shape, as data) an item must be told apart from (the training set; it should
    contain the secret's own rows), compared at the layout's quantisation (`quantised`), so
    that a coarse secret (4-bit pixels) decoded exactly is nearest to its own row."""
    if task.layout != secret.layout:
        raise MemorizationError("the task's layout is not the secret's")
    execution = execute(attack, target, task)
    decoded = execution.output
    layout = secret.layout
    values = np.asarray(decoded.values)
    if values.shape != secret.values.shape:
        raise MemorizationError(
            f"{attack.name} decoded values of shape {values.shape}, expected {secret.values.shape}"
        )
    values = np.clip(values, 0, (1 << layout.value_bits) - 1).astype(np.uint64)
    truth_bits = secret.bits()
    decoded_bits = decoded.bits if decoded.bits is not None else to_bits(values, layout.value_bits)
    accuracy = bit_accuracy(truth_bits, np.asarray(decoded_bits)[: truth_bits.size])
    original = secret.data()
    recovered_data = layout.values_to_data(values)
    if layout.kind == "image":
        errors = mean_absolute_error(original, recovered_data)
        mae = float(errors.mean())
        quality = psnr(recovered_data.reshape(len(values), *layout.item_shape), original)
        psnr_mean = float(np.mean(quality))
    else:
        finite = np.where(np.isfinite(recovered_data), recovered_data, 0.0)
        mae = float(mean_absolute_error(original, finite).mean())
        psnr_mean = None
    pool = None if candidates is None else layout.quantised(candidates)
    recovered = _recognised(recovered_data, original, pool)
    information = channel_bits(layout.total_bits, accuracy)
    white_box = execution.access.rank >= Access.WHITEBOX.rank
    params = 0
    if white_box:
        params = parameter_count(target.model)
    return MemorizationResult(
        method=attack.name,
        threat_model=attack.threat_model,
        access=execution.access,
        clean_accuracy=float(clean_accuracy),
        honest_accuracy=float(honest_accuracy),
        items=layout.items,
        recovered=recovered,
        bits_encoded=layout.total_bits,
        bit_accuracy=accuracy,
        exact_match=exact_match_rate(secret.values, values),
        mae=mae,
        psnr=psnr_mean,
        queries=execution.queries,
        parameters=params,
        recovered_bits=information,
        bits_per_parameter=information / params if params else None,
        bits_per_query=information / execution.queries if execution.queries else None,
        seconds=execution.seconds,
        options=attack.to_dict(),
        decoded=recovered_data,
        original=original,
    )
