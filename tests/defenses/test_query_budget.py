"""The per-client query budget: answers up to n, refuses past it with the target's own
QueryBudgetError (on which attacks stop), reports when the client ran into it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privacylab.attacks.extraction import ExtractionTask, make_extraction
from privacylab.defenses import DefenseError, parse_defense
from privacylab.target import QueryBudgetError, Target


def _target() -> Target:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(6, 3)).eval()
    return Target(model, "scores", 3, precision="float64")


def test_answers_up_to_n_then_refuses() -> None:
    watch = parse_defense("budget:10")
    target = watch.defend(_target())
    target.probabilities(torch.rand(4, 6))
    assert watch.verdict() == {
        "detected": False, "queries_until_detection": None, "queries": 4, "refused": 0,
        "budget": 10,
    }  # fmt: skip
    with pytest.raises(QueryBudgetError, match="budget of 10") as caught:
        target.probabilities(torch.rand(7, 6))
    assert "\n" not in str(caught.value)
    target.labels(torch.rand(6, 6))
    verdict = watch.verdict()
    assert verdict["detected"] and verdict["queries_until_detection"] == 10
    assert verdict["queries"] == 10 == target.queries and verdict["refused"] == 7
    with pytest.raises(QueryBudgetError):
        target.labels(torch.rand(1, 6))


def test_spending_exactly_n_counts_as_detected() -> None:
    watch = parse_defense("budget:n=5")
    watch.defend(_target()).labels(torch.rand(5, 6))
    assert watch.verdict()["detected"] and watch.verdict()["refused"] == 0


def test_each_client_has_its_own_budget() -> None:
    shared = _target()
    first = parse_defense("budget:5")
    second = first.fresh()
    first.defend(shared).labels(torch.rand(5, 6))
    second.defend(shared).labels(torch.rand(5, 6))
    assert shared.queries == 10
    assert first.verdict()["queries"] == second.verdict()["queries"] == 5


def test_an_attack_stops_cleanly_at_the_budget() -> None:
    watch = parse_defense("budget:5")
    target = watch.defend(_target())
    stolen = make_extraction("equation").steal(target, ExtractionTask((6,), 3))
    assert stolen.stopped == "budget" and target.queries == 5
    assert watch.verdict()["detected"] and watch.verdict()["refused"] > 0


@pytest.mark.parametrize("spec", ["budget:0", "budget:-3", "budget:1.5", "budget:many"])
def test_bad_budget_one_line(spec: str) -> None:
    with pytest.raises(DefenseError, match="budget: n must be") as caught:
        parse_defense(spec)
    assert "\n" not in str(caught.value)
