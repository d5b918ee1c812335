"""Critical points of a piecewise-linear function along lines, located exactly, and the jump
of its input gradient there.

Carlini, Jagielski & Mironov 2020 (Cryptanalytic extraction of neural network models), Sec. 4.2
("finding critical points"): restricted to a line x0 + t·v, a ReLU network is piecewise linear
in t; a segment [a, b] holding one kink is recognised by extrapolating the linear pieces at both
ends (slopes from two close points) and checking that they meet at a point whose value the
oracle confirms; the kink is then the intersection of the two pieces — exact up to float64
rounding, not a bisection tolerance — re-computed from points far apart on each piece (their
"precision refinement" of a critical point). Segments that fail the check are halved (Rolnick &
Kording 2020, Alg. 1, binary search for boundary points). Several logits are searched jointly
through one random projection (a kink is missed only if its gradient jump is orthogonal to it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privacylab.attacks.extraction.base import ExtractionError
from privacylab.attacks.extraction.relu.oracle import Oracle


@dataclass
class Kink:
    """A critical point: input `x`, the line it was found on (`x0 + t·v`) and the largest
    distance `room` (in t) to either side that stays inside the two linear pieces."""

    x: np.ndarray
    x0: np.ndarray
    v: np.ndarray
    t: float
    room: float


class Line:
    """The projected output phi(t) = r·f(x0 + t·v) along one line."""

    def __init__(self, oracle: Oracle, x0: np.ndarray, v: np.ndarray, r: np.ndarray) -> None:
        self.oracle, self.x0, self.v, self.r = oracle, x0, v, r

    def __call__(self, ts: list[float] | np.ndarray) -> np.ndarray:
        ts = np.asarray(ts, dtype=np.float64)
        return self.oracle(self.x0[None, :] + ts[:, None] * self.v[None, :]) @ self.r


def _meet(a: float, fa: float, sa: float, b: float, fb: float, sb: float) -> float:
    """Where the line through (a, fa) of slope sa meets the one through (b, fb) of slope sb."""
    return (fb - fa + sa * a - sb * b) / (sa - sb)


def find_kinks(
    line: Line,
    a: float = 0.0,
    b: float = 1.0,
    rtol: float = 1e-9,
    min_width: float = 1e-9,
    max_kinks: int = 2000,
    max_unresolved: int = 4,
    max_segments: int = 8000,
) -> list[Kink]:
    """Every kink of `line` in [a, b] (those whose slope change is above `rtol` of the
    function's scale), each located as the intersection of its two linear pieces and verified
    by one more query (Carlini et al. 2020, Sec. 4.2 and 5.3). More than `max_unresolved`
    segments shorter than `min_width` that are neither linear nor one kink, more than
    `max_segments` segments or `max_kinks` kinks on one line, mean the function is not
    piecewise linear (not a ReLU network, or not answered in float64): ExtractionError."""
    unresolved = segments = 0
    fa, fb = line([a, b])
    stack = [(a, b, float(fa), float(fb))]
    found: list[Kink] = []
    while stack:
        a, b, fa, fb = stack.pop()
        width = b - a
        eps = width * 1e-4
        ga, gb = line([a + eps, b - eps])
        sa, sb = (ga - fa) / eps, (fb - gb) / eps
        tol = rtol * (1.0 + abs(fa) + abs(fb) + (abs(sa) + abs(sb)) * width)
        if abs(fa + sa * width - fb) <= tol and abs(sa - sb) * width <= tol:
            continue
        t = _meet(a, fa, sa, b, fb, sb) if abs(sa - sb) * width > tol else np.nan
        if a + eps < t < b - eps:
            gap = min(t - a, b - t) * 1e-3
            fl, fr = line([t - gap, t + gap])
            sl = (fl - fa) / (t - gap - a)
            sr = (fb - fr) / (b - t - gap)
            if abs(sl - sr) * width > tol:
                t2 = _meet(a, fa, sl, b, fb, sr)
                if a < t2 < b:
                    ft, fl2, fr2 = line([t2, 0.5 * (a + t2), 0.5 * (t2 + b)])
                    if (
                        abs(ft - (fa + sl * (t2 - a))) <= tol
                        and abs(ft - (fb + sr * (t2 - b))) <= tol
                        and abs(fl2 - (fa + sl * 0.5 * (t2 - a))) <= tol
                        and abs(fr2 - (fb - sr * 0.5 * (b - t2))) <= tol
                    ):
                        x = line.x0 + t2 * line.v
                        found.append(Kink(x, line.x0, line.v, float(t2), min(t2 - a, b - t2)))
                        continue
        segments += 1
        if width < min_width:
            unresolved += 1
        if unresolved > max_unresolved or segments > max_segments or len(found) > max_kinks:
            raise ExtractionError(
                "relu-exact: the target's logits are not piecewise linear along a line "
                "(not a ReLU network, or not answered in float64)"
            )
        if width < min_width:
            continue
        m = 0.5 * (a + b)
        (fm,) = line([m])
        stack.append((m, b, float(fm), fb))
        stack.append((a, m, fa, float(fm)))
    return found


def jacobian(oracle: Oracle, x: np.ndarray, step: float) -> np.ndarray:
    """The (k, d) Jacobian of the oracle at `x` by forward differences of size `step` (exact
    up to rounding inside a linear region): d + 1 queries."""
    d = x.shape[0]
    points = np.repeat(x[None, :], d + 1, axis=0)
    points[1:] += step * np.eye(d)
    out = oracle(points)
    return ((out[1:] - out[0][None, :]) / step).T


def gradient_jump(oracle: Oracle, kink: Kink, step: float) -> tuple[np.ndarray, float]:
    """The unit direction u of the rank-one jump of the Jacobian across `kink` (J+ − J− =
    g·uᵀ; Carlini et al. 2020, Sec. 4.3, first-layer weights from the gradient difference),
    and how far from rank one the jump is (second/first singular value)."""
    rho = 0.5 * kink.room
    norm_v = float(np.linalg.norm(kink.v))
    h = min(step, 0.25 * rho * norm_v)
    plus = jacobian(oracle, kink.x0 + (kink.t + rho) * kink.v, h)
    minus = jacobian(oracle, kink.x0 + (kink.t - rho) * kink.v, h)
    _, s, vt = np.linalg.svd(plus - minus, full_matrices=False)
    ratio = float(s[1] / s[0]) if len(s) > 1 and s[0] > 0 else 0.0
    return vt[0], ratio
