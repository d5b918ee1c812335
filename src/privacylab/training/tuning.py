"""Private hyperparameter tuning: random search whose privacy cost is accounted.

Papernot & Steinke 2022 ("Hyperparameter Tuning with Rényi Differential Privacy", ICLR 2022):
draw the number of trials K at random, run K independent trials — each a DP training run with
hyperparameters drawn at random from a fixed list — and output only the best one (model and
score). If one trial is (λ, ε(λ))-RDP for all orders λ, the whole search is RDP with

- K ~ truncated negative binomial D_{η,γ} (their Theorem 2, Eq. 6), for λ > 1 and any λ̂ ≥ 1:
  ε'(λ) = ε(λ) + (1 + η)(1 − 1/λ̂) ε(λ̂) + (1 + η) log(1/γ)/λ̂ + log(E[K])/(λ − 1);
- K ~ Poisson(μ) (their Poisson result, §3.1), for λ > 1 when the trial is also (ε̂, δ̂)-DP
  with e^ε̂ ≤ 1 + 1/(λ − 1):  ε'(λ) = ε(λ) + μ δ̂ + log(μ)/(λ − 1).

The (ε, δ) reported is the tight RDP conversion (Balle et al. 2020, Thm 21) of ε'. The accounting
functions are pure (numpy/scipy); `private_random_search` runs the trials (`privacylab train
--tune N`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import brentq

from privacylab.accounting import PrivacyParameterError, calibrate_noise_multiplier
from privacylab.accounting.rdp import (
    DEFAULT_ORDERS,
    rdp_gaussian,
    rdp_subsampled_gaussian,
    rdp_to_delta,
    rdp_to_epsilon,
)
from privacylab.training.config import TrainConfig, TrainingError

DEFAULT_ETA = 0.0
"""η of the truncated negative binomial: 0 is the logarithmic distribution, whose tuning cost
for pure ε-DP trials tends to 2ε (Papernot & Steinke 2022, §3.2), against 3ε for the geometric
distribution (η = 1, Liu & Talwar 2019)."""


def tnb_mean(eta: float, gamma: float) -> float:
    """E[K] for K ~ D_{η,γ}, the negative binomial NB(η, γ) conditioned on K ≥ 1 (Papernot &
    Steinke 2022, Def. 1): η(1 − γ)/(γ(1 − γ^η)), and (1/γ − 1)/log(1/γ) for η = 0."""
    _check_tnb(eta, gamma)
    if eta == 0:
        return (1.0 / gamma - 1.0) / math.log(1.0 / gamma)
    return eta * (1.0 - gamma) / (gamma * (1.0 - gamma**eta))


def tnb_pmf(k: np.ndarray, eta: float, gamma: float) -> np.ndarray:
    """P[K = k] for K ~ D_{η,γ}, k ≥ 1 (Papernot & Steinke 2022, Def. 1):
    (1 − γ)^k / (k log(1/γ)) for η = 0, else C(k + η − 1, k) γ^η (1 − γ)^k / (1 − γ^η)."""
    _check_tnb(eta, gamma)
    k = np.asarray(k, dtype=float)
    if eta == 0:
        return np.exp(k * math.log1p(-gamma) - np.log(k)) / math.log(1.0 / gamma)
    from scipy.special import gammaln

    # For η in (−1, 0) both Γ(η) and 1 − γ^η are negative: the signs cancel.
    log_binom = gammaln(k + eta) - gammaln(k + 1) - math.lgamma(eta)
    scale = abs(1 - gamma**eta)
    return np.exp(log_binom + eta * math.log(gamma) + k * math.log1p(-gamma)) / scale


def gamma_for_mean(eta: float, mean: float) -> float:
    """The γ in (0, 1) for which D_{η,γ} has expectation `mean` (> 1)."""
    if not (math.isfinite(mean) and mean > 1.0):
        raise TrainingError(f"the expected number of trials must be > 1, got {mean!r}")
    return float(brentq(lambda g: tnb_mean(eta, g) - mean, 1e-12, 1 - 1e-12, xtol=1e-15))


def sample_tnb(rng: np.random.Generator, eta: float, gamma: float) -> int:
    """One draw of K ~ D_{η,γ}: a logarithmic draw for η = 0, else a negative binomial draw
    NB(η, γ) (failures before η successes of probability γ) redrawn until it is ≥ 1."""
    _check_tnb(eta, gamma)
    if eta == 0:
        return int(rng.logseries(1.0 - gamma))
    if eta < 0:
        raise TrainingError("sampling is implemented for eta >= 0 only")
    while True:
        k = int(rng.negative_binomial(eta, gamma))
        if k >= 1:
            return k


def _check_tnb(eta: float, gamma: float) -> None:
    if not (math.isfinite(eta) and eta > -1.0):
        raise TrainingError(f"eta must be a finite number > -1, got {eta!r}")
    if not 0.0 < gamma < 1.0:
        raise TrainingError(f"gamma must be in (0, 1), got {gamma!r}")


def _check_curve(orders: np.ndarray, rdp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    if a.ndim != 1 or a.shape != r.shape or a.size == 0:
        raise TrainingError("orders and RDP values must be 1-D arrays of one length")
    if np.any(a <= 1.0) or not np.all(np.isfinite(a)) or np.any(np.isnan(r)) or np.any(r < 0):
        raise TrainingError("orders must be > 1 and RDP values >= 0")
    return a, r


def tnb_tuning_rdp(orders: np.ndarray, rdp: np.ndarray, eta: float, gamma: float) -> np.ndarray:
    """RDP at each order λ of the best of K ~ D_{η,γ} trials, each with RDP curve `rdp`
    (Papernot & Steinke 2022, Theorem 2):

        ε'(λ) = ε(λ) + min_λ̂ [(1 + η)(1 − 1/λ̂) ε(λ̂) + (1 + η) log(1/γ)/λ̂] + log(E[K])/(λ − 1),

    the minimum taken over the same orders (the theorem holds for every λ̂ ≥ 1, so the minimum
    over any subset is a valid bound)."""
    a, r = _check_curve(orders, rdp)
    _check_tnb(eta, gamma)
    overhead = np.min((1 + eta) * (1 - 1 / a) * r + (1 + eta) * math.log(1 / gamma) / a)
    return r + overhead + math.log(tnb_mean(eta, gamma)) / (a - 1)


def poisson_tuning_rdp(orders: np.ndarray, rdp: np.ndarray, mu: float) -> np.ndarray:
    """RDP at each order λ of the best of K ~ Poisson(μ) trials, each with RDP curve `rdp`
    (Papernot & Steinke 2022, §3.1, Poisson distribution):

        ε'(λ) = ε(λ) + μ δ̂ + log(μ)/(λ − 1),

    where each trial is (ε̂, δ̂)-DP with ε̂ = log(1 + 1/(λ − 1)), δ̂ taken from the trial's RDP curve
    by the tight conversion (an upper bound on its δ at ε̂). K = 0 outputs nothing."""
    a, r = _check_curve(orders, rdp)
    if not (math.isfinite(mu) and mu > 0):
        raise TrainingError(f"mu must be a finite number > 0, got {mu!r}")
    delta_hat = np.array([rdp_to_delta(a, r, math.log1p(1 / (lam - 1)))[0] for lam in a])
    return r + mu * delta_hat + math.log(mu) / (a - 1)


def trial_rdp(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    orders: np.ndarray = DEFAULT_ORDERS,
    score_noise: float | None = None,
) -> np.ndarray:
    """RDP of one trial: `steps` of Poisson-sampled Gaussian DP-SGD (Mironov, Talwar & Zhang
    2019), composed with the Gaussian mechanism on the validation count when `score_noise` (the
    count's noise standard deviation; sensitivity 1) is given."""
    curve = steps * rdp_subsampled_gaussian(sample_rate, noise_multiplier, orders)
    if score_noise is not None:
        curve = curve + rdp_gaussian(score_noise, orders)
    return curve


@dataclass(frozen=True)
class TuningBudget:
    """The privacy split of a tuning run: what each trial spends and what the search does."""

    total_epsilon: float
    delta: float
    per_trial_epsilon: float
    noise_multipliers: tuple[float, ...]
    expected_trials: float
    eta: float
    gamma: float
    score_noise: float


def tuning_epsilon(
    curve: np.ndarray, delta: float, eta: float, gamma: float, orders: np.ndarray = DEFAULT_ORDERS
) -> float:
    """(ε, δ) of the tuning run with trial RDP `curve` (Theorem 2 then Balle et al. 2020)."""
    return rdp_to_epsilon(orders, tnb_tuning_rdp(orders, curve, eta, gamma), delta)[0]


def calibrate_tuning(
    target_epsilon: float,
    delta: float,
    plans: list[tuple[float, int]],
    expected_trials: float,
    *,
    eta: float = DEFAULT_ETA,
    score_noise: float = 10.0,
    orders: np.ndarray = DEFAULT_ORDERS,
) -> TuningBudget:
    """Noise multipliers for each trial plan `(sample_rate, steps)` such that the whole search
    (K ~ D_{η,γ} with E[K] = `expected_trials`) is (target ε, δ)-DP.

    Every plan's σ is calibrated to one per-trial ε₀ (RDP accountant); a trial's mechanism is
    "draw a plan, then train", whose RDP at each order is at most the largest over the plans
    (Rényi divergence is jointly quasi-convex, van Erven & Harremoës 2014, Thm 13). ε₀ is the
    largest (bisection) for which Theorem 2 gives total ε ≤ target.
    """
    if not plans:
        raise TrainingError("tuning needs at least one trial plan")
    gamma = gamma_for_mean(eta, expected_trials)

    def budget(eps0: float) -> tuple[float, tuple[float, ...]]:
        sigmas = tuple(calibrate_noise_multiplier(eps0, delta, q, t, "rdp") for q, t in plans)
        curve = np.max(
            [
                trial_rdp(s, q, t, orders, score_noise)
                for s, (q, t) in zip(sigmas, plans, strict=True)
            ],
            axis=0,
        )
        return tuning_epsilon(curve, delta, eta, gamma, orders), sigmas

    def fits(eps0: float) -> bool:
        try:
            return budget(eps0)[0] <= target_epsilon
        except PrivacyParameterError:  # no σ up to 1e6 reaches ε₀
            return False

    hi = target_epsilon
    lo = hi / 2
    while not fits(lo):
        hi, lo = lo, lo / 2
        if lo < target_epsilon * 1e-3:
            raise TrainingError(
                f"epsilon {target_epsilon:g} is too small for tuning with about "
                f"{expected_trials:g} trials; use fewer trials or a larger epsilon"
            )
    for _ in range(30):
        mid = math.sqrt(lo * hi)
        if fits(mid):
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.002:
            break
    total, sigmas = budget(lo)
    return TuningBudget(
        total_epsilon=total,
        delta=delta,
        per_trial_epsilon=lo,
        noise_multipliers=sigmas,
        expected_trials=expected_trials,
        eta=eta,
        gamma=gamma,
        score_noise=score_noise,
    )


LR_FACTORS = (0.5, 0.7, 1.0, 1.4, 2.0)
"""The learning rate is searched over these multiples of the default (log-uniform)."""

CLIP_NORMS = (0.3, 1.0, 3.0)
"""Clipping norms searched (lr·C kept by scaling lr when C is searched)."""

BATCH_FACTORS = (1.0, 2.0)
"""The batch size is searched over these multiples of the default, at the same number of steps
(De et al. 2022's fixed step budget; smaller batches only add noise per step)."""

VALIDATION_FRACTION = 0.2
SCORE_NOISE_FRACTION = 0.02
"""The validation count's Gaussian noise is at least this fraction of the validation size (2%
accuracy) and at least SCORE_NOISE_TIMES_EPSILON / ε, so that on small validation sets the
score does not take most of the budget."""

SCORE_NOISE_TIMES_EPSILON = 20.0


@dataclass
class Trial:
    """One trial of the search: its hyperparameters and its noisy validation accuracy."""

    index: int
    lr: float
    max_grad_norm: float
    batch_size: int
    epochs: int
    noise_multiplier: float
    noisy_validation_accuracy: float


@dataclass
class TuningResult:
    """The best trial's model, every trial run, and the privacy of the whole search."""

    model: Any
    best: Trial
    trials: list[Trial]
    budget: TuningBudget
    train_size: int
    validation_size: int


def _candidates(base: TrainConfig, fixed: set[str], n: int) -> list[dict[str, float]]:
    """Every hyperparameter combination the search draws from, around `base`.

    Options in `fixed` (given by the user) are not searched."""
    lrs = [base.lr] if "lr" in fixed else [base.lr * f for f in LR_FACTORS]
    assert base.privacy is not None
    clip0 = base.privacy.max_grad_norm
    clips = [clip0] if "max_grad_norm" in fixed else list(CLIP_NORMS)
    batches = (
        [base.batch_size]
        if "batch_size" in fixed or "epochs" in fixed
        else sorted({max(1, min(n, round(base.batch_size * f))) for f in BATCH_FACTORS})
    )
    out = []
    for lr in lrs:
        for clip in clips:
            for batch in batches:
                # lr·C kept when only C is searched (Ponomareva et al. 2023, §5.4.2).
                rate = lr if "lr" in fixed else lr * clip0 / clip
                out.append({"lr": rate, "max_grad_norm": clip, "batch_size": batch})
    return out


def _epochs_for(batch: int, base: TrainConfig, n_full: int, n: int, fixed: set[str]) -> int:
    """Epochs giving the base run's number of steps at batch size `batch` on `n` examples."""
    if "epochs" in fixed:
        return base.epochs
    steps = base.epochs * max(1, round(n_full / base.batch_size))
    return max(1, math.ceil(steps / max(1, round(n / batch))))


def private_random_search(
    build: Callable[[int], Any],
    train_data: Any,
    base: TrainConfig,
    expected_trials: float,
    *,
    fixed: set[str] = frozenset(),  # type: ignore[assignment]
    eta: float = DEFAULT_ETA,
    progress: Callable[[str], None] | None = None,
) -> TuningResult:
    """Random search over DP hyperparameters that is (ε, δ)-DP as a whole (Papernot & Steinke
    2022, Algorithm 1 with Theorem 2), for ε = `base.privacy.epsilon`, δ = `base.privacy.delta`.

    The training part `train_data` is split (seeded by `base.seed`, each example independently
    with probability 0.2 to validation, so that neighbouring data sets give neighbouring parts)
    into the part each trial trains on and the part it is scored on. Both are private data:
    the score is the validation correct-count plus Gaussian noise (std the larger of 2% of the
    validation size and 20/ε; sensitivity 1), and its RDP is added to the training run's
    (sequential composition, an over-estimate of the parallel one). The test set is never seen
    by the search.

    K ~ D_{η,γ} with E[K] = `expected_trials`; each trial draws lr, C and the batch size (at a
    fixed step count) uniformly from a grid around `base` (options in `fixed` are kept), trains
    a fresh `build(seed)` model with σ calibrated so that the whole search meets the target, and
    the trial with the best noisy score is returned. `progress` receives one line per trial.
    """
    import torch

    from privacylab.training.trainer import train

    privacy = base.privacy
    if privacy is None or privacy.epsilon is None:
        raise TrainingError("tuning needs private training with a target epsilon")
    if privacy.noise_multiplier is not None:
        raise TrainingError(
            "tuning calibrates the noise itself: give epsilon, not a noise multiplier"
        )
    if privacy.sampling != "poisson":
        raise TrainingError("tuning is accounted for Poisson sampling only")
    n_full = len(train_data)
    # Each example goes to validation on its own coin (not a cut of a permutation of all n):
    # adding or removing one example then changes one part by that one example only.
    to_validation = np.random.default_rng(base.seed).random(n_full) < VALIDATION_FRACTION
    n_val = int(to_validation.sum())
    if n_val < 1 or n_full - n_val < 2:
        raise TrainingError(
            f"tuning needs a validation part and at least 2 examples to train on; "
            f"{n_full} training examples give {n_val} for validation"
        )
    fit = train_data.subset(np.flatnonzero(~to_validation))
    val = train_data.subset(np.flatnonzero(to_validation))
    n = len(fit)
    candidates = _candidates(base, set(fixed), n)
    plans = sorted(
        {
            (
                min(1.0, c["batch_size"] / n),
                _epochs_for(int(c["batch_size"]), base, n_full, n, set(fixed)),
            )
            for c in candidates
        }
    )
    plan_steps = [(q, epochs * max(1, round(1 / q))) for q, epochs in plans]
    score_noise = max(SCORE_NOISE_FRACTION * n_val, SCORE_NOISE_TIMES_EPSILON / privacy.epsilon)
    budget = calibrate_tuning(
        privacy.epsilon,
        privacy.delta,
        plan_steps,
        expected_trials,
        eta=eta,
        score_noise=score_noise,
    )
    sigma_of = dict(zip(plans, budget.noise_multipliers, strict=True))
    rng = np.random.default_rng(base.seed + 7919)
    count = sample_tnb(rng, eta, budget.gamma)
    noise = torch.Generator().manual_seed(base.seed + 104729)
    trials: list[Trial] = []
    best_model, best = None, None
    for k in range(count):
        choice = candidates[int(rng.integers(len(candidates)))]
        batch = int(choice["batch_size"])
        epochs = _epochs_for(batch, base, n_full, n, set(fixed))
        sigma = sigma_of[(min(1.0, batch / n), epochs)]
        config = replace(
            base,
            lr=float(choice["lr"]),
            batch_size=batch,
            epochs=epochs,
            seed=base.seed + 1 + k,
            privacy=replace(
                privacy,
                epsilon=None,
                noise_multiplier=sigma,
                max_grad_norm=float(choice["max_grad_norm"]),
            ),
        )
        model = train(build(base.seed + 1 + k), fit, config).model
        correct = _correct(model, val, config.device)
        score = (correct + float(torch.normal(0.0, score_noise, (1,), generator=noise))) / n_val
        trial = Trial(k + 1, config.lr, float(choice["max_grad_norm"]), batch, epochs, sigma, score)
        trials.append(trial)
        if progress is not None:
            progress(
                f"trial {k + 1}/{count}: lr {trial.lr:.3g}, C {trial.max_grad_norm:g}, "
                f"batch {batch}, {epochs} epochs, σ {sigma:.3g}: noisy validation accuracy "
                f"{score:.4f}"
            )
        if best is None or score > best.noisy_validation_accuracy:
            best_model, best = model, trial
    assert best is not None
    return TuningResult(best_model, best, trials, budget, n, n_val)


def _correct(model: Any, data: Any, device: str) -> int:
    """Number of rows of `data` the model classifies correctly."""
    import torch

    model.eval()
    with torch.no_grad():
        out = model(data.features.to(device))
    return int((out.argmax(1).cpu() == data.labels).sum())
