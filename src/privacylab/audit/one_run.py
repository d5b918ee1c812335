"""Privacy auditing with one training run (Steinke, Nasr & Jagielski 2023, "Privacy Auditing
with One (1) Training Run", NeurIPS 2023, Algorithm 1).

m canaries are drawn; each is included independently with probability ½ (S ∈ {−1, +1}^m,
seeded). ONE DP-SGD run trains on the data plus the included canaries; every canary gets a
score; the auditor guesses "IN" for the k₊ highest scores, "OUT" for the k₋ lowest and abstains
on the rest. With r = k₊ + k₋ guesses of which v are right, Theorem 3 of the paper (the p-value
of `privacylab.audit.statistics.one_run_p_value`) gives the lower bound
ε_LB = `one_run_epsilon_lower_bound(m, r, v, δ, confidence)`.

Two variants:

- ``"one-run"`` (black box, the paper's Sec. 6.2 input-space canaries): canaries are training
  examples — by default mislabelled copies of held-out real examples, the strongest black-box
  canaries (Aerni, Zhang & Tramèr 2024) — trained through the one trainer
  (`privacylab.training.train`); score = −loss of the final model on the canary.
- ``"one-run-whitebox"`` (the paper's Sec. 6.1 gradient canaries with the auditor seeing every
  intermediate update): each included canary contributes, at every step and with the Poisson
  rate q of the data, a Dirac gradient C·e_i on its own coordinate i of the first Linear layer's
  weight, at an input feature that is 0 in every example (so the data's gradient there is exactly
  0). Digits has only 3 such pixels, so the images are widened with all-zero columns until the
  first layer has ≥ m such weights; this changes neither the model's outputs nor its training.
  The canaries enter through a `DPSGD` step hook, exactly as if they were examples whose clipped
  gradient is C·e_i; score = Σ_t of the privatised gradient `.grad` at the canary's coordinate
  (the white-box observation; the update is −lr times it).

Choosing (k₊, k₋): give `k_plus`/`k_minus` (counts) or `k_plus_fraction`/`k_minus_fraction`
(of m). With `grid`, a list of (k₊, k₋), the bound is computed at every grid point at
confidence 1 − (1 − confidence)/len(grid) and the largest reported: by the union (Bonferroni)
bound the reported maximum still holds with probability ≥ `confidence`.

`noise_scale_bug` deliberately breaks the run: it trains with σ·bug but reports the ε of σ,
so a working audit should find ε_LB > ε_theory when bug ≪ 1.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.accounting import calibrate_noise_multiplier
from privacylab.accounting.calibration import dp_sgd_epsilon
from privacylab.audit._checks import confidence_level, positive, whole
from privacylab.audit.result import AuditResult
from privacylab.audit.statistics import one_run_epsilon_lower_bound
from privacylab.data import CANARY_KINDS, Dataset, insert_canaries, load_dataset
from privacylab.execution.executor import torch_threads
from privacylab.models import build_model

VARIANTS = ("one-run", "one-run-whitebox")
ACCOUNTANTS = ("pld", "rdp", "rdp-classic", "gdp", "naive", "advanced")

__all__ = ["VARIANTS", "OneRunAudit", "one_run_guesses", "run_one_run_audit"]


def _fail(message: str) -> None:
    raise ValueError(message)


@dataclass
class OneRunAudit:
    """Configuration of a one-run audit (Steinke, Nasr & Jagielski 2023, Algorithm 1).

    Attributes:
        variant: ``"one-run"`` (black box, loss scores) or ``"one-run-whitebox"`` (Dirac
            gradient canaries, scores from every privatised update).
        dataset, model: names for `load_dataset` and `build_model` (white box: a model whose
            first parametrised layer is an ``nn.Linear`` on the flattened input: logreg, mlp).
        epsilon, delta: the DP-SGD target; σ is calibrated for the planned steps.
        accountant: accountant for calibration and for ε_theory.
        m: number of canaries.
        k_plus, k_minus: numbers of "IN" / "OUT" guesses; or `k_plus_fraction` /
            `k_minus_fraction` of m (used when the counts are None).
        grid: optional list of (k₊, k₋); the best bound is reported, Bonferroni-corrected.
        epochs: training epochs (steps = epochs · round(1/q), q = batch_size / N).
        batch_size, lr, max_grad_norm: DP-SGD's expected batch size, learning rate (plain SGD)
            and clipping norm C.
        canary_kind: black box only: a kind of `privacylab.data.insert_canaries`
            ("mislabeled" copies of held-out examples, "random", "blank-corner").
        noise_scale_bug: train with σ·bug, report the ε of σ (1.0: no bug).
        seed: seeds the canary draw, S, the model, the batches and the noise.
        device: torch device for training.
    """

    variant: str = "one-run-whitebox"
    dataset: str = "digits"
    model: str = "logreg"
    epsilon: float = 8.0
    delta: float = 1e-5
    accountant: str = "pld"
    m: int = 1000
    k_plus: int | None = None
    k_minus: int | None = None
    k_plus_fraction: float = 0.1
    k_minus_fraction: float = 0.1
    grid: Sequence[tuple[int, int]] | None = None
    epochs: int = 20
    batch_size: int = 256
    lr: float = 0.1
    max_grad_norm: float = 1.0
    canary_kind: str = "mislabeled"
    noise_scale_bug: float = 1.0
    seed: int = 0
    device: str = "cpu"

    def guess_counts(self) -> list[tuple[int, int]]:
        """The (k₊, k₋) pairs to evaluate: the grid, or the single configured pair."""
        if self.grid is not None:
            return [(int(a), int(b)) for a, b in self.grid]
        k_plus = self.k_plus
        if k_plus is None:
            k_plus = math.floor(self.k_plus_fraction * self.m)
        k_minus = self.k_minus
        if k_minus is None:
            k_minus = math.floor(self.k_minus_fraction * self.m)
        return [(k_plus, k_minus)]

    def validate(self) -> OneRunAudit:
        """Check every option; raise ValueError with one line for the first bad one."""
        if self.variant not in VARIANTS:
            _fail(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.accountant not in ACCOUNTANTS:
            _fail(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {self.accountant!r}")
        if self.canary_kind not in CANARY_KINDS:
            _fail(f"canary_kind must be one of {', '.join(CANARY_KINDS)}, got {self.canary_kind!r}")
        positive("epsilon", self.epsilon)
        if positive("delta", self.delta) >= 1.0:
            _fail(f"delta must be in (0, 1), got {self.delta!r}")
        whole("m", self.m, 1)
        whole("epochs", self.epochs, 1)
        whole("batch_size", self.batch_size, 1)
        whole("seed", self.seed, 0)
        positive("lr", self.lr)
        positive("max_grad_norm", self.max_grad_norm)
        positive("noise_scale_bug", self.noise_scale_bug)
        for name in ("k_plus_fraction", "k_minus_fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                _fail(f"{name} must be a number in [0, 1], got {value!r}")
            if not 0.0 <= float(value) <= 1.0:
                _fail(f"{name} must be in [0, 1], got {value!r}")
        if self.grid is not None and len(self.grid) == 0:
            _fail("grid must hold at least one (k_plus, k_minus) pair")
        for pair in self.guess_counts() if self.grid is None else self.grid:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                _fail(f"each grid point must be a (k_plus, k_minus) pair, got {pair!r}")
            k_plus = whole("k_plus", pair[0], 0)
            k_minus = whole("k_minus", pair[1], 0)
            if k_plus + k_minus == 0:
                _fail("k_plus + k_minus must be >= 1 (the audit needs at least one guess)")
            if k_plus + k_minus > self.m:
                _fail(f"k_plus + k_minus ({k_plus} + {k_minus}) exceed the m ({self.m}) canaries")
        return self


def one_run_guesses(
    scores: np.ndarray, included: np.ndarray, k_plus: int, k_minus: int
) -> tuple[int, int]:
    """(r, v) of Algorithm 1: guess IN for the `k_plus` highest scores, OUT for the `k_minus`
    lowest, abstain on the rest; v counts the correct guesses among r = k₊ + k₋.

    Ties are broken by canary index (a fixed rule that does not look at S).
    """
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    if scores.ndim != 1 or scores.shape != included.shape:
        _fail(f"scores {scores.shape} and inclusion {included.shape} must be equal 1-D shapes")
    if not np.isfinite(scores).all():
        _fail("canary scores must be finite")
    m = scores.shape[0]
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        _fail(f"need 0 <= k_plus, k_minus and k_plus + k_minus <= m ({m})")
    order = np.argsort(-scores, kind="stable")
    guessed_in = order[:k_plus]
    guessed_out = order[m - k_minus :] if k_minus else order[:0]
    v = int(included[guessed_in].sum()) + int((~included[guessed_out]).sum())
    return k_plus + k_minus, v


def _calibrate(config: OneRunAudit, sample_rate: float, steps: int) -> tuple[float, float]:
    sigma = calibrate_noise_multiplier(
        config.epsilon, config.delta, sample_rate, steps, accountant=config.accountant
    )
    epsilon = dp_sgd_epsilon(sigma, sample_rate, steps, config.delta, config.accountant)
    return sigma, epsilon


def _training_part(data: Dataset) -> Dataset:
    return data if data.train_size is None else data.subset(range(data.train_size))


def _black_box(config: OneRunAudit, included: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    from privacylab.training import train
    from privacylab.training.config import PrivacyConfig, TrainConfig

    data = _training_part(load_dataset(config.dataset))
    rng = np.random.default_rng(config.seed)
    if config.canary_kind == "mislabeled":
        if config.m >= len(data):
            _fail(f"m ({config.m}) mislabelled canaries need more than m examples ({len(data)})")
        order = rng.permutation(len(data))
        source, base = data.subset(order[: config.m]), data.subset(order[config.m :])
    else:
        source, base = data, data
    merged, rows = insert_canaries(source, config.m, kind=config.canary_kind, seed=config.seed)
    canaries = merged.subset(rows)
    train_data = Dataset(
        name=base.name,
        features=torch.cat([base.features, canaries.features[torch.from_numpy(included)]]),
        labels=torch.cat([base.labels, canaries.labels[torch.from_numpy(included)]]),
        num_classes=base.num_classes,
        input_shape=base.input_shape,
        kind=base.kind,
    )
    n = len(train_data)
    q = min(1.0, config.batch_size / n)
    steps = config.epochs * max(1, round(1.0 / q))
    sigma, epsilon = _calibrate(config, q, steps)
    model = build_model(config.model, base.input_shape, base.num_classes, seed=config.seed)
    train_config = TrainConfig(
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.lr,
        optimizer="sgd",
        seed=config.seed,
        device=config.device,
        privacy=PrivacyConfig(
            noise_multiplier=sigma * config.noise_scale_bug,
            delta=config.delta,
            max_grad_norm=config.max_grad_norm,
            accountant=config.accountant,
            clipping="auto",
        ),
    )
    trained = train(model, train_data, train_config).model
    trained.eval()
    with torch.no_grad():
        x = canaries.features.to(config.device)
        y = canaries.labels.to(config.device)
        losses = F.cross_entropy(trained(x), y, reduction="none")
    info = {"sigma": sigma, "sample_rate": q, "steps": steps, "n_train": n}
    return -losses.double().cpu().numpy(), {"epsilon": epsilon, **info}


def _first_linear(model: nn.Module, flat: int) -> tuple[str, nn.Linear]:
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.in_features == flat:
            return f"{name}.weight", module
        if any(True for _ in module.parameters(recurse=False)):
            break
    _fail("the white-box one-run audit needs a model whose first layer is nn.Linear (logreg, mlp)")
    raise AssertionError


def _widened(data: Dataset, extra: int) -> Dataset:
    """`data` with `extra` all-zero input features appended (image data: zero columns)."""
    if extra <= 0:
        return data
    x = data.features
    if data.kind == "image" and x.dim() == 4:
        channels, height, _ = data.input_shape
        columns = math.ceil(extra / (channels * height))
        x = F.pad(x, (0, columns))
    elif x.dim() == 2:
        x = F.pad(x, (0, extra))
    else:
        _fail(f"cannot add zero features to {data.kind} data of shape {tuple(x.shape)}")
    return Dataset(data.name, x, data.labels, data.num_classes, tuple(x.shape[1:]), data.kind)


def _canary_coordinates(
    config: OneRunAudit, data: Dataset
) -> tuple[Dataset, nn.Module, str, Tensor]:
    """Widened data, the model, the canary parameter's name and m flat indices into it."""
    flat = math.prod(data.input_shape)
    probe = build_model(config.model, data.input_shape, data.num_classes, seed=config.seed)
    _, layer = _first_linear(probe, flat)
    rows = layer.out_features
    zero = (data.features.reshape(len(data), -1) == 0).all(0)
    needed = math.ceil(config.m / rows)
    data = _widened(data, needed - int(zero.sum()))
    flat = math.prod(data.input_shape)
    model = build_model(config.model, data.input_shape, data.num_classes, seed=config.seed)
    name, layer = _first_linear(model, flat)
    columns = (data.features.reshape(len(data), -1) == 0).all(0).nonzero().squeeze(1)
    grid_rows = torch.arange(rows).repeat(len(columns))
    grid_cols = columns.repeat_interleave(rows)
    index = (grid_rows * flat + grid_cols)[: config.m]
    return data, model, name, index


