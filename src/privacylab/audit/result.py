"""The one result type of every privacy audit."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class AuditResult:
    """An empirical lower bound on ε next to the accountant's upper bound for the same run.

    `epsilon_lower_bound` holds with probability `confidence` over the audit's randomness (the
    method says how); `epsilon_theory` is the certified ε of the audited training at `delta`,
    from `accountant`. `counts` are the raw numbers behind the bound (e.g. true/false positives
    per dataset, guesses and correct guesses) and `trials` how many training runs were used.
    """

    method: str
    epsilon_theory: float
    delta: float
    accountant: str
    epsilon_lower_bound: float
    confidence: float
    trials: int
    counts: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def violated(self) -> bool:
        """Whether the audit refutes the claimed guarantee (a bug in the DP implementation or
        its accounting): the lower bound exceeds the certified ε."""
        return self.epsilon_lower_bound > self.epsilon_theory

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (non-finite floats become None)."""
        out = asdict(self)
        out["violated"] = self.violated
        for key, value in out.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
        return out
