"""Alignment of exactly-recovered layers with the victim's, and the exact attacks' report.

A ReLU network is determined by its function only up to a permutation of each hidden layer
and a positive scale per hidden neuron (propagated to the next layer's columns) — the
symmetries Rolnick & Kording 2020 (seed 000, Sec. 2) name; Carlini, Jagielski & Mironov 2020
(Sec. 6) report extraction quality as the weight error after undoing them and as the largest
output difference over random inputs (in bits, log2). One-layer softmax models recovered by
equation solving (Tramèr et al. 2016, Sec. 4.1.2) are identified only up to a per-class shift
common to all classes: their rows are compared after centring across classes.

Every victim hidden neuron gets a status: "recovered" (matched with a positive scale),
"sign-flipped" (matched only with a negative scale), "unobservable" (its pre-activation keeps
one sign on 10^5 random inputs in the domain: no query can see it switch), or "missed". No
neuron is dropped silently. Recovered neurons with no victim counterpart (e.g. pass-through
neurons carrying a linear part) are counted as "extra".
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from privacylab.attacks.extraction.base import Layer, Stolen, Truth, layers_module

__all__ = ["align_layers", "exact_report", "max_output_error"]

MATCH_TOL = 1e-6
"""1 − cosine under which a recovered row is the victim's (rows in float64)."""


def _hidden(layers: list[Layer], x: np.ndarray) -> list[np.ndarray]:
    """Pre-activations of every hidden layer at rows x."""
    out, h = [], x
    for w, b in layers[:-1]:
        z = h @ w.T + b
        out.append(z)
        h = np.maximum(z, 0.0)
    return out


def align_layers(
    victim: list[Layer], recovered: list[Layer], samples: np.ndarray | None = None
) -> dict[str, Any]:
    """Match recovered hidden neurons to the victim's layer by layer (Hungarian assignment on
    the cosine of [w, b] rows, expressed in the victim's coordinates of the previous layer),
    undo the positive scales, and return per-layer statuses and the largest weight error
    after alignment (over matched rows and known columns, output layer included)."""
    layers_out: list[dict[str, Any]] = []
    switching = None
    if samples is not None:
        switching = [((z > 0).any(0) & (z < 0).any(0)) for z in _hidden(victim, samples)]
    if len(victim) == 1 and len(recovered) == 1:
        (vw, vb), (rw, rb) = victim[0], recovered[0]
        v = np.hstack([vw, vb[:, None]])
        r = np.hstack([rw, rb[:, None]])
        if v.shape != r.shape:
            return {"layers": [], "max_weight_error": float("inf"), "counts": {}}
        if v.shape[0] > 1:
            v, r = v - v.mean(0), r - r.mean(0)
        err = np.abs(v - r).max(1)
        good = err <= 1e-6 * (1 + np.abs(v).max())
        status = ["recovered" if g else "missed" for g in good]
        return {
            "layers": [{"layer": 1, "victim_width": v.shape[0], "status": status}],
            "max_weight_error": float(err.max()),
            "counts": {"recovered": int(good.sum()), "missed": int((~good).sum())},
        }
    prev_map: dict[int, tuple[int, float]] | None = None
    max_err = 0.0
    counts = {"recovered": 0, "sign-flipped": 0, "unobservable": 0, "missed": 0, "extra": 0}
    for j in range(len(victim)):
        vw, vb = victim[j]
        last = j == len(victim) - 1
        if not last and j >= len(recovered) - 1:
            counts["missed"] += vw.shape[0]
            layers_out.append(
                {
                    "layer": j + 1,
                    "victim_width": int(vw.shape[0]),
                    "status": ["missed"] * vw.shape[0],
                }
            )
            prev_map = {}
            continue
        rw, rb = recovered[-1] if last else recovered[j]
        # recovered rows in the victim's coordinates of the previous layer
        if prev_map is None:
            r_in = rw
            if r_in.shape[1] != vw.shape[1]:
                break
        else:
            r_in = np.full((rw.shape[0], vw.shape[1]), np.nan)
            for p, (q, c) in prev_map.items():
                r_in[:, p] = rw[:, q] / c
        r = np.hstack([r_in, rb[:, None]])
        v = np.hstack([vw, vb[:, None]])
        if last:
            known = ~np.isnan(r[0])
            if r.shape[0] == v.shape[0]:
                err = np.abs(r[:, known] - v[:, known])
                max_err = max(max_err, float(err[:, :-1].max()) if known[:-1].any() else 0.0)
            layers_out.append(
                {"layer": j + 1, "output": True, "columns_compared": int(known.sum())}
            )
            break
        known = ~np.isnan(r)
        cos = np.zeros((v.shape[0], r.shape[0]))
        for a in range(v.shape[0]):
            for c in range(r.shape[0]):
                mask = known[c]
                x, y = v[a, mask], r[c, mask]
                nx, ny = np.linalg.norm(x), np.linalg.norm(y)
                cos[a, c] = float(x @ y) / (nx * ny) if nx > 0 and ny > 0 else 0.0
        rows, cols = linear_sum_assignment(-np.abs(cos))
        status = ["missed"] * v.shape[0]
        mapping: dict[int, tuple[int, float]] = {}
        used = set()
        for a, c in zip(rows, cols, strict=True):
            if 1.0 - abs(cos[a, c]) > MATCH_TOL:
                continue
            mask = known[c]
            scale = float(v[a, mask] @ r[c, mask]) / float(r[c, mask] @ r[c, mask])
            used.add(int(c))
            if scale > 0:
                status[a] = "recovered"
                mapping[int(a)] = (int(c), scale)
                max_err = max(max_err, float(np.abs(scale * r[c, mask] - v[a, mask]).max()))
            else:
                status[a] = "sign-flipped"
        if switching is not None:
            for a in range(v.shape[0]):
                if status[a] == "missed" and not switching[j][a]:
                    status[a] = "unobservable"
        for s in status:
            counts[s] += 1
        counts["extra"] += rw.shape[0] - len(used)
        layers_out.append(
            {
                "layer": j + 1,
                "victim_width": int(v.shape[0]),
                "recovered_width": int(r.shape[0]),
                "status": status,
            }
        )
        prev_map = mapping
    return {"layers": layers_out, "max_weight_error": max_err, "counts": counts}


