"""`updates` access: the federated server's view (the model it sent plus what came back) sits
above white-box; narrower views hide the updates; an output defence cannot defend it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privacylab.federated import LocalTraining, ObservedUpdate, local_update
from privacylab.target import Access, AccessError, Target


def _update(model: nn.Module) -> ObservedUpdate:
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.rand(2, 4), torch.tensor([0, 1])
    return ObservedUpdate(0, (0,), state, local_update(model, state, x, y, LocalTraining()), 2)


def test_updates_is_the_widest_access() -> None:
    assert [a.value for a in Access][-1] == "updates"
    assert Access.UPDATES.allows(Access.WHITEBOX)
    assert not Access.WHITEBOX.allows(Access.UPDATES)


def test_updates_are_read_only_at_updates_access_and_cost_no_queries() -> None:
    model = nn.Linear(4, 2)
    target = Target(model, "updates", 2, updates=[_update(model)])
    assert len(target.updates) == 1 and target.queries == 0
    for narrower in ("white-box", "logits", "scores", "label"):
        with pytest.raises(AccessError, match="needs updates access"):
            _ = target.with_access(narrower).updates
    target.model(torch.rand(3, 4))
    assert target.queries == 3


def test_updates_need_an_updates_target() -> None:
    model = nn.Linear(4, 2)
    with pytest.raises(AccessError, match="updates access"):
        Target(model, "white-box", 2, updates=[_update(model)])


def test_an_output_defence_cannot_defend_an_updates_target() -> None:
    target = Target(nn.Linear(4, 2), "updates", 2)
    with pytest.raises(AccessError, match="white-box"):
        target.with_output_defense(lambda p: p, "scores")
