"""`relu-exact`: functionally-equivalent extraction of a fully connected ReLU network from
float64 logits, without knowing its widths or depth.

Rolnick & Kording 2020 (seed 000), Alg. 1 (layer 1: critical points on random lines, a
hyperplane per neuron, verified on fresh lines) and Alg. 2 (deeper layers: boundaries in the
space of the known layer's activations), with the exact critical-point location, gradient-jump
solve, partial-row unification and float64 precision of Carlini, Jagielski & Mironov 2020, and
the sign recovery of Canales-Martínez et al. 2024 (see `signs`). Depth by depth: collect
critical points on random lines through the domain; those not on a known neuron's boundary are
solved for a row of the current layer (`layers.partial_row`), merged by overlap and accepted
once the seed's kink test passes on fresh lines; when `patience` rounds of lines bring no new
neuron, the layer is closed, its signs recovered, and the search moves one layer deeper. When a
layer brings nothing new, the previous one was the last hidden layer: its signs are fixed by the
exact regression and the output layer by least squares of the logits on [h_L(x), 1].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.extraction.base import (
    ExtractionAttack,
    ExtractionError,
    ExtractionTask,
    Stolen,
    layers_module,
    register_extraction,
)
from privacylab.attacks.extraction.relu.critical import Kink, Line, find_kinks, gradient_jump
from privacylab.attacks.extraction.relu.layers import (
    Cluster,
    Network,
    add_to_clusters,
    kink_at,
    merge_clusters,
    partial_row,
    zero_crossings,
)
from privacylab.attacks.extraction.relu.oracle import Oracle
from privacylab.attacks.extraction.relu.refine import crossings, exact_points, refit_row
from privacylab.attacks.extraction.relu.signs import (
    consistency_signs,
    freeze_sign,
    last_layer_fit,
    wiggle_sign,
)
from privacylab.target import Access, QueryBudgetError, Target


@dataclass
class _Pending:
    """A critical point not yet explained by a known neuron, with its gradient-jump direction."""

    kink: Kink
    u: np.ndarray | None = None
    clustered: bool = False


@dataclass
class _Candidate:
    cluster: Cluster
    accepted: bool = False
    tries: int = 0
    on_boundary: list[np.ndarray] | None = None


@register_extraction("relu-exact")
class ReluExact(ExtractionAttack):
    """Functionally-equivalent extraction of a fully connected ReLU network (float64 logits).

    `lines_per_round` random lines are searched per round; a layer is closed after `patience`
    rounds without a new neuron (at most `max_rounds` per layer, `max_depth` layers); `step` is
    the finite-difference step (relative to the domain width); `verify_lines` fresh lines test
    each candidate neuron; `explain_tol` is the relative distance to a known boundary under
    which a critical point is that neuron's. The oracle is queried anywhere in R^d, not only in
    the box `task.bounds` (where the output error is measured): search points are spread up to
    `spread` box widths around it, and each first-layer search line x0 + t·v is followed over
    t in [−`reach`, 1 + `reach`] (deeper layers: t in [0, 1], their boundaries bend and far
    lines hold many more kinks). With `refine`, every recovered layer is refitted through
    critical points located exactly on its boundaries (Carlini et al. 2020, Sec. 5.3)."""

    threat_model = ThreatModel(Access.LOGITS, ("bounds",))
    exact = True
    needs_float64 = True
    paper = (
        "Rolnick & Kording 2020; Carlini, Jagielski & Mironov 2020; Canales-Martinez et al. 2024"
    )

    def __init__(
        self,
        lines_per_round: int = 4,
        patience: int = 3,
        max_rounds: int = 60,
        max_depth: int = 8,
        step: float = 1e-5,
        verify_lines: int = 8,
        explain_tol: float = 1e-7,
        spread: float = 10.0,
        refine: bool = True,
        reach: float = 4.0,
    ) -> None:
        if lines_per_round < 1 or patience < 1 or max_rounds < 1 or max_depth < 1:
            raise ExtractionError(
                "relu-exact: lines_per_round, patience, max_rounds and max_depth must be >= 1"
            )
        if not 0 < step < 1:
            raise ExtractionError(f"relu-exact: step must be in (0, 1), got {step!r}")
        self.lines_per_round = int(lines_per_round)
        self.patience = int(patience)
        self.max_rounds = int(max_rounds)
        self.max_depth = int(max_depth)
        self.step = float(step)
        self.verify_lines = int(verify_lines)
        self.explain_tol = float(explain_tol)
        if not spread > 0:
            raise ExtractionError(f"relu-exact: spread must be > 0, got {spread!r}")
        self.spread = float(spread)
        self.refine = bool(refine)
        if not reach >= 0:
            raise ExtractionError(f"relu-exact: reach must be >= 0, got {reach!r}")
        self.reach = float(reach)

    def steal(self, target: Target, task: ExtractionTask) -> Stolen:
        run = _Run(self, target, task)
        try:
            run.extract()
        except QueryBudgetError:
            run.stopped = "budget"
        return run.result()


class _Run:
    """One extraction: the state shared by the steps of `ReluExact.steal`."""

    def __init__(self, attack: ReluExact, target: Target, task: ExtractionTask) -> None:
        self.attack = attack
        self.task = task
        self.oracle = Oracle(target, task.input_shape)
        self.rng = np.random.default_rng(task.seed)
        self.low, self.high = task.bounds
        self.width = self.high - self.low
        self.d = self.oracle.d
        r = self.rng.standard_normal(self.oracle.k)
        self.r = r / np.linalg.norm(r)
        self.net = Network()
        self.pending: list[_Pending] = []
        self.output: tuple[np.ndarray, np.ndarray] | None = None
        self.stopped: str | None = None
        self.report: list[dict[str, Any]] = []
        self.kinks_found = 0
        self.boundary: list[list[np.ndarray]] = []
        self.step = attack.step * self.width

    def random_point(self) -> np.ndarray:
        """A query point for search and verification lines. The oracle takes any float64 input
        (Carlini et al. 2020 query all of R^d; the box is only where the output error is
        measured), so two thirds of the points are a uniform point of the box plus Gaussian
        noise of s box widths per coordinate, s log-uniform in [0.1, `spread`]: lines between
        them cross every first-layer hyperplane with constant probability, also those of
        neurons that never switch inside the box (trained networks' neurons that are active
        or inactive on the whole box). The rest are uniform in the box or random corners
        (boundaries near its faces)."""
        u = self.rng.random()
        if u < 2.0 / 3.0:
            scale = np.exp(self.rng.uniform(np.log(0.1), np.log(max(self.attack.spread, 0.1))))
            noise = scale * self.width * self.rng.standard_normal(self.d)
            return self.rng.uniform(self.low, self.high, self.d) + noise
        if u < 5.0 / 6.0:
            return self.rng.uniform(self.low, self.high, self.d)
        return np.where(self.rng.random(self.d) < 0.5, self.low, self.high).astype(np.float64)

    def step_at(self, x: np.ndarray) -> float:
        """The finite-difference step at x: `step` box widths inside the box's radius, growing
        with the distance from its centre beyond it (the outputs, and so their rounding, grow
        about linearly with the distance; inside a linear piece any step is exact)."""
        radius = 0.5 * self.width * np.sqrt(self.d)
        distance = float(np.linalg.norm(x - 0.5 * (self.low + self.high)))
        return self.step * max(1.0, distance / radius)

    def random_points(self, n: int) -> np.ndarray:
        """`n` rows of `random_point` (one call)."""
        return np.stack([self.random_point() for _ in range(n)])

    def random_line(self) -> tuple[np.ndarray, np.ndarray]:
        x0, x1 = self.random_point(), self.random_point()
        return x0, x1 - x0

    def explained(self, x: np.ndarray, rows: list[np.ndarray]) -> bool:
        for depth in range(1, len(self.net.layers) + 1):
            if np.abs(self.net.preactivations(x[None, :], depth)).min() < self.attack.explain_tol:
                return True
        if rows:
            stacked = np.nan_to_num(np.stack(rows))
            h = self.net.hidden(x[None, :])[0]
            w, b = stacked[:, :-1], stacked[:, -1]
            scale = np.abs(w) @ np.abs(h) + np.abs(b) + 1e-300
            if (np.abs(w @ h + b) / scale).min() < self.attack.explain_tol:
                return True
        return False

    def check_piecewise_linear(self, points: int = 16) -> None:
        """A ReLU network is linear around almost every input: second differences vanish up
        to rounding. Most points curved means a smooth activation (or float32 rounding):
        ExtractionError before any search (3 queries a point)."""
        curved = 0
        h = 1e-3 * self.width
        for _ in range(points):
            x = self.rng.uniform(self.low + h, self.high - h, self.d)
            v = self.rng.standard_normal(self.d)
            v /= np.linalg.norm(v)
            f = self.oracle(np.stack([x - h * v, x, x + h * v]))
            second = np.abs(f[0] + f[2] - 2 * f[1]).max()
            if second > 1e-10 * (1.0 + np.abs(f).max()):
                curved += 1
        if curved > points // 2:
            raise ExtractionError(
                f"relu-exact: the target's logits are curved at {curved} of {points} random "
                "inputs (not a piecewise-linear ReLU network, or not answered in float64)"
            )

    def extract(self) -> None:
        self.check_piecewise_linear()
        depth = 1
        while depth <= self.attack.max_depth:
            rows, boundary, unexplained = self.search_layer(depth)
            if not rows:
                break
            previous_boundary, self.boundary = self.boundary, boundary
            w = np.stack([row[:-1] for row in rows])
            b = np.array([row[-1] for row in rows])
            missing = np.isnan(w)
            w = np.nan_to_num(w)
            self.net.layers.append((w, b))
            info: dict[str, Any] = {
                "layer": depth,
                "neurons": len(rows),
                "unknown_weights": int(missing.sum()),
            }
            if self.attack.refine:
                refined = self.refine(depth)
                info["refined"] = int(refined.sum())
                if depth > 1:
                    keep = self.distinct(depth, refined)
                    if not keep:
                        self.net.layers.pop()
                        self.boundary = previous_boundary
                        break
                    info["dropped"] = int(len(refined) - len(keep))
                    w, b = self.net.layers[depth - 1]
                    self.net.layers[depth - 1] = (w[keep], b[keep])
                    self.boundary = [boundary[i] for i in keep]
                    info["neurons"] = len(keep)
                self.pending = [p for p in self.pending if not self.explained(p.kink.x, [])]
                unexplained = len(self.pending)
            self.report.append(info)
            if unexplained == 0:
                break
            info["signs"] = self.intermediate_signs(depth, self.boundary)
            depth += 1
        if not self.net.layers:
            raise ExtractionError(
                "relu-exact found no critical point on any line: the target is constant, "
                "affine, or not a ReLU network"
            )
        self.finish()

    def search_layer(self, depth: int) -> tuple[list[np.ndarray], list[list[np.ndarray]], int]:
        """Rows of layer `depth` (NaN where never observed), points on each row's boundary,
        and how many critical points remain unexplained by layers 1..depth."""
        candidates: list[_Candidate] = []
        stale = rounds = 0
        for item in self.pending:
            item.clustered = False
        while stale < self.attack.patience and rounds < self.attack.max_rounds:
            rounds += 1
            for _ in range(self.attack.lines_per_round):
                x0, v = self.random_line()
                reach = self.attack.reach if depth == 1 else 0.0
                kinks = find_kinks(Line(self.oracle, x0, v, self.r), -reach, 1.0 + reach)
                self.kinks_found += len(kinks)
                self.pending.extend(_Pending(k) for k in kinks)
            accepted_rows = [c.cluster.row for c in candidates if c.accepted]
            still: list[_Pending] = []
            clusters = [c.cluster for c in candidates]
            for item in self.pending:
                if self.explained(item.kink.x, accepted_rows):
                    continue
                still.append(item)
                if item.u is None:
                    item.u, _ = gradient_jump(self.oracle, item.kink, self.step_at(item.kink.x))
                if item.clustered:
                    continue
                item.clustered = True
                row = partial_row(self.net, depth, item.kink.x, item.u)
                if row is not None:
                    add_to_clusters(clusters, row, item.kink.x)
            self.pending = still
            known = {id(c.cluster): c for c in candidates}
            merged = merge_clusters(clusters)
            candidates = []
            for cluster in merged:
                old = next(
                    (
                        known[id(c)]
                        for c in clusters
                        if id(c) in known and any(p is cluster.points[0] for p in c.points)
                    ),
                    None,
                )
                cand = old if old is not None else _Candidate(cluster)
                cand.cluster = cluster
                candidates.append(cand)
            new = False
            for cand in candidates:
                if not cand.accepted and cand.tries < 3:
                    cand.tries += 1
                    ok, points = self.verify(depth, cand.cluster.row)
                    if ok:
                        cand.accepted, cand.on_boundary, new = True, points, True
            incomplete = any(c.accepted and not c.cluster.complete for c in candidates)
            stale = 0 if new or (incomplete and rounds < self.attack.max_rounds // 2) else stale + 1
        accepted = [c for c in candidates if c.accepted]
        rows = []
        for c in accepted:
            row = c.cluster.row
            rows.append(row / np.linalg.norm(np.nan_to_num(row)))
        boundary = [list(c.cluster.points) + list(c.on_boundary or []) for c in accepted]
        accepted_rows = [c.cluster.row for c in accepted]
        self.pending = [p for p in self.pending if not self.explained(p.kink.x, accepted_rows)]
        return rows, boundary, len(self.pending)

    def verify(self, depth: int, row: np.ndarray) -> tuple[bool, list[np.ndarray]]:
        """The seed's test: on fresh lines between random inputs on opposite sides of the
        candidate's boundary, the oracle must kink exactly where the candidate's
        pre-activation crosses zero (crossings where an unobserved input is active are
        skipped; the known layers make the crossings free to compute)."""
        unknown = np.isnan(row[:-1])
        w, b = np.nan_to_num(row[:-1]), float(row[-1])
        x = self.random_points(2048)
        h = self.net.hidden(x, depth - 1)
        value = h @ w + b
        usable = ~(h[:, unknown] > 0).any(1) if unknown.any() else np.ones(len(x), bool)
        pos, neg = x[(value > 0) & usable], x[(value < 0) & usable]
        yes = no = masked = 0
        points: list[np.ndarray] = []
        if len(pos) == 0 or len(neg) == 0:
            return False, points
        for _ in range(self.attack.verify_lines):
            x0 = pos[self.rng.integers(len(pos))]
            v = neg[self.rng.integers(len(neg))] - x0
            for t in zero_crossings(self.net, depth, w, b, x0, v, grid=64)[:3]:
                at = x0 + t * v
                if (
                    unknown.any()
                    and (self.net.hidden(at[None, :], depth - 1)[0][unknown] > 0).any()
                ):
                    continue
                gap = 1e-3 * self.width / max(float(np.linalg.norm(v)), 1e-300)
                gap = min(gap, 0.2 * t, 0.2 * (1 - t))
                seen = kink_at(Line(self.oracle, x0, v, self.r), t, gap)
                if seen is None:
                    masked += 1
                elif seen:
                    yes += 1
                    points.append(at)
                else:
                    no += 1
            if yes >= 3 and no == 0:
                break
        return (yes >= 2 and no == 0 and yes >= masked), points

    def refine(self, depth: int) -> np.ndarray:
        """Precision refinement of layer `depth` (`refine` module; Carlini et al. 2020, Sec.
        5.3): per neuron, critical points located exactly on lines across its predicted
        boundary, and the row refitted through them. Returns which rows were refitted."""
        w, b = self.net.layers[depth - 1]
        w, b = w.copy(), b.copy()
        previous = Network(self.net.layers[: depth - 1])
        m = w.shape[1]
        n_lines = int(1.5 * (m + 1)) + 16
        done = np.zeros(w.shape[0], dtype=bool)
        for i in range(w.shape[0]):
            row = np.concatenate([w[i], [b[i]]])
            found: list[np.ndarray] = []
            for _ in range(4):
                x0, v, t = self.refine_lines(previous, depth, w[i], float(b[i]), n_lines)
                keep = ~np.isnan(t)
                x0, v, t = x0[keep], v[keep], t[keep]
                if len(t):
                    gap = 1e-3 * self.width / np.linalg.norm(v, axis=1)
                    gap = np.minimum(gap, np.minimum(t, 1 - t) / 4)
                    found.extend(exact_points(self.oracle, self.r, x0, v, t, gap))
                if len(found) < m + 3:
                    continue
                fit = refit_row(previous.hidden(np.array(found)), row)
                if fit is None or fit[1] > 1e-9:
                    continue
                new = fit[0]
                if 1.0 - abs(float(new @ row) / np.linalg.norm(row)) > 1e-6:
                    break
                w[i], b[i] = new[:-1], new[-1]
                done[i] = True
                break
        self.net.layers[depth - 1] = (w, b)
        return done

    def distinct(self, depth: int, refined: np.ndarray) -> list[int]:
        """Rows of a deeper layer to keep: the refitted ones (a refit needs many critical points
        exactly on the predicted boundary, a stronger test than `verify`; merged partial rows
        of different neurons fail it), one per neuron (refits of one neuron coincide)."""
        w, b = self.net.layers[depth - 1]
        rows = np.hstack([w, b[:, None]])
        rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        keep: list[int] = []
        for i in np.flatnonzero(refined):
            if all(1.0 - abs(float(rows[i] @ rows[j])) > 1e-9 for j in keep):
                keep.append(int(i))
        return keep

    def refine_lines(
        self, previous: Network, depth: int, w: np.ndarray, b: float, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Lines x0 + t·v across a neuron's predicted boundary and the crossings t. First
        layer: short lines (one box width) centred on the projection of a random box point
        onto the hyperplane, t = 1/2: the crossings lie as close to the box as the
        hyperplane allows, where the outputs (and their rounding) are smallest. Deeper
        layers: random lines and their computed crossings."""
        if depth > 1:
            x0 = self.random_points(n)
            v = self.random_points(n) - x0
            return x0, v, crossings(previous, depth, w, b, x0, v)
        x = self.rng.uniform(self.low, self.high, (n, self.d))
        x += 0.1 * self.width * self.rng.standard_normal((n, self.d))
        on = x - ((x @ w + b) / float(w @ w))[:, None] * w[None, :]
        v = self.rng.standard_normal((n, self.d))
        v *= self.width / np.linalg.norm(v, axis=1, keepdims=True)
        return on - 0.5 * v, v, np.full(n, 0.5)

    def intermediate_signs(self, depth: int, boundary: list[list[np.ndarray]]) -> dict[str, int]:
        """Signs of an intermediate layer: the exact freeze test where it applies, else the
        neuron-wiggle vote (Canales-Martínez et al. 2024)."""
        w, b = self.net.layers[depth - 1]
        w, b = w.copy(), b.copy()
        counts = {"freeze": 0, "wiggle": 0, "undecided": 0}
        for i, points in enumerate(boundary):
            verdicts = [
                freeze_sign(self.oracle, self.net, depth, w, i, x, self.step) for x in points[:6]
            ]
            decided = [v for v in verdicts if v is not None]
            if decided:
                flip = sum(decided) * 2 < len(decided)
                counts["freeze"] += 1
            else:
                votes = [
                    wiggle_sign(self.oracle, self.net, depth, w, i, x, self.step)
                    for x in points[:9]
                ]
                total = float(np.sum(votes))
                flip = total < 0
                counts["wiggle" if total != 0 else "undecided"] += 1
            if flip:
                w[i], b[i] = -w[i], -b[i]
        deeper = [p for p in self.pending if p.u is not None][:400]
        if deeper:
            sign, bad, informative = consistency_signs(
                Network(self.net.layers[: depth - 1]),
                depth,
                w,
                b,
                [p.kink.x for p in deeper],
                [p.u for p in deeper],
                np.ones(w.shape[0]),
            )
            counts["consistency_flips"] = int((sign < 0).sum())
            counts["contradicted_points"] = bad
            counts["informative_points"] = informative
            w, b = w * sign[:, None], b * sign
        self.net.layers[depth - 1] = (w, b)
        return counts

    def near_boundaries(self, per_neuron: int = 4) -> np.ndarray:
        """Inputs scattered around each last-layer neuron's critical points, so that every
        neuron is seen on both sides in the read-out regression, however rarely it switches."""
        out = []
        for points in self.boundary:
            for x in points[:per_neuron]:
                noise = self.rng.standard_normal(self.d)
                radius = 0.05 * self.width * self.rng.random()
                out.append(x + radius * noise / np.linalg.norm(noise))
        return np.array(out).reshape(-1, self.d)

    def finish(self) -> None:
        """Last hidden layer's signs and the output layer (`signs.last_layer_fit`). A linear
        part left by always-active (never-kinking) neurons is carried by pass-through neurons,
        one per logit, shifted to stay positive on the sampled inputs (on the whole box when
        the last hidden layer is the first)."""
        w, b = self.net.layers[-1]
        previous = Network(self.net.layers[:-1])
        n_in = previous.hidden(np.zeros((1, self.d))).shape[1]
        n = 2 * (w.shape[0] + n_in + 1) + 16
        x = np.vstack(
            [
                self.rng.uniform(self.low, self.high, (n, self.d)),
                self.random_points(n),
                self.near_boundaries(),
            ]
        )
        y = self.oracle(x)
        flips, alpha, linear, bias, residual = last_layer_fit(previous, w, b, x, y)
        sign = np.where(flips, -1.0, 1.0)
        w, b = w * sign[:, None], b * sign
        self.report[-1]["sign_residual"] = residual
        self.report[-1]["flipped"] = int(flips.sum())
        scale = np.abs(alpha).max() if alpha.size else 1.0
        keep = np.flatnonzero(np.abs(linear).max(1) > 1e-9 * max(scale, 1.0))
        if len(keep):
            lin = linear[keep]
            if len(self.net.layers) == 1:
                low = np.minimum(lin * self.low, lin * self.high).sum(1)
            else:
                low = (previous.hidden(x) @ lin.T).min(0) - np.abs(lin).sum(1) * 1e3
            shift = np.maximum(-low, 0.0) + 1.0
            w = np.vstack([w, lin])
            b = np.concatenate([b, shift])
            out = np.zeros((alpha.shape[0], len(keep)))
            out[keep, np.arange(len(keep))] = 1.0
            alpha = np.hstack([alpha, out])
            bias = bias - out @ shift
            self.report[-1]["pass_through"] = len(keep)
        self.net.layers[-1] = (w, b)
        self.output = (alpha, bias)

    def result(self) -> Stolen:
        layers = [*self.net.layers, self.output] if self.output is not None else None
        if layers is None:
            k = self.oracle.k
            layers = [(np.zeros((k, self.d)), np.zeros(k))]
        model = layers_module(layers, self.task.input_shape)
        return Stolen(
            model=model,
            layers=layers if self.output is not None else None,
            neurons=self.report,
            stopped=self.stopped,
            params={
                "widths": [w.shape[0] for w, _ in self.net.layers],
                "critical_points": self.kinks_found,
                "queries": self.oracle.queries,
            },
        )
