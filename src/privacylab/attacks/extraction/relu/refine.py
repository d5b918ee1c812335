"""Precision refinement of recovered hidden neurons (Carlini, Jagielski & Mironov 2020,
Sec. 5.3, "precision refinement"): a row found from one gradient jump carries the error of
finite differences (~1e-9). Given its approximate hyperplane, many lines are drawn across it;
on each, the oracle's two linear pieces on either side of the predicted crossing are measured
(three points a side) and intersected, which puts a critical point exactly on the true
boundary (up to float64 rounding). The row is then refitted as the null vector (SVD) of the
matrix [h_{j−1}(x*), 1] over these points, in the previous layer's activation space."""

from __future__ import annotations

import numpy as np

from privacylab.attacks.extraction.relu.layers import Network, zero_crossings
from privacylab.attacks.extraction.relu.oracle import Oracle


def crossings(
    net: Network, depth: int, w: np.ndarray, b: float, x0: np.ndarray, v: np.ndarray
) -> np.ndarray:
    """For each line x0[i] + t·v[i], the first t in (0, 1) where the layer-`depth` neuron
    (w, b) changes sign (NaN if none); closed form for the first layer."""
    if depth == 1:
        a, c = x0 @ w + b, v @ w
        with np.errstate(divide="ignore", invalid="ignore"):
            t = -a / c
        return np.where((t > 0) & (t < 1), t, np.nan)
    out = np.full(len(x0), np.nan)
    for i in range(len(x0)):
        ts = zero_crossings(net, depth, w, b, x0[i], v[i], grid=32)
        if ts:
            out[i] = ts[0]
    return out


def exact_points(
    oracle: Oracle, r: np.ndarray, x0: np.ndarray, v: np.ndarray, t: np.ndarray, gap: np.ndarray
) -> np.ndarray:
    """Critical points near the predicted crossings t (one oracle call): on each line, the
    pieces through t−3g, t−2g, t−g and t+g, t+2g, t+3g, each checked to be straight, are
    intersected; rows whose pieces bend, do not jump, or meet farther than g/2 from t are
    dropped."""
    offsets = np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0])
    ts = t[:, None] + offsets[None, :] * gap[:, None]
    pts = x0[:, None, :] + ts[:, :, None] * v[:, None, :]
    f = (oracle(pts.reshape(-1, x0.shape[1])) @ r).reshape(len(t), 6)
    sl = (f[:, 2] - f[:, 0]) / (2 * gap)
    sr = (f[:, 5] - f[:, 3]) / (2 * gap)
    noise = 1e-13 * (1.0 + np.abs(f).max(1))
    bend_l = np.abs(f[:, 0] + f[:, 2] - 2 * f[:, 1])
    bend_r = np.abs(f[:, 3] + f[:, 5] - 2 * f[:, 4])
    jump = np.abs(sl - sr) * gap
    with np.errstate(divide="ignore", invalid="ignore"):
        tt = (f[:, 3] - f[:, 2] + sl * ts[:, 2] - sr * ts[:, 3]) / (sl - sr)
    ok = (
        (jump > 1e4 * noise)
        & (bend_l < 1e-4 * jump + 10 * noise)
        & (bend_r < 1e-4 * jump + 10 * noise)
        & (np.abs(tt - t) < 0.5 * gap)
    )
    return x0[ok] + tt[ok, None] * v[ok]


def refit_row(h: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, float] | None:
    """The row [w, b] with [h, 1]·row = 0 over the critical points' previous-layer activations
    h (smallest right singular vector, on the coordinates active at some point; the others
    keep `row`'s values; points more than 10× the median residual off are dropped and the fit
    repeated, at most twice), scaled to `row`'s orientation and unit norm; and the largest
    relative residual of the points kept. None when the points do not determine it."""
    a = np.hstack([h, np.ones((len(h), 1))])
    known = np.abs(a).max(0) > 0
    sub = a[:, known]
    if sub.shape[0] < sub.shape[1] + 2:
        return None
    norms = np.linalg.norm(sub, axis=0)
    norms[norms == 0] = 1.0
    use = np.ones(len(sub), dtype=bool)
    for _ in range(3):
        if int(use.sum()) < sub.shape[1] + 2:
            return None
        _, s, vt = np.linalg.svd(sub[use] / norms, full_matrices=False)
        null = vt[-1] / norms
        err = np.abs(sub @ null) / (np.abs(sub) @ np.abs(null))
        cut = max(10.0 * float(np.median(err[use])), 1e-15)
        if (err[use] <= cut).all():
            break
        use = err <= cut
    if s[-2] <= 1e3 * s[-1]:
        return None
    old = np.nan_to_num(row[known])
    c = float(old @ null) / float(null @ null)
    if c == 0:
        return None
    new = row.copy()
    new[known] = c * null
    residual = float(err[use].max())
    return new / np.linalg.norm(np.nan_to_num(new)), residual
