"""Reconstruction quality, defined once, in [0, 1] pixel space: every gradient-inversion and
model-inversion result, benchmark and report picture is scored here.

Images are arrays (n, C, H, W) or (n, H, W) (or one image without the leading n). They are
first clipped to their `bounds` and rescaled to [0, 1], so a model fed normalised pixels is
still scored on the pixels a person sees (the reference tools' users report PSNR computed on
normalised tensors, which inflates it).

- MSE: mean squared pixel error per image.
- PSNR: 10 log10(1 / MSE) dB (peak 1), capped at `PSNR_CAP` for a perfect copy.
- SSIM: Wang et al. 2004, "Image Quality Assessment: From Error Visibility to Structural
  Similarity", Eq. 13 with local statistics over a 7x7 uniform window, sample covariances,
  K1 = 0.01, K2 = 0.03, data range 1, averaged over the window positions that fit inside the
  image and over channels (the defaults of scikit-image's `structural_similarity`).
- `match`: a batch is recovered in any order (Zhu et al. 2019, Fig. 4), so reconstructions are
  paired with the true images by the assignment minimising the total MSE (Kuhn's Hungarian
  method, `scipy.optimize.linear_sum_assignment`).
- `label_accuracy`: the share of a batch's labels recovered, as multisets (order-free).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from scipy.ndimage import uniform_filter
from scipy.optimize import linear_sum_assignment

from privacylab.stats._checks import StatisticsError

__all__ = [
    "PSNR_CAP",
    "SSIM_WINDOW",
    "image_scores",
    "label_accuracy",
    "match",
    "mse",
    "psnr",
    "ssim",
    "to_unit",
]

PSNR_CAP = 100.0
"""PSNR reported for identical images (MSE 0): 100 dB, i.e. MSE 1e-10."""

SSIM_WINDOW = 7
K1, K2 = 0.01, 0.03


def _batch(x: object, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 2:
        arr = arr[None, None]
    elif arr.ndim == 3:
        arr = arr[:, None]
    if arr.ndim != 4 or arr.shape[0] == 0:
        raise StatisticsError(
            f"{name} must be images (n, C, H, W), (n, H, W) or one (H, W), got shape {np.shape(x)}"
        )
    if not np.isfinite(arr).all():
        raise StatisticsError(f"{name} contains NaN or infinite pixels")
    return arr


def _pair(a: object, b: object) -> tuple[np.ndarray, np.ndarray]:
    x, y = _batch(a, "reconstruction"), _batch(b, "truth")
    if x.shape != y.shape:
        raise StatisticsError(f"images differ in shape: {x.shape} vs {y.shape}")
    return x, y


def to_unit(x: object, bounds: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """`x` clipped to `bounds` = (low, high) and rescaled to [0, 1] (float64)."""
    low, high = (float(b) for b in bounds)
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        raise StatisticsError(f"bounds must be finite with low < high, got {bounds!r}")
    arr = np.asarray(x, dtype=np.float64)
    return (np.clip(arr, low, high) - low) / (high - low)


def mse(a: object, b: object) -> np.ndarray:
    """Mean squared error per image, shape (n,)."""
    x, y = _pair(a, b)
    return ((x - y) ** 2).reshape(len(x), -1).mean(1)


def psnr(a: object, b: object) -> np.ndarray:
    """Peak signal-to-noise ratio per image in dB (peak 1), capped at `PSNR_CAP`."""
    return _psnr(mse(a, b))


def _psnr(err: np.ndarray) -> np.ndarray:
    return np.minimum(10.0 * np.log10(1.0 / np.maximum(err, 10 ** (-PSNR_CAP / 10))), PSNR_CAP)


def ssim(a: object, b: object) -> np.ndarray:
    """Structural similarity per image (Wang et al. 2004, Eq. 13), in [-1, 1]; images smaller
    than the 7x7 window use a window of their smaller side (made odd)."""
    x, y = _pair(a, b)
    side = min(SSIM_WINDOW, x.shape[2], x.shape[3])
    win = side if side % 2 else side - 1
    if win < 1:
        raise StatisticsError(f"images of {x.shape[2]}x{x.shape[3]} pixels are too small")
    size = (1, 1, win, win)
    ux, uy = uniform_filter(x, size), uniform_filter(y, size)
    uxx, uyy, uxy = (uniform_filter(v, size) for v in (x * x, y * y, x * y))
    points = win * win
    norm = points / (points - 1) if points > 1 else 1.0
    vx, vy, vxy = norm * (uxx - ux * ux), norm * (uyy - uy * uy), norm * (uxy - ux * uy)
    c1, c2 = K1**2, K2**2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux**2 + uy**2 + c1) * (vx + vy + c2))
    pad = (win - 1) // 2
    h, w = x.shape[2], x.shape[3]
    s = s[:, :, pad : h - pad, pad : w - pad]
    return s.reshape(len(x), -1).mean(1)


def match(reconstruction: object, truth: object) -> np.ndarray:
    """`order` with reconstruction[order[i]] paired with truth[i], minimising total MSE."""
    x, y = _pair(reconstruction, truth)
    cost = ((x.reshape(len(x), 1, -1) - y.reshape(1, len(y), -1)) ** 2).mean(2)
    rows, cols = linear_sum_assignment(cost)
    order = np.empty(len(y), dtype=np.int64)
    order[cols] = rows
    return order


def label_accuracy(
    predicted: Sequence[int] | np.ndarray, true: Sequence[int] | np.ndarray
) -> float:
    """Share of `true` labels found in `predicted`, both taken as multisets (a batch's labels
    are recovered without their order)."""
    p, t = [int(v) for v in np.ravel(predicted)], [int(v) for v in np.ravel(true)]
    if not t:
        raise StatisticsError("label accuracy needs at least one true label")
    found = sum((Counter(p) & Counter(t)).values())
    return found / len(t)


def image_scores(
    reconstruction: object, truth: object, bounds: tuple[float, float] = (0.0, 1.0)
) -> dict[str, object]:
    """Both batches mapped to [0, 1] from `bounds`, matched (`match`), and scored: per-image
    and mean `mse`, `psnr`, `ssim`, and the `order` used."""
    x, y = to_unit(reconstruction, bounds), to_unit(truth, bounds)
    order = match(x, y)
    paired = _batch(x, "reconstruction")[order]
    err = mse(paired, y)
    per = {"mse": err, "psnr": _psnr(err), "ssim": ssim(paired, y)}
    out: dict[str, object] = {k: float(np.mean(v)) for k, v in per.items()}
    out["per_example"] = [{k: float(per[k][i]) for k in per} for i in range(len(order))]
    out["order"] = [int(i) for i in order]
    return out
