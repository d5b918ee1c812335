"""Equation-solving extraction (Tramèr et al. 2016, Sec. 4.1): exact softmax / logistic
regression weights from d + 1 probability vectors in float64; graceful least squares when the
answers are float32 or rounded; a non-linear victim refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from torch import nn

from privacylab.attacks.extraction import (
    ExtractionError,
    ExtractionTask,
    Truth,
    make_extraction,
    relu_layers,
    run_extraction,
)
from privacylab.attacks.extraction.equation import answer_step, solve_log_ratios
from privacylab.data import load_dataset
from privacylab.errors import PrivacylabError
from privacylab.target import Target

D = 64
TASK = dict(input_shape=(1, 8, 8), num_classes=10)


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    data = load_dataset("digits")
    return data.features, data.labels


@pytest.fixture(scope="module")
def sklearn_victim(digits) -> tuple[nn.Module, np.ndarray, np.ndarray]:
    """A multinomial logistic regression fitted by scikit-learn, served as Flatten -> Linear
    (float32 parameters: the oracle is those, centred across classes)."""
    x, y = digits
    fitted = LogisticRegression(C=0.5, max_iter=300).fit(x[:1200].flatten(1).numpy(), y[:1200])
    model = nn.Sequential(nn.Flatten(), nn.Linear(D, 10))
    with torch.no_grad():
        model[1].weight.copy_(torch.from_numpy(fitted.coef_))
        model[1].bias.copy_(torch.from_numpy(fitted.intercept_))
    weight = model[1].weight.detach().double().numpy()
    bias = model[1].bias.detach().double().numpy()
    np.testing.assert_allclose(weight, fitted.coef_, atol=1e-6)
    return model.eval(), weight - weight.mean(0), bias - bias.mean()


def _weight_error(layers, weight: np.ndarray, bias: np.ndarray) -> float:
    (w, b) = layers[0]
    return float(max(np.abs(w - weight).max(), np.abs(b - bias).max()))


def test_float64_softmax_exact_from_d_plus_1_queries(sklearn_victim, digits) -> None:
    victim, weight, bias = sklearn_victim
    target = Target(victim, "scores", 10, precision="float64")
    stolen = make_extraction("equation").steal(target, ExtractionTask(**TASK))
    assert stolen.params["solved_from"] == D + 1
    assert target.queries == D + 1 + stolen.params["check_queries"] == D + 9
    assert stolen.params["exact_answers"] and stolen.params["underdetermined_classes"] == []
    assert _weight_error(stolen.layers, weight, bias) < 1e-9
    w, b = stolen.layers[0]
    assert np.abs(w.sum(0)).max() < 1e-12 and abs(b.sum()) < 1e-12
    x = digits[0].double()
    assert torch.equal(stolen.model(x).argmax(1), victim(x.float()).argmax(1))


def test_runner_reports_exact_metrics(sklearn_victim, digits) -> None:
    victim, _, _ = sklearn_victim
    x, y = digits
    target = Target(victim, "scores", 10, precision="float64")
    truth = Truth(victim, x[1200:], y[1200:], layers=relu_layers(victim))
    result = run_extraction(make_extraction("equation"), target, ExtractionTask(**TASK), truth)
    out = result.to_dict()
    assert out["fidelity"] == 1.0 and out["queries"] == D + 9
    assert out["max_weight_error"] < 1e-9
    # logits compared up to the per-row constant softmax hides (as the weights are)
    assert out["max_output_error_log2"] < -25


def test_solver_matches_closed_form_and_softmax_invariance() -> None:
    rng = np.random.default_rng(0)
    d, k = 5, 4
    weight, bias = rng.normal(size=(k, d)), rng.normal(size=k)
    x = rng.uniform(size=(d + 1, d))
    shift_w, shift_b = rng.normal(size=d), rng.normal()

    def answers(w: np.ndarray, b: np.ndarray) -> np.ndarray:
        z = x @ w.T + b
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    (w1, b1), _ = solve_log_ratios(x, answers(weight, bias))
    (w2, b2), _ = solve_log_ratios(x, answers(weight + shift_w, bias + shift_b))
    np.testing.assert_allclose(w1, weight - weight.mean(0), atol=1e-11)
    np.testing.assert_allclose(b1, bias - bias.mean(), atol=1e-11)
    np.testing.assert_allclose(w2, w1, atol=1e-11)
    np.testing.assert_allclose(b2, b1, atol=1e-11)
    (_, _), info = solve_log_ratios(x[:d], answers(weight, bias)[:d])
    assert len(info["underdetermined"]) == k - 1


def test_binary_sigmoid_victim_exact() -> None:
    torch.manual_seed(3)
    victim = nn.Sequential(nn.Flatten(), nn.Linear(12, 1), nn.Sigmoid()).eval()
    target = Target(victim, "scores", 1, outputs="probabilities", precision="float64")
    task = ExtractionTask(input_shape=(12,), num_classes=1, bounds=(-1.0, 1.0))
    stolen = make_extraction("equation").steal(target, task)
    (w, b) = stolen.layers[0]
    np.testing.assert_allclose(w, victim[1].weight.detach().double().numpy(), atol=1e-10)
    np.testing.assert_allclose(b, victim[1].bias.detach().double().numpy(), atol=1e-10)
    assert target.queries == 13 + 8


def test_float32_answers_degrade_to_least_squares(sklearn_victim) -> None:
    victim, weight, bias = sklearn_victim
    target = Target(victim, "scores", 10, precision="float32")
    stolen = make_extraction("equation").steal(target, ExtractionTask(**TASK))
    assert not stolen.params["exact_answers"]
    assert stolen.params["solved_from"] == 4 * (D + 1)
    error = _weight_error(stolen.layers, weight, bias)
    assert 1e-9 < error < 1e-3
    assert stolen.params["residual"] < 1e-5


def test_rounded_answers_reported_not_refused(sklearn_victim, digits) -> None:
    from privacylab.defenses import parse_defense

    victim, weight, bias = sklearn_victim
    target = parse_defense("rounding:3").defend(Target(victim, "scores", 10, precision="float64"))
    stolen = make_extraction("equation").steal(target, ExtractionTask(**TASK))
    assert stolen.params["answer_step"] == pytest.approx(1e-3)
    error = _weight_error(stolen.layers, weight, bias)
    assert np.isfinite(error) and error > 1e-6
    x = digits[0][1200:].double()
    fidelity = (stolen.model(x).argmax(1) == victim(x.float()).argmax(1)).double().mean()
    assert fidelity > 0.9


def test_answer_step() -> None:
    assert answer_step(np.array([[0.25, 0.75], [0.5, 0.5]])) == pytest.approx(0.01)
    assert answer_step(np.array([[0.123, 0.877]])) == pytest.approx(1e-3)
    assert answer_step(np.array([[1 / 3, 2 / 3]])) is None


def test_non_linear_victim_refused(digits) -> None:
    torch.manual_seed(0)
    x, y = digits
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.Adam(mlp.parameters(), 1e-2)
    for _ in range(150):
        optimizer.zero_grad()
        nn.functional.cross_entropy(mlp(x[:1200]), y[:1200]).backward()
        optimizer.step()
    target = Target(mlp.eval(), "scores", 10, precision="float64")
    with pytest.raises(ExtractionError, match="not a softmax-linear model") as caught:
        make_extraction("equation").steal(target, ExtractionTask(**TASK))
    assert "\n" not in str(caught.value)


def test_budget_and_refusal_stop_cleanly(sklearn_victim) -> None:
    victim, _, _ = sklearn_victim
    target = Target(victim, "scores", 10, precision="float64")
    stolen = make_extraction("equation").steal(target, ExtractionTask(**TASK, budget=30))
    assert target.queries == 30 and stolen.stopped == "budget"
    assert len(stolen.params["underdetermined_classes"]) == 9

    class RefusedError(PrivacylabError):
        pass

    seen = []

    def monitor(x: torch.Tensor) -> None:
        seen.append(len(x))
        if sum(seen) > D + 1:
            raise RefusedError("client flagged")

    watched = Target(victim, "scores", 10, precision="float64").with_monitor(monitor)
    stolen = make_extraction("equation").steal(watched, ExtractionTask(**TASK))
    assert stolen.stopped == "refused" and watched.queries == D + 1


@pytest.mark.parametrize(
    "options",
    [{"queries": 0}, {"checks": 0}, {"oversample": 0.5}, {"max_residual": 0.0}],
)
def test_bad_options_one_line(options) -> None:
    with pytest.raises(ExtractionError) as caught:
        make_extraction("equation", **options)
    assert "\n" not in str(caught.value)
