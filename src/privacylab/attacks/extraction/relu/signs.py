"""Signs of recovered neurons: a hyperplane gives a row up to a nonzero scale; the positive
part is a symmetry of the network, the sign is not.

- `last_layer_fit`: exact, for the last hidden layer. f(x) = Σ_i a_i relu(z_i) + c and
  relu(−z) = relu(z) − z, so regressing the logits on [relu(ẑ_i), h_{L−1}, 1] over random
  inputs gives coefficients α_i and a linear part γ = −Σ_{flipped i} α_i w_i (ẑ_i = w_i·h + b_i):
  solving γ for the 0/1 flip indicators is one least-squares problem (the brief's regression;
  cf. Canales-Martínez et al. 2024, Sec. 3, on why the last layer is the easy case).
- `freeze_sign`: exact, for a neuron whose input-space gradient is not in the span of its
  layer's other neurons' gradients at a critical point (contractive layers; Carlini et al.
  2020, Sec. 4.4 "recovering the sign"): moving along the part of the gradient orthogonal to
  the others changes only that neuron's pre-activation, so the oracle's output changes on the
  active side only.
- `wiggle_sign`: Canales-Martínez, Chávez-Saab, Hambitzer, Rodríguez-Henríquez, Satpute and
  Shamir 2024 (Polynomial-time sign recovery, the neuron wiggle, Sec. 4): a move that changes the
  neuron's pre-activation most relative to the others' changes the output more on its active
  side; the vote over several critical points decides.
"""

from __future__ import annotations

import numpy as np

from privacylab.attacks.extraction.relu.layers import Network
from privacylab.attacks.extraction.relu.oracle import Oracle


def _binary_solve(system: np.ndarray, target: np.ndarray, exhaustive: int = 20) -> np.ndarray:
    """The 0/1 vector s minimising ‖system·s − target‖: least squares rounded, then (when that
    is not exact) every vector for up to `exhaustive` unknowns — the system is
    under-determined when the layer is wider than its input — else greedy single flips."""
    s, *_ = np.linalg.lstsq(system, target, rcond=None)
    best = s > 0.5
    scale = np.linalg.norm(target) + 1e-300

    def cost(v: np.ndarray) -> float:
        return float(np.linalg.norm(system @ v.astype(float) - target))

    if cost(best) <= 1e-7 * scale:
        return best
    n = system.shape[1]
    if n <= exhaustive:
        bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
        costs = np.concatenate(
            [
                np.linalg.norm(bits[i : i + 65536] @ system.T - target[None, :], axis=1)
                for i in range(0, 2**n, 65536)
            ]
        )
        return bits[int(np.argmin(costs))].astype(bool)
    current = cost(best)
    improved = True
    while improved:
        improved = False
        for i in range(n):
            best[i] = ~best[i]
            trial = cost(best)
            if trial < current:
                current, improved = trial, True
            else:
                best[i] = ~best[i]
    return best


