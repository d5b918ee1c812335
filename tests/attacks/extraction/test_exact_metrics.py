"""metrics.exact_report / align_layers against hand-made oracles: a permuted, positively
rescaled copy of the victim aligns with zero error; a flipped neuron, a missing neuron and a
never-switching neuron get their own status; output error is measured without a target."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import torch

from privacylab.attacks.extraction import Stolen, Truth, layers_module
from privacylab.attacks.extraction.metrics import align_layers, exact_report


def _victim(widths: list[int], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((o, i)) / np.sqrt(i), rng.standard_normal(o) * 0.1)
        for i, o in pairwise(widths)
    ]


def _permute_scale(layers, seed: int = 1, negate: int | None = None):
    """The same function: each hidden layer permuted, each neuron scaled by c > 0, the next
    layer's columns divided by c (the network's symmetries)."""
    rng = np.random.default_rng(seed)
    out = [(w.copy(), b.copy()) for w, b in layers]
    for j in range(len(out) - 1):
        w, b = out[j]
        perm = rng.permutation(w.shape[0])
        scale = rng.uniform(0.2, 5.0, w.shape[0])
        w, b = w[perm] * scale[:, None], b[perm] * scale
        if negate is not None and j == 0:
            w[negate], b[negate] = -w[negate], -b[negate]
        nw, nb = out[j + 1]
        out[j] = (w, b)
        out[j + 1] = (nw[:, perm] / scale[None, :], nb)
    return out


def _truth(layers, d: int) -> Truth:
    model = layers_module(layers, (d,))
    x = torch.rand(50, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return Truth(model=model, x=x, y=torch.zeros(50, dtype=torch.long), layers=layers)


def test_permuted_rescaled_copy_aligns_exactly():
    victim = _victim([6, 8, 5, 3])
    copy = _permute_scale(victim)
    report = exact_report(
        Stolen(model=layers_module(copy, (6,)), layers=copy), _truth(victim, 6), n=2000
    )
    assert report["neurons_total"] == 13
    assert report["neurons_recovered"] + report["neurons_unobservable"] == 13
    assert report["neurons_missed"] == 0
    assert report["max_weight_error"] < 1e-12
    assert report["max_output_error_log2"] < -40


def test_flipped_and_missing_neurons_are_reported():
    victim = _victim([5, 6, 2], seed=3)
    x = np.random.default_rng(0).uniform(0, 1, (4000, 5))
    flipped = _permute_scale(victim, negate=2)
    aligned = align_layers(victim, flipped, x)
    assert aligned["counts"]["sign-flipped"] == 1
    w, b = victim[0]
    short = [(w[1:], b[1:]), (victim[1][0][:, 1:], victim[1][1])]
    aligned = align_layers(victim, short, x)
    status = aligned["layers"][0]["status"]
    assert status[0] in ("missed", "unobservable") and status[1:] == ["recovered"] * 5
    report = exact_report(
        Stolen(model=layers_module(short, (5,)), layers=short), _truth(victim, 5), n=4000
    )
    assert report["neurons_recovered"] == 5 and report["neurons_total"] == 6
    # the output error is what neuron 0 contributes: a closed form on the same inputs
    z = np.maximum(x @ w[0] + b[0], 0.0)
    assert report["max_output_error"] >= 0.5 * np.abs(np.outer(z, victim[1][0][:, 0])).max()


def test_never_switching_neuron_is_unobservable():
    victim = _victim([4, 3, 1], seed=5)
    w, b = victim[0]
    b[1] = 100.0  # always active on [0, 1]^4
    short = [(np.delete(w, 1, 0), np.delete(b, 1)), (np.delete(victim[1][0], 1, 1), victim[1][1])]
    x = np.random.default_rng(0).uniform(0, 1, (2000, 4))
    status = align_layers(victim, short, x)["layers"][0]["status"]
    assert status[1] == "unobservable"


def test_softmax_rows_align_after_centring():
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((4, 7)), rng.standard_normal(4)
    shift_w, shift_b = rng.standard_normal(7), rng.standard_normal()
    aligned = align_layers([(w, b)], [(w + shift_w, b + shift_b)])
    assert aligned["max_weight_error"] < 1e-12
    assert aligned["counts"]["recovered"] == 4
    aligned = align_layers([(w, b)], [(w + 1e-3 * rng.standard_normal((4, 7)), b)])
    assert aligned["counts"]["missed"] == 4
