"""The contract every registered backdoor defence keeps (after scikit-learn's
`parametrize_with_checks`): it runs over `backdoor_defense_names()`, so a defence added in a new
file of `privacylab.defenses.backdoor` is checked with no edit here.

On a tiny backdoored model (a small MLP on sklearn's 8x8 digits, a 3x3 white corner trigger
on 40 rows relabelled 0) each defence must: declare a name, a paper and what it needs (a
subset of EVIDENCE); refuse evidence missing any need in one BackdoorDefenseError line; return
a Detection of its own name whose `to_dict` survives `json.dumps`; leave the user's model
(state_dict and training mode) unchanged; give the same verdict for the same seed; and, when
it repairs with a model, return a model other than the user's. The shared pieces are checked
by hand: `layer_activations` against the layer's own forward (and the input of the last Linear
for a model with nothing before it), `evaluate_mitigation` against counts on six rows.
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
from torch import nn

from _backdoor_digits import digits, fit, poisoned
from privacylab.data import Dataset
from privacylab.defenses.backdoor import (
    BACKDOOR_DEFENSES,
    EVIDENCE,
    BackdoorDefenseError,
    BackdoorEvidence,
    Detection,
    Mitigation,
    backdoor_defense_names,
    evaluate_mitigation,
    feature_layer,
    layer_activations,
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
    return fit(_net, x, y, steps=steps, lr=0.02, seed=seed)


@pytest.fixture(scope="module")
def case() -> Iterator[Case]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    x, y = digits()
    order = np.random.default_rng(0).permutation(len(y))
    train, clean = order[:600], order[600:800]
    features, labels, _ = poisoned(x[train], y[train], 40)
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


# ------------------------------------------------ what every defence shares: activations, metrics


def test_layer_activations_read_the_whole_layer_and_leave_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    conv = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 8 * 8, 10)
    )
    x = torch.rand(7, 1, 8, 8)
    conv.train()
    read = layer_activations(conv, x, "0", batch=3)
    with torch.no_grad():
        by_hand = conv[0](x).flatten(1)  # type: ignore[index]
    assert read.shape == (7, 3 * 8 * 8) and torch.allclose(read, by_hand)
    assert feature_layer(conv) == "2"
    assert torch.allclose(layer_activations(conv, x), torch.relu(by_hand))
    assert conv.training and not conv[0]._forward_hooks  # type: ignore[index]

    z = torch.randn(5, 4)
    for model in (nn.Linear(4, 3), nn.Sequential(nn.Linear(4, 3))):
        assert feature_layer(model) == ""
        assert torch.equal(layer_activations(model, z), z), "the input of the last Linear"
        assert not any(m._forward_pre_hooks for m in model.modules())
    with pytest.raises(BackdoorDefenseError, match="no layer named 'nine'"):
        layer_activations(conv, x, "nine")
    with pytest.raises(BackdoorDefenseError, match=r"no nn\.Linear"):
        feature_layer(nn.Sequential(nn.Flatten()))


def test_evaluate_mitigation_against_hand_counts() -> None:
    """A parameter-free model whose label is the argmax of its input: clean rows 0..5 with
    labels [0, 1, 2, 0, 1, 2] predicted [0, 1, 0, 0, 1, 2]; triggered copies predicted
    [0, 0, 0, 1, 1, 0] with target 0; the filter refuses rows whose 4th feature is set
    (clean row 5, triggered rows 1 and 2). ASR counts the 4 non-target rows (1, 2, 4, 5): 3
    reach the target unfiltered, 1 (row 5) once rows 1 and 2 are refused."""
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    eye = torch.eye(4)
    clean_x = eye[[0, 1, 0, 0, 1, 2]].clone()
    clean_x[5, 3] = 0.5
    bad_x = eye[[0, 0, 0, 1, 1, 0]].clone()
    bad_x[[1, 2], 3] = 0.5
    test = Dataset("hand", clean_x, labels, 3, (4,), "tabular")
    model = nn.Flatten()
    model.train()
    wanted = np.zeros(6, dtype=np.int64)

    def reject(x: torch.Tensor) -> np.ndarray:
        return (x[:, 3] > 0).numpy()

    plain = evaluate_mitigation(None, model, test, bad_x, wanted)
    assert plain["accuracy"] == pytest.approx(5 / 6)
    assert plain["asr"] == pytest.approx(3 / 4) == plain["asr_unfiltered"]
    assert plain["rejected_clean"] == 0 and plain["rejected_triggered"] == 0
    filtered = evaluate_mitigation(Mitigation(reject=reject), model, test, bad_x, wanted)
    assert filtered["accuracy"] == pytest.approx(4 / 6)
    assert filtered["asr"] == pytest.approx(1 / 4)
    assert filtered["asr_unfiltered"] == pytest.approx(3 / 4)
    assert filtered["rejected_clean"] == pytest.approx(1 / 6)
    assert filtered["rejected_triggered"] == pytest.approx(2 / 4)
    assert model.training, "evaluate_mitigation left the model in eval mode"
