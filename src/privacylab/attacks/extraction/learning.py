"""Learning-based model extraction: query the victim, train a copy on its answers.

Four ways of choosing the queries, one way of training (`thief.Thief`: soft labels when the
target serves probability vectors, rounded or not; hard labels when it serves labels only) and
one ledger (`thief.QuerySession`: checkpoints for the accuracy/fidelity-against-queries curve,
the task's budget, a clean stop on QueryBudgetError or a monitor's refusal):

- `random` (Tramèr et al. 2016, Sec. 4-5, "random queries"): inputs uniform in the task's
  bounds.
- `copycat` (Correia-Silva et al. 2018, CopycatCNN; Jagielski et al. 2020, Sec. 6): the pool the
  thief owns, queried as it is (in-distribution or out-of-distribution, `task.pool_kind`).
- `jacobian` (Papernot et al. 2017, Practical Black-Box Attacks, Alg. 1 with the periodic step
  and reservoir sampling of its Sec. 6 / Papernot et al.'s later variant): a small seed set from
  the pool, then rounds of "train the substitute, S_{r+1} = S_r U {x + lambda_r sign(grad_x
  F_sub(x)[O(x)])}", clipped to the bounds.
- `knockoff` (Orekondy et al. 2019, Knockoff Nets, Sec. 4.1): the pool sampled at random
  (`policy="random"`) or by the adaptive policy, a gradient bandit over k-means clusters of the
  pool (the paper's actions are the pool's coarse labels; the thief has no labels here) with
  the rewards "cert", "div" and "loss" of its Eq. (3)-(5), each standardised by a running mean
  and variance (Welford) before they are added, computed with log-softmax and clamping so that
  one-hot, rounded or all-zero answers keep them finite.

A pool smaller than the budget: `copycat` and `knockoff` query every pool row once, then (with
`beyond_pool="mixup"`, the default) convex combinations lambda x_i + (1 - lambda) x_j of two
pool rows with lambda ~ U(0, 1) — an extension here, not in the papers (their pools are larger
than their budgets): a repeated query teaches the copy nothing, a mixed one probes the victim
between two owned examples (mixup, Zhang et al. 2018). `beyond_pool="none"` stops at the pool's
size.
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.extraction.base import (
    ExtractionAttack,
    ExtractionError,
    ExtractionTask,
    Stolen,
    register_extraction,
)
from privacylab.attacks.extraction.thief import (
    SOFT_LOSSES,
    QuerySession,
    Thief,
    soft_cross_entropy_rows,
)
from privacylab.target import Access, Target

__all__ = [
    "CopycatExtraction",
    "JacobianExtraction",
    "KnockoffExtraction",
    "RandomExtraction",
    "RunningNorm",
    "certainty_reward",
    "diversity_reward",
    "loss_reward",
]

ANSWERS = ("auto", "labels", "scores")
BEYOND_POOL = ("mixup", "none")
POLICIES = ("random", "adaptive")
REWARDS = ("cert", "div", "loss")


def _whole(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ExtractionError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise ExtractionError(f"{name} must be a finite number > 0, got {value!r}")
    if value <= 0:
        raise ExtractionError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ExtractionError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


class _LearningAttack(ExtractionAttack):
    """Shared configuration: how the copy is trained (`epochs` per fit and at least
    `min_steps` Adam steps, `batch_size`, `lr`, `warm_start`, `device`), the query batch size
    (`query_batch`) and which answers it uses.

    `answers`: "labels" (hard labels, at any access), "scores" (probability vectors: the
    attack's threat model becomes SCORES for this instance, so `run_extraction` serves it
    probability vectors, rounded if the target's output defence rounds them), or "auto" (the
    default: probability vectors whenever the target view it receives serves scores, else
    labels; the class-level threat model, LABEL, is the least the attack needs). `uses_up_to`
    says what the attack can use beyond that least (scores): `core.execute` serves it what
    the target offers up to that."""

    uses_up_to: ClassVar[Access] = Access.SCORES

    def __init__(
        self,
        *,
        answers: str = "auto",
        epochs: int = 10,
        batch_size: int = 128,
        lr: float = 1e-3,
        min_steps: int = 300,
        soft_loss: str = "cross-entropy",
        warm_start: bool = True,
        query_batch: int = 256,
        device: str = "cpu",
    ) -> None:
        self.epochs = _whole("epochs", epochs)
        self.batch_size = _whole("batch size", batch_size)
        self.lr = _positive("learning rate", lr)
        self.min_steps = _whole("min_steps", min_steps)
        self.soft_loss = _choice("soft_loss", soft_loss, SOFT_LOSSES)
        self.warm_start = bool(warm_start)
        self.query_batch = _whole("query batch", query_batch)
        self.device = device
        self.answers = _choice("answers", answers, ANSWERS)
        if self.answers == "scores":
            base = type(self).threat_model
            self.threat_model = ThreatModel(Access.SCORES, base.side_information)
        elif self.answers == "labels":
            self.uses_up_to = Access.LABEL

    def _session(self, target: Target, task: ExtractionTask) -> QuerySession:
        thief = Thief(
            task,
            soft=self.answers != "labels" and target.access.allows(Access.SCORES),
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            min_steps=self.min_steps,
            soft_loss=self.soft_loss,
            warm_start=self.warm_start,
            device=self.device,
            seed=task.seed,
        )
        return QuerySession(target, task, thief, soft=thief.soft)

    def _settings(self) -> dict[str, Any]:
        return {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "min_steps": self.min_steps,
            "soft_loss": self.soft_loss,
            "warm_start": self.warm_start,
            "answers_option": self.answers,
        }


class _PoolSampler:
    """Draws queries from the thief's pool: each row once, in a seeded random order (per
    group when `groups` are given), then mixup rows of two pool rows of the same group
    (`beyond="mixup"`), or nothing more (`beyond="none"`)."""

    def __init__(
        self,
        pool: Tensor,
        bounds: tuple[float, float],
        rng: np.random.Generator,
        beyond: str,
        groups: np.ndarray | None = None,
    ) -> None:
        self.pool, self.bounds, self.rng, self.beyond = pool.float(), bounds, rng, beyond
        labels = np.zeros(len(pool), dtype=np.int64) if groups is None else groups
        self.members = [np.flatnonzero(labels == g) for g in range(int(labels.max()) + 1)]
        self.unused = [deque(rng.permutation(m).tolist()) for m in self.members]
        self.mixed = 0

    def available(self, group: int = 0) -> bool:
        """Whether `group` can still give a query."""
        return bool(self.unused[group]) or (self.beyond == "mixup" and len(self.members[group]) > 0)

    def take(self, n: int, group: int = 0) -> Tensor:
        """Up to `n` queries from `group`."""
        rows = [self.unused[group].popleft() for _ in range(min(n, len(self.unused[group])))]
        out = [self.pool[torch.as_tensor(rows, dtype=torch.int64)]] if rows else []
        extra = n - len(rows)
        if extra > 0 and self.beyond == "mixup" and len(self.members[group]):
            first = self.rng.choice(self.members[group], size=extra)
            second = self.rng.choice(self.members[group], size=extra)
            lam = torch.from_numpy(self.rng.uniform(size=extra).astype(np.float32))
            lam = lam.reshape(-1, *([1] * (self.pool.ndim - 1)))
            mixed = lam * self.pool[first] + (1 - lam) * self.pool[second]
            out.append(mixed.clamp(*self.bounds))
            self.mixed += extra
        if not out:
            return self.pool[:0]
        return torch.cat(out)


@register_extraction("random")
class RandomExtraction(_LearningAttack):
    """Tramèr et al. 2016 (Stealing Machine Learning Models via Prediction APIs), Sec. 4-5:
    queries uniform in the input domain (`task.bounds`), the copy trained on the answers."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.LABEL, ("architecture", "bounds"))
    paper: ClassVar[str] = "Tramèr et al. 2016"

    def steal(self, target: Target, task: ExtractionTask) -> Stolen:
        """Uniform random queries until the budget is spent; the copy trained on them."""
        session = self._session(target, task)
        rng = np.random.default_rng(task.seed)
        low, high = task.bounds
        while not session.exhausted:
            n = min(self.query_batch, session.remaining)
            x = torch.from_numpy(rng.uniform(low, high, (n, *task.input_shape)).astype(np.float32))
            session.ask(x)
        return session.finish(method="random", **self._settings())


