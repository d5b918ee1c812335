"""Inverting Gradients: Geiping, Bauermeister, Dröge & Moeller 2020, "Inverting Gradients —
How easy is it to break privacy in federated learning?" (NeurIPS 2020).

The attacker (the honest-but-curious server) looks for a batch x in the data's box whose
replayed update points the same way as the observed one (their Sec. 4, Eq. 4):

    argmin_{x in [low, high]^n}  1 - <U(x), U*> / (||U(x)|| ||U*||)  +  tv * TV(x)

where U* is the observed update and U(x) the update a client holding (x, y) would have sent,
both over all parameters together (one long vector, their equal layer weights). The cosine
distance is blind to the update's magnitude (their Sec. 3-4: the direction carries the
information about the input, the magnitude mostly the state of training, and a FedAvg step
size does not matter); with first-order signed Adam instead of DLG's L-BFGS it works on ReLU
networks. TV is the anisotropic total variation (`total_variation`).

Optimisation follows their released code (inversefed): Adam (lr 0.1) on the *sign* of the
gradient of x, the step divided by 10 at 3/8, 5/8 and 7/8 of the iterations, x clamped into the
box after every step, and `restarts` runs from independent dummy data of which the one with the
lowest cosine loss at the end is kept (their trial selection by gradient loss, no TV).

Multi-step FedAvg (their Sec. 5): U(x) is the weight change w_0 - w_T of the clients' local SGD
steps, unrolled and differentiable (`replay` on `privacylab.federated.local_update` with
`create_graph=True`), compared with the observed change by the same cosine distance; the
clients' local procedure is side information the task must give.

Labels are known, as in their main experiments; a caller that withholds them gets them from
`privacylab.attacks.inversion.labels.recover_labels`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.inversion.base import (
    GradientAttack,
    GradientTask,
    InversionError,
    Reconstruction,
    client_steps,
    moved,
    number_option,
    register_inversion,
    replay,
    whole_option,
)
from privacylab.attacks.inversion.labels import recover_labels
from privacylab.federated import ObservedUpdate
from privacylab.target import Access, Target

__all__ = ["INITS", "InvertingGradients", "cosine_distance", "milestones", "total_variation"]

INITS = ("randn", "uniform")
"""Dummy data: "randn" draws N(0, 1) and clips it into the box (inversefed's default);
"uniform" draws uniformly in the box."""


def total_variation(x: Tensor) -> Tensor:
    """Anisotropic total variation of images x (n, C, H, W), as in Geiping et al.'s code:
    the mean absolute difference of horizontally neighbouring pixels plus the mean absolute
    difference of vertically neighbouring pixels (means over the batch, channels and
    positions), a scalar."""
    if x.dim() != 4:
        raise InversionError(f"total variation needs images (n, C, H, W), got {tuple(x.shape)}")
    across = (x[..., :, 1:] - x[..., :, :-1]).abs().mean()
    down = (x[..., 1:, :] - x[..., :-1, :]).abs().mean()
    return across + down


def cosine_distance(update: list[Tensor], observed: Tensor, observed_norm: Tensor) -> Tensor:
    """1 - <U, U*> / (||U|| ||U*||) over all tensors of `update` together (Geiping et al. 2020,
    Eq. 4 with equal layer weights): `observed` is U* flattened in the same order and
    `observed_norm` its norm. A zero U gives 1."""
    flat = torch.cat([t.reshape(-1) for t in update])
    norm = flat.norm()
    return 1.0 - (flat @ observed) / (norm * observed_norm).clamp_min(1e-30)


def milestones(iterations: int) -> list[int]:
    """The steps after which Geiping et al. divide the step size by 10: 3/8, 5/8 and 7/8 of
    `iterations` (inversefed's max_iterations // 2.667, // 1.6, // 1.142)."""
    return sorted({max(1, int(iterations * f)) for f in (3 / 8, 5 / 8, 7 / 8)})


@register_inversion("ig")
class InvertingGradients(GradientAttack):
    """Inverting Gradients (Geiping et al. 2020, Sec. 4 Eq. 4; Sec. 5 for FedAvg updates).

    `iterations`: Adam steps per restart (2000 by default, what the CLI runs; the paper's runs
    on CIFAR-10 and ImageNet are longer; 100-300 recover a single 8x8 digit). `lr`: Adam's step
    size, 0.1, in units of the box width (task.bounds), so the attack behaves the same on
    [0, 1] pixels and on normalised ones (inversefed's 0.1 is in normalised units, about 0.025 box
    widths on CIFAR-10; on the ReLU LeNet and 8x8 digits 0.025 needs about 1000 steps for what
    0.1 reaches in 200, and ends no better). `tv`: weight of the total variation of the image
    rescaled to [0, 1]; 1e-4, tuned on 8x8 digits (1e-3 blurs their strokes; on 28x28 MNIST
    1e-3 does slightly better). `restarts`: independent runs, the lowest cosine loss kept.
    `init`: dummy data (`INITS`). `signed`: Adam on the sign of the gradient (their choice),
    else on the gradient.
    `snapshots`: how many (iteration, x) pictures to keep over the run, first and last
    included. `record_every`: history is written every this many iterations (None: about 200
    points per run).

    The returned `loss`, `history` and `restarts` are the cosine (gradient) loss, the
    criterion the restarts are chosen by; `history` ends with the loss of the returned x."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.UPDATES, ("labels", "local-training"))
    paper: ClassVar[str] = (
        "Geiping, Bauermeister, Dröge & Moeller 2020, Inverting Gradients - How easy is it to "
        "break privacy in federated learning? (NeurIPS), Sec. 4 Eq. 4 and Sec. 5"
    )
    aliases: ClassVar[tuple[str, ...]] = ("inverting-gradients",)

    def __init__(
        self,
        iterations: int = 2000,
        lr: float = 0.1,
        tv: float = 1e-4,
        restarts: int = 1,
        init: str = "randn",
        signed: bool = True,
        snapshots: int = 8,
        record_every: int | None = None,
    ) -> None:
        self.iterations = whole_option("ig", "iterations", iterations)
        self.lr = number_option("ig", "lr", lr)
        self.tv = number_option("ig", "tv", tv, zero=True)
        self.restarts = whole_option("ig", "restarts", restarts)
        if init not in INITS:
            raise InversionError(f"ig: init must be one of {', '.join(INITS)}, got {init!r}")
        self.init = init
        if not isinstance(signed, bool):
            raise InversionError(f"ig: signed must be true or false, got {signed!r}")
        self.signed = signed
        self.snapshots = whole_option("ig", "snapshots", snapshots, 0)
        self.record_every = (
            max(1, self.iterations // 200)
            if record_every is None
            else whole_option("ig", "record_every", record_every)
        )

    # -----------------------------------------------------------------------------------------

    def reconstruct(self, target: Target, task: GradientTask) -> Reconstruction:
        """The batch behind the task's update: `restarts` runs of Eq. 4, the lowest cosine
        loss kept."""
        observed = self.observed(target, task)
        training = self.training(observed, task)
        shape = (observed.num_examples, *task.input_shape)
        if self.tv > 0 and len(task.input_shape) != 3:
            raise InversionError(
                f"ig: the total variation prior needs image inputs (C, H, W), got input shape "
                f"{task.input_shape}; set tv=0"
            )
        model = target.model
        device, dtype = target.device, target.dtype
        update = moved(observed, device, dtype)
        labels, source = self._labels(target, task, observed)
        labels = labels.to(device)
        goal = torch.cat([update.update[k].reshape(-1) for k in update.state])
        goal_norm = goal.norm()
        if not (torch.isfinite(goal).all() and goal_norm > 0):
            raise InversionError("ig: the observed update is zero or not finite; nothing to invert")

        def gradient_loss(x: Tensor) -> Tensor:
            replayed = replay(model, update, x, labels, training)
            return cosine_distance([replayed[k] for k in update.state], goal, goal_norm)

        runs = [
            self._run(gradient_loss, shape, task, restart, device, dtype)
            for restart in range(self.restarts)
        ]
        best = min(range(len(runs)), key=lambda i: (runs[i]["loss"], i))
        kept = runs[best]
        return Reconstruction(
            x=kept["x"],
            labels=labels.detach().cpu(),
            initial=kept["initial"],
            loss=kept["loss"],
            history=kept["history"],
            snapshots=kept["snapshots"],
            restarts=[run["loss"] for run in runs],
            params={
                "iterations": self.iterations,
                "lr": self.lr,
                "tv": self.tv,
                "restarts": self.restarts,
                "init": self.init,
                "signed": self.signed,
                "kept_restart": best,
                "labels": source,
                "local_steps": client_steps(observed, training),
                "training": training.to_dict(),
            },
        )

    def _labels(
        self, target: Target, task: GradientTask, update: ObservedUpdate
    ) -> tuple[Tensor, str]:
        """The task's labels ("given"), else those read off the update's output layer
        (`labels.recover_labels`, "recovered": sorted by class, which FedSGD's mean gradient
        does not see but a FedAvg update split into several local batches may)."""
        n = update.num_examples
        if task.labels is not None:
            if int(task.labels.numel()) != n:
                raise InversionError(
                    f"ig: {int(task.labels.numel())} labels given for an update of {n} examples"
                )
            return task.labels.long(), "given"
        labels = recover_labels(
            update, target.model, n, task.num_classes, training=self.training(update, task)
        )
        if labels is None:
            raise InversionError(
                "ig needs the client's labels (side information 'labels'): they cannot be read "
                "off this update (no output layer with a bias)"
            )
        return labels.long().reshape(-1), "recovered"

    def _dummy(
        self, shape: tuple[int, ...], task: GradientTask, restart: int, device: Any, dtype: Any
    ) -> Tensor:
        """Seeded dummy data in the box, drawn on the CPU (the same on every device)."""
        generator = torch.Generator().manual_seed(int(task.seed) * 1_000_003 + restart)
        low, high = task.bounds
        if self.init == "uniform":
            x = low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)
        else:
            x = torch.randn(shape, generator=generator, dtype=torch.float64).clamp(low, high)
        return x.to(device=device, dtype=dtype)

    def _run(
        self,
        gradient_loss: Any,
        shape: tuple[int, ...],
        task: GradientTask,
        restart: int,
        device: Any,
        dtype: Any,
    ) -> dict[str, Any]:
        """One restart: signed Adam on Eq. 4 with the step decay and the box."""
        low, high = task.bounds
        tv = self.tv / (high - low)
        initial = self._dummy(shape, task, restart, device, dtype)
        x = initial.clone().requires_grad_(True)
        optimiser = torch.optim.Adam([x], lr=self.lr * (high - low))
        schedule = torch.optim.lr_scheduler.MultiStepLR(
            optimiser, milestones=milestones(self.iterations), gamma=0.1
        )
        pictures = _snapshot_steps(self.iterations, self.snapshots)
        snapshots: list[tuple[int, Tensor]] = []
        recorded: list[tuple[int, Tensor]] = []
        for step in range(self.iterations):
            if step in pictures:
                snapshots.append((step, x.detach().cpu().clone()))
            try:
                distance = gradient_loss(x)
            except RuntimeError as error:
                if step:
                    raise
                first = str(error).strip().splitlines()[0] if str(error).strip() else "failed"
                raise InversionError(
                    f"ig: the model cannot replay the update on inputs of shape "
                    f"{tuple(x.shape)}: {first}"
                ) from None
            objective = distance + tv * total_variation(x) if tv > 0 else distance
            (grad,) = torch.autograd.grad(objective, x)
            x.grad = grad.sign() if self.signed else grad
            optimiser.step()
            schedule.step()
            with torch.no_grad():
                x.clamp_(low, high)
            if step % self.record_every == 0:
                recorded.append((step, distance.detach()))
        final = gradient_loss(x).detach()
        if self.iterations in pictures:
            snapshots.append((self.iterations, x.detach().cpu().clone()))
        history = [(step, float(value)) for step, value in recorded]
        history.append((self.iterations, float(final)))
        loss = float(final)
        return {
            "x": x.detach().cpu(),
            "initial": initial.cpu(),
            "loss": loss if math.isfinite(loss) else math.inf,
            "history": history,
            "snapshots": snapshots,
        }


def _snapshot_steps(iterations: int, count: int) -> set[int]:
    """`count` iterations spread over 0..iterations, both ends included."""
    if count == 0:
        return set()
    if count == 1:
        return {iterations}
    return {round(k * iterations / (count - 1)) for k in range(count)}
