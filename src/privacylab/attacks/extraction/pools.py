"""The thief's query sets: data it owns from the victim's distribution, data from another
distribution, and random inputs — the three sources of the learning-based extraction
literature (Tramèr et al. 2016, Sec. 5 "random queries"; Papernot et al. 2017, Sec. 4 "a small
set of inputs representative of the input domain"; Orekondy et al. 2019, Sec. 4.1: the
adversary's image set P_A is either the victim's distribution or a different one; Jagielski et
al. 2020, Sec. 6: the thief owns unlabelled in-distribution data).

Choices, each one documented where it is made:

- `extraction_split`: the victim's *test* rows (the ones its trainer held out under the same
  seed) cut in half at random: the first half is the thief's owned in-distribution pool, the
  second the evaluator's held-out rows for accuracy and fidelity. The victim's training rows are
  in neither: the thief owns data *like* the training data, not the training data itself, and
  fidelity is measured on inputs neither the victim nor the thief trained on.
- `out_of_distribution_pool`: for images, patches of the two natural photographs scikit-learn
  ships (`sklearn.datasets.load_sample_images`, available offline), at random positions and
  scales, grey-scaled for one channel, resized to the input's height and width, contrast
  stretched to [0, 1]: natural-image statistics, none of the victim's classes — the
  "different distribution" of Knockoff Nets at the scale of a laptop. For tabular inputs, a
  reference table's columns shuffled independently (each feature's marginal kept, every
  dependence between features broken), or uniform rows in the bounds without a reference.
- `random_pool`: independent uniform features in the bounds (Tramèr et al.'s random queries).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from privacylab.attacks.extraction.base import ExtractionError
from privacylab.data.dataset import Dataset, as_index, train_test_indices

__all__ = [
    "extraction_split",
    "in_distribution_pool",
    "out_of_distribution_pool",
    "random_pool",
]

LUMINANCE = (0.299, 0.587, 0.114)
"""ITU-R BT.601 weights for the grey level of an RGB pixel."""


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ExtractionError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def _shape(input_shape: tuple[int, ...]) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in input_shape)
    except (TypeError, ValueError):
        raise ExtractionError(
            f"input shape must be a tuple of sizes, got {input_shape!r}"
        ) from None
    if not shape or any(s < 1 for s in shape):
        raise ExtractionError(f"input shape must be non-empty sizes >= 1, got {input_shape!r}")
    return shape


def _bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    low, high = (float(b) for b in bounds)
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        raise ExtractionError(f"bounds must be finite with low < high, got {bounds!r}")
    return low, high


def extraction_split(data: Dataset, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(pool rows, evaluation rows) of `data`: its test rows (`train_test_indices(data,
    seed=seed)`, the rows the victim trained with `seed` did not see) permuted under `seed` and
    cut in half, each half sorted. The thief owns the first half (unlabelled), the evaluator
    keeps the second; the victim's training rows are in neither."""
    seed = _count("seed", seed, 0)
    _, test_rows = train_test_indices(data, seed=seed)
    order = np.random.default_rng(seed).permutation(np.asarray(test_rows, dtype=np.int64))
    if len(order) < 2:
        raise ExtractionError(
            f"{data.name}: {len(order)} test rows; the extraction split needs at least 2"
        )
    half = len(order) // 2
    return np.sort(order[:half]), np.sort(order[half:])


def in_distribution_pool(data: Dataset, rows: np.ndarray | Tensor | list[int]) -> Tensor:
    """The features of `data` at `rows` (float32, labels dropped): the thief's unlabelled
    in-distribution pool (Jagielski et al. 2020, Sec. 6; Papernot et al. 2017, Sec. 4)."""
    index = as_index(rows, len(data), data.name)
    if len(index) == 0:
        raise ExtractionError(f"{data.name}: an in-distribution pool needs at least one row")
    return data.features[index].float().clone()


