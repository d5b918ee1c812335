"""Training the thief's copy from the victim's answers, and the query ledger every learning
attack sends its queries through.

`Thief` holds the copy and every answered query. With scores (probability vectors, possibly
rounded by an output defence) it trains on soft labels, the cross-entropy to the returned vector
H(y, softmax(f(x))) = -sum_k y_k log softmax(f(x))_k (distillation, Hinton et al. 2015; the
"probabilities" setting of Tramèr et al. 2016, Sec. 5, and of Orekondy et al. 2019, Sec. 4.2);
with labels only, on hard labels (cross-entropy to the arg-max class, Papernot et al. 2017,
Alg. 1 step 4; Correia-Silva et al. 2018). Adam, a few epochs over all answered queries at each
fit; by default a fit continues from the previous one (warm start), `warm_start=False`
re-initialises the copy first.

`QuerySession` sends the attack's batches to the target: it cuts them at the task's
checkpoints so that the copy is fitted and snapshotted at exactly those query counts (the
accuracy/fidelity-against-queries curve), stops at the task's budget, and turns a refusal into
a clean stop: `QueryBudgetError` ("budget": the batch is halved until what is left of the
target's own budget is spent) or any other `PrivacylabError` a query monitor raises
("refused", e.g. PRADA flagging the client). The attack then returns the copy trained on what
was answered.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.attacks.extraction.base import ExtractionError, ExtractionTask, Stolen
from privacylab.errors import PrivacylabError
from privacylab.models import ModelSpec
from privacylab.target import Access, Target
from privacylab.target.access import AccessError, QueryBudgetError, TargetError

__all__ = [
    "SOFT_LOSSES",
    "QuerySession",
    "Thief",
    "log_ratio_loss",
    "soft_cross_entropy",
    "soft_cross_entropy_rows",
    "thief_model",
]


def thief_model(task: ExtractionTask, seed: int) -> nn.Module:
    """The copy to train: `task.architecture.build(seed=seed)` when the thief knows the
    architecture, else the project's default MLP (`mlp`, widths (512, 256)) on the input
    shape."""
    spec = task.architecture or ModelSpec("mlp", task.input_shape, task.num_classes)
    model = spec.build(seed=seed)
    return model.float()


SOFT_LOSSES = ("cross-entropy", "log-ratio")


def log_ratio_loss(logits: Tensor, targets: Tensor, floor: float = 1e-30) -> Tensor:
    """Mean over rows and classes of ((z_k - mean_j z_j) - (log y_k - mean_j log y_j))^2: the
    copy's logits matched to the victim's up to the per-row constant softmax forgets (log y_k -
    log y_j = z_k - z_j, the relation equation-solving attacks use, Tramèr et al. 2016, Sec.
    4.1). `floor` bounds log y below: with rounded (zero) probabilities use the cross-entropy."""
    target = targets.clamp_min(floor).log()
    target = target - target.mean(1, keepdim=True)
    centred = logits - logits.mean(1, keepdim=True)
    return ((centred - target) ** 2).mean()


def soft_cross_entropy_rows(logits: Tensor, targets: Tensor) -> Tensor:
    """Per row, -sum_k y_k log softmax(logits)_k; `targets` are rows of non-negative weights
    renormalised to sum to 1 (a rounded probability vector may not; an all-zero row counts as
    uniform). Computed with `log_softmax`: finite for any finite logits."""
    weights = targets.clamp_min(0)
    total = weights.sum(1, keepdim=True)
    uniform = torch.full_like(weights, 1.0 / weights.shape[1])
    weights = torch.where(total > 0, weights / total.clamp_min(1e-12), uniform)
    return -(weights * F.log_softmax(logits, dim=1)).sum(1)


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """The mean over rows of `soft_cross_entropy_rows`."""
    return soft_cross_entropy_rows(logits, targets).mean()


class Thief:
    """The copy and its training set (inputs and the victim's answers).

    `soft`: answers are probability vectors (n, classes), else labels (n,). `epochs`,
    `batch_size`, `lr`: Adam's fit over all answered queries, with at least `min_steps` steps
    (more epochs while the answered set is small); `warm_start`: continue from the
    previous fit (else re-initialise); `device` where the copy trains; `seed` seeds the copy's
    initialisation and every shuffle."""

    def __init__(
        self,
        task: ExtractionTask,
        *,
        soft: bool,
        epochs: int = 10,
        batch_size: int = 128,
        lr: float = 1e-3,
        min_steps: int = 300,
        soft_loss: str = "cross-entropy",
        warm_start: bool = True,
        device: str = "cpu",
        seed: int = 0,
    ) -> None:
        if soft_loss not in SOFT_LOSSES:
            raise ExtractionError(
                f"soft_loss must be one of {', '.join(SOFT_LOSSES)}, got {soft_loss!r}"
            )
        self.soft_loss = soft_loss
        for name, value in (("epochs", epochs), ("batch size", batch_size), ("steps", min_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ExtractionError(f"thief {name} must be a whole number >= 1, got {value!r}")
        if not (isinstance(lr, int | float) and np.isfinite(lr) and lr > 0):
            raise ExtractionError(f"thief learning rate must be > 0, got {lr!r}")
        self.task, self.soft = task, bool(soft)
        self.epochs, self.batch_size, self.lr = epochs, batch_size, float(lr)
        self.min_steps = min_steps
        self.warm_start, self.seed = bool(warm_start), int(seed)
        self.device = torch.device(device)
        self.model = thief_model(task, self.seed).to(self.device)
        self._optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        self._x: list[Tensor] = []
        self._y: list[Tensor] = []
        self._fitted_on = 0
        self._fits = 0
        self.snapshots: list[tuple[int, nn.Module]] = []

    def __len__(self) -> int:
        return sum(len(x) for x in self._x)

    def add(self, x: Tensor, answers: Tensor) -> None:
        """Record answered queries: `answers` are probability rows when `soft`, labels else."""
        self._x.append(x.detach().float().cpu())
        self._y.append(answers.detach().cpu().float() if self.soft else answers.long().cpu())

    def data(self) -> tuple[Tensor, Tensor]:
        """All answered queries: (inputs, answers)."""
        if not self._x:
            shape = (0, self.task.num_classes) if self.soft else (0,)
            dtype = torch.float32 if self.soft else torch.int64
            return torch.zeros(0, *self.task.input_shape), torch.zeros(shape, dtype=dtype)
        return torch.cat(self._x), torch.cat(self._y)

    def loss(self, logits: Tensor, answers: Tensor) -> Tensor:
        """Soft cross-entropy to probability rows, or cross-entropy to labels."""
        if self.soft and self.soft_loss == "log-ratio":
            return log_ratio_loss(logits, answers)
        if self.soft:
            return soft_cross_entropy(logits, answers)
        return F.cross_entropy(logits, answers)

    def fit(self, epochs: int | None = None) -> None:
        """Train the copy for `epochs` (default `self.epochs`) epochs of Adam over every
        answered query (nothing to do when nothing new was answered since the last fit)."""
        x, y = self.data()
        if len(x) == 0 or len(x) == self._fitted_on:
            return
        if not self.warm_start:
            self.model = thief_model(self.task, self.seed).to(self.device)
            self._optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        generator = torch.Generator().manual_seed(self.seed * 7919 + self._fits)
        self._fits += 1
        self.model.train()
        x, y = x.to(self.device), y.to(self.device)
        epochs = self.epochs if epochs is None else epochs
        per_epoch = -(-len(x) // self.batch_size)
        for _ in range(max(epochs, -(-self.min_steps // per_epoch))):
            order = torch.randperm(len(x), generator=generator).to(self.device)
            for start in range(0, len(x), self.batch_size):
                batch = order[start : start + self.batch_size]
                self._optimizer.zero_grad()
                self.loss(self.model(x[batch]), y[batch]).backward()
                self._optimizer.step()
        self.model.eval()
        self._fitted_on = len(x)

    def step(self, x: Tensor, answers: Tensor, steps: int = 1) -> None:
        """A few Adam steps on one batch only (the online update of Knockoff Nets' adaptive
        policy between fits)."""
        self.model.train()
        x, answers = x.float().to(self.device), answers.to(self.device)
        for _ in range(steps):
            self._optimizer.zero_grad()
            self.loss(self.model(x), answers).backward()
            self._optimizer.step()
        self.model.eval()

    @torch.no_grad()
    def predict_logits(self, x: Tensor) -> Tensor:
        """The copy's logits on `x` (CPU, float32)."""
        self.model.eval()
        return self.model(x.float().to(self.device)).float().cpu()

    def snapshot(self, queries: int) -> None:
        """Fit on what is answered and keep (queries, a CPU deep copy of the copy)."""
        self.fit()
        if self.snapshots and self.snapshots[-1][0] == queries:
            return
        self.snapshots.append((int(queries), copy.deepcopy(self.model).cpu().eval()))


class QuerySession:
    """The ledger between a learning attack and the target.

    `ask(x)` sends `x` in pieces that end at the task's checkpoints (fitting and snapshotting
    the thief there) and never past `task.budget`; it returns the inputs answered and their
    answers (probability rows when `soft`, by default when the target serves scores; labels
    else), fewer than asked when
    the budget is spent or the target refused, after which `stopped` is set ("budget",
    "refused") or `exhausted` is True (the task's budget is spent)."""

    def __init__(
        self, target: Target, task: ExtractionTask, thief: Thief, *, soft: bool | None = None
    ) -> None:
        self.target, self.task, self.thief = target, task, thief
        if soft is None:
            soft = target.access.allows(Access.SCORES)
        if soft and not target.access.allows(Access.SCORES):
            raise ExtractionError(
                f"probability answers need scores access; the target offers {target.access.value}"
            )
        if soft != thief.soft:
            raise ExtractionError("the session and the thief must agree on soft or hard answers")
        self.soft = bool(soft)
        self.stopped: str | None = None
        self.refusal: str | None = None
        self._start = target.queries
        self._next = 0

    @property
    def spent(self) -> int:
        """Queries this attack sent through the target."""
        return self.target.queries - self._start

    @property
    def remaining(self) -> int:
        """Queries left of the task's budget (0 once stopped)."""
        return 0 if self.stopped else max(self.task.budget - self.spent, 0)

    @property
    def exhausted(self) -> bool:
        """Nothing more may be sent (budget spent or stopped)."""
        return self.remaining == 0

    def _answer(self, x: Tensor) -> Tensor:
        if self.soft:
            return self.target.probabilities(x).float()
        return self.target.labels(x).long()

    def _send(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        """Answers for `x`, or for its longest prefix the target's budget allows (None when
        nothing was answered); sets `stopped` on a refusal."""
        size = len(x)
        while size >= 1:
            try:
                return x[:size], self._answer(x[:size])
            except QueryBudgetError:
                if size == 1:
                    self.stopped = "budget"
                    return None
                size //= 2
            except (AccessError, TargetError):
                raise
            except PrivacylabError as error:
                self.stopped, self.refusal = "refused", str(error).splitlines()[0]
                return None
        return None

    def ask(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Send `x` (as much of it as the budget allows); the answered inputs and answers."""
        x = torch.as_tensor(x).float()
        answered_x: list[Tensor] = []
        answered_y: list[Tensor] = []
        offset = 0
        checkpoints = self.task.checkpoints
        while offset < len(x) and not self.exhausted:
            while self._next < len(checkpoints) and checkpoints[self._next] <= self.spent:
                self._next += 1
            limit = self.remaining
            if self._next < len(checkpoints):
                limit = min(limit, checkpoints[self._next] - self.spent)
            got = self._send(x[offset : offset + limit])
            if got is None:
                break
            inputs, answers = got
            self.thief.add(inputs, answers)
            answered_x.append(inputs)
            answered_y.append(answers)
            offset += len(inputs)
            if self._next < len(checkpoints) and self.spent >= checkpoints[self._next]:
                self.thief.snapshot(self.spent)
        if not answered_x:
            empty_y = (
                torch.zeros(0, self.task.num_classes)
                if self.soft
                else torch.zeros(0, dtype=torch.int64)
            )
            return x[:0], empty_y
        return torch.cat(answered_x), torch.cat(answered_y)

    def labels_of(self, answers: Tensor) -> Tensor:
        """The victim's label for each answer row (arg-max of a probability row)."""
        return answers.argmax(1) if self.soft else answers

    def finish(self, **params: Any) -> Stolen:
        """The final copy: fitted on everything answered and snapshotted at the queries spent
        (the curve's last point); `params` are the attack's settings and diagnostics."""
        self.thief.snapshot(self.spent)
        model = self.thief.snapshots[-1][1] if self.thief.snapshots else self.thief.model
        info = dict(params)
        info.update(
            {
                "answers": "probabilities" if self.soft else "labels",
                "answered": len(self.thief),
            }
        )
        if self.refusal is not None:
            info["refusal"] = self.refusal
        return Stolen(
            model=model, snapshots=list(self.thief.snapshots), stopped=self.stopped, params=info
        )