@torch.no_grad()
def max_output_error(
    victim: torch.nn.Module,
    stolen: torch.nn.Module,
    bounds: tuple[float, float],
    input_shape: tuple[int, ...],
    n: int = 100_000,
    seed: int = 0,
    chunk: int = 10_000,
    centre: bool = False,
) -> float:
    """max |f̂(x) − f(x)| over `n` uniform random inputs in `bounds`, both in float64; with
    `centre`, each output row is centred across classes first (softmax logits are identifiable
    only up to a per-row constant from probabilities)."""
    gen = torch.Generator().manual_seed(seed)
    low, high = bounds
    victim, stolen = victim.double().eval(), stolen.double().eval()
    worst = 0.0
    for i in range(0, n, chunk):
        m = min(chunk, n - i)
        x = low + (high - low) * torch.rand((m, *input_shape), generator=gen, dtype=torch.float64)
        diff = victim(x) - stolen(x)
        if centre:
            diff = diff - diff.mean(1, keepdim=True)
        worst = max(worst, float(diff.abs().max()))
    return worst


def exact_report(stolen: Stolen, truth: Truth, n: int = 100_000) -> dict[str, Any]:
    """The exact attacks' metrics: `neurons_recovered`/`neurons_total` (victim hidden
    neurons; for a one-layer model, its output rows), per-status counts and per-layer statuses,
    `max_weight_error` after alignment, `max_output_error` and its log2 over `n` uniform
    inputs in `truth.bounds` (the evaluator's victim, no target queries; for a one-layer
    softmax model, logits centred across classes, as its weights are)."""
    input_shape = tuple(truth.x.shape[1:])
    victim_model = (
        layers_module(truth.layers, input_shape)
        if truth.layers is not None
        else copy_double(truth.model)
    )
    softmax_linear = (
        truth.layers is not None
        and stolen.layers is not None
        and len(truth.layers) == len(stolen.layers) == 1
        and truth.layers[0][0].shape[0] > 1
    )
    out_err = max_output_error(
        victim_model, stolen.model, truth.bounds, input_shape, n, centre=softmax_linear
    )
    report: dict[str, Any] = {
        "max_output_error": out_err,
        "max_output_error_log2": float(np.log2(max(out_err, 2.0**-1074))),
    }
    if truth.layers is None or stolen.layers is None:
        total = sum(w.shape[0] for w, _ in (truth.layers or [])[:-1])
        report.update(
            neurons_recovered=0,
            neurons_total=total,
            max_weight_error=None,
            neuron_status=[],
        )
        return report
    low, high = truth.bounds
    rng = np.random.default_rng(0)
    samples = rng.uniform(low, high, (min(n, 100_000), truth.layers[0][0].shape[1]))
    aligned = align_layers(truth.layers, stolen.layers, samples)
    counts = aligned["counts"]
    if len(truth.layers) == 1:
        total = truth.layers[0][0].shape[0]
    else:
        total = sum(w.shape[0] for w, _ in truth.layers[:-1])
    report.update(
        neurons_recovered=int(counts.get("recovered", 0)),
        neurons_total=int(total),
        neurons_sign_flipped=int(counts.get("sign-flipped", 0)),
        neurons_unobservable=int(counts.get("unobservable", 0)),
        neurons_missed=int(counts.get("missed", 0)),
        neurons_extra=int(counts.get("extra", 0)),
        max_weight_error=float(aligned["max_weight_error"]),
        neuron_status=aligned["layers"],
    )
    return report


def copy_double(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of `model` (the caller's model is left as it is)."""
    return copy.deepcopy(model).double().eval()
