"""Training data in any of the forms people hold it, as tensors the trainer can index.

DP-SGD with Poisson sampling (Abadi et al. 2016, Alg. 1: "take a random sample L_t with sampling
probability q") needs random access to every example: each step includes each of the N examples
independently with probability q. So every accepted form is brought to one `TrainingData` — a
tuple of input tensors and a target tensor, batch first — once, before training:

- a privacylab `Dataset` (its features and labels, not copied);
- `(x, y)` with numpy arrays or tensors, or `((x1, ..., xk), y)` for a model with several inputs;
- a `torch.utils.data.TensorDataset` (its last tensor is the target);
- any map-style `torch.utils.data.Dataset` whose items are `(x, y)` or `(x1, ..., xk, y)`:
  materialised once by reading every item (so a random transform is applied once, not per
  epoch), refused when it would take more than `MAX_MATERIALISED_BYTES`;
- a `torch.utils.data.DataLoader`: its dataset, as above, and its `batch_size` as the expected
  batch size; its own sampler and batching are not used (under DP, batches are Poisson-resampled
  from the dataset, which is what the accountant analyses).

Anything wrong is one `TrainingError` line: an empty set, inputs and targets of different
lengths, NaN or infinite values, labels the loss cannot take.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from torch.utils.data import Dataset as TorchDataset

from privacylab.data import Dataset
from privacylab.training.config import TrainingError

MAX_MATERIALISED_BYTES = 4 << 30
"""Largest map-style torch Dataset read into memory (4 GiB, estimated from its first item); a
larger one is refused with a line saying so — pass it as tensors or a memory-mapped array."""

ACCEPTED = (
    "a privacylab Dataset, (x, y) arrays or tensors, ((x1, ..., xk), y), a torch Dataset of "
    "(x, y) items, or a DataLoader"
)


@dataclass(frozen=True)
class TrainingData:
    """Batch-first input tensors and targets of N examples, and where they came from.

    Attributes:
        inputs: the model's positional inputs, each of shape (N, ...); the model is called as
            ``model(*inputs)``.
        targets: (N, ...) targets for the loss.
        batch_size: the batch size of the DataLoader the data came from, else None.
        source: what the data was given as (for messages).
    """

    inputs: tuple[Tensor, ...]
    targets: Tensor
    batch_size: int | None = None
    source: str = "tensors"

    def __len__(self) -> int:
        return int(self.targets.shape[0])

    def select(self, index: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
        """The inputs and targets of the examples at `index` (on the data's device)."""
        return tuple(t[index] for t in self.inputs), self.targets[index]

    def to(self, device: torch.device) -> TrainingData:
        """The same data on `device`."""
        return TrainingData(
            tuple(t.to(device) for t in self.inputs),
            self.targets.to(device),
            self.batch_size,
            self.source,
        )


def _tensor(value: Any, what: str) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        if value.dtype == object or not (
            np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_
        ):
            raise TrainingError(f"{what} must be numeric, got a numpy array of {value.dtype}")
        return torch.from_numpy(np.ascontiguousarray(value))
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TrainingError(
            f"{what} must be a tensor, a numpy array or numbers, got {type(value).__name__}"
        ) from None


def _from_pair(data: Sequence[Any]) -> tuple[tuple[Tensor, ...], Tensor]:
    if len(data) != 2:
        raise TrainingError(
            f"data given as a sequence must be (x, y) or ((x1, ..., xk), y), got {len(data)} items"
        )
    x, y = data
    parts = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    if not parts:
        raise TrainingError("the model inputs are an empty tuple")
    return tuple(_tensor(p, "inputs") for p in parts), _tensor(y, "targets")


def _item_parts(item: Any, index: int) -> tuple[Any, ...]:
    if isinstance(item, dict):
        raise TrainingError(
            f"item {index} of the torch Dataset is a dict; items must be (x, y) or "
            "(x1, ..., xk, y) tuples"
        )
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise TrainingError(
            f"item {index} of the torch Dataset is a {type(item).__name__}, not an (x, y) or "
            "(x1, ..., xk, y) tuple"
        )
    return tuple(item)


def _materialise(data: TorchDataset, max_bytes: int) -> tuple[tuple[Tensor, ...], Tensor]:
    """Read every item of a map-style torch Dataset and stack the fields."""
    try:
        n = len(data)  # type: ignore[arg-type]
    except TypeError:
        raise TrainingError(
            f"the torch Dataset {type(data).__name__} has no length; Poisson sampling needs "
            "random access to every example"
        ) from None
    if n == 0:
        raise TrainingError("the training data is empty")
    columns: list[list[Tensor]] = []
    for i in range(n):
        parts = _item_parts(data[i], i)
        if i == 0:
            columns = [[] for _ in parts]
            first = [_tensor(p, f"field {k} of item 0") for k, p in enumerate(parts)]
            size = sum(t.numel() * t.element_size() for t in first) * n
            if size > max_bytes:
                raise TrainingError(
                    f"the torch Dataset would take about {size / 2**30:.1f} GiB once read into "
                    f"memory (limit {max_bytes / 2**30:.1f} GiB); pass it as tensors or "
                    "memory-mapped arrays"
                )
            for column, t in zip(columns, first, strict=True):
                column.append(t)
            continue
        if len(parts) != len(columns):
            raise TrainingError(
                f"item {i} of the torch Dataset has {len(parts)} fields but item 0 has "
                f"{len(columns)}"
            )
        for k, (column, p) in enumerate(zip(columns, parts, strict=True)):
            t = _tensor(p, f"field {k} of item {i}")
            if t.shape != column[0].shape:
                raise TrainingError(
                    f"field {k} of item {i} has shape {tuple(t.shape)} but item 0's has "
                    f"{tuple(column[0].shape)}"
                )
            column.append(t)
    stacked = [torch.stack(column) for column in columns]
    return tuple(stacked[:-1]), stacked[-1]


def as_training_data(
    data: Any,
    *,
    name: str = "training data",
    float_dtype: torch.dtype = torch.float32,
    max_bytes: int = MAX_MATERIALISED_BYTES,
) -> TrainingData:
    """`data` in any accepted form (see the module docstring) as checked `TrainingData`.

    Floating inputs and targets are cast to `float_dtype` (the model's), integer inputs (token
    ids) and integer targets to int64. Raises TrainingError (one line) for an unknown form, an
    empty set, inputs and targets of different lengths, a tensor without a batch dimension, or
    NaN/infinite values.
    """
    batch_size: int | None = None
    if isinstance(data, DataLoader):
        batch_size = data.batch_size
        source = f"DataLoader over {type(data.dataset).__name__}"
        data = data.dataset
    else:
        source = type(data).__name__
    if isinstance(data, Dataset):
        inputs, targets = (data.features,), data.labels
    elif isinstance(data, TensorDataset):
        if len(data.tensors) < 2:
            raise TrainingError(
                "a TensorDataset for training needs at least two tensors: inputs and targets"
            )
        inputs, targets = tuple(data.tensors[:-1]), data.tensors[-1]
    elif isinstance(data, IterableDataset):
        raise TrainingError(
            f"{type(data).__name__} is an IterableDataset; Poisson sampling needs random access "
            "to every example: give a map-style Dataset, a TensorDataset or tensors"
        )
    elif isinstance(data, TorchDataset):
        inputs, targets = _materialise(data, max_bytes)
    elif isinstance(data, (tuple, list)):
        inputs, targets = _from_pair(data)
    else:
        raise TrainingError(f"the {name} must be {ACCEPTED}; got {type(data).__name__}")
    return _checked(inputs, targets, batch_size, source, name, float_dtype)


def _checked(
    inputs: tuple[Tensor, ...],
    targets: Tensor,
    batch_size: int | None,
    source: str,
    name: str,
    float_dtype: torch.dtype,
) -> TrainingData:
    if targets.ndim == 0:
        raise TrainingError(f"the {name}'s targets must have one row per example, got a scalar")
    n = int(targets.shape[0])
    if n == 0:
        raise TrainingError(f"the {name} is empty")
    cast = []
    for k, x in enumerate(inputs):
        label = "inputs" if len(inputs) == 1 else f"input {k}"
        if x.ndim == 0 or x.shape[0] != n:
            rows = "a scalar" if x.ndim == 0 else f"{x.shape[0]} rows"
            raise TrainingError(f"the {name}'s {label} has {rows} but its targets have {n}")
        cast.append(_cast(x, f"the {name}'s {label}", float_dtype))
    return TrainingData(
        tuple(cast), _cast(targets, f"the {name}'s targets", float_dtype), batch_size, source
    )


def _cast(t: Tensor, what: str, float_dtype: torch.dtype) -> Tensor:
    if t.is_complex():
        raise TrainingError(f"{what} are complex numbers")
    if t.is_floating_point():
        if not bool(torch.isfinite(t).all()):
            raise TrainingError(f"{what} contain NaN or infinite values")
        return t if t.dtype == float_dtype else t.to(float_dtype)
    if t.dtype == torch.bool:
        return t
    return t if t.dtype == torch.int64 else t.to(torch.int64)


def check_class_labels(targets: Tensor, name: str = "training data") -> None:
    """Targets the default cross-entropy loss can take: 1-D integer class indices >= 0."""
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise TrainingError(
            f"the {name}'s labels are {str(targets.dtype).removeprefix('torch.')}, but the "
            "default loss (cross-entropy) needs integer class indices; pass loss_fn= for "
            "regression, multi-label or soft targets"
        )
    if targets.ndim != 1:
        raise TrainingError(
            f"the {name}'s labels have shape {tuple(targets.shape)}; the default loss "
            "(cross-entropy) needs one class index per example; pass loss_fn= for other targets"
        )
    if len(targets) and int(targets.min()) < 0:
        raise TrainingError(f"the {name}'s labels must be >= 0, got {int(targets.min())}")


def check_label_range(targets: Tensor, classes: int, name: str = "training data") -> None:
    """Every class index below the number of model outputs."""
    if len(targets) and int(targets.max()) >= classes:
        raise TrainingError(
            f"the {name} has label {int(targets.max())} but the model gives {classes} outputs "
            f"(classes 0..{classes - 1})"
        )


def resolve_batch_size(configured: int | None, default: int, loader: int | None) -> int:
    """The expected batch size: the DataLoader's unless the configuration sets another one
    (a value other than its default)."""
    if loader is not None and (configured is None or configured == default):
        return loader
    return configured if configured is not None else default


def sample_rate(batch_size: float, n: int, source: str) -> float:
    """q = batch size / N for Poisson sampling; TrainingError when it exceeds 1."""
    q = batch_size / n
    if q > 1.0 or not math.isfinite(q):
        raise TrainingError(
            f"the expected batch size {batch_size:g} of the {source} exceeds its {n} examples "
            f"(sample rate q = {q:.3g} > 1)"
        )
    return q
