"""Improved Deep Leakage from Gradients: Zhao, Mopuri & Bilen 2020, "iDLG: Improved Deep
Leakage from Gradients" (arXiv:2001.02610), Sec. 3.

The labels are read off the update first (`labels.recover_labels`: the sign of the output
layer's bias gradient for one example, Sec. 3.2; class counts from it for a batch), then DLG's
gradient matching (Zhu et al. 2019, Alg. 1; `dlg.DLG`) runs on the data alone with those hard
labels held fixed, which removes the label search that makes DLG slow and unstable. iDLG
stays label-free: it takes nothing from the task but the update. Where the labels cannot be
read off (no output layer with a bias for a batch, a FedAvg update without the local
procedure), it falls back to DLG's optimised soft labels and says so in `params["labels"]`.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.inversion.base import GradientTask, register_inversion
from privacylab.attacks.inversion.dlg import DLG
from privacylab.attacks.inversion.labels import recover_labels
from privacylab.federated import LocalTraining, ObservedUpdate
from privacylab.target import Access, Target

__all__ = ["IDLG", "IDLGFedAvg"]


@register_inversion("idlg")
class IDLG(DLG):
    """iDLG (Zhao et al. 2020): labels from the update (`recover_labels`), then DLG's L-BFGS
    on the data alone. Options as `DLG`."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.UPDATES, ())
    paper: ClassVar[str] = (
        "Zhao, Mopuri & Bilen 2020, iDLG: Improved Deep Leakage from Gradients, Sec. 3"
    )

    def fixed_labels(
        self, target: Target, task: GradientTask, update: ObservedUpdate, training: LocalTraining
    ) -> tuple[Tensor | None, str]:
        """The labels read off the update ("recovered"), or (None, "optimised") where they
        cannot be."""
        labels = recover_labels(
            update, target.model, update.num_examples, task.num_classes, training=training
        )
        if labels is None:
            return None, "optimised"
        return labels.long().reshape(-1), "recovered"


@register_inversion("idlg-fedavg")
class IDLGFedAvg(IDLG):
    """iDLG on an update of multi-step FedAvg, replaying the clients' local steps (side
    information "local-training"). One example's label is still exact (the bias delta is a sum
    of steps that are all negative in the true class only); a batch's counts come from the
    delta divided by lr times the number of steps, with the mean softmax estimated at the
    midpoint weights: an approximation (`labels` module docstring)."""

    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.UPDATES, ("local-training",))