def last_layer_fit(
    net: Network, w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Signs and read-out of the last hidden layer (rows w, b) from logits y (n, k) at
    inputs x: returns the flip indicators, the output weights α (k, n) on the flipped rows'
    activations, the linear part Γ (k, m) on the previous layer's activations h, the bias c
    (k,), and the relative residual of the flip solve.

    f = α·relu(ẑ) + Γ0·h + c exactly (relu(−z) = relu(z) − z); a flipped row adds −α_i w_i
    to Γ0, so with no always-active neuron (Γ = 0) the 0/1 flips solve Γ0 = −Σ s_i α_i w_iᵀ
    exactly. Always-active neurons of the last layer are invisible (they never kink) and add an
    arbitrary linear part; then signs are not identifiable from f at all (any flip is absorbed
    by the linear part) and the least-squares rounding is kept, the linear part returned."""
    h = net.hidden(x)
    z = h @ w.T + b
    n, m = w.shape[0], h.shape[1]
    design = np.hstack([np.maximum(z, 0.0), h, np.ones((len(x), 1))])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    alpha, gamma = coef[:n], coef[n : n + m]
    system = -np.einsum("ic,iu->uci", alpha, w).reshape(-1, n)
    flips = _binary_solve(system, gamma.reshape(-1))
    linear = gamma.reshape(-1) - system @ flips.astype(float)
    residual = float(np.linalg.norm(linear) / (np.linalg.norm(gamma) + 1e-300))
    sign = np.where(flips, -1.0, 1.0)
    zf = z * sign
    design = np.hstack([np.maximum(zf, 0.0), h, np.ones((len(x), 1))])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    return flips, coef[:n].T.copy(), coef[n : n + m].T.copy(), coef[-1].copy(), residual


def _layer_gradients(
    net: Network, depth: int, w: np.ndarray, i: int, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Input gradients of the layer-`depth` pre-activations (rows w) at x: neuron i's and
    the others'."""
    _, jac = net.jacobian(x, depth - 1)
    grads = w @ jac
    return grads[i], np.delete(grads, i, axis=0)


def freeze_sign(
    oracle: Oracle,
    net: Network,
    depth: int,
    w: np.ndarray,
    i: int,
    x: np.ndarray,
    step: float,
    rtol: float = 1e-9,
) -> bool | None:
    """At x on neuron i's boundary: True if its row's sign is right, False if it must flip,
    None when the test cannot tell (gradient in the others' span, or no visible change)."""
    gi, others = _layer_gradients(net, depth, w, i, x)
    others = others[np.linalg.norm(others, axis=1) > 0]
    if len(others):
        coef, *_ = np.linalg.lstsq(others.T, gi, rcond=None)
        delta = gi - others.T @ coef
    else:
        delta = gi
    if np.linalg.norm(delta) <= 1e-6 * np.linalg.norm(gi):
        return None
    delta = delta / np.linalg.norm(delta)
    f = oracle(np.stack([x, x + step * delta, x - step * delta]))
    up, down = np.abs(f[1] - f[0]).max(), np.abs(f[2] - f[0]).max()
    tol = rtol * (1.0 + np.abs(f).max())
    if (up > tol) == (down > tol):
        return None
    return bool(up > tol) == bool(gi @ delta > 0)


def wiggle_sign(
    oracle: Oracle,
    net: Network,
    depth: int,
    w: np.ndarray,
    i: int,
    x: np.ndarray,
    step: float,
) -> float:
    """The neuron wiggle at x on neuron i's boundary: a vote in [-1, 1] (positive: the row's
    sign is right), weighted by how lopsided the output change is."""
    gi, others = _layer_gradients(net, depth, w, i, x)
    gram = others.T @ others
    gram += (1e-6 * np.trace(gram) / max(gram.shape[0], 1) + 1e-12) * np.eye(gram.shape[0])
    delta = np.linalg.solve(gram, gi)
    delta = delta / np.linalg.norm(delta)
    if gi @ delta < 0:
        delta = -delta
    f = oracle(np.stack([x, x + step * delta, x - step * delta]))
    up, down = np.linalg.norm(f[1] - f[0]), np.linalg.norm(f[2] - f[0])
    if up + down == 0:
        return 0.0
    return float((up - down) / (up + down))


def _consistent(grads: np.ndarray, z: np.ndarray, u: np.ndarray, sign: np.ndarray) -> int:
    """+1 if u lies in the span of the gradients of the neurons active under `sign`, −1 if
    not, 0 when the test says nothing (the active gradients already span their space)."""
    active = z * sign > 0
    rows = grads[active]
    if len(rows) == 0:
        return -1
    rank_all = np.linalg.matrix_rank(grads, tol=1e-9 * np.abs(grads).max())
    sol, _, rank, _ = np.linalg.lstsq(rows.T, u, rcond=None)
    if rank >= rank_all:
        return 0
    return 1 if np.linalg.norm(rows.T @ sol - u) <= 1e-6 else -1


def consistency_signs(
    net: Network,
    depth: int,
    w: np.ndarray,
    b: np.ndarray,
    points: list[np.ndarray],
    directions: list[np.ndarray],
    start: np.ndarray,
) -> tuple[np.ndarray, int, int]:
    """Signs of layer `depth` that explain the deeper critical points (Carlini et al. 2020,
    Sec. 4.4: a deeper neuron's gradient jump u at x* lies in the span of the input gradients
    of the layer's neurons *active* at x*). With wrong signs the active sets are wrong and u
    falls outside their span wherever fewer neurons are active than the layer's rank. Greedy
    single flips from `start` (±1 per neuron) while the number of contradicted points drops;
    returns the signs, the points contradicted and the points that were informative."""
    cache = []
    for x, u in zip(points, directions, strict=True):
        h, jac = net.jacobian(x, depth - 1)
        cache.append((w @ jac, w @ h + b, u))

    def score(sign: np.ndarray) -> tuple[int, int]:
        votes = [_consistent(g, z, u, sign) for g, z, u in cache]
        return sum(v < 0 for v in votes), sum(v != 0 for v in votes)

    sign = start.astype(float).copy()
    bad, informative = score(sign)
    while bad > 0:
        best = None
        for i in range(len(sign)):
            sign[i] = -sign[i]
            trial, _ = score(sign)
            sign[i] = -sign[i]
            if trial < bad and (best is None or trial < best[0]):
                best = (trial, i)
        if best is None:
            break
        bad = best[0]
        sign[best[1]] = -sign[best[1]]
    _, informative = score(sign)
    return sign, bad, informative
