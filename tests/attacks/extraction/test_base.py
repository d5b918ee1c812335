"""The extraction family's base: what the thief is given, how a run is counted and scored."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
import torch
from torch import nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.extraction import (
    EXTRACTION_ATTACKS,
    ExtractionAttack,
    ExtractionError,
    ExtractionTask,
    Stolen,
    Truth,
    layers_module,
    relu_layers,
    run_extraction,
)
from privacylab.target import Access, AccessError, Target


class _Constant(nn.Module):
    def __init__(self, label: int, classes: int) -> None:
        super().__init__()
        self.label, self.classes = label, classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(x), self.classes)
        out[:, self.label] = 1.0
        return out


class _MajorityThief(ExtractionAttack):
    """Asks the victim's labels on the pool and predicts their majority; snapshots after
    each half."""

    name = "majority-test"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.LABEL, ("pool",))
    seen: ClassVar[list[ExtractionTask]] = []

    def steal(self, target: Target, task: ExtractionTask) -> Stolen:
        type(self).seen.append(task)
        pool = task.require_pool(self.name)
        half = len(pool) // 2
        first = target.labels(pool[:half])
        snap = _Constant(int(first.mode().values), task.num_classes)
        labels = torch.cat([first, target.labels(pool[half:])])
        final = _Constant(int(labels.mode().values), task.num_classes)
        return Stolen(final, snapshots=[(half, snap), (len(pool), final)], params={"n": len(pool)})


def _victim() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


def _task(**kw) -> ExtractionTask:
    g = torch.Generator().manual_seed(1)
    defaults = dict(input_shape=(4,), num_classes=3, pool=torch.rand(40, 4, generator=g))
    return ExtractionTask(**{**defaults, **kw})


def test_runner_counts_queries_and_scores_against_the_victim() -> None:
    victim = _victim()
    x = torch.rand(200, 4, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 3, (200,), generator=torch.Generator().manual_seed(3))
    target = Target(victim, "scores", 3)
    result = run_extraction(_MajorityThief(), target, _task(), Truth(victim, x, y))
    victim_labels = victim(x).argmax(1)
    stolen_label = int(victim(_task().pool).argmax(1).mode().values)
    assert result.queries == 40 == target.queries
    assert result.access == "label"
    assert result.fidelity == pytest.approx(float((victim_labels == stolen_label).double().mean()))
    assert result.accuracy == pytest.approx(float((y == stolen_label).double().mean()))
    assert result.victim_accuracy == pytest.approx(float((victim_labels == y).double().mean()))
    assert [p.queries for p in result.curve] == [20, 40]
    assert result.stolen is not None and "stolen" not in result.to_dict()
    assert result.to_dict()["curve"][1]["fidelity"] == result.fidelity
    assert {"method", "queries", "accuracy", "fidelity", "victim_accuracy"} <= set(result.to_dict())


def test_the_thief_gets_only_its_declared_side_information() -> None:
    from privacylab.models import ModelSpec

    _MajorityThief.seen.clear()
    spec = ModelSpec("mlp", (4,), 3, {"widths": [6]})
    victim = _victim()
    truth = Truth(victim, torch.rand(5, 4), torch.zeros(5, dtype=torch.int64))
    run_extraction(_MajorityThief(), Target(victim, "scores", 3), _task(architecture=spec), truth)
    assert _MajorityThief.seen[-1].architecture is None
    assert _MajorityThief.seen[-1].pool is not None
    with pytest.raises(ExtractionError, match="unknown side information"):
        _task().restricted_to(["weights"])


def test_label_attack_cannot_widen_and_scores_attack_needs_scores() -> None:
    class _Scores(_MajorityThief):
        threat_model: ClassVar[ThreatModel] = ThreatModel(Access.SCORES, ("pool",))

    victim = _victim()
    truth = Truth(victim, torch.rand(5, 4), torch.zeros(5, dtype=torch.int64))
    with pytest.raises(AccessError, match="needs scores"):
        run_extraction(_Scores(), Target(victim, "label", 3), _task(), truth)


def test_float64_attacks_refuse_a_float32_target() -> None:
    class _Exact(_MajorityThief):
        needs_float64 = True

    victim = _victim()
    truth = Truth(victim, torch.rand(5, 4), torch.zeros(5, dtype=torch.int64))
    with pytest.raises(ExtractionError, match="float64"):
        run_extraction(_Exact(), Target(victim, "scores", 3), _task(), truth)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"budget": 0}, "budget"),
        ({"budget": True}, "budget"),
        ({"bounds": (1.0, 0.0)}, "bounds"),
        ({"bounds": (0.0, float("nan"))}, "bounds"),
        ({"pool": torch.zeros(3, 5)}, "shape"),
        ({"pool_kind": "stolen"}, "pool_kind"),
    ],
)
def test_bad_tasks_are_one_line(kw: dict, match: str) -> None:
    with pytest.raises(ExtractionError, match=match):
        _task(**kw)


def test_checkpoints_are_clipped_to_the_budget_and_default_to_it() -> None:
    assert _task(budget=100, checkpoints=(50, 10, 500, 10)).checkpoints == (10, 50)
    assert _task(budget=100).checkpoints == (100,)


def test_no_pool_is_one_line() -> None:
    with pytest.raises(ExtractionError, match="needs data the attacker owns"):
        _task(pool=None).require_pool("copycat")


def test_relu_layers_round_trip_through_layers_module() -> None:
    victim = _victim()
    layers = relu_layers(victim)
    assert [w.shape for w, _ in layers] == [(6, 4), (3, 6)]
    assert all(w.dtype == np.float64 for w, _ in layers)
    rebuilt = layers_module(layers)
    x = torch.rand(9, 4, dtype=torch.float64)
    assert torch.allclose(rebuilt(x), victim.double()(x))


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (
            nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)),
            "'2' \\(Tanh\\)",
        ),
        (nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten()), "Conv2d"),
        (nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.ReLU()), "ending in a Linear"),
        (nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 3)), "'1' \\(Linear\\)"),
    ],
)
def test_relu_layers_refuses_other_networks_naming_the_layer(model: nn.Module, match: str) -> None:
    with pytest.raises(ExtractionError, match=match):
        relu_layers(model)


def test_registry_names_are_normalised_and_unknown_names_are_one_line() -> None:
    with pytest.raises(ExtractionError, match="unknown extraction method"):
        EXTRACTION_ATTACKS.get("no-such-thief")


def test_one_output_models_are_labelled_by_the_sign_of_their_logit() -> None:
    from privacylab.attacks.extraction import predicted_labels

    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -1.0]]))
        model.bias.zero_()
    x = torch.tensor([[2.0, 1.0], [1.0, 2.0], [0.0, 3.0]])
    assert predicted_labels(model, x).tolist() == [1, 0, 0]
