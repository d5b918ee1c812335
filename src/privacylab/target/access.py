"""Access levels of the threat model: what an attacker may ask of a deployed model."""

from __future__ import annotations

from enum import Enum

from privacylab.errors import PrivacylabError


class Access(str, Enum):
    """What a query returns, from least to most: the predicted label; the probability vector
    (softmax scores); the logits; the model itself (white-box: weights, gradients); the model
    and the updates its clients send back (`updates`: the honest-but-curious federated server
    of Zhu et al. 2019 and Geiping et al. 2020, who sent the model and observes each client's
    gradient or weight change, or with secure aggregation only their sum)."""

    LABEL = "label"
    SCORES = "scores"
    LOGITS = "logits"
    WHITEBOX = "white-box"
    UPDATES = "updates"

    @property
    def rank(self) -> int:
        """Position in the order label < scores < logits < white-box < updates."""
        return list(Access).index(self)

    def allows(self, needed: Access) -> bool:
        """Whether an attacker with this access may do what needs `needed`."""
        return self.rank >= Access(needed).rank

    @classmethod
    def parse(cls, value: str | Access) -> Access:
        """`value` as an Access, or AccessError naming the choices."""
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(a.value for a in cls)
            raise AccessError(f"unknown access level {value!r}; choose one of {choices}") from None


class AccessError(PrivacylabError, PermissionError):
    """An attack asked for more than its declared access, or for an unknown level."""


class QueryBudgetError(PrivacylabError, RuntimeError):
    """The attacker asked more queries than the target's budget allows."""


class TargetError(PrivacylabError, ValueError):
    """The model behind a target returned what its declaration does not allow (wrong shape,
    NaN, probabilities declared as logits or the reverse)."""
