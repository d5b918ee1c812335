"""The one result type of every membership inference attack."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privacylab.errors import PrivacylabError


class AttackError(PrivacylabError, ValueError):
    """An attack was misconfigured or given bad input; the message is one line for the user."""


@dataclass(eq=False)
class MembershipResult:
    """Per-example membership scores of one attack on one target.

    `scores[i]` is higher when the attack believes example i was a training member;
    `membership[i]` is the truth (1 member, 0 non-member). `predictions`, when the attack chose
    a threshold on data other than the evaluated examples (shadow/reference data), holds its
    hard decisions. `queries` counts the examples sent to the target; `access` is the level the
    attack declared; `params` records its configuration.
    """

    attack: str
    scores: np.ndarray
    membership: np.ndarray
    access: str
    queries: int
    seconds: float = 0.0
    predictions: np.ndarray | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores = np.asarray(self.scores, dtype=np.float64).reshape(-1)
        self.membership = np.asarray(self.membership).astype(np.int64).reshape(-1)
        if self.scores.shape != self.membership.shape:
            raise AttackError(
                f"{self.attack}: {self.scores.size} scores but {self.membership.size} labels"
            )
        if not np.isin(self.membership, (0, 1)).all():
            raise AttackError(f"{self.attack}: membership labels must be 0 or 1")
        if np.isnan(self.scores).any():
            raise AttackError(f"{self.attack}: scores contain NaN")
        if self.predictions is not None:
            self.predictions = np.asarray(self.predictions).astype(np.int64).reshape(-1)
            if self.predictions.shape != self.scores.shape:
                raise AttackError(f"{self.attack}: predictions and scores differ in length")

    def to_dict(self, *, with_scores: bool = False) -> dict[str, Any]:
        """JSON-ready summary; per-example arrays only with `with_scores`."""
        out: dict[str, Any] = {
            "attack": self.attack,
            "access": self.access,
            "queries": int(self.queries),
            "seconds": float(self.seconds),
            "examples": int(self.scores.size),
            "members": int(self.membership.sum()),
            "params": self.params,
        }
        if with_scores:
            out["scores"] = self.scores.tolist()
            out["membership"] = self.membership.tolist()
        return out
