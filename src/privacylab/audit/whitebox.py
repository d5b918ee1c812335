"""White-box audit of DP-SGD with a Dirac gradient canary.

Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini & Terzis 2023 ("Tight Auditing of
Differentially Private Machine Learning", USENIX Security), Sec. 4–5, after Nasr et al. 2021
("Adversary Instantiation", Sec. 4, the "gradient canary" adversary with access to all
intermediate updates).

The adversary controls "examples" whose clipped gradient is the Dirac vector C·e_j, with j a
weight of a logistic regression on a pixel that is 0 in every training image, so that the real
data contributes exactly 0 to coordinate j of the clipped sum.  Every such weight (each zero
pixel × each class: 110 with the default 200 digits) hosts its own canary.  Their coordinates are
disjoint, the data never reaches them and a weight on a zero pixel never changes any output, so
the canaries' observations are independent and each run yields one trial per canary.
The training run is DP-SGD through :class:`~privacylab.training.dp.engine.DPSGD` with Poisson
sampling at rate q.  In world D1 each canary joins each step's batch independently with
probability q (like any example); in D0 it is absent.  The auditor
reads coordinate j of every privatised update,

    o_t = L·grad_t[j] = clipped_sum_t[j] + noise_t[j] + C·b_t,   b_t ~ Bernoulli(q) in D1, 0 in D0,

so, in units of σC, o_t/(σC) ~ N(0, 1) under D0 and (1 − q)·N(0, 1) + q·N(1/σ, 1) under D1 —
exactly the Poisson-subsampled Gaussian mechanism composed over the steps that the accountant
analyses, which is why a Dirac canary can make the audit (nearly) tight.

The score of a run is the Neyman–Pearson log-likelihood ratio of D1 against D0 for the per-step
observations (Nasr et al. 2023 use the per-step observations directly),

    S = Σ_t log(1 − q + q·exp(μ₀·z_t − μ₀²/2)),   z_t = o_t/(σC), μ₀ = 1/σ,

with the *claimed* σ and the true rate q (the auditor designs the canary; it knows how often it
is inserted).  For q = 1 this is an increasing function of Σ_t o_t, the "simple sum".
``score="sum"`` uses Σ_t z_t for any q.

Design (a) (:func:`run_whitebox_audit`, method ``"dirac"``): T trials, each one run with the
canary (D1) and one without (D0).

* The *Clopper–Pearson* bound (``params["epsilon_lower_bound_cp"]``) of Jagielski et al. 2020
  (Alg. 2; :func:`privacylab.report.metrics.epsilon_lower_bound`), valid at ``confidence`` for
  any mechanism: trials with an even index choose the threshold (largest bound there), trials
  with an odd index are counted at it.
* The *GDP* bound (``params["epsilon_lower_bound_gdp"]``) of Nasr et al. 2023 (Sec. 4): at the
  threshold fixed in advance halfway between the claimed D0 and D1 (likelihood ratio 1), FPR and
  FNR over all trials are bounded by Clopper–Pearson (Bonferroni over the two), μ_LB =
  Φ⁻¹(1 − FPR_hi) − Φ⁻¹(FNR_hi) (Dong, Roth & Su 2022, Eq. 2.3) and ε_LB is the ε of μ_LB-GDP
  (Dong et al., Cor. 2.13).  It is certified when the trade-off curve is Gaussian, which holds
  exactly for q = 1 (T steps of noise σ are √T/σ-GDP, and the Dirac observations are Gaussian).
* ``epsilon_lower_bound`` is the GDP bound for q = 1 and the Clopper–Pearson one for q < 1
  (``bound="auto"``; set ``bound`` to choose).
* ``params["epsilon_gdp_estimate"]`` is the GDP point estimate μ̂ at the same counts (floored at
  ½): not a bound.

Reaching ε_LB ≈ ε with Clopper–Pearson alone at δ = 1e-5 needs FPR ≈ e^{−ε} to be *certified*,
i.e. ≳ 3.7·e^{ε} held-out trials per world (thousands at ε = 8); the GDP bound is nearly tight
with about 2,000 trials per world (20 runs of 110 canaries).

Design (b), per-step trials inside one run (:func:`run_per_step_audit`, method
``"dirac-per-step"``): at every step of one long run a fair coin, not Poisson sampling, decides
whether the canary is added, and each step is one trial.  This is statistically valid for *this*
canary only: coordinate j never receives data gradient (its pixel is 0 in every image, so the
clipped sum there is exactly 0 whatever the model) and the noise is fresh each step, so the pairs
(b_t, z_t) are independent and identically distributed — the adaptivity that breaks per-step
trials for a general canary (later updates depend on earlier insertions) does not reach z_t.
But the mechanism those trials audit is the *one-step, unsampled* Gaussian mechanism with noise
multiplier σ, so its ``epsilon_theory`` is ε(σ, q = 1, 1 step), not the run's ε (which is
amplified by sampling and composed over steps and can be far smaller — comparing the per-step
bound with it would "refute" a correct implementation).  Design (b) therefore audits σ only: it
catches ``noise_scale_bug`` cheaply and cannot see ``rate_bug``.

Deliberately broken DP-SGD for testing that audits catch bugs: ``noise_scale_bug`` = b trains
with noise multiplier σ·b while reporting the ε of σ; ``rate_bug`` = r samples at q but reports the
ε computed for rate q·r.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from scipy.special import ndtri
from torch import Tensor, nn

from privacylab.accounting.calibration import calibrate_noise_multiplier, dp_sgd_epsilon
from privacylab.audit._checks import confidence_level, finite, whole
from privacylab.audit.result import AuditResult
from privacylab.audit.runner import run_trials
from privacylab.audit.statistics import epsilon_from_gdp_mu, epsilon_lower_bound_gdp
from privacylab.execution import Executor, ResultStore
from privacylab.execution.executor import torch_threads
from privacylab.stats import epsilon_from_counts, epsilon_lower_bound, roc_counts

METHOD = "dirac"
SCORES: tuple[str, ...] = ("likelihood_ratio", "sum")
BOUNDS: tuple[str, ...] = ("auto", "gdp", "clopper-pearson")
_ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp", "gdp")
GDP_MIN_ERROR_RATE = 0.05
"""Least error rate on each side at the threshold used for the GDP estimate."""


@dataclass(frozen=True)
class DiracAudit:
    """Configuration of a Dirac-canary white-box audit of DP-SGD (Nasr et al. 2023, Sec. 4–5).

    Attributes:
        epsilon: target ε; σ is calibrated so that the *reported* run is (ε, δ)-DP.
        delta: δ of the guarantee and of the audit's bounds.
        sample_rate: q, the Poisson sampling rate of the data and of the canary.
        steps: DP-SGD steps per training run.
        max_grad_norm: C, the clipping norm (and the canary's norm).
        num_examples: training examples taken from sklearn's ``digits``.
        learning_rate: SGD step size.
        accountant: accountant used to calibrate σ and report ε (``pld``, ``rdp`` or ``gdp``).
        score: ``likelihood_ratio`` (default, Neyman–Pearson for the Poisson mixture) or ``sum``.
        canaries: Dirac canaries per run, one per (zero pixel, class) weight; 0 = all there are.
        bound: the bound reported as ``epsilon_lower_bound``: ``gdp`` (Nasr et al. 2023, exact for
            q = 1), ``clopper-pearson`` (Jagielski et al. 2020) or ``auto`` (gdp iff q = 1).
        noise_scale_bug: b in (0, 1]; train with σ·b but report the ε of σ (1 = no bug).
        rate_bug: r in (0, 1]; sample at q but report the ε of rate q·r (1 = no bug).
        seed: base seed; trial i of this configuration is seeded from (seed, i).
    """

    epsilon: float = 2.0
    delta: float = 1e-5
    sample_rate: float = 1.0
    steps: int = 10
    max_grad_norm: float = 1.0
    num_examples: int = 200
    learning_rate: float = 0.1
    accountant: str = "pld"
    score: str = "likelihood_ratio"
    canaries: int = 0
    bound: str = "auto"
    noise_scale_bug: float = 1.0
    rate_bug: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        eps = finite("epsilon", self.epsilon)
        if eps <= 0.0:
            raise ValueError(f"epsilon must be > 0, got {self.epsilon!r}")
        if not 0.0 < finite("delta", self.delta) < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        for name in ("sample_rate", "noise_scale_bug", "rate_bug"):
            if not 0.0 < finite(name, getattr(self, name)) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)!r}")
        for name in ("max_grad_norm", "learning_rate"):
            if finite(name, getattr(self, name)) <= 0.0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        whole("steps", self.steps, 1)
        whole("num_examples", self.num_examples, 1)
        whole("seed", self.seed, 0)
        whole("canaries", self.canaries, 0)
        if self.bound not in BOUNDS:
            raise ValueError(f"bound must be one of {', '.join(BOUNDS)}, got {self.bound!r}")
        if self.accountant not in _ACCOUNTANTS:
            raise ValueError(
                f"accountant must be one of {', '.join(_ACCOUNTANTS)}, got {self.accountant!r}"
            )
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {', '.join(SCORES)}, got {self.score!r}")

    @property
    def certified_by(self) -> str:
        """The bound reported as ``epsilon_lower_bound`` (``auto`` resolved)."""
        if self.bound != "auto":
            return self.bound
        return "gdp" if self.sample_rate >= 1.0 else "clopper-pearson"

    @property
    def reported_sample_rate(self) -> float:
        """The rate the accountant is told: q·rate_bug."""
        return self.sample_rate * self.rate_bug

    def reported_noise_multiplier(self) -> float:
        """σ calibrated (PLD/RDP/GDP, as configured) for (ε, δ) at the reported rate and steps."""
        return calibrate_noise_multiplier(
            self.epsilon,
            self.delta,
            self.reported_sample_rate,
            self.steps,
            accountant=self.accountant,
        )

    def reported_epsilon(self) -> float:
        """ε the (possibly buggy) implementation reports for its run."""
        return dp_sgd_epsilon(
            self.reported_noise_multiplier(),
            self.reported_sample_rate,
            self.steps,
            self.delta,
            self.accountant,
        )

    def actual_epsilon(self) -> float:
        """ε of the mechanism actually run (σ·noise_scale_bug at rate q), same accountant."""
        return dp_sgd_epsilon(
            self.reported_noise_multiplier() * self.noise_scale_bug,
            self.sample_rate,
            self.steps,
            self.delta,
            self.accountant,
        )


@lru_cache(maxsize=4)
def _digits(num_examples: int) -> tuple[Tensor, Tensor, Tensor]:
    """First `num_examples` digits, flattened, and the indices of the pixels that are 0 in all of
    them."""
    from privacylab.data import load_dataset

    data = load_dataset("digits")
    n = min(num_examples, int(data.labels.shape[0]))
    x = data.features.reshape(data.labels.shape[0], -1)[:n].contiguous()
    y = data.labels[:n].contiguous()
    zero = (x.abs().sum(0) == 0).nonzero().flatten()
    if zero.numel() == 0:
        raise ValueError("no pixel is 0 in every training image; cannot isolate a Dirac coordinate")
    return x, y, zero


def canary_coordinates(config: DiracAudit) -> tuple[Tensor, Tensor]:
    """(class rows, pixel columns) of the weights hosting the canaries: every zero pixel × every
    class, pixel-major, the first ``config.canaries`` of them (all for 0)."""
    _, _, zero = _digits(config.num_examples)
    rows = torch.arange(10).repeat(zero.numel())
    cols = zero.repeat_interleave(10)
    if config.canaries > rows.numel():
        raise ValueError(
            f"canaries={config.canaries} but only {rows.numel()} weights sit on zero pixels"
        )
    k = config.canaries or rows.numel()
    return rows[:k], cols[:k]


def _train_and_observe(
    config: DiracAudit,
    noise_multiplier: float,
    canary: bool | np.ndarray,
    seed: int,
    claimed: float,
) -> np.ndarray:
    """One DP-SGD run of logistic regression on digits, trained with `noise_multiplier`;
    returns o_t/(σ_claimed·C) for every canary and step, shape (canaries, steps),
    σ_claimed = `claimed`.

    The model has no bias: with a single parameter tensor the engine's noise draws cannot be
    reordered (ghost clipping visits a layer's parameters in frozenset order, which depends on
    PYTHONHASHSEED), so the same seed gives the same numbers in every process.

    `canary`: False (D0), True (D1: each canary Poisson-sampled at rate q each step, independently)
    or a boolean schedule of shape (canaries, steps).
    """
    from privacylab.training.dp.engine import DPSGD, StepInfo

    x, y, _ = _digits(config.num_examples)
    rows, cols = canary_coordinates(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = nn.Linear(x.shape[1], 10, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=config.learning_rate)
    q = config.sample_rate
    clip = config.max_grad_norm
    engine = DPSGD(
        model,
        opt,
        nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=noise_multiplier,
        max_grad_norm=clip,
        expected_batch_size=q * x.shape[0],
        clipping="ghost",
        generator=gen,
    )
    canary_gen = torch.Generator().manual_seed(seed + 1)
    unit = claimed * clip
    observed = np.empty((rows.numel(), config.steps), dtype=np.float64)

    def hook(info: StepInfo) -> None:
        grad = model.weight.grad
        assert grad is not None
        t = info.step - 1
        if isinstance(canary, np.ndarray):
            present = torch.as_tensor(canary[:, t], dtype=torch.bool)
        elif canary:
            present = torch.rand(rows.numel(), generator=canary_gen) < q
        else:
            present = torch.zeros(rows.numel(), dtype=torch.bool)
        grad[rows, cols] += present.to(grad.dtype) * (clip / engine.expected_batch_size)
        observed[:, t] = (grad[rows, cols] * (engine.expected_batch_size / unit)).numpy()

    engine.add_step_hook(hook)
    for _ in range(config.steps):
        if q >= 1.0:
            idx = torch.arange(x.shape[0])
        else:
            idx = (torch.rand(x.shape[0], generator=gen) < q).nonzero().squeeze(1)
        engine.step(x[idx], y[idx])
    return observed


def _score(config: DiracAudit, obs: np.ndarray) -> list[float]:
    """The run's score of each canary (one row of `obs` each, one column per step)."""
    if config.score == "sum":
        return obs.sum(axis=1).tolist()
    mu = 1.0 / config.reported_noise_multiplier()
    q = config.sample_rate
    log_ratio = mu * obs - 0.5 * mu * mu
    if q >= 1.0:
        return log_ratio.sum(axis=1).tolist()
    return np.logaddexp(math.log1p(-q), math.log(q) + log_ratio).sum(axis=1).tolist()


def whitebox_trial(task: dict[str, Any]) -> dict[str, Any]:
    """One audit trial (top-level, picklable, for :func:`privacylab.audit.run_trials`).

    ``task = {"config": asdict(DiracAudit), "trial": i}``; trains one run without the canaries
    (D0) and one with them (D1), with seeds derived from (seed, i), and returns every canary's
    score in each, ``{"score_out": [...], "score_in": [...]}``.
    """
    with torch_threads(1):
        return _whitebox_trial(task)


def _whitebox_trial(task: dict[str, Any]) -> dict[str, Any]:
    """The trial itself (see the public wrapper)."""
    config = DiracAudit(**task["config"])
    index = whole("trial", task["trial"], 0)
    claimed = config.reported_noise_multiplier()
    sigma = claimed * config.noise_scale_bug
    base = (config.seed * 1_000_003 + index) * 4
    out = _train_and_observe(config, sigma, canary=False, seed=base, claimed=claimed)
    into = _train_and_observe(config, sigma, canary=True, seed=base + 2, claimed=claimed)
    return {"score_out": _score(config, out), "score_in": _score(config, into)}


def _mu(fp: Any, fn: Any, n0: Any, n1: Any) -> Any:
    """μ̂ = Φ⁻¹(1 − FPR) − Φ⁻¹(FNR), error counts floored at ½ (and capped at n − ½) so that it
    stays finite; accepts arrays."""
    fpr = np.clip(fp, 0.5, np.asarray(n0) - 0.5) / n0
    fnr = np.clip(fn, 0.5, np.asarray(n1) - 0.5) / n1
    return ndtri(1.0 - fpr) - ndtri(fnr)


def _counts(inside: np.ndarray, outside: np.ndarray, threshold: float) -> tuple[int, ...]:
    tp = int(np.sum(inside >= threshold))
    fp = int(np.sum(outside >= threshold))
    return tp, inside.size - tp, fp, outside.size - fp


def _lowest_best(values: np.ndarray, thresholds: np.ndarray) -> tuple[float, float]:
    """(largest value, the lowest threshold reaching it); `thresholds` run from high to low."""
    last = values.size - 1 - int(np.argmax(values[::-1]))
    return float(values[last]), float(thresholds[last])


def held_out_audit(
    inside: np.ndarray,
    outside: np.ndarray,
    delta: float,
    confidence: float,
    *,
    splits: tuple[list[np.ndarray], list[np.ndarray]] | None = None,
    gdp_threshold: float | None = None,
) -> dict[str, Any]:
    """Threshold on the first half of each score array, counts on the second half.

    Returns the Clopper–Pearson ε bound (Jagielski et al. 2020, Alg. 2), the GDP bound and the
    GDP estimate (Nasr et al. 2023, Sec. 4) from counts not used to choose their thresholds, with
    the thresholds and counts.
    `splits` = ([choose_in, test_in], [choose_out, test_out]) overrides the halving.

    With `gdp_threshold` (fixed before the data, e.g. the claimed model's midpoint), the GDP
    estimate counts *all* scores at it.  Without, the GDP threshold is the one with the largest
    μ̂ on the choosing half among those with at least ``GDP_MIN_ERROR_RATE`` of each side
    misclassified there (extreme thresholds make μ̂ mostly noise), counted on the other half.
    """
    if splits is None:
        half_in, half_out = inside.size // 2, outside.size // 2
        choose_in, choose_out = inside[:half_in], outside[:half_out]
        test_in, test_out = inside[half_in:], outside[half_out:]
    else:
        (choose_in, test_in), (choose_out, test_out) = splits
    # Counts of "score >= t" at every distinct choosing score and at +inf, highest t first.
    fps, tps, thresholds = roc_counts(
        np.concatenate([choose_in, choose_out]),
        np.r_[np.ones(choose_in.size, dtype=np.int64), np.zeros(choose_out.size, dtype=np.int64)],
    )
    fns, tns = choose_in.size - tps, choose_out.size - fps
    bounds = epsilon_from_counts(tps, fns, fps, tns, delta, confidence)
    _, cp_threshold = _lowest_best(bounds, thresholds)
    mus = _mu(fps, fns, choose_out.size, choose_in.size)
    min_fp = max(1, math.ceil(GDP_MIN_ERROR_RATE * choose_out.size))
    min_fn = max(1, math.ceil(GDP_MIN_ERROR_RATE * choose_in.size))
    eligible = (fps >= min_fp) & (fns >= min_fn)
    if eligible.any():
        _, mu_threshold = _lowest_best(np.where(eligible, mus, -np.inf), thresholds)
    else:
        _, mu_threshold = _lowest_best(mus, thresholds)
    tp, fn, fp, tn = _counts(test_in, test_out, cp_threshold)
    certified = epsilon_lower_bound(tp, fn, fp, tn, delta, confidence)
    if gdp_threshold is None:
        gtp, gfn, gfp, gtn = _counts(test_in, test_out, mu_threshold)
    else:
        mu_threshold = float(gdp_threshold)
        gtp, gfn, gfp, gtn = _counts(inside, outside, mu_threshold)
    mu_hat = max(float(_mu(gfp, gfn, gfp + gtn, gtp + gfn)), 0.0)
    epsilon_gdp_lb, mu_lb = epsilon_lower_bound_gdp(
        gfp, gfp + gtn, gfn, gtp + gfn, delta, confidence
    )
    return {
        "epsilon_cp": certified,
        "epsilon_gdp_lb": epsilon_gdp_lb,
        "mu_gdp_lb": mu_lb,
        "epsilon_gdp": epsilon_from_gdp_mu(mu_hat, delta),
        "mu_gdp": mu_hat,
        "cp_threshold": cp_threshold,
        "gdp_threshold": mu_threshold,
        "counts": {"tp": tp, "fn": fn, "fp": fp, "tn": tn},
        "gdp_counts": {"tp": gtp, "fn": gfn, "fp": gfp, "tn": gtn},
    }


def _midpoint(config: DiracAudit, sigma: float) -> float:
    """Score halfway between D0 and D1 under the claimed model: likelihood ratio 1 (score 0), or
    for ``score="sum"`` half the expected canary signal, steps·q/(2σ)."""
    if config.score == "sum":
        return config.steps * config.sample_rate / (2.0 * sigma)
    return 0.0


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _checked(
    config: object, name: str, count: object, low: int, confidence: object
) -> tuple[int, float]:
    """The audit's count (trials or steps) and confidence, checked before any training; also
    fails fast on more canaries than there are untouched weights."""
    if not isinstance(config, DiracAudit):
        raise ValueError(f"config must be a DiracAudit, got {type(config).__name__}")
    n = whole(name, count, low)
    level = confidence_level(confidence)
    canary_coordinates(config)
    return n, level


def _result(
    config: DiracAudit,
    found: dict[str, Any],
    bound: str,
    *,
    method: str,
    epsilon_theory: float,
    level: float,
    trials: int,
    start: float,
    counts: dict[str, Any],
    params: dict[str, Any],
) -> AuditResult:
    """The `AuditResult` of a Dirac audit: `bound` (``gdp`` or ``clopper-pearson``) is reported
    as ``epsilon_lower_bound``; both bounds, the GDP estimate and the configuration's noise are
    added to `params`, the counts of `found` to `counts`."""
    sigma = config.reported_noise_multiplier()
    return AuditResult(
        method=method,
        epsilon_theory=epsilon_theory,
        delta=config.delta,
        accountant=config.accountant,
        epsilon_lower_bound=found["epsilon_gdp_lb"] if bound == "gdp" else found["epsilon_cp"],
        confidence=level,
        trials=trials,
        counts={**found["counts"], "gdp": found["gdp_counts"], **counts},
        seconds=time.perf_counter() - start,
        params={
            "noise_multiplier": sigma,
            "noise_multiplier_trained": sigma * config.noise_scale_bug,
            "sample_rate": config.sample_rate,
            "max_grad_norm": config.max_grad_norm,
            "bound": bound,
            "epsilon_lower_bound_cp": found["epsilon_cp"],
            "epsilon_lower_bound_gdp": found["epsilon_gdp_lb"],
            "mu_lower_bound_gdp": found["mu_gdp_lb"],
            "epsilon_gdp_estimate": found["epsilon_gdp"],
            "mu_gdp_estimate": found["mu_gdp"],
            "noise_scale_bug": config.noise_scale_bug,
            "rate_bug": config.rate_bug,
            **params,
        },
    )


def run_whitebox_audit(
    config: DiracAudit,
    trials: int,
    *,
    store: ResultStore,
    executor: Executor | None = None,
    confidence: float = 0.95,
) -> AuditResult:
    """Audit DP-SGD with a Dirac gradient canary (Nasr et al. 2023, Sec. 4–5; design (a)).

    Runs (or reuses from `store`) trials 0..trials−1, each a D0 and a D1 training run with every
    canary; for the Clopper–Pearson bound the canaries of even trials choose the threshold and
    those of odd trials are counted, the GDP bound counts all at the threshold fixed in advance.
    ``epsilon_lower_bound`` is the bound named by ``config.certified_by``, certified at
    `confidence` (see the module docstring); both bounds and the GDP point estimate are in
    ``params``.  ``epsilon_theory`` is the ε the run reports
    (so ``violated`` flags ``noise_scale_bug``/``rate_bug``); ``params["epsilon_actual"]`` is the
    ε of the mechanism actually run.
    """
    n, level = _checked(config, "trials", trials, 2, confidence)
    start = time.perf_counter()
    sigma = config.reported_noise_multiplier()
    rows = run_trials(whitebox_trial, asdict(config), n, store=store, executor=executor)
    inside = np.array([r["score_in"] for r in rows], dtype=np.float64)
    outside = np.array([r["score_out"] for r in rows], dtype=np.float64)
    choose, count = slice(0, n, 2), slice(1, n, 2)
    found = held_out_audit(
        inside.ravel(),
        outside.ravel(),
        config.delta,
        level,
        splits=(
            [inside[choose].ravel(), inside[count].ravel()],
            [outside[choose].ravel(), outside[count].ravel()],
        ),
        gdp_threshold=_midpoint(config, sigma),
    )
    return _result(
        config,
        found,
        config.certified_by,
        method=METHOD,
        epsilon_theory=config.reported_epsilon(),
        level=level,
        trials=n,
        start=start,
        counts={"runs": 2 * n, "canaries": int(inside.shape[1])},
        params={
            "sample_rate_reported": config.reported_sample_rate,
            "steps": config.steps,
            "score": config.score,
            "epsilon_target": config.epsilon,
            "epsilon_actual": config.actual_epsilon(),
            "cp_threshold": _finite_or_none(found["cp_threshold"]),
            "gdp_threshold": _finite_or_none(found["gdp_threshold"]),
        },
    )


def per_step_trial(task: dict[str, Any]) -> dict[str, Any]:
    """Design (b): one run of ``config["per_step_steps"]`` steps, each canary added at each step
    with probability ½ (its own coin); returns the coins and the observations z = o/(σC), both of
    shape (canaries, steps) (top-level and picklable, for :func:`privacylab.audit.run_trials`)."""
    with torch_threads(1):
        return _per_step_trial(task)


def _per_step_trial(task: dict[str, Any]) -> dict[str, Any]:
    """The trial itself (see the public wrapper)."""
    fields = dict(task["config"])
    steps = whole("per_step_steps", fields.pop("per_step_steps", None), 2)
    audited = DiracAudit(**fields)
    claimed = audited.reported_noise_multiplier()
    sigma = claimed * audited.noise_scale_bug
    config = replace(audited, steps=steps)
    seed = (config.seed * 1_000_003 + whole("trial", task["trial"], 0)) * 4
    width = canary_coordinates(config)[0].numel()
    coins = torch.rand(width, steps, generator=torch.Generator().manual_seed(seed + 3)) < 0.5
    labels = coins.numpy()
    z = _train_and_observe(config, sigma, canary=labels, seed=seed, claimed=claimed)
    return {"labels": labels.tolist(), "scores": z.tolist()}


def run_per_step_audit(
    config: DiracAudit,
    steps: int,
    *,
    store: ResultStore,
    executor: Executor | None = None,
    confidence: float = 0.95,
) -> AuditResult:
    """Design (b): per-step trials inside one run of `steps` steps (see the module docstring).

    Every (canary, step) pair is a trial.  For the Clopper–Pearson bound (Jagielski et al. 2020,
    Alg. 2) even steps choose the threshold and odd steps are counted; the GDP bound (Nasr et al.
    2023, Sec. 4) counts all at the claimed midpoint 1/(2σ).  The audited mechanism is one
    unsampled Gaussian step, exactly (1/σ)-GDP, so ``bound="auto"`` reports the GDP bound.
    ``epsilon_theory`` is ε(σ_reported, q = 1, 1 step) by the configured accountant — the
    guarantee the per-step trials can test.  The run is one durable trial in `store`.
    """
    n, level = _checked(config, "steps", steps, 4, confidence)
    start = time.perf_counter()
    sigma = config.reported_noise_multiplier()
    payload = {**asdict(config), "per_step_steps": n}
    (row,) = run_trials(per_step_trial, payload, 1, store=store, executor=executor)
    labels = np.asarray(row["labels"], dtype=bool)
    scores = np.asarray(row["scores"], dtype=np.float64)
    choose, count = slice(0, n, 2), slice(1, n, 2)
    parts = [scores[:, choose][labels[:, choose]], scores[:, count][labels[:, count]]]
    nulls = [scores[:, choose][~labels[:, choose]], scores[:, count][~labels[:, count]]]
    if min(p.size for p in parts + nulls) == 0:
        raise ValueError(f"steps={n} is too few: a half has no step with (or without) the canary")
    found = held_out_audit(
        np.concatenate(parts),
        np.concatenate(nulls),
        config.delta,
        level,
        splits=(parts, nulls),
        gdp_threshold=0.5 / sigma,
    )
    return _result(
        config,
        found,
        "gdp" if config.bound == "auto" else config.bound,
        method="dirac-per-step",
        epsilon_theory=dp_sgd_epsilon(sigma, 1.0, 1, config.delta, config.accountant),
        level=level,
        trials=int(labels.size),
        start=start,
        counts={"runs": 1, "steps": n, "canaries": int(labels.shape[0])},
        params={
            "steps": n,
            "epsilon_run_reported": dp_sgd_epsilon(
                sigma, config.reported_sample_rate, n, config.delta, config.accountant
            ),
        },
    )