def random_pool(
    input_shape: tuple[int, ...], n: int, bounds: tuple[float, float] = (0.0, 1.0), seed: int = 0
) -> Tensor:
    """`n` inputs with independent uniform features in `bounds` (float32): Tramèr et al.
    2016, Sec. 5, "random queries" drawn uniformly from the input domain."""
    shape, n, (low, high) = _shape(input_shape), _count("pool size", n, 1), _bounds(bounds)
    rng = np.random.default_rng(_count("seed", seed, 0))
    return torch.from_numpy(rng.uniform(low, high, size=(n, *shape)).astype(np.float32))


def _photographs() -> list[np.ndarray]:
    """scikit-learn's two sample photographs as float (H, W, 3) arrays in [0, 1]."""
    from sklearn.datasets import load_sample_images

    return [np.asarray(image, dtype=np.float64) / 255.0 for image in load_sample_images().images]


def _image_patches(
    shape: tuple[int, int, int], n: int, bounds: tuple[float, float], rng: np.random.Generator
) -> Tensor:
    channels, height, width = shape
    photos = _photographs()
    patches = []
    for _ in range(n):
        photo = photos[int(rng.integers(len(photos)))]
        side = int(rng.integers(16, min(photo.shape[:2]) // 2 + 1))
        top = int(rng.integers(photo.shape[0] - side + 1))
        left = int(rng.integers(photo.shape[1] - side + 1))
        patch = photo[top : top + side, left : left + side]
        if rng.random() < 0.5:
            patch = patch[:, ::-1]
        if channels == 1:
            patch = (patch @ np.asarray(LUMINANCE))[..., None]
        elif channels != 3:
            patch = np.repeat((patch @ np.asarray(LUMINANCE))[..., None], channels, axis=2)
        patches.append(
            F.interpolate(
                torch.from_numpy(np.ascontiguousarray(patch.transpose(2, 0, 1)))[None],
                size=(height, width),
                mode="area",
            )[0]
        )
    images = torch.stack(patches)
    flat = images.reshape(n, -1)
    low, high = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    flat = (flat - low) / (high - low).clamp_min(1e-12)
    return (bounds[0] + (bounds[1] - bounds[0]) * flat).reshape(images.shape).float()


def out_of_distribution_pool(
    input_shape: tuple[int, ...],
    n: int,
    seed: int = 0,
    *,
    bounds: tuple[float, float] = (0.0, 1.0),
    reference: Tensor | np.ndarray | None = None,
) -> Tensor:
    """`n` unlabelled inputs from another distribution than the victim's (float32).

    Images (`input_shape` = (C, H, W)): random square patches (16 pixels to half the shorter
    side, random position and horizontal flip) of scikit-learn's two sample photographs,
    grey-scaled (BT.601) when C = 1, area-resized to H x W and contrast-stretched to `bounds`:
    the natural-image "different distribution" of Orekondy et al. 2019, Sec. 4.1. Tabular
    inputs (`input_shape` = (d,)): with `reference` rows (n_ref, d), each column resampled
    independently from that column (marginals kept, the joint distribution broken); without,
    uniform rows in `bounds`."""
    shape, n, bounds = _shape(input_shape), _count("pool size", n, 1), _bounds(bounds)
    rng = np.random.default_rng(_count("seed", seed, 0))
    if len(shape) == 3:
        return _image_patches(shape, n, bounds, rng)  # type: ignore[arg-type]
    if reference is None:
        return random_pool(shape, n, bounds, seed)
    table = np.asarray(torch.as_tensor(reference).detach().cpu().numpy(), dtype=np.float64)
    if table.ndim < 2 or tuple(table.shape[1:]) != shape or len(table) == 0:
        raise ExtractionError(
            f"reference rows have shape {tuple(table.shape)}, expected (n >= 1, "
            f"{', '.join(map(str, shape))})"
        )
    flat = table.reshape(len(table), -1)
    picks = rng.integers(len(flat), size=(n, flat.shape[1]))
    columns = np.arange(flat.shape[1])[None, :]
    return torch.from_numpy(flat[picks, columns].reshape(n, *shape).astype(np.float32))
