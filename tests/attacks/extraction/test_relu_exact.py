"""relu-exact: functionally-equivalent extraction of ReLU networks from float64 logits.

Victims are small random networks whose biases are centred so that every hidden neuron switches
inside the domain (each is observable); the evaluator's alignment and output error
(`metrics.exact_report`, checked against hand-made oracles in test_exact_metrics.py) judge the
result. A tanh network and float32 answers are refused in one line; a query budget stops the
attack with what it has."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privacylab.attacks.extraction import (
    ExtractionError,
    ExtractionTask,
    Truth,
    make_extraction,
    relu_layers,
    run_extraction,
)
from privacylab.target import Target


def _victim(widths: list[int], seed: int = 0, activation: type[nn.Module] = nn.ReLU) -> nn.Module:
    torch.manual_seed(seed)
    modules: list[nn.Module] = [nn.Flatten()]
    for i in range(len(widths) - 1):
        modules.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            modules.append(activation())
    model = nn.Sequential(*modules).double()
    h = torch.rand(4000, widths[0], dtype=torch.float64)
    with torch.no_grad():
        for layer in [m for m in model if isinstance(m, nn.Linear)][:-1]:
            z = layer(h)
            layer.bias -= z.median(0).values
            h = torch.relu(layer(h))
    return model


def _run(model: nn.Module, widths: list[int], **target_options):
    d, k = widths[0], widths[-1]
    target = Target(model, "logits", k, precision="float64", **target_options)
    x = torch.rand(200, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        y = model(x).argmax(1)
    truth = Truth(model=model, x=x, y=y, layers=relu_layers(model), bounds=(0.0, 1.0))
    task = ExtractionTask((d,), k, bounds=(0.0, 1.0), seed=0)
    return run_extraction(make_extraction("relu-exact"), target, task, truth)


@pytest.mark.parametrize("widths", [[10, 15, 1], [8, 12, 3]])
def test_one_hidden_layer_recovered_exactly(widths):
    result = _run(_victim(widths), widths)
    exact = result.exact
    assert exact["neurons_total"] == widths[1]
    assert exact["neurons_recovered"] == widths[1]
    assert exact["max_output_error_log2"] <= -30
    assert exact["max_weight_error"] < 1e-6
    assert result.fidelity == 1.0
    assert result.queries < 2**14


def test_two_hidden_layers_recovered_exactly():
    widths = [10, 15, 15, 1]
    result = _run(_victim(widths), widths)
    exact = result.exact
    assert exact["neurons_recovered"] == exact["neurons_total"] == 30
    assert exact["max_output_error_log2"] <= -30
    assert exact["max_weight_error"] < 1e-6
    assert result.queries < 2**17


def test_tanh_network_refused_in_one_line():
    widths = [4, 6, 1]
    model = _victim(widths, activation=nn.Tanh)
    with pytest.raises(ExtractionError, match="Tanh"):
        relu_layers(model)
    target = Target(model, "logits", 1, precision="float64")
    with pytest.raises(ExtractionError, match="not a piecewise-linear ReLU network"):
        make_extraction("relu-exact").steal(target, ExtractionTask((4,), 1))


def test_float32_answers_refused():
    target = Target(_victim([4, 5, 1]), "logits", 1)
    with pytest.raises(ExtractionError, match="float64"):
        make_extraction("relu-exact").run(target, ExtractionTask((4,), 1))


def test_budget_stops_the_attack():
    widths = [10, 15, 1]
    target = Target(_victim(widths), "logits", 1, precision="float64", query_budget=300)
    stolen = make_extraction("relu-exact").steal(target, ExtractionTask((10,), 1))
    assert stolen.stopped == "budget"
    assert target.queries <= 300


def test_neuron_that_never_switches_in_the_box_is_recovered():
    """Queries go anywhere in R^d: a neuron active on the whole box (its hyperplane lies
    outside it) is still found, and the output error stays at float64 level."""
    widths = [6, 8, 1]
    model = _victim(widths, seed=3)
    first = model[1]
    with torch.no_grad():
        first.bias[0] = first.weight[0].abs().sum() + 0.5  # active on all of [0, 1]^6
    result = _run(model, widths)
    exact = result.exact
    assert exact["neurons_recovered"] == exact["neurons_total"] == 8
    assert exact["neurons_unobservable"] == 0
    assert exact["max_output_error_log2"] <= -30


def test_precision_refinement_reaches_rounding_level():
    """Carlini et al. 2020, Sec. 5.3: critical points located exactly on lines across a
    slightly wrong hyperplane refit it to float64 rounding (closed-form victim, numpy)."""
    import numpy as np

    from privacylab.attacks.extraction.relu.layers import Network
    from privacylab.attacks.extraction.relu.oracle import Oracle
    from privacylab.attacks.extraction.relu.refine import crossings, exact_points, refit_row

    widths = [5, 7, 1]
    model = _victim(widths, seed=2)
    (w, b), _ = relu_layers(model)
    true = np.hstack([w[0], b[0]]) / np.linalg.norm(np.hstack([w[0], b[0]]))
    rng = np.random.default_rng(0)
    guess = true + 1e-7 * rng.standard_normal(6)
    guess /= np.linalg.norm(guess)
    oracle = Oracle(Target(model, "logits", 1, precision="float64"), (5,))
    x0 = rng.uniform(-2, 3, (60, 5))
    v = rng.uniform(-2, 3, (60, 5)) - x0
    t = crossings(Network(), 1, guess[:-1], float(guess[-1]), x0, v)
    keep = ~np.isnan(t)
    gap = 1e-3 / np.linalg.norm(v[keep], axis=1)
    points = exact_points(oracle, np.ones(1), x0[keep], v[keep], t[keep], gap)
    assert len(points) >= 10
    fit = refit_row(points, guess)
    assert fit is not None
    row, residual = fit
    assert np.abs(row - true).max() < 1e-12 < np.abs(guess - true).max()
    assert residual < 1e-12
