"""Federated learning, simulated: clients that train locally (FedSGD, FedAvg), an
honest-but-curious server that observes each update (or, with secure aggregation, only their
sum), and the update defences clients may apply. What the server observes is the `updates`
access of the threat model (`privacylab.target`)."""

from privacylab.federated.local import cross_entropy, local_update, module_names, training_mode
from privacylab.federated.protocol import (
    ALGORITHMS,
    ClientDefense,
    FederatedError,
    LocalPrivacy,
    LocalTraining,
    ObservedUpdate,
)

__all__ = [
    "ALGORITHMS",
    "ClientDefense",
    "FederatedError",
    "LocalPrivacy",
    "LocalTraining",
    "ObservedUpdate",
    "cross_entropy",
    "local_update",
    "module_names",
    "training_mode",
]
