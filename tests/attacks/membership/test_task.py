"""MembershipTask narrowed to an attack's declared side information, and references that
return probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from privacylab.attacks.membership import AttackError, MembershipTask, make_attack, run_attack
from privacylab.target import Target, TargetError


def _task(references: list[nn.Module], **kw: object) -> MembershipTask:
    torch.manual_seed(0)
    keep = np.array([[True, False, True, False, True], [False, True, False, True, False]])
    return MembershipTask(
        torch.randn(3, 4), torch.tensor([0, 1, 2]), 3, torch.randn(2, 4), torch.tensor([1, 0]),
        references, keep, **kw,
    )  # fmt: skip


def test_restricted_to_drops_only_what_is_not_declared() -> None:
    refs = [nn.Linear(4, 3), nn.Linear(4, 3)]
    task = _task(refs)
    assert task.restricted_to(("population", "references")) is task
    bare = task.restricted_to(())
    assert bare.m == 0 and bare.references == [] and bare.keep is None and bare.n == 3
    no_population = task.restricted_to(("references",))
    assert no_population.m == 0 and no_population.keep.shape == (2, 3)
    no_refs = task.restricted_to(("population",))
    assert no_refs.m == 2 and no_refs.references == []
    with pytest.raises(AttackError, match="unknown side information labels"):
        task.restricted_to(("labels",))


def test_references_that_return_probabilities() -> None:
    torch.manual_seed(1)
    refs = [nn.Sequential(nn.Linear(4, 3), nn.Softmax(dim=1)) for _ in range(2)]
    truth = np.array([1, 0, 1])
    target = Target(nn.Linear(4, 3), "scores", 3)
    with pytest.raises(TargetError, match='outputs="probabilities"'):
        run_attack(make_attack("loss"), target, _task(refs), truth)
    task = _task(refs, references_return="probabilities")
    result = run_attack(make_attack("loss"), target, task, truth)
    assert np.isfinite(result.scores).all() and result.params["references"] == 2
