"""Issue 10 §2: boundary-cw showed 0 queries. White-box forward passes through `Target.model`
are counted (one query per example per pass) and match C&W's own per-example count."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from privacylab.attacks.membership import MembershipTask, make_attack, run_attack
from privacylab.attacks.membership.boundary import carlini_wagner_l2
from privacylab.target import Target


def test_carlini_wagner_counts_its_forward_passes() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    x, y = torch.rand(10, 6), torch.randint(0, 3, (10,))
    target = Target(model, "white-box", 3)
    points = carlini_wagner_l2(target.model, x, y, steps=4, search_steps=2, batch_size=4)
    assert points.queries.tolist() == [10, 9, 9, 9, 10, 9, 9, 9, 10, 9]
    assert target.queries == points.queries.sum()

    task = MembershipTask(x, y, 3)
    truth = np.r_[np.ones(5), np.zeros(5)]
    attack = make_attack("boundary-cw", steps=4, search_steps=2)
    result = run_attack(attack, target, task, truth)
    assert result.queries == 10 * (1 + 2 * 4) + 1
    assert target.queries == points.queries.sum() + result.queries
