"""Layer-by-layer recovery of the hidden neurons from critical points.

Rolnick & Kording 2020 (Reverse-engineering deep ReLU networks), Alg. 1 and 2, with the
gradient-jump solve of Carlini, Jagielski & Mironov 2020, Sec. 4.3 and 4.4: at a critical point
x* of neuron m of layer j the input-gradient jump is proportional to J_{j−1}(x*)ᵀ w_m, where
J_{j−1} is the Jacobian of the (already recovered) layer j−1 at x*; solving for w_m on the
coordinates active at x* and setting b_m = −w_m·h_{j−1}(x*) gives the neuron up to scale on
those coordinates. Critical points of the same neuron agree on their common coordinates
(up to scale): they are merged into one row ("unification", Carlini et al. Sec. 4.4). A
candidate row is accepted only after the seed's test (Rolnick & Kording, Alg. 1, last step):
on fresh random lines, the oracle must have a kink exactly where the recovered neuron's
pre-activation crosses zero; kinks of deeper neurons fail it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from privacylab.attacks.extraction.relu.critical import Line


@dataclass
class Network:
    """The hidden layers recovered so far, rows scaled to unit norm of [w, b] (the positive
    scale is a symmetry of the network), their signs fixed for all but possibly the last."""

    layers: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def hidden(self, x: np.ndarray, depth: int | None = None) -> np.ndarray:
        """h_depth(x) for rows x (depth 0: x itself)."""
        h = np.atleast_2d(x)
        for w, b in self.layers[: len(self.layers) if depth is None else depth]:
            h = np.maximum(h @ w.T + b, 0.0)
        return h

    def jacobian(self, x: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """h_depth(x) and its Jacobian with respect to x (for one point x)."""
        h = x.copy()
        jac = np.eye(x.shape[0])
        for w, b in self.layers[:depth]:
            z = w @ h + b
            active = z > 0
            h = np.where(active, z, 0.0)
            jac = (w @ jac) * active[:, None]
        return h, jac

    def preactivations(self, x: np.ndarray, depth: int) -> np.ndarray:
        """Pre-activations of layer `depth` (1-based) at rows x, each divided by the scale of
        its row's input, so that |value| is a relative distance to the neuron's boundary."""
        w, b = self.layers[depth - 1]
        h = self.hidden(x, depth - 1)
        scale = np.abs(h) @ np.abs(w).T + np.abs(b)[None, :] + 1e-300
        return (h @ w.T + b) / scale


def partial_row(
    net: Network, depth: int, x: np.ndarray, u: np.ndarray, atol: float = 1e-6
) -> np.ndarray | None:
    """The row [w, b] of a layer-`depth` neuron with a kink at x and gradient-jump direction
    u, known on the coordinates of layer depth−1 active at x (NaN elsewhere), scaled to unit
    norm; None when it is not determined (more active coordinates than the Jacobian's rank)
    or u is not in the span (not this layer's kink)."""
    h, jac = net.jacobian(x, depth - 1)
    active = np.flatnonzero(h > 0) if depth > 1 else np.arange(x.shape[0])
    if len(active) == 0:
        return None
    basis = jac[active].T
    sol, _, rank, sv = np.linalg.lstsq(basis, u, rcond=None)
    if rank < len(active) or sv[-1] < 1e-8 * sv[0]:
        return None
    if np.linalg.norm(basis @ sol - u) > atol:
        return None
    row = np.full(h.shape[0] + 1, np.nan)
    row[active] = sol
    row[-1] = -float(sol @ h[active])
    return row / np.linalg.norm(row[~np.isnan(row)])


@dataclass
class Cluster:
    """Critical points believed to belong to one neuron and the row they determine so far."""

    row: np.ndarray
    points: list[np.ndarray]

    @property
    def complete(self) -> bool:
        return not bool(np.isnan(self.row).any())


def _parallel(a: np.ndarray, b: np.ndarray, min_overlap: int, tol: float) -> float | None:
    """The scale c with a ≈ c·b on their common known coordinates, or None."""
    common = ~np.isnan(a) & ~np.isnan(b)
    if int(common.sum()) < min_overlap:
        return None
    x, y = a[common], b[common]
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    if nx == 0 or ny == 0:
        return None
    cos = float(x @ y) / (nx * ny)
    if 1.0 - abs(cos) > tol:
        return None
    return float(x @ y) / float(y @ y)


def _absorb(into: Cluster, row: np.ndarray, points: list[np.ndarray], tol: float) -> bool:
    """Fill `into`'s unknown coordinates from `row` (rescaled) and take `points`, if the two
    rows agree on at least min(3, length) common coordinates."""
    scale = _parallel(into.row, row, min(3, row.shape[0]), tol)
    if scale is None:
        return False
    fill = np.isnan(into.row) & ~np.isnan(row)
    into.row[fill] = scale * row[fill]
    into.points.extend(points)
    return True


def add_to_clusters(
    clusters: list[Cluster], row: np.ndarray, point: np.ndarray, tol: float = 1e-8
) -> None:
    """Merge `row` into the first cluster it agrees with (Carlini et al. Sec. 4.4, merging
    partial rows by their overlap), or start a new one."""
    for cluster in clusters:
        if _absorb(cluster, row, [point], tol):
            return
    clusters.append(Cluster(row.copy(), [point]))


def merge_clusters(clusters: list[Cluster], tol: float = 1e-8) -> list[Cluster]:
    """Clusters that agree on their overlap joined (a neuron seen in disjoint regions first)."""
    merged: list[Cluster] = []
    for cluster in sorted(clusters, key=lambda c: -int((~np.isnan(c.row)).sum())):
        for into in merged:
            if _absorb(into, cluster.row, cluster.points, tol):
                break
        else:
            merged.append(Cluster(cluster.row.copy(), list(cluster.points)))
    return merged


def zero_crossings(
    net: Network, depth: int, w: np.ndarray, b: float, x0: np.ndarray, v: np.ndarray, grid: int
) -> list[float]:
    """The t in [0, 1] where w·h_{depth−1}(x0 + t·v) + b changes sign, located exactly (the
    function is piecewise linear in t and known: no queries)."""
    ts = np.linspace(0.0, 1.0, grid)

    def value(t: np.ndarray) -> np.ndarray:
        return net.hidden(x0[None, :] + t[:, None] * v[None, :], depth - 1) @ w + b

    vals = value(ts)
    out = []
    for i in np.flatnonzero(np.sign(vals[:-1]) * np.sign(vals[1:]) < 0):
        lo, hi, flo, fhi = ts[i], ts[i + 1], vals[i], vals[i + 1]
        for _ in range(60):
            mid = lo - flo * (hi - lo) / (fhi - flo)
            if not lo < mid < hi:
                mid = 0.5 * (lo + hi)
            (fm,) = value(np.array([mid]))
            if fm == 0 or hi - lo < 1e-15:
                break
            if np.sign(fm) == np.sign(flo):
                lo, flo = mid, fm
            else:
                hi, fhi = mid, fm
        out.append(float(mid))
    return out


def kink_at(line: Line, t: float, gap: float) -> bool | None:
    """Whether the oracle has a kink at t on `line` (6 queries): the pieces through t−3g, t−2g,
    t−g and t+g, t+2g, t+3g, each straight, are intersected (Carlini et al. 2020, Sec. 4.2);
    True when they meet within g/2 of t, False when they meet elsewhere. None when no slope
    change is visible (the neuron's effect is masked there, or no kink at all: a wrong
    candidate gets only None) or a side bends (another kink nearby)."""
    f = line([t - 3 * gap, t - 2 * gap, t - gap, t + gap, t + 2 * gap, t + 3 * gap])
    sl, sr = (f[2] - f[0]) / (2 * gap), (f[5] - f[3]) / (2 * gap)
    noise = 1e-12 * (1.0 + float(np.abs(f).max()))
    jump = abs(sl - sr) * gap
    if jump <= 1e3 * noise:
        return None
    if max(abs(f[0] + f[2] - 2 * f[1]), abs(f[3] + f[5] - 2 * f[4])) > 1e-4 * jump + 10 * noise:
        return None
    meet = (f[3] - f[2] + sl * (t - gap) - sr * (t + gap)) / (sl - sr)
    return bool(abs(meet - t) < 0.5 * gap)
