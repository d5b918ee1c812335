"""What a federated client runs and what the server observes: the protocol, public to both.

`LocalTraining` is the client's local procedure (McMahan et al. 2017, "Communication-Efficient
Learning of Deep Networks from Decentralized Data", Alg. 1): FedSGD sends the gradient of the
mean loss on its batch (one step, the setting of Zhu et al. 2019, Alg. 1); FedAvg runs `epochs`
passes of SGD over its data in local batches of `batch_size` rows with step `lr` and sends the
weight change w_0 - w_T (Geiping et al. 2020, Sec. 5, "multiple local updates").

`ObservedUpdate` is one message as the honest-but-curious server receives it: the round, whose
update it is (one client, or with secure aggregation all clients of the round, Bonawitz et al.
2017, of whom it sees only the example-weighted mean), the parameters it had sent, what came
back, how many examples are behind it, the local procedure and the update defence the clients
applied. It is what a `Target` at `updates` access carries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from privacylab.errors import PrivacylabError

__all__ = [
    "ALGORITHMS",
    "ClientDefense",
    "FederatedError",
    "LocalPrivacy",
    "LocalTraining",
    "ObservedUpdate",
    "check_defense",
    "check_secure_aggregation",
    "positive_number",
    "whole_number",
]

ALGORITHMS = ("fedsgd", "fedavg")

Algorithm = Literal["fedsgd", "fedavg"]


class FederatedError(PrivacylabError, ValueError):
    """A bad federated setting (clients, rounds, local training); one line."""


def whole_number(name: str, value: object, low: int = 1) -> int:
    """`value` as an int if it is a whole number >= `low` (not a bool), else FederatedError."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise FederatedError(f"{name} must be a whole number >= {low}, got {value!r}")
    return int(value)


def check_secure_aggregation(secure: object, clients: int) -> bool:
    """`secure` if it is a bool and, when True, `clients` (per round) >= 2: the sum of one
    client's update is that update, so secure aggregation (Bonawitz et al. 2017) over one
    client hides nothing; else FederatedError."""
    if not isinstance(secure, bool):
        raise FederatedError(f"secure_aggregation must be True or False, got {secure!r}")
    if secure and clients < 2:
        raise FederatedError(
            "secure aggregation needs >= 2 clients per round: the sum of one update is that update"
        )
    return secure


def positive_number(name: str, value: object) -> float:
    """`value` as a float if it is a finite number > 0 (not a bool), else FederatedError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float | np.integer | np.floating)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise FederatedError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class LocalTraining:
    """A client's local procedure. `algorithm`: "fedsgd" (one gradient of the mean
    cross-entropy over the client's batch is sent) or "fedavg" (`epochs` passes of plain SGD
    with step `lr` over the client's rows in order, in local batches of `batch_size` rows, the
    last one smaller; None: all rows in one batch; the change w_0 - w_T is sent)."""

    algorithm: Algorithm = "fedsgd"
    epochs: int = 1
    batch_size: int | None = None
    lr: float = 0.1

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise FederatedError(
                f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}"
            )
        object.__setattr__(self, "epochs", whole_number("local epochs", self.epochs))
        if self.batch_size is not None:
            object.__setattr__(
                self, "batch_size", whole_number("local batch_size", self.batch_size)
            )
        object.__setattr__(self, "lr", positive_number("local lr", self.lr))
        if self.algorithm == "fedsgd" and (self.epochs != 1 or self.batch_size is not None):
            raise FederatedError("fedsgd sends one gradient: epochs=1 and batch_size=None")

    def batches(self, n: int) -> list[tuple[int, int]]:
        """The (start, stop) rows of each local step on `n` rows, in order."""
        size = n if self.batch_size is None else min(self.batch_size, n)
        one_epoch = [(i, min(i + size, n)) for i in range(0, n, size)]
        return one_epoch * (1 if self.algorithm == "fedsgd" else self.epochs)

    def steps(self, n: int) -> int:
        """Local SGD steps a client with `n` rows takes."""
        return len(self.batches(n))

    @property
    def sends(self) -> str:
        """What the client sends: "gradient" (FedSGD) or "delta" (FedAvg: w_0 - w_T)."""
        return "gradient" if self.algorithm == "fedsgd" else "delta"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "algorithm": self.algorithm,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
        }


@dataclass(eq=False)
class ObservedUpdate:
    """One update as the server sees it.

    `round`: the federation round. `clients`: whose update it is (one id, or every client of
    the round when `aggregated`). `state`: the parameters the server sent (name -> tensor, the
    model's `named_parameters` names). `update`: what came back, same names (the gradient for
    FedSGD, w_0 - w_T for FedAvg; with secure aggregation the example-weighted mean over
    `clients`). `num_examples`: rows behind it (the sum when aggregated; FedAvg weights by it,
    so the server knows it). `training`: the local procedure. `defense`: the update defence
    the clients applied (its spec, or None)."""

    round: int
    clients: tuple[int, ...]
    state: dict[str, Tensor]
    update: dict[str, Tensor]
    num_examples: int
    training: LocalTraining = field(default_factory=LocalTraining)
    aggregated: bool = False
    defense: str | None = None

    def __post_init__(self) -> None:
        if set(self.state) != set(self.update):
            missing = sorted(set(self.state) ^ set(self.update))
            raise FederatedError(f"update and state name different parameters: {missing[:3]}")
        for name, value in self.update.items():
            if tuple(value.shape) != tuple(self.state[name].shape):
                raise FederatedError(
                    f"update {name!r} has shape {tuple(value.shape)}, "
                    f"the parameter {tuple(self.state[name].shape)}"
                )
        self.num_examples = whole_number("an update's num_examples", self.num_examples)


@dataclass(frozen=True)
class LocalPrivacy:
    """DP-SGD inside a client's local training (Abadi et al. 2016, Alg. 1): each example's
    gradient is clipped to L2 norm `clip`, the clipped gradients are summed, Gaussian noise of
    standard deviation `noise_multiplier * clip` is added to each coordinate, and the sum is
    divided by the local batch size."""

    clip: float
    noise_multiplier: float

    def __post_init__(self) -> None:
        for name in ("clip", "noise_multiplier"):
            object.__setattr__(self, name, positive_number(name, getattr(self, name)))


@runtime_checkable
class ClientDefense(Protocol):
    """What a federated client applies to its update (implemented in
    `privacylab.defenses.update`): `local_privacy` turns its local training into DP-SGD
    (None: unchanged); `apply` transforms the update before it is sent (noise, pruning,
    quantisation; identity for DP-SGD). `spec` is its CLI spelling (`noise:1e-2`)."""

    @property
    def spec(self) -> str: ...

    def local_privacy(
        self, *, training: LocalTraining, examples: int, rounds: int
    ) -> LocalPrivacy | None: ...

    def apply(self, update: dict[str, Tensor], generator: torch.Generator) -> dict[str, Tensor]: ...


def check_defense(defense: object) -> ClientDefense | None:
    """`defense` if it is None or a `ClientDefense`, else FederatedError (one line)."""
    if defense is not None and not isinstance(defense, ClientDefense):
        raise FederatedError(
            "defense must be a client defence (privacylab.defenses.update."
            f"parse_update_defense), got {type(defense).__name__}"
        )
    return defense