def _white_box(config: OneRunAudit, included: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    from privacylab.training.dp import DPSGD, PoissonSampler

    device = torch.device(config.device)
    data = _training_part(load_dataset(config.dataset))
    data, model, name, index = _canary_coordinates(config, data)
    model.to(device)
    n = len(data)
    q = min(1.0, config.batch_size / n)
    expected = q * n
    sampler_gen = torch.Generator().manual_seed(config.seed)
    canary_gen = torch.Generator().manual_seed(config.seed + 3)
    noise_gen = torch.Generator(device=device).manual_seed(config.seed + 1)
    sampler = PoissonSampler(n, q, generator=sampler_gen)
    steps = config.epochs * sampler.steps_per_epoch
    sigma, epsilon = _calibrate(config, q, steps)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    engine = DPSGD(
        model,
        optimizer,
        lambda out, y: F.cross_entropy(out, y, reduction="none"),
        noise_multiplier=sigma * config.noise_scale_bug,
        max_grad_norm=config.max_grad_norm,
        expected_batch_size=expected,
        clipping="auto",
        generator=noise_gen,
    )
    param = engine.params[name]
    index = index.to(device)
    member = torch.from_numpy(included).to(device)
    contribution = config.max_grad_norm / expected
    scores = torch.zeros(config.m, dtype=torch.float64, device=device)

    def inject(info: Any) -> None:
        sampled = (torch.rand(config.m, generator=canary_gen) < q).to(device) & member
        grad = param.grad.view(-1)
        grad[index[sampled]] += contribution
        scores.add_(grad[index].double())

    handle = engine.add_step_hook(inject)
    x, y = data.features.to(device), data.labels.to(device)
    model.train()
    for _ in range(config.epochs):
        for batch in sampler:
            batch = batch.to(device)
            engine.step(x[batch], y[batch])
    handle.remove()
    info = {"sigma": sigma, "sample_rate": q, "steps": steps, "n_train": n, "parameter": name}
    return scores.cpu().numpy(), {"epsilon": epsilon, **info}


def run_one_run_audit(config: OneRunAudit, *, confidence: float = 0.95) -> AuditResult:
    """Audit one DP-SGD run with m canaries (Steinke, Nasr & Jagielski 2023, Algorithm 1).

    Returns an `AuditResult` with method ``"one-run"`` or ``"one-run-whitebox"``; counts hold
    m, r, v, k_plus, k_minus (of the reported grid point) and the number of included canaries;
    `epsilon_theory` is the accountant's ε for σ (not σ·noise_scale_bug); trials = 1.
    """
    if not isinstance(config, OneRunAudit):
        _fail(f"config must be a OneRunAudit, got {type(config).__name__}")
    config.validate()
    overall = confidence_level(confidence)
    start = time.perf_counter()
    included = np.random.default_rng([config.seed, 1]).random(config.m) < 0.5
    with torch_threads(1):
        if config.variant == "one-run":
            scores, info = _black_box(config, included)
        else:
            scores, info = _white_box(config, included)
    pairs = config.guess_counts()
    level = 1.0 - (1.0 - overall) / len(pairs)
    best: tuple[float, int, int, int, int] | None = None
    for k_plus, k_minus in pairs:
        r, v = one_run_guesses(scores, included, k_plus, k_minus)
        bound = one_run_epsilon_lower_bound(config.m, r, v, config.delta, level)
        if best is None or bound > best[0]:
            best = (bound, r, v, k_plus, k_minus)
    assert best is not None
    bound, r, v, k_plus, k_minus = best
    params = asdict(config)
    params["grid"] = [list(p) for p in pairs] if config.grid is not None else None
    params.update({k: info[k] for k in info if k != "epsilon"})
    params["per_point_confidence"] = level
    return AuditResult(
        method=config.variant,
        epsilon_theory=float(info["epsilon"]),
        delta=config.delta,
        accountant=config.accountant,
        epsilon_lower_bound=float(bound),
        confidence=overall,
        trials=1,
        counts={
            "m": config.m,
            "r": r,
            "v": v,
            "k_plus": k_plus,
            "k_minus": k_minus,
            "included": int(included.sum()),
        },
        seconds=time.perf_counter() - start,
        params=params,
    )
