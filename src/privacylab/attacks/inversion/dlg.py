"""Deep Leakage from Gradients: Zhu, Liu & Han 2019, "Deep Leakage from Gradients"
(NeurIPS 2019), Alg. 1.

The honest-but-curious server draws a dummy batch x' ~ N(0, 1) and dummy label logits
y' ~ N(0, 1), and minimises the squared distance between the update they would produce and
the observed one,

    D(x', y') = sum over parameters of || dW(x', softmax(y')) - dW ||^2,

over both with L-BFGS (`_optim.match_gradients`: strong-Wolfe line search, so no learning
rate). The labels are the argmax of the optimised dummy logits. Matching gradients by L-BFGS
needs the update to be twice differentiable in x', so DLG refuses ReLU-like activations (the
paper replaces ReLU by sigmoid).

The paper's experiments use batches of at most 8 (their Fig. 5); larger batches run, with a
warning in `params`. An update from multi-step FedAvg is replayed step by step (`dlg-fedavg`,
which declares the clients' local procedure as side information); plain `dlg` is FedSGD's
attack and refuses a FedAvg update in one line.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.inversion._optim import MatchRun, match_gradients
from privacylab.attacks.inversion.base import (
    GradientAttack,
    GradientTask,
    InversionError,
    Reconstruction,
    client_steps,
    moved,
    number_option,
    register_inversion,
    whole_option,
)
from privacylab.federated import LocalTraining, ObservedUpdate
from privacylab.target import Access, Target

__all__ = ["DLG", "PAPER_MAX_BATCH", "DLGFedAvg"]

PAPER_MAX_BATCH = 8
"""The largest batch Zhu et al. 2019 reconstruct (their Fig. 5)."""


@register_inversion("dlg")
class DLG(GradientAttack):
    """Deep Leakage from Gradients (Zhu et al. 2019, Alg. 1) with L-BFGS and a strong-Wolfe
    line search.

    `iterations`: L-BFGS iterations per restart, each with its line search (300; the
    released code calls a fixed-step L-BFGS 300 times with up to 20 inner iterations each; one
    8x8 digit on the sigmoid LeNet converges here in about 60 to 120). `restarts`: independent
    starts, the one with the lowest final D kept (a start that ends in NaN is discarded).
    `tol`: stop once D falls below `tol` times the observed update's squared norm; a run also
    stops when D no longer decreases (relative 1e-4 over two tenths of the iterations).
    History and snapshots are taken every tenth of the iterations."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.UPDATES, ())
    paper: ClassVar[str] = "Zhu, Liu & Han 2019, Deep Leakage from Gradients (NeurIPS), Alg. 1"
    needs_smooth: ClassVar[bool] = True

    def __init__(self, iterations: int = 300, restarts: int = 1, tol: float = 1e-9) -> None:
        self.iterations = whole_option(self._label(), "iterations", iterations)
        self.restarts = whole_option(self._label(), "restarts", restarts)
        self.tol = number_option(self._label(), "tol", tol, zero=True)

    @classmethod
    def _label(cls) -> str:
        return getattr(cls, "name", cls.__name__.lower())

    def fixed_labels(
        self, target: Target, task: GradientTask, update: ObservedUpdate, training: LocalTraining
    ) -> tuple[Tensor | None, str]:
        """The hard labels to hold fixed, and where they come from; DLG optimises them
        (None, "optimised")."""
        return None, "optimised"

    def reconstruct(self, target: Target, task: GradientTask) -> Reconstruction:
        """The batch behind the task's update: `restarts` runs of Alg. 1, the lowest D kept."""
        observed = self.observed(target, task)
        training = self.training(observed, task)
        model = target.model
        device, dtype = target.device, target.dtype
        update = moved(observed, device, dtype)
        if not all(bool(torch.isfinite(v).all()) for v in update.update.values()):
            raise InversionError(f"{self.name}: the observed update is not finite")
        n = observed.num_examples
        labels, source = self.fixed_labels(target, task, observed, training)
        if labels is not None:
            labels = labels.to(device)
        runs: list[MatchRun] = []
        for restart in range(self.restarts):
            generator = torch.Generator().manual_seed(int(task.seed) * 1_000_003 + restart)
            x0 = torch.randn((n, *task.input_shape), generator=generator, dtype=torch.float64)
            y0 = torch.randn((n, task.num_classes), generator=generator, dtype=torch.float64)
            runs.append(
                match_gradients(
                    model,
                    update,
                    training,
                    x=x0.to(device=device, dtype=dtype),
                    label_logits=None if labels is not None else y0.to(device=device, dtype=dtype),
                    labels=labels,
                    iterations=self.iterations,
                    tol=self.tol,
                    name=self.name,
                )
            )
        finite = [i for i, run in enumerate(runs) if run.finite]
        if not finite:
            raise InversionError(
                f"{self.name}: every restart diverged (NaN); try more restarts or a float64 target"
            )
        best = min(finite, key=lambda i: (runs[i].loss, i))
        kept = runs[best]
        low, high = task.bounds
        if labels is None:
            assert kept.label_logits is not None
            labels = kept.label_logits.argmax(dim=1)
        params: dict[str, Any] = {
            "iterations": self.iterations,
            "restarts": self.restarts,
            "tol": self.tol,
            "kept_restart": best,
            "labels": source,
            "lbfgs_iterations": kept.iterations,
            "evaluations": sum(run.evaluations for run in runs),
            "local_steps": client_steps(observed, training),
            "training": training.to_dict(),
        }
        if n > PAPER_MAX_BATCH:
            params["warning"] = (
                f"{self.name} was shown for batches of at most {PAPER_MAX_BATCH} "
                f"(Zhu et al. 2019); this batch has {n}"
            )
        return Reconstruction(
            x=kept.x.clamp(low, high).cpu(),
            labels=labels.detach().long().cpu(),
            initial=kept.initial.cpu(),
            loss=kept.loss,
            history=kept.history,
            snapshots=[(i, x.clamp(low, high).cpu()) for i, x in kept.snapshots],
            restarts=[run.loss for run in runs],
            params=params,
        )


@register_inversion("dlg-fedavg")
class DLGFedAvg(DLG):
    """DLG on an update of multi-step FedAvg: the clients' local steps are replayed,
    unrolled and differentiable, which needs their local procedure (side information
    "local-training"; Geiping et al. 2020, Sec. 5, for the unrolled replay). On a FedSGD
    update it is plain DLG."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.UPDATES, ("local-training",))
