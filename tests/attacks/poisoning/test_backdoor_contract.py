"""The contract every registered backdoor attack keeps (after scikit-learn's
`parametrize_with_checks`): it runs over `backdoor_names()`, so an attack added in a new file of
`privacylab.attacks.poisoning` is checked with no edit here.

Every attack declares a `ThreatModel` with side information from the family's list and is
either a data-poisoning attack (label access) or a model-trojaning one (white-box). A
data-poisoning attack, on 8x8 digits: crafts the same poisons for the same task and other
poisons for another seed, from the attacker's own rows only (each poison is one of its source
images, changed at most inside the trigger's box; the task has no field for the victim's
rows), shaped like the images; its activation runs on a target narrowed to label access
whatever the target offers, and counts one query per probe in the view and in the target. A
trojaning attack refuses every target below white-box with AccessError before doing any work.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from privacylab.attacks.core import ThreatModel, execute
from privacylab.attacks.poisoning import (
    SIDE_INFORMATION,
    DataPoisoningAttack,
    ModelTrojanAttack,
    PoisonTask,
    ProbeTask,
    TrojanTask,
    backdoor_class,
    backdoor_names,
    make_backdoor,
)
from privacylab.data import Dataset, load_dataset
from privacylab.target import Access, AccessError, Target

CHEAP: dict[str, dict[str, Any]] = {
    "badnets": {"trigger": "square:2@random"},
    "clip-backdoor": {"trigger": "pattern:3@random"},
    "trojan": {"trigger_steps": 2, "inversion_steps": 2, "retrain_epochs": 1},
}
"""Light options (the contract, not the attack's strength, is tested); others run with their
defaults, which must fit 8x8 images."""

NAMES = backdoor_names()
CLASS_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _attack(name: str) -> Any:
    return make_backdoor(name, **CHEAP.get(name, {}))


@pytest.fixture(scope="module")
def source() -> Dataset:
    data = load_dataset("digits")
    return data.subset(torch.arange(300))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10)).eval()


def test_the_family_is_registered() -> None:
    assert "badnets" in NAMES
    assert len(NAMES) == len(set(NAMES))


@pytest.mark.parametrize("name", NAMES)
def test_declares_threat_model(name: str) -> None:
    cls = backdoor_class(name)
    assert cls.name == name
    assert isinstance(cls.threat_model, ThreatModel)
    assert set(cls.threat_model.side_information) <= set(SIDE_INFORMATION)
    assert issubclass(cls, DataPoisoningAttack | ModelTrojanAttack)
    if issubclass(cls, DataPoisoningAttack):
        assert cls.threat_model.access == Access.LABEL
    else:
        assert cls.threat_model.access == Access.WHITEBOX
    assert isinstance(_attack(name), cls)


def _task(source: Dataset, seed: int, budget: int = 12) -> PoisonTask:
    return PoisonTask(source, budget, target_class=2, class_names=CLASS_NAMES, seed=seed)


POISONERS = [n for n in NAMES if issubclass(backdoor_class(n), DataPoisoningAttack)]
TROJANS = [n for n in NAMES if issubclass(backdoor_class(n), ModelTrojanAttack)]


def test_poisoning_task_holds_no_victim_rows() -> None:
    fields = {f.name for f in dataclasses.fields(PoisonTask)}
    assert fields == {
        "source",
        "budget",
        "target_class",
        "mode",
        "class_names",
        "captions",
        "seed",
    }


@pytest.mark.parametrize("name", POISONERS)
def test_craft_is_seeded_and_from_own_rows(name: str, source: Dataset) -> None:
    attack = _attack(name)
    first = attack.craft(_task(source, seed=4))
    again = _attack(name).craft(_task(source, seed=4))
    other = attack.craft(_task(source, seed=5))
    assert len(first) >= 1
    assert first.features.shape[1:] == (1, 8, 8)
    assert first.labels.shape == (len(first),)
    assert torch.equal(first.features, again.features)
    assert torch.equal(first.labels, again.labels)
    assert first.captions == again.captions
    assert first.target_class == 2
    changed = not torch.equal(first.features, other.features) or first.captions != other.captions
    assert changed
    flat = source.features.flatten(1)
    size = 0 if attack.trigger is None else attack.trigger.size
    for poison in first.features.flatten(1):
        differs = (flat != poison).sum(1).min()
        assert int(differs) <= size * size
    merged = first.merged(source)
    assert len(merged) == len(source) + len(first)


@pytest.mark.parametrize("name", POISONERS)
@pytest.mark.parametrize("offered", [Access.LABEL, Access.SCORES, Access.WHITEBOX])
def test_activation_narrows_to_labels_and_counts(
    name: str, offered: Access, source: Dataset
) -> None:
    attack = _attack(name)
    target = Target(_net(), offered, 10)
    probes = source.features[:17]
    execution = execute(attack, target, ProbeTask(probes, seed=0))
    assert execution.access == Access.LABEL
    assert execution.queries == 17
    assert target.queries == 17
    predictions = np.asarray(execution.output.predictions)
    assert predictions.shape == (17,)
    assert ((predictions >= 0) & (predictions < 10)).all()
    again = execute(attack, Target(_net(), offered, 10), ProbeTask(probes, seed=0))
    assert np.array_equal(np.asarray(again.output.predictions), predictions)


@pytest.mark.parametrize("name", TROJANS)
@pytest.mark.parametrize("offered", [Access.LABEL, Access.SCORES, Access.LOGITS])
def test_trojan_refuses_less_than_white_box(name: str, offered: Access) -> None:
    target = Target(_net(), offered, 10)
    task = TrojanTask((1, 8, 8), 10, target_class=1, seed=0)
    with pytest.raises(AccessError) as error:
        execute(_attack(name), target, task)
    assert "\n" not in str(error.value)
    assert target.queries == 0
