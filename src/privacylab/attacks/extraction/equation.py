"""Equation-solving extraction of softmax (multinomial logistic regression) models from
probability vectors: Tramèr, Zhang, Juels, Reiter & Ristenpart 2016, "Stealing Machine Learning
Models via Prediction APIs", Sec. 4.1 ("Equation-solving attacks": logistic regression and
multiclass LR / softmax models).

A victim whose logits are one affine map z = W x + b of the flattened input answers
p = softmax(z). Each answer gives k - 1 linear equations in the unknowns, since for a reference
class K (Tramèr et al., Sec. 4.1.2)

    log(p_i / p_K) = (w_i - w_K) · x + (b_i - b_K),      i != K.

The rows are only identifiable up to a common shift (softmax invariance), so the attack solves
for the differences θ_i = (w_i - w_K, b_i - b_K) and returns W centred across classes
(Σ_i w_i = 0, Σ_i b_i = 0), the unique representative the evaluator compares with the victim's
centred weights. All classes are solved jointly from the same queries: d + 1 generic inputs
(d input features, one more for the bias) make the system square, and in float64 the solution
is exact to rounding. A one-output victim serving sigmoid probabilities (binary logistic
regression, Sec. 4.1.1) gives logit(p) = w · x + b directly, with nothing to centre.

When the answers are inexact (a float32 API, rounded probabilities), the attack notices it on
a few fresh check queries, asks more queries and solves the over-determined system by weighted
least squares: by the delta method an answer rounded with step q has log-error about q / p, so
the equation for class i against K is weighted by 1 / sqrt(1/p_i² + 1/p_K²); an answer of 0
(underflow or rounding) gives no equation. A victim that is not softmax-linear (an MLP) leaves
a large residual on fresh queries and is refused with one line (answers rounded to a decimal
grid cannot be told from a non-linear victim that way: the residual is then reported).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.extraction.base import (
    ExtractionAttack,
    ExtractionError,
    ExtractionTask,
    Layer,
    Stolen,
    layers_module,
    register_extraction,
)
from privacylab.errors import PrivacylabError
from privacylab.target import Access, AccessError, QueryBudgetError, Target, TargetError

__all__ = ["EquationSolving", "probability_residual", "refine_cross_entropy", "solve_log_ratios"]

EXACT_RESIDUAL = 1e-9
"""max |p̂ - p| on the check queries below which the answers count as exact (float64)."""


def probability_residual(x: np.ndarray, probs: np.ndarray, layer: Layer) -> float:
    """max |p̂ - p| over the answers `probs` to the flattened queries `x`, where p̂ is what the
    fitted `layer` predicts (softmax of its logits, or sigmoid for one output): how far the
    fit is from the victim's answers, in the answers' own units."""
    weight, bias = layer
    logits = torch.from_numpy(x @ weight.T + bias)
    fitted = torch.sigmoid(logits) if probs.shape[1] == 1 else torch.softmax(logits, dim=1)
    return float(np.abs(fitted.numpy() - probs).max())


def _reference_class(probs: np.ndarray) -> int:
    """The class K the log-ratios are taken against: the one answered non-zero most often
    (ties: the larger total probability), so that as many equations as possible are usable."""
    positive = (probs > 0).sum(0)
    best = positive == positive.max()
    totals = np.where(best, probs.sum(0), -np.inf)
    return int(np.argmax(totals))


def solve_log_ratios(x: np.ndarray, probs: np.ndarray) -> tuple[Layer, dict[str, Any]]:
    """The affine layer (W, b) whose softmax (sigmoid, for one output column) best explains
    the probability rows `probs` (n, k) answered to the flattened queries `x` (n, d), by
    (weighted) least squares on log(p_i / p_K) = (w_i - w_K)·x + (b_i - b_K) (Tramèr et al.
    2016, Sec. 4.1), W centred across classes; and diagnostics: per class, how many equations
    it had (`equations`) and the classes with fewer than d + 1 (`underdetermined`), solved
    with the minimum-norm solution."""
    n, d = x.shape
    k = probs.shape[1]
    design = np.hstack([x, np.ones((n, 1))])
    if k == 1:
        p = probs[:, 0]
        usable = (p > 0) & (p < 1)
        if int(usable.sum()) == 0:
            raise ExtractionError(
                "every answer of the one-output target is 0 or 1: no logit to solve for "
                "(a one-output model must serve sigmoid probabilities)"
            )
        pu = p[usable]
        w = 1.0 / np.sqrt(1.0 / pu**2 + 1.0 / (1 - pu) ** 2)
        y = np.log(pu) - np.log1p(-pu)
        theta = np.linalg.lstsq(design[usable] * w[:, None], y * w, rcond=None)[0]
        count = int(usable.sum())
        info = {"equations": [count], "underdetermined": [0] if count < d + 1 else []}
        return (theta[None, :d].copy(), theta[None, d:].ravel().copy()), info
    reference = _reference_class(probs)
    thetas = np.zeros((k, d + 1))
    equations = [0] * k
    under: list[int] = []
    for i in range(k):
        if i == reference:
            continue
        usable = (probs[:, i] > 0) & (probs[:, reference] > 0)
        count = int(usable.sum())
        equations[i] = count
        if count < d + 1:
            under.append(i)
        if count == 0:
            continue
        pi, pk = probs[usable, i], probs[usable, reference]
        w = 1.0 / np.sqrt(1.0 / pi**2 + 1.0 / pk**2)
        y = np.log(pi) - np.log(pk)
        thetas[i] = np.linalg.lstsq(design[usable] * w[:, None], y * w, rcond=None)[0]
    equations[reference] = int((probs[:, reference] > 0).sum())
    thetas -= thetas.mean(0, keepdims=True)
    return (thetas[:, :d].copy(), thetas[:, d].copy()), {
        "equations": equations,
        "underdetermined": under,
    }


def refine_cross_entropy(x: np.ndarray, probs: np.ndarray, layer: Layer, steps: int = 100) -> Layer:
    """`layer` refined by minimising the cross-entropy between the answers `probs` (used as
    soft labels) and the layer's softmax (sigmoid for one output) on the flattened queries `x`,
    with L-BFGS in float64 from `layer`: the loss Tramèr et al. 2016 (Sec. 4.1.2) minimise for
    multiclass LR when the equations cannot be solved exactly. Convex in (W, b); answers rounded
    to 0 still count (the log-ratio equations must drop them). W is returned centred."""
    weight, bias = layer
    xt = torch.from_numpy(x)
    target = torch.from_numpy(probs)
    w = torch.tensor(weight, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [w, b], max_iter=steps, tolerance_grad=1e-12, tolerance_change=1e-15,
        line_search_fn="strong_wolfe",
    )  # fmt: skip

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        logits = xt @ w.T + b
        if probs.shape[1] == 1:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        else:
            loss = -(target * torch.log_softmax(logits, dim=1)).sum(1).mean()
        loss.backward()
        return loss

    optimizer.step(closure)
    weight, bias = w.detach().numpy(), b.detach().numpy()
    if probs.shape[1] > 1:
        weight, bias = weight - weight.mean(0), bias - bias.mean()
    return weight.copy(), bias.copy()


def answer_step(probs: np.ndarray, finest: int = 8) -> float | None:
    """The decimal grid 10^-r (r = 1..`finest`) every answer lies on, or None: answers rounded
    by the API (an output defence such as `rounding:r`) show it, continuous ones do not."""
    values = probs[np.isfinite(probs)]
    for r in range(1, finest + 1):
        scaled = values * 10.0**r
        if np.all(np.abs(scaled - np.round(scaled)) <= 1e-6):
            return 10.0**-r
    return None


@register_extraction("equation")
class EquationSolving(ExtractionAttack):
    """Tramèr et al. 2016, Sec. 4.1: exact weights of a softmax / logistic-regression victim
    from probability vectors by solving the log-ratio equations.

    `queries`: inputs solved from (default d + 1, the paper's count: exact in float64);
    `checks`: fresh queries the fit is tested on (exactness, linearity); `oversample`: when
    the check residual shows inexact answers (float32, rounding), the fit is redone from
    `oversample`·(d + 1) queries by weighted least squares; `max_residual`: the largest
    |p̂ - p| on fresh queries (`probability_residual`) above which the victim is refused as
    not softmax-linear — unless its answers lie on a decimal grid (`answer_step`: rounded by
    the API), where the misfit may be the rounding's and is only reported (`residual`).
    Queries are uniform in `task.bounds`. Spends at most `task.budget` queries; a budget or a
    monitor's refusal stops it with the fit from what was answered (`stopped`)."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.SCORES, ("bounds",))
    exact: ClassVar[bool] = True
    paper: ClassVar[str] = (
        "Tramèr et al. 2016, Stealing Machine Learning Models via Prediction APIs, Sec. 4.1"
    )

    def __init__(
        self,
        queries: int | None = None,
        checks: int = 8,
        oversample: float = 4.0,
        max_residual: float = 0.05,
    ) -> None:
        if queries is not None and (isinstance(queries, bool) or int(queries) < 1):
            raise ExtractionError(f"equation: queries must be >= 1, got {queries!r}")
        if isinstance(checks, bool) or int(checks) < 1:
            raise ExtractionError(f"equation: checks must be >= 1, got {checks!r}")
        if not (np.isfinite(oversample) and oversample >= 1):
            raise ExtractionError(f"equation: oversample must be >= 1, got {oversample!r}")
        if not (np.isfinite(max_residual) and max_residual > 0):
            raise ExtractionError(f"equation: max_residual must be > 0, got {max_residual!r}")
        self.queries = None if queries is None else int(queries)
        self.checks = int(checks)
        self.oversample = float(oversample)
        self.max_residual = float(max_residual)

    def steal(self, target: Target, task: ExtractionTask) -> Stolen:
        """Query, solve, check on fresh queries; redo by least squares when inexact."""
        d = task.input_dim
        gen = np.random.default_rng(task.seed)
        low, high = task.bounds
        state = _Asker(target, task, gen, low, high)
        first = self.queries if self.queries is not None else d + 1
        state.ask(min(first, task.budget))
        checks = state.ask_checks(self.checks)
        if state.x.shape[0] == 0:
            raise ExtractionError("equation: the target answered no query")
        layer, info = solve_log_ratios(state.x, state.p)
        residual = probability_residual(*checks, layer) if checks else float("nan")
        exact = bool(residual <= EXACT_RESIDUAL)
        if not exact and self.queries is None and state.stopped is None:
            more = int(np.ceil(self.oversample * (d + 1)))
            state.absorb(*checks)
            state.ask(more - state.x.shape[0])
            checks = state.ask_checks(self.checks)
            layer, info = solve_log_ratios(state.x, state.p)
        if not exact:
            layer = refine_cross_entropy(state.x, state.p, layer)
            if checks:
                residual = probability_residual(*checks, layer)
        answered = state.p if not checks else np.vstack([state.p, checks[1]])
        step = answer_step(answered)
        if checks and residual > self.max_residual and step is None:
            raise ExtractionError(
                "victim is not a softmax-linear model (or its answers are perturbed): the fit "
                f"misses its answers on fresh queries by up to {residual:.3g} "
                f"(> {self.max_residual:g})"
            )
        params = {
            "solved_from": int(state.x.shape[0]),
            "check_queries": len(checks[0]) if checks else 0,
            "residual": residual,
            "exact_answers": exact,
            "answer_step": step,
            "underdetermined_classes": info["underdetermined"],
            "equations_per_class": info["equations"],
        }
        model = layers_module([layer])
        return Stolen(model=model, layers=[layer], stopped=state.stopped, params=params)


class _Asker:
    """The attack's queries and answers so far (flattened float64 inputs, probability rows),
    stopping at the task's budget or at a refusal."""

    def __init__(
        self,
        target: Target,
        task: ExtractionTask,
        gen: np.random.Generator,
        low: float,
        high: float,
    ) -> None:
        self.target, self.task, self.gen = target, task, gen
        self.low, self.high = low, high
        self.x = np.zeros((0, task.input_dim))
        self.p = np.zeros((0, max(task.num_classes, 1)))
        self.spent = 0
        self.stopped: str | None = None

    def _query(self, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        n = min(n, self.task.budget - self.spent)
        if n <= 0 or self.stopped is not None:
            if n <= 0 and self.stopped is None:
                self.stopped = "budget"
            return None
        x = self.gen.uniform(self.low, self.high, size=(n, self.task.input_dim))
        answered = self._answer(x)
        if not answered:
            return None
        probs = np.vstack(answered)
        self.spent += len(probs)
        return x[: len(probs)], probs

    def _answer(self, x: np.ndarray) -> list[np.ndarray]:
        """Probability rows for the longest prefix of `x` the target answers: a batch refused
        for the budget is split in halves (an API that counts per batch refuses the whole
        batch that would exceed it; the rest of the budget is still worth spending)."""
        batch = torch.from_numpy(x).reshape(len(x), *self.task.input_shape)
        try:
            return [self.target.probabilities(batch).double().numpy()]
        except QueryBudgetError:
            if len(x) == 1:
                self.stopped = "budget"
                return []
            half = len(x) // 2
            first = self._answer(x[:half])
            if self.stopped is not None:
                return first
            return first + self._answer(x[half:])
        except (TargetError, AccessError):
            raise
        except PrivacylabError:
            self.stopped = "refused"
            return []

    def ask(self, n: int) -> None:
        """Query `n` more inputs and keep them for the fit."""
        got = self._query(n)
        if got is not None:
            self.absorb(*got)

    def ask_checks(self, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """`n` fresh queries the fit is tested on (None when none could be asked)."""
        return self._query(n)

    def absorb(self, x: np.ndarray, probs: np.ndarray) -> None:
        """Add answered queries to the fit's equations."""
        if self.p.shape[1] != probs.shape[1]:
            self.p = np.zeros((0, probs.shape[1]))
        self.x = np.vstack([self.x, x])
        self.p = np.vstack([self.p, probs])
