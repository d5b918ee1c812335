"""Gradient matching under L-BFGS, shared by DLG and iDLG (Zhu et al. 2019, "Deep Leakage from
Gradients", Alg. 1; Zhao et al. 2020, iDLG, Sec. 3.3).

The objective is D(x', y') = sum over parameters of ||dW' - dW||^2, dW the observed update and
dW' = `replay(model, update, x', y', training)` the update the dummy batch would produce (the
gradient for FedSGD, the unrolled local steps for FedAvg). It is minimised with
`torch.optim.LBFGS(line_search_fn="strong_wolfe")`: the line search picks the step, so there is
no learning rate to tune (the released DLG code uses a fixed step of 1, which diverges or stalls
depending on the model; reports of DLG being "not reproducible" trace back to it).

The optimiser runs in chunks of L-BFGS iterations; between chunks (only there) the objective
is read back once for the stopping rule, the history and the snapshots, and that evaluation
(its gradient taken only when the run goes on) is the one the next chunk's L-BFGS step starts
from, not computed again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from privacylab.attacks.inversion.base import InversionError, replay
from privacylab.federated import LocalTraining, ObservedUpdate

__all__ = ["MatchRun", "match_gradients"]


@dataclass
class MatchRun:
    """One optimisation from one start: the final dummy data `x` (unclamped), the dummy label
    logits (None with fixed labels), the start `initial`, the final objective `loss` (NaN
    when it diverged), `history` (iteration, objective) after each chunk, `snapshots`
    (iteration, x), and the L-BFGS `iterations` and objective `evaluations` it ran."""

    x: Tensor
    label_logits: Tensor | None
    initial: Tensor
    loss: float
    history: list[tuple[int, float]] = field(default_factory=list)
    snapshots: list[tuple[int, Tensor]] = field(default_factory=list)
    iterations: int = 0
    evaluations: int = 0

    @property
    def finite(self) -> bool:
        """Whether the run ended with a finite objective and finite data."""
        return math.isfinite(self.loss) and bool(torch.isfinite(self.x).all())


def _distance(replayed: dict[str, Tensor], observed: list[Tensor]) -> Tensor:
    diffs = [
        (mine - theirs).pow(2).sum()
        for mine, theirs in zip(replayed.values(), observed, strict=True)
    ]
    return torch.stack(diffs).sum()


def match_gradients(
    model: nn.Module,
    update: ObservedUpdate,
    training: LocalTraining,
    *,
    x: Tensor,
    label_logits: Tensor | None = None,
    labels: Tensor | None = None,
    iterations: int = 300,
    tol: float = 1e-9,
    chunks: int = 10,
    patience: int = 2,
    name: str = "dlg",
) -> MatchRun:
    """Minimise D over the dummy batch `x` (and the dummy `label_logits`, whose softmax is the
    soft label, when `labels` is None) from the given start: `iterations` L-BFGS iterations
    with a strong-Wolfe line search in `chunks` chunks, stopping early when D is below `tol`
    times the observed update's squared norm (scale-free: a FedAvg delta is lr times smaller
    than a gradient), when D has not decreased by a relative 1e-4 over `patience` chunks, or
    when it is not finite (then `loss` is NaN and the caller discards the run). A model that
    cannot take `x` is refused in one line naming the attack (`name`)."""
    observed = [update.update[k].detach().to(x.device) for k in update.state]
    threshold = tol * float(torch.stack([g.pow(2).sum() for g in observed]).sum())
    initial = x.detach().clone()
    dummy = x.detach().clone().requires_grad_(True)
    variables = [dummy]
    logits = None
    if labels is None:
        if label_logits is None:
            raise InversionError(f"{name}: gradient matching needs labels or label logits")
        logits = label_logits.detach().clone().requires_grad_(True)
        variables.append(logits)
    chunk = max(1, math.ceil(iterations / max(1, chunks)))
    optimizer = torch.optim.LBFGS(
        variables,
        lr=1.0,
        max_iter=chunk,
        max_eval=chunk * 25,
        history_size=100,
        tolerance_grad=0.0,
        tolerance_change=0.0,
        line_search_fn="strong_wolfe",
    )

    def objective() -> Tensor:
        target = labels if logits is None else torch.softmax(logits, dim=1)
        return _distance(replay(model, update, dummy, target, training), observed)

    pending: list[Tensor] = []  # the boundary's objective, its gradient already in .grad

    def closure() -> Tensor:
        if pending:
            return pending.pop()
        optimizer.zero_grad(set_to_none=True)
        loss = objective()
        loss.backward()
        return loss

    run = MatchRun(x=dummy.detach(), label_logits=None, initial=initial, loss=float("nan"))
    done = 0
    best = math.inf
    stalled = 0
    reused = 0
    group = optimizer.param_groups[0]
    try:
        current = objective()
    except RuntimeError as error:
        reason = (str(error).strip().splitlines() or ["failed"])[0]
        raise InversionError(
            f"{name}: the model cannot replay the update on inputs of shape "
            f"{tuple(dummy.shape)}: {reason}"
        ) from None
    while True:
        value = float(current.detach())
        run.evaluations += 1
        if not math.isfinite(value) or not bool(torch.isfinite(dummy).all()):
            run.iterations = done
            run.evaluations += int(optimizer.state[dummy].get("func_evals", 0)) - reused
            return run
        run.history.append((done, value))
        run.snapshots.append((done, dummy.detach().clone()))
        stalled = stalled + 1 if value > best * (1 - 1e-4) else 0
        best = min(best, value)
        if done >= iterations or value < threshold or stalled >= patience:
            break
        group["max_iter"] = min(chunk, iterations - done)
        group["max_eval"] = group["max_iter"] * 25
        optimizer.zero_grad(set_to_none=True)
        current.backward()
        pending.append(current)
        reused += 1
        before = optimizer.state[dummy].get("n_iter", 0)
        optimizer.step(closure)
        done = int(optimizer.state[dummy]["n_iter"])
        if done == before:
            break
        current = objective()
    run.evaluations += int(optimizer.state[dummy].get("func_evals", 0)) - reused
    run.x = dummy.detach().clone()
    run.label_logits = None if logits is None else logits.detach().clone()
    run.loss = value
    run.iterations = done
    return run
