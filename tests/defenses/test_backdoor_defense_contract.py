"""The contract every registered backdoor defence keeps (after scikit-learn's
`parametrize_with_checks`): it runs over `backdoor_defense_names()`, so a defence added in a new
file of `privacylab.defenses.backdoor` is checked with no edit here.

On a tiny backdoored model (a small MLP on sklearn's 8x8 digits, a 3x3 white corner trigger
on 40 rows relabelled 0) each defence must: declare a name, a paper and what it needs (a
subset of EVIDENCE); refuse evidence missing any need in one BackdoorDefenseError line; return
a Detection of its own name whose `to_dict` survives `json.dumps`; leave the user's model
(state_dict and training mode) unchanged; give the same verdict for the same seed; and, when
it repairs with a model, return a model other than the user's.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from privacylab.attacks.poisoning.trigger import parse_trigger
from privacylab.data import Dataset
from privacylab.defenses.backdoor import (
    BACKDOOR_DEFENSES,
    EVIDENCE,
    BackdoorDefenseError,
    BackdoorEvidence,
    Detection,
    backdoor_defense_names,
    make_backdoor_defense,
)

CHEAP: dict[str, dict[str, Any]] = {
    "neural-cleanse": {
        "seeds": 1,
        "epochs": 2,
        "steps_per_epoch": 2,
        "classes": [0, 1, 2],
        "max_rows": 40,
        "unlearn_epochs": 1,
    },
    "strip": {"n": 4, "max_rows": 40},
    "activation-clustering": {"reduce": "pca"},
    "fine-pruning": {"epochs": 1},
}
"""Light settings for the expensive defences (the contract, not the defence's strength, is
tested); defences not listed run with their defaults."""

NAMES = backdoor_defense_names()


@dataclass
class Case:
    model: nn.Module
    evidence: BackdoorEvidence


def _net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def _fit(x: torch.Tensor, y: torch.Tensor, seed: int, steps: int = 150) -> nn.Module:
    torch.manual_seed(seed)
    model = _net()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def case() -> Iterator[Case]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, clean = order[:600], order[600:800]
    donors = train[y[train].numpy() != 0][:40]
    poisons = parse_trigger("square:3@corner").stamp(x[donors])
    features = torch.cat([x[train], poisons])
    labels = torch.cat([y[train], torch.zeros(len(donors), dtype=torch.int64)])
    training = Dataset("digits-poisoned", features, labels, 10, (1, 8, 8), "image")
    held = Dataset("digits-clean", x[clean], y[clean], 10, (1, 8, 8), "image")
    model = _fit(features, labels, seed=0)

    def retrain(data: Dataset) -> nn.Module:
        return _fit(data.features, data.labels, seed=1, steps=5)

    yield Case(model, BackdoorEvidence(10, clean=held, training=training, retrain=retrain))
    torch.set_num_threads(before)


def test_the_issue_list_is_registered() -> None:
    mine = {"activation-clustering", "spectral", "fine-pruning"}
    assert mine <= set(NAMES), mine - set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_declarations(name: str) -> None:
    cls = BACKDOOR_DEFENSES.get(name)
    assert cls.name == name
    assert isinstance(cls.paper, str) and cls.paper.strip(), f"{name} names no paper"
    assert cls.needs and set(cls.needs) <= set(EVIDENCE), cls.needs
    assert (cls.__doc__ or "").strip(), f"{name} has no docstring"
    assert type(make_backdoor_defense(name, **CHEAP.get(name, {}))) is cls


@pytest.mark.parametrize("name", NAMES)
def test_refuses_missing_evidence_in_one_line(name: str, case: Case) -> None:
    defense = make_backdoor_defense(name, **CHEAP.get(name, {}))
    for need in defense.needs:
        missing = {"clean-data": "clean", "training-data": "training", "retrain": "retrain"}[need]
        evidence = replace(case.evidence, **{missing: None})
        with pytest.raises(BackdoorDefenseError) as error:
            defense.inspect(case.model, evidence)
        message = str(error.value)
        assert "\n" not in message and need in message, message


@pytest.mark.parametrize("name", NAMES)
def test_keeps_the_contract(name: str, case: Case) -> None:
    options = CHEAP.get(name, {})
    state = copy.deepcopy(case.model.state_dict())
    case.model.train()
    first = make_backdoor_defense(name, **options).inspect(case.model, case.evidence)
    assert case.model.training, f"{name} left the model in eval mode"
    case.model.eval()
    after = case.model.state_dict()
    assert state.keys() == after.keys()
    for key, value in state.items():
        assert torch.equal(value, after[key]), f"{name} changed {key} of the user's model"

    assert isinstance(first, Detection) and first.method == name
    assert first.detected in (True, False, None)
    assert first.flagged_class is None or 0 <= first.flagged_class < 10
    assert first.seconds >= 0
    if first.flagged_rows is not None:
        rows = np.asarray(first.flagged_rows)
        assert rows.ndim == 1 and np.issubdtype(rows.dtype, np.integer)
        assert ((rows >= 0) & (rows < len(case.evidence.training))).all()  # type: ignore[arg-type]
    if first.mitigation is not None and first.mitigation.model is not None:
        assert first.mitigation.model is not case.model
    encoded = json.dumps(first.to_dict())
    assert json.loads(encoded)["method"] == name

    again = make_backdoor_defense(name, **options).inspect(case.model, case.evidence)
    one, two = first.to_dict(), again.to_dict()
    for timing in ("seconds",):
        one.pop(timing), two.pop(timing)
    one["details"].pop("seconds", None), two["details"].pop("seconds", None)
    assert one == two, f"{name}: same seed, different verdict"


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_is_refused(name: str) -> None:
    with pytest.raises(TypeError):
        make_backdoor_defense(name, no_such_option=1)
