"""Membership splits: disjoint, the asked sizes, deterministic for a seed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.data import DataError, membership_split


@st.composite
def split_arguments(draw: st.DrawFn) -> dict:
    n = draw(st.integers(2, 2000))
    target = draw(st.integers(1, n // 2))
    nonmembers = draw(st.one_of(st.none(), st.integers(0, n - target)))
    rest = n - target - (target if nonmembers is None else nonmembers)
    population = draw(st.one_of(st.none(), st.integers(0, rest)))
    seed = draw(st.integers(0, 2**32))
    return {
        "n": n,
        "target_size": target,
        "nonmember_size": nonmembers,
        "population_size": population,
        "seed": seed,
    }


@settings(max_examples=60, deadline=None)
@given(split_arguments())
def test_disjoint_sized_and_deterministic(args: dict) -> None:
    split = membership_split(**args)
    again = membership_split(**args)
    n, target = args["n"], args["target_size"]
    nonmembers = target if args["nonmember_size"] is None else args["nonmember_size"]
    population = n - target - nonmembers
    if args["population_size"] is not None:
        population = args["population_size"]
    parts = (split.target_members, split.target_nonmembers, split.population)
    assert [len(p) for p in parts] == [target, nonmembers, population]
    joined = np.concatenate(parts)
    assert joined.dtype == np.int64
    assert len(np.unique(joined)) == len(joined)
    assert joined.min(initial=0) >= 0 and joined.max(initial=0) < n
    for mine, other in zip(
        parts, (again.target_members, again.target_nonmembers, again.population), strict=True
    ):
        assert np.array_equal(mine, other)


def test_seed_changes_the_split() -> None:
    a = membership_split(1000, target_size=100, seed=0)
    b = membership_split(1000, target_size=100, seed=1)
    assert not np.array_equal(a.target_members, b.target_members)


def test_fixed_values_are_stable_across_machines() -> None:
    split = membership_split(10, target_size=2, population_size=3, seed=0)
    assert np.array_equal(
        np.concatenate([split.target_members, split.target_nonmembers, split.population]),
        np.random.default_rng(0).permutation(10)[:7],
    )


def test_target_indices_labels() -> None:
    split = membership_split(20, target_size=5, nonmember_size=3, seed=2)
    indices, labels = split.target_indices()
    assert len(indices) == 8 and labels.tolist() == [1] * 5 + [0] * 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 10, "target_size": 6, "seed": 0},
        {"n": 10, "target_size": 3, "population_size": 5, "seed": 0},
        {"n": 10, "target_size": 0, "seed": 0},
        {"n": 10, "target_size": 2, "seed": -1},
        {"n": 10, "target_size": 2.5, "seed": 0},
        {"n": 10, "target_size": True, "seed": 0},
    ],
)
def test_bad_sizes_raise(kwargs: dict) -> None:
    with pytest.raises(DataError):
        membership_split(**kwargs)
