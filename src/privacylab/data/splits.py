"""Seeded, disjoint index splits for membership inference experiments.

The target model is trained on `target_members`; `target_nonmembers` come from the same
distribution but are never trained on; `population` is what the attacker may use to train shadow
models (Shokri et al. 2017) or reference models (Carlini et al. 2022, "Membership Inference
Attacks From First Principles"). All three are drawn from one seeded permutation of 0..n-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privacylab.data.errors import DataError


@dataclass(frozen=True, eq=False)
class MembershipSplit:
    """Disjoint int64 index arrays into one dataset of size `n`, drawn under `seed`."""

    target_members: np.ndarray
    target_nonmembers: np.ndarray
    population: np.ndarray
    n: int
    seed: int

    def target_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """Members then non-members, with membership labels (1 member, 0 non-member)."""
        indices = np.concatenate([self.target_members, self.target_nonmembers])
        labels = np.concatenate(
            [
                np.ones(len(self.target_members), np.int64),
                np.zeros(len(self.target_nonmembers), np.int64),
            ]
        )
        return indices, labels


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DataError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise DataError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def membership_split(
    n: int,
    *,
    target_size: int,
    population_size: int | None = None,
    seed: int,
    nonmember_size: int | None = None,
) -> MembershipSplit:
    """Split indices 0..n-1 into target members, target non-members and an attacker population.

    `nonmember_size` defaults to `target_size` (a balanced membership game); `population_size`
    defaults to every remaining index. The same arguments give the same arrays on every machine
    (numpy's PCG64 generator).
    """
    n = _count("n", n, 1)
    target_size = _count("target_size", target_size, 1)
    seed = _count("seed", seed, 0)
    nonmembers = (
        target_size if nonmember_size is None else _count("nonmember_size", nonmember_size, 0)
    )
    rest = n - target_size - nonmembers
    if rest < 0:
        raise DataError(f"{target_size} members + {nonmembers} non-members exceed the {n} examples")
    population = rest if population_size is None else _count("population_size", population_size, 0)
    if population > rest:
        raise DataError(
            f"population_size {population} exceeds the {rest} examples left after "
            f"{target_size} members and {nonmembers} non-members"
        )
    order = np.random.default_rng(seed).permutation(n).astype(np.int64)
    cut_members, cut_nonmembers = target_size, target_size + nonmembers
    return MembershipSplit(
        target_members=order[:cut_members],
        target_nonmembers=order[cut_members:cut_nonmembers],
        population=order[cut_nonmembers : cut_nonmembers + population],
        n=n,
        seed=seed,
    )


def balanced_subsample(membership: np.ndarray, per_side: int, seed: int) -> np.ndarray:
    """Sorted positions of at most `per_side` members (1) and `per_side` non-members (0) of
    `membership`, each side drawn by a seeded permutation (for attacks too costly to run on
    every candidate)."""
    rng = np.random.default_rng(seed)
    picks = [rng.permutation(np.flatnonzero(membership == side))[:per_side] for side in (1, 0)]
    return np.sort(np.concatenate(picks))
