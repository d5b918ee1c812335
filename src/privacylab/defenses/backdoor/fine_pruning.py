"""Fine-pruning (Liu, Dolan-Gavitt & Garg 2018, "Fine-Pruning: Defending Against Backdooring
Attacks on Deep Neural Networks", RAID, Sec. 4).

A backdoor tends to live in units that clean inputs leave dormant: the trigger switches them
on. The pruning defence (Sec. 4.1) removes the units of a late layer — the last convolutional
layer's channels — in increasing order of their mean activation on clean validation data,
and stops before clean accuracy drops by more than a set amount (4 points in the paper). An
attacker aware of pruning can hide the backdoor in the units clean data does use (the
pruning-aware attack, Sec. 4.2), so fine-pruning (Sec. 4.3) fine-tunes the pruned network on
the same clean data afterwards, which moves the weights the backdoor rests on.

Here a unit is pruned by zeroing its weights and bias (and its affine normalisation, when a
norm layer follows), so its output is a constant that carries nothing and the pruned model
saves and loads as any other; pruned units stay zero during fine-tuning. The user's model is
never touched: the work is done on a copy. Fine-pruning repairs and gives no verdict
(`detected` is None). The order by mean activation assumes the paper's ReLU units (a dormant
unit's mean is near 0, the smallest possible); with tanh or sigmoid units a low mean is not
dormancy, and the pruned unit's constant output is tanh(0) or sigmoid(0).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.data import Dataset
from privacylab.defenses.backdoor.base import (
    BackdoorDefense,
    BackdoorDefenseError,
    BackdoorEvidence,
    Detection,
    Mitigation,
    check_layer,
    check_number,
    check_whole,
    layer_activations,
    register_backdoor_defense,
)
from privacylab.defenses.base import accuracy as clean_accuracy

__all__ = ["FinePruning", "prunable_layer", "prune_units"]

_NORMS = (nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.InstanceNorm2d)


def prunable_layer(model: nn.Module) -> str:
    """The default layer to prune (Liu et al. 2018 Sec. 4.1: the last convolutional layer):
    the last `nn.Conv2d` in `named_modules` order, else the `nn.Linear` before the last one
    (the units of the penultimate representation)."""
    convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    if convs:
        return convs[-1]
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if len(linears) < 2:
        raise BackdoorDefenseError(
            "fine-pruning: the model has no Conv2d and fewer than two Linear layers: name the layer"
        )
    return linears[-2]


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if n and not list(m.children())]


def _follower(model: nn.Module, name: str, kind: tuple[type, ...] | None) -> str | None:
    """The first leaf after `name` (skipping norm layers), or the norm layer right after it
    when `kind` is the norm types."""
    leaves = _leaves(model)
    names = [n for n, _ in leaves]
    for after, module in leaves[names.index(name) + 1 :]:
        if kind is not None:
            return after if isinstance(module, kind) else None
        if not isinstance(module, _NORMS):
            return after
    return None


def prune_units(model: nn.Module, layer: str, units: list[int] | np.ndarray) -> None:
    """Zero, in place, the weights and bias of `units` (output channels or features) of
    `layer` in `model` — and of the affine norm layer right after it, if any — so each pruned
    unit outputs a constant."""
    modules = dict(model.named_modules())
    index = torch.as_tensor(np.asarray(units, dtype=np.int64))
    if index.numel() == 0:
        return
    targets = [modules[layer]]
    norm = _follower(model, layer, _NORMS)
    if norm is not None:
        targets.append(modules[norm])
    with torch.no_grad():
        for module in targets:
            for attr in ("weight", "bias"):
                tensor = getattr(module, attr, None)
                if isinstance(tensor, Tensor) and tensor.ndim >= 1:
                    tensor[index.to(tensor.device)] = 0.0


@register_backdoor_defense
class FinePruning(BackdoorDefense):
    """Fine-pruning (Liu, Dolan-Gavitt & Garg 2018, Sec. 4): prune the units of `layer`
    (default `prunable_layer`: the last conv layer's channels, else the penultimate Linear's
    units) in increasing order of mean activation on the clean data, one at a time, while
    clean accuracy stays within `max_drop` of the unpruned model's and at most `fraction` of
    the units are gone; then fine-tune the pruned copy on the clean data for `epochs` epochs
    (Adam at `lr`, batches of `batch_size`, shuffled by the evidence's seed; 0 epochs: the
    pruning defence of Sec. 4.1 alone). Needs clean data; no verdict."""

    name = "fine-pruning"
    paper = (
        "Liu, Dolan-Gavitt & Garg 2018, Fine-Pruning: Defending Against Backdooring Attacks "
        "on Deep Neural Networks (RAID), Sec. 4"
    )
    needs = ("clean-data",)

    def __init__(
        self,
        layer: str | None = None,
        max_drop: float = 0.04,
        fraction: float = 0.9,
        epochs: int = 10,
        lr: float = 1e-2,
        batch_size: int = 64,
    ) -> None:
        self.layer = check_layer(self.name, layer)
        self.max_drop = check_number(
            self.name, "max_drop", max_drop, low=0.0, high=1.0, low_open=False
        )
        self.fraction = check_number(
            self.name, "fraction", fraction, low=0.0, high=1.0, high_open=True
        )
        self.epochs = check_whole(self.name, "epochs", epochs, low=0)
        self.lr = check_number(self.name, "lr", lr, low=0.0)
        self.batch_size = check_whole(self.name, "batch_size", batch_size)

    def mean_activations(self, model: nn.Module, layer: str, data: Dataset) -> np.ndarray:
        """Each unit's mean activation over the clean rows (and positions, for channels), read
        right after `layer`'s activation function (norm layers skipped) when there is one, else
        at `layer` itself."""
        units = int(dict(model.named_modules())[layer].weight.shape[0])  # type: ignore[union-attr]
        after = _follower(model, layer, None)
        probes = [layer]
        if after is not None and not list(dict(model.named_modules())[after].parameters()):
            probes.insert(0, after)
        for probe in probes:
            acts = layer_activations(model, data.features, probe)
            if acts.shape[1] % units == 0:
                return acts.view(len(data), units, -1).mean(dim=(0, 2)).double().numpy()
        raise BackdoorDefenseError(f"fine-pruning: cannot read {units} units at layer {layer!r}")

    def fine_tune(
        self, model: nn.Module, layer: str, pruned: np.ndarray, data: Dataset, seed: int
    ) -> None:
        """Train `model` in place on `data` for `epochs`, keeping the `pruned` units at zero."""
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        optimizer = torch.optim.Adam(model.parameters(), lr=self.lr)
        generator = torch.Generator().manual_seed(seed)
        model.train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for _ in range(self.epochs):
                order = torch.randperm(len(data), generator=generator)
                for start in range(0, len(data), self.batch_size):
                    rows = order[start : start + self.batch_size]
                    x, y = data.features[rows].to(device), data.labels[rows].to(device)
                    optimizer.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    optimizer.step()
                    prune_units(model, layer, pruned)
        model.eval()

    def inspect(self, model: nn.Module, evidence: BackdoorEvidence) -> Detection:
        """Prune the clean-dormant units while accuracy holds, then fine-tune; a repaired copy."""
        start = time.perf_counter()
        evidence.require(self.name, self.needs)
        clean = evidence.clean
        assert clean is not None
        layer = prunable_layer(model) if self.layer is None else self.layer
        modules = dict(model.named_modules())
        if layer not in modules:
            raise BackdoorDefenseError(f"fine-pruning: no layer named {layer!r} in the model")
        if not isinstance(modules[layer], nn.Conv2d | nn.Linear):
            raise BackdoorDefenseError(
                f"fine-pruning: layer {layer!r} is a {type(modules[layer]).__name__}, "
                "not a Conv2d or Linear"
            )
        repaired = self.copy_model(model).eval()
        activity = self.mean_activations(repaired, layer, clean)
        order = np.argsort(activity, kind="stable")
        baseline = clean_accuracy(repaired, clean)
        limit = int(np.floor(self.fraction * order.size))
        pruned = 0
        curve = [baseline]
        trial = self.copy_model(repaired)
        for count in range(1, limit + 1):
            prune_units(trial, layer, order[count - 1 : count])
            accuracy = clean_accuracy(trial, clean)
            if baseline - accuracy > self.max_drop:
                break
            pruned = count
            curve.append(accuracy)
        removed = np.sort(order[:pruned])
        prune_units(repaired, layer, removed)
        pruned_accuracy = clean_accuracy(repaired, clean)
        if self.epochs:
            self.fine_tune(repaired, layer, removed, clean, evidence.seed)
        tuned_accuracy = clean_accuracy(repaired, clean)
        details: dict[str, Any] = {
            "layer": layer,
            "units": int(order.size),
            "pruned": removed.tolist(),
            "mean_activation": activity.tolist(),
            "clean_accuracy": {
                "before": baseline,
                "pruned": pruned_accuracy,
                "fine_tuned": tuned_accuracy,
            },
            "accuracy_curve": curve,
            "max_drop": self.max_drop,
            "fraction": self.fraction,
            "epochs": self.epochs,
            "seed": evidence.seed,
        }
        mitigation = Mitigation(
            model=repaired,
            description=(
                f"fine-pruning: {pruned} of {order.size} units of {layer} pruned, "
                f"fine-tuned {self.epochs} epochs on {len(clean)} clean rows"
            ),
        )
        return Detection(
            method=self.name,
            detected=None,
            scores={"mean_activation": activity.tolist()},
            mitigation=mitigation,
            seconds=time.perf_counter() - start,
            details=details,
        )
