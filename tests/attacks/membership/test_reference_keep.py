"""The public reference assignment: every example IN for half of the references, OUT for the
rest, so offline attacks work on hand-built references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from privacylab.attacks.membership import (
    AttackError,
    MembershipTask,
    make_attack,
    reference_keep,
    run_attack,
)
from privacylab.target import Target


@given(
    count=st.integers(2, 40),
    universe=st.integers(1, 60),
    share=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**31),
)
def test_every_example_has_in_and_out_references(count, universe, share, seed):
    train_size = max(1, min(universe, round(share * universe)))
    keep = reference_keep(count, universe, train_size, seed)
    assert keep.shape == (count, universe)
    inside = keep.sum(0)
    assert (inside == inside[0]).all()  # the same number of IN models for every example
    assert 1 <= inside[0] <= count - 1  # never all IN or all OUT


def _linear(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


def test_offline_lira_on_hand_built_references_names_the_helper():
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    refs = [_linear(s) for s in range(4)]
    membership = np.r_[np.ones(5, int), np.zeros(5, int)]
    target = Target(_linear(9), "scores", 3)
    everything_in = np.ones((4, 10), bool)
    with pytest.raises(AttackError, match="reference_keep"):
        run_attack(
            make_attack("lira-offline"),
            target,
            MembershipTask(x, y, 3, None, None, refs, everything_in),
            membership,
        )
    balanced = MembershipTask(x, y, 3, None, None, refs, reference_keep(4, 10, 5, seed=0))
    result = run_attack(make_attack("lira-offline"), target, balanced, membership)
    assert np.isfinite(result.scores).all() and result.scores.shape == (10,)