@register_extraction("copycat")
class CopycatExtraction(_LearningAttack):
    """Correia-Silva et al. 2018 (Copycat CNN) and Jagielski et al. 2020 (High Accuracy and High
    Fidelity Extraction, Sec. 6): the thief's own pool, in- or out-of-distribution
    (`task.pool_kind`), labelled by the victim; past the pool, mixup rows (`beyond_pool`)."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(
        Access.LABEL, ("pool", "architecture", "bounds")
    )
    paper: ClassVar[str] = "Correia-Silva et al. 2018; Jagielski et al. 2020"

    def __init__(self, *, beyond_pool: str = "mixup", **options: Any) -> None:
        super().__init__(**options)
        self.beyond_pool = _choice("beyond_pool", beyond_pool, BEYOND_POOL)

    def steal(self, target: Target, task: ExtractionTask) -> Stolen:
        """The pool (then mixup rows) in a seeded random order until the budget is spent."""
        pool = task.require_pool("copycat")
        session = self._session(target, task)
        sampler = _PoolSampler(
            pool, task.bounds, np.random.default_rng(task.seed), self.beyond_pool
        )
        while not session.exhausted and sampler.available():
            session.ask(sampler.take(min(self.query_batch, session.remaining)))
        return session.finish(
            method="copycat",
            pool_kind=task.pool_kind,
            pool_size=len(pool),
            beyond_pool=self.beyond_pool,
            mixup_queries=sampler.mixed,
            **self._settings(),
        )


@register_extraction("jacobian")
class JacobianExtraction(_LearningAttack):
    """Papernot et al. 2017 (Practical Black-Box Attacks against Machine Learning), Alg. 1.

    S_0: `seed_size` rows of the pool. Round r: label the new points of S_r by the oracle O,
    train the substitute F on S_r, then S_{r+1} = S_r U {clip(x + lambda_r sign(J_F(x)[O(x)]))
    : x in S_r}. lambda_r = `lam` * (-1)^floor(r / `tau`) (the periodic step size, Sec. 6; `tau`
    None keeps lambda fixed). With `reservoir` = kappa, from round `sigma` on only kappa random
    points of the previous round's new points are augmented (reservoir sampling, Papernot et al.
    2017's extended version), so the set grows linearly instead of doubling. Rounds go on until
    the budget is spent (or `rounds`)."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(
        Access.LABEL, ("pool", "architecture", "bounds")
    )
    paper: ClassVar[str] = "Papernot et al. 2017"

    def __init__(
        self,
        *,
        seed_size: int = 100,
        lam: float = 0.1,
        tau: int | None = None,
        reservoir: int | None = None,
        sigma: int = 3,
        rounds: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.seed_size = _whole("seed_size", seed_size)
        self.lam = _positive("lambda", lam)
        self.tau = None if tau is None else _whole("tau", tau)
        self.reservoir = None if reservoir is None else _whole("reservoir", reservoir)
        self.sigma = _whole("sigma", sigma, 0)
        self.rounds = None if rounds is None else _whole("rounds", rounds)

    def _augment(self, thief: Thief, x: Tensor, labels: Tensor, step: float) -> Tensor:
        """x + step * sign(d F_sub(x)[label] / dx), clipped later by the caller."""
        model = thief.model.eval()
        out = []
        for start in range(0, len(x), 1024):
            xb = x[start : start + 1024].float().to(thief.device).requires_grad_(True)
            yb = labels[start : start + 1024].to(thief.device)
            logits = model(xb)
            picked = logits.gather(1, yb[:, None]).sum()
            (grad,) = torch.autograd.grad(picked, xb)
            out.append((xb + step * grad.sign()).detach().cpu())
        return torch.cat(out) if out else x[:0]

    def steal(self, target: Target, task: ExtractionTask) -> Stolen:
        """Alg. 1 until the budget is spent."""
        pool = task.require_pool("jacobian")
        session = self._session(target, task)
        rng = np.random.default_rng(task.seed)
        picks = rng.permutation(len(pool))[: self.seed_size]
        new = pool[torch.as_tensor(picks, dtype=torch.int64)].float()
        sizes: list[int] = []
        low, high = task.bounds
        rounds = 0
        while not session.exhausted and len(new):
            x, answers = session.ask(new)
            sizes.append(len(session.thief))
            if len(x) == 0:
                break
            session.thief.fit()
            rounds += 1
            if session.exhausted or (self.rounds is not None and rounds >= self.rounds):
                break
            step = self.lam
            if self.tau is not None and (rounds // self.tau) % 2 == 1:
                step = -step
            if self.reservoir is not None and rounds > self.sigma and len(x) > self.reservoir:
                keep = torch.as_tensor(
                    np.sort(rng.choice(len(x), size=self.reservoir, replace=False))
                )
                x, answers = x[keep], answers[keep]
            if rounds <= self.sigma or self.reservoir is None:
                x, answers = session.thief.data()
            labels = session.labels_of(answers)
            new = self._augment(session.thief, x, labels, step).clamp(low, high)
        return session.finish(
            method="jacobian",
            seed_size=self.seed_size,
            lam=self.lam,
            tau=self.tau,
            reservoir=self.reservoir,
            rounds=rounds,
            set_sizes=sizes,
            **self._settings(),
        )


def _as_probabilities(answers: Tensor, num_classes: int) -> Tensor:
    """Answers as float64 probability rows: labels become one-hot rows; probability rows are
    clamped to [0, 1] with NaN read as 0."""
    if answers.ndim == 1:
        return F.one_hot(answers.long(), num_classes).double()
    return torch.nan_to_num(answers.double(), nan=0.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)


def certainty_reward(probs: Tensor) -> Tensor:
    """Orekondy et al. 2019, Eq. (3): the margin between the victim's two most likely classes,
    P(y_k1 | x) - P(y_k2 | x), per row, in [0, 1]."""
    probs = _as_probabilities(probs, probs.shape[-1] if probs.ndim == 2 else 2)
    if probs.shape[1] < 2:
        return torch.ones(len(probs), dtype=torch.float64)
    top = probs.topk(2, dim=1).values
    return (top[:, 0] - top[:, 1]).clamp(0.0, 1.0)


def diversity_reward(probs: Tensor, recent_mean: Tensor) -> Tensor:
    """Orekondy et al. 2019, Eq. (4): sum_k max(0, y_k - ybar_k), with ybar the mean answer of
    the last Delta steps; per row, in [0, 1]."""
    probs = _as_probabilities(probs, probs.shape[1])
    mean = torch.nan_to_num(recent_mean.double(), nan=0.0).clamp(0.0, 1.0)
    return (probs - mean).clamp_min(0.0).sum(1).clamp(0.0, 1.0)


def loss_reward(probs: Tensor, thief_logits: Tensor) -> Tensor:
    """Orekondy et al. 2019, Eq. (5): the thief's cross-entropy to the victim's answer,
    -sum_k y_k log softmax(f_A(x))_k, with log-softmax (finite for finite logits; non-finite
    logits are clamped) and the answer renormalised (an all-zero row reads as uniform)."""
    probs = _as_probabilities(probs, thief_logits.shape[1])
    logits = torch.nan_to_num(thief_logits.double(), nan=0.0, posinf=1e4, neginf=-1e4)
    return soft_cross_entropy_rows(logits, probs)


class RunningNorm:
    """Welford's running mean and variance; `normalise(r)` = (r - mean) / sqrt(var + eps),
    updated with `r` first (a constant reward normalises to 0, never to inf or NaN)."""

    def __init__(self, eps: float = 1e-8) -> None:
        self.count, self.mean, self.m2, self.eps = 0, 0.0, 0.0, float(eps)

    def update(self, values: np.ndarray) -> None:
        """Add finite `values` to the statistics."""
        for value in np.asarray(values, dtype=np.float64).ravel():
            if not np.isfinite(value):
                continue
            self.count += 1
            delta = value - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (value - self.mean)

    @property
    def variance(self) -> float:
        """The population variance of what was added (0 before two values)."""
        return self.m2 / self.count if self.count > 1 else 0.0

    def normalise(self, values: np.ndarray) -> np.ndarray:
        """Update with `values`, then return them standardised (non-finite ones read as the
        mean)."""
        values = np.asarray(values, dtype=np.float64)
        self.update(values)
        values = np.where(np.isfinite(values), values, self.mean)
        return (values - self.mean) / np.sqrt(self.variance + self.eps)


@register_extraction("knockoff")
class KnockoffExtraction(_LearningAttack):
    """Orekondy et al. 2019 (Knockoff Nets: Stealing Functionality of Black-Box Models),
    Sec. 4.1.

    `policy="random"`: pool rows drawn uniformly without replacement (then mixup rows).
    `policy="adaptive"`: actions are `clusters` k-means clusters of the pool (default: one per
    class). Each step draws `bandit_batch` actions from pi_t = softmax(H_t), a pool row of each
    action's cluster, queries them, takes `online_steps` Adam steps of the copy on the batch, and
    rewards each with r = sum of the standardised `rewards` (cert, Eq. 3; div, Eq. 4 over the
    last `delta` steps; loss, Eq. 5); the gradient bandit (Sutton & Barto, Sec. 2.8, the paper's
    Eq. 2) updates H_{t+1}(z_t) = H_t(z_t) + alpha (r_t - rbar_t)(1 - pi_t(z_t)) and
    H_{t+1}(z) = H_t(z) - alpha (r_t - rbar_t) pi_t(z) for z != z_t, rbar_t the running mean
    reward. The copy is also fitted on everything at each checkpoint."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(
        Access.LABEL, ("pool", "architecture", "bounds")
    )
    paper: ClassVar[str] = "Orekondy et al. 2019"

    def __init__(
        self,
        *,
        policy: str = "random",
        rewards: tuple[str, ...] | list[str] | str = REWARDS,
        clusters: int | None = None,
        alpha: float = 0.05,
        delta: int = 25,
        bandit_batch: int = 16,
        online_steps: int = 1,
        beyond_pool: str = "mixup",
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.policy = _choice("policy", policy, POLICIES)
        names = tuple(rewards.split(",")) if isinstance(rewards, str) else tuple(rewards)
        if not names:
            raise ExtractionError(f"rewards must name at least one of {', '.join(REWARDS)}")
        for name in names:
            _choice("reward", name, REWARDS)
        self.rewards = names
        self.clusters = None if clusters is None else _whole("clusters", clusters)
        self.alpha = _positive("alpha", alpha)
        self.delta = _whole("delta", delta)
        self.bandit_batch = _whole("bandit batch", bandit_batch)
        self.online_steps = _whole("online steps", online_steps, 0)
        self.beyond_pool = _choice("beyond_pool", beyond_pool, BEYOND_POOL)

    def _cluster(self, pool: Tensor, k: int, seed: int) -> np.ndarray:
        from sklearn.cluster import KMeans

        flat = pool.reshape(len(pool), -1).double().numpy()
        k = max(1, min(k, len(np.unique(flat, axis=0))))
        if k == 1:
            return np.zeros(len(pool), dtype=np.int64)
        model = KMeans(n_clusters=k, n_init=3, random_state=seed).fit(flat)
        return model.labels_.astype(np.int64)

    def steal(self, target: Target, task: ExtractionTask) -> Stolen:
        """The random or adaptive policy until the budget (or the pool) is spent."""
        pool = task.require_pool("knockoff")
        session = self._session(target, task)
        rng = np.random.default_rng(task.seed)
        params: dict[str, Any] = {"method": "knockoff", "policy": self.policy}
        if self.policy == "random":
            sampler = _PoolSampler(pool, task.bounds, rng, self.beyond_pool)
            while not session.exhausted and sampler.available():
                session.ask(sampler.take(min(self.query_batch, session.remaining)))
        else:
            sampler = self._adaptive(session, pool, task, rng, params)
        params.update(
            pool_kind=task.pool_kind,
            pool_size=len(pool),
            beyond_pool=self.beyond_pool,
            mixup_queries=sampler.mixed,
            **self._settings(),
        )
        return session.finish(**params)

    def _adaptive(
        self,
        session: QuerySession,
        pool: Tensor,
        task: ExtractionTask,
        rng: np.random.Generator,
        params: dict[str, Any],
    ) -> _PoolSampler:
        groups = self._cluster(pool, self.clusters or task.num_classes, task.seed)
        k = int(groups.max()) + 1
        sampler = _PoolSampler(pool, task.bounds, rng, self.beyond_pool, groups)
        preferences = np.zeros(k)
        norms = {name: RunningNorm() for name in self.rewards}
        baseline = RunningNorm()
        recent: deque[Tensor] = deque(maxlen=self.delta)
        counts = np.zeros(k, dtype=np.int64)
        rewards_seen: list[float] = []
        while not session.exhausted:
            live = np.array([sampler.available(g) for g in range(k)])
            if not live.any():
                break
            logits = np.where(live, preferences, -np.inf)
            policy = np.exp(logits - logits[live].max())
            policy /= policy.sum()
            n = min(self.bandit_batch, session.remaining)
            actions = rng.choice(k, size=n, p=policy)
            batch, chosen = [], []
            for action in actions:
                row = sampler.take(1, int(action))
                if len(row):
                    batch.append(row)
                    chosen.append(int(action))
            if not batch:
                break
            x, answers = session.ask(torch.cat(batch))
            if len(x) == 0:
                break
            chosen_arr = np.asarray(chosen[: len(x)], dtype=np.int64)
            probs = _as_probabilities(answers, task.num_classes)
            thief_logits = session.thief.predict_logits(x)
            mean = torch.stack(list(recent)).mean(0) if recent else torch.zeros(task.num_classes)
            raw = {
                "cert": certainty_reward(probs),
                "div": diversity_reward(probs, mean),
                "loss": loss_reward(probs, thief_logits),
            }
            recent.append(probs.mean(0))
            total = np.zeros(len(x))
            for name in self.rewards:
                total += norms[name].normalise(raw[name].numpy())
            for action, reward in zip(chosen_arr, total, strict=True):
                baseline.update(np.array([reward]))
                advantage = reward - baseline.mean
                step = self.alpha * advantage
                preferences -= step * policy
                preferences[action] += step
            counts += np.bincount(chosen_arr, minlength=k)
            rewards_seen.extend(total.tolist())
            if self.online_steps:
                session.thief.step(x, answers, self.online_steps)
        params.update(
            clusters=k,
            rewards=list(self.rewards),
            action_counts=counts.tolist(),
            preferences=preferences.tolist(),
            mean_reward=float(np.mean(rewards_seen)) if rewards_seen else None,
        )
        return sampler
