"""The contract every registered membership attack keeps (after scikit-learn's
`parametrize_with_checks`): it runs over `attack_names()`, so an attack added in a new file of
`privacylab.attacks.membership` is checked with no edit here.

On a tiny 8x8 digits game (a small MLP target, four references, 24 candidates a side) each
attack must: declare a threat model; refuse a target with less access (AccessError); return
one finite score per candidate; give the same scores for the same seed, and the same scores
whatever the truth is (it never sees membership); count its queries (> 0: every attack here
queries the target), and the view's queries show in the target's count.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.membership import (
    MembershipTask,
    attack_class,
    attack_names,
    make_attack,
    run_attack,
)
from privacylab.attacks.membership.base import SIDE_INFORMATION
from privacylab.attacks.membership.references import reference_keep
from privacylab.target import Access, AccessError, Target

CHEAP: dict[str, dict[str, Any]] = {
    "boundary": {"max_queries": 60, "iterations": 2, "init_evals": 8},
    "boundary-cw": {"steps": 5, "search_steps": 2},
    "noise": {"n_samples": 4},
    "shadow": {"max_iter": 30},
    "rmia": {"population": 60},
}
"""Light settings for the expensive attacks (the contract, not the attack's strength, is
tested); attacks not listed run with their defaults."""

SIDE = 24


@dataclass
class Game:
    target: nn.Module
    task: MembershipTask
    membership: np.ndarray


def _net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def _train(x: torch.Tensor, y: torch.Tensor, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = _net()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(150):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def game() -> Iterator[Game]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = np.random.default_rng(0).permutation(len(y))
    members, others = order[:SIDE], order[SIDE : 2 * SIDE]
    population = order[2 * SIDE : 2 * SIDE + 80]
    candidates = np.r_[members, others]
    universe = np.r_[candidates, population]
    keep = reference_keep(4, universe.size, universe.size // 2, seed=1)
    references = [_train(x[universe[keep[j]]], y[universe[keep[j]]], seed=10 + j) for j in range(4)]
    task = MembershipTask(
        x[candidates], y[candidates], 10, x[population], y[population], references, keep
    )
    target = _train(x[members], y[members], seed=0)
    yield Game(target, task, np.r_[np.ones(SIDE), np.zeros(SIDE)].astype(np.int64))
    torch.set_num_threads(before)


def _fresh(task: MembershipTask) -> MembershipTask:
    """The same knowledge in a new task object (no shared output cache)."""
    return task.subset(np.arange(task.n))


@pytest.mark.parametrize("name", attack_names())
def test_attack_keeps_the_contract(name: str, game: Game) -> None:
    cls = attack_class(name)
    threat = cls.threat_model
    assert isinstance(threat, ThreatModel), f"{name} declares no ThreatModel"
    assert cls.access is threat.access
    assert set(threat.side_information) <= set(SIDE_INFORMATION)
    options = CHEAP.get(name, {})

    if threat.access.rank > 0:
        lower = list(Access)[threat.access.rank - 1]
        with pytest.raises(AccessError):
            run_attack(
                make_attack(name, **options),
                Target(game.target, lower, 10),
                game.task,
                game.membership,
            )

    target = Target(game.target, threat.access, 10)
    first = run_attack(make_attack(name, **options), target, _fresh(game.task), game.membership)
    assert first.scores.shape == (game.task.n,)
    assert np.isfinite(first.scores).all(), f"{name} returned non-finite scores"
    assert first.queries > 0, f"{name} reported no queries"
    assert target.queries == first.queries, "the view's queries must show in the target's"

    flipped = 1 - game.membership
    again = run_attack(
        make_attack(name, **options),
        Target(game.target, threat.access, 10),
        _fresh(game.task),
        flipped,
    )
    np.testing.assert_array_equal(first.scores, again.scores)  # same seed, and truth unseen
    assert first.queries == again.queries


def test_the_contract_covers_the_whole_suite() -> None:
    assert len(attack_names()) >= 13
