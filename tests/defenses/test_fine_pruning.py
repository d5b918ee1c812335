"""Fine-pruning (Liu, Dolan-Gavitt & Garg 2018, Sec. 4): on a small MLP backdoored on 8x8
digits (a 3x3 white corner, 60 poisons) it lowers the attack success rate with the clean test
accuracy kept within 5 points (numbers printed); the pruning step alone is re-derived by hand
(the units of least mean clean activation, computed from the weights; accuracy within
`max_drop`, and one more unit would break it); pruned units stay zero through fine-tuning; a
conv layer is pruned by channel, norm layer included; bad options and layers are one line."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from _backdoor_digits import TARGET, TRIGGER, digits, fit, poisoned
from privacylab.attacks.poisoning.trigger import parse_trigger
from privacylab.data import Dataset
from privacylab.defenses.backdoor import (
    BackdoorDefenseError,
    BackdoorEvidence,
    evaluate_mitigation,
)
from privacylab.defenses.backdoor.fine_pruning import FinePruning, prunable_layer, prune_units


@dataclass
class Scene:
    model: nn.Module
    clean: Dataset
    test: Dataset
    triggered: torch.Tensor


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    x, y = digits()
    order = np.random.default_rng(0).permutation(len(y))
    train, held, rest = order[:1200], order[1200:1400], order[1400:]
    features, labels, _ = poisoned(x[train], y[train], 60, TARGET)
    model = fit(
        lambda: nn.Sequential(
            nn.Flatten(),
            nn.Linear(64, 64),
            nn.ReLU(),
            nn.Linear(64, 256),
            nn.ReLU(),
            nn.Linear(256, 10),
        ),
        features,
        labels,
        steps=200,
    )
    clean = Dataset("held", x[held], y[held], 10, (1, 8, 8), "image")
    test = Dataset("test", x[rest], y[rest], 10, (1, 8, 8), "image")
    yield Scene(model, clean, test, parse_trigger(TRIGGER).stamp(test.features))
    torch.set_num_threads(before)


def _numbers(scene: Scene, mitigation: object) -> dict[str, float]:
    wanted = np.full(len(scene.test), TARGET)
    return evaluate_mitigation(mitigation, scene.model, scene.test, scene.triggered, wanted)  # type: ignore[arg-type]


def test_lowers_asr_with_bounded_accuracy_drop(scene: Scene) -> None:
    before = _numbers(scene, None)
    detection = FinePruning().inspect(scene.model, BackdoorEvidence(10, clean=scene.clean))
    after = _numbers(scene, detection.mitigation)
    print(
        f"fine-pruning: accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}, "
        f"ASR {before['asr']:.3f} -> {after['asr']:.3f}; {detection.mitigation.description}"  # type: ignore[union-attr]
    )
    assert detection.detected is None and detection.flagged_class is None
    assert before["asr"] >= 0.95
    assert after["asr"] <= before["asr"] - 0.2
    assert after["accuracy"] >= before["accuracy"] - 0.05


def _hidden(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The pruned layer's ReLU output, from the weights (no hooks)."""
    first, second = model[1], model[3]  # type: ignore[index]
    with torch.no_grad():
        return torch.relu(
            torch.relu(x.flatten(1) @ first.weight.T + first.bias) @ second.weight.T + second.bias
        )


def _accuracy(model: nn.Module, data: Dataset) -> float:
    with torch.no_grad():
        return float((model(data.features).argmax(1) == data.labels).float().mean())


def test_pruning_step_re_derived_by_hand(scene: Scene) -> None:
    defense = FinePruning(epochs=0, max_drop=0.04)
    detection = defense.inspect(scene.model, BackdoorEvidence(10, clean=scene.clean))
    assert detection.details["layer"] == prunable_layer(scene.model) == "3"
    activity = _hidden(scene.model, scene.clean.features).mean(0).double().numpy()
    assert np.allclose(detection.scores["mean_activation"], activity, atol=1e-5)
    order = np.argsort(activity, kind="stable")
    pruned = detection.details["pruned"]
    k = len(pruned)
    assert 0 < k < 256 and sorted(pruned) == sorted(order[:k].tolist())
    baseline = _accuracy(scene.model, scene.clean)
    repaired = detection.mitigation.model  # type: ignore[union-attr]
    assert _accuracy(repaired, scene.clean) >= baseline - 0.04
    one_more = copy.deepcopy(scene.model)
    prune_units(one_more, "3", order[: k + 1])
    assert _accuracy(one_more, scene.clean) < baseline - 0.04
    assert np.all(_hidden(repaired, scene.clean.features)[:, pruned].numpy() == 0)


def test_pruned_units_stay_zero_after_fine_tuning(scene: Scene) -> None:
    detection = FinePruning(epochs=2).inspect(scene.model, BackdoorEvidence(10, clean=scene.clean))
    repaired = detection.mitigation.model  # type: ignore[union-attr]
    pruned = detection.details["pruned"]
    layer = dict(repaired.named_modules())["3"]
    assert torch.all(layer.weight[pruned] == 0) and torch.all(layer.bias[pruned] == 0)
    assert not torch.equal(layer.weight, dict(scene.model.named_modules())["3"].weight)


def test_fraction_caps_the_pruning(scene: Scene) -> None:
    detection = FinePruning(epochs=0, max_drop=1.0, fraction=0.1).inspect(
        scene.model, BackdoorEvidence(10, clean=scene.clean)
    )
    assert len(detection.details["pruned"]) == int(0.1 * 256)


def test_conv_channels_and_their_norm_are_pruned() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 8, 3, padding=1),
        nn.GroupNorm(2, 8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    )
    assert prunable_layer(model) == "2"
    x = torch.rand(20, 1, 8, 8)
    prune_units(model, "2", [1, 6])
    seen: list[torch.Tensor] = []
    handle = model[4].register_forward_hook(lambda _m, _i, out: seen.append(out))
    model(x)
    handle.remove()
    assert torch.all(seen[0][:, [1, 6]] == 0) and torch.any(seen[0][:, [0, 2]] != 0)
    data = Dataset("rand", x, torch.randint(0, 10, (20,)), 10, (1, 8, 8), "image")
    means = FinePruning().mean_activations(model, "2", data)
    assert means.shape == (8,) and means[1] == means[6] == 0.0


def test_layers_that_cannot_be_pruned_are_one_line(scene: Scene) -> None:
    evidence = BackdoorEvidence(10, clean=scene.clean)
    for layer, words in [("9", "no layer named"), ("2", "not a Conv2d or Linear")]:
        with pytest.raises(BackdoorDefenseError, match=words):
            FinePruning(layer=layer).inspect(scene.model, evidence)
    with pytest.raises(BackdoorDefenseError, match="name the layer"):
        prunable_layer(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    with pytest.raises(BackdoorDefenseError, match="needs clean-data"):
        FinePruning().inspect(scene.model, BackdoorEvidence(10))


@pytest.mark.parametrize(
    "options",
    [
        {"max_drop": -0.1},
        {"max_drop": 2},
        {"fraction": 1.0},
        {"fraction": 0},
        {"epochs": -1},
        {"lr": 0},
        {"batch_size": 0},
        {"layer": ""},
    ],
)
def test_bad_options_are_one_line(options: dict[str, object]) -> None:
    with pytest.raises(BackdoorDefenseError) as error:
        FinePruning(**options)  # type: ignore[arg-type]
    assert "\n" not in str(error.value) and "fine-pruning" in str(error.value)
