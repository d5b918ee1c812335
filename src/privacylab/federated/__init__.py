"""Federated learning, simulated: clients that train locally (FedSGD, FedAvg), an
honest-but-curious server that observes each update (or, with secure aggregation, only their
sum), and the update defences clients may apply. What the server observes is the `updates`
access of the threat model (`privacylab.target`)."""

from privacylab.federated.clients import ClientResult, ClientTask, observe, run_client
from privacylab.federated.local import cross_entropy, local_update, module_names, training_mode
from privacylab.federated.protocol import (
    ALGORITHMS,
    ClientDefense,
    FederatedError,
    LocalPrivacy,
    LocalTraining,
    ObservedUpdate,
)
from privacylab.federated.server import (
    Federation,
    FederationConfig,
    FederationResult,
    RoundRecord,
)

__all__ = [
    "ALGORITHMS",
    "ClientDefense",
    "ClientResult",
    "ClientTask",
    "FederatedError",
    "Federation",
    "FederationConfig",
    "FederationResult",
    "LocalPrivacy",
    "LocalTraining",
    "ObservedUpdate",
    "RoundRecord",
    "cross_entropy",
    "local_update",
    "module_names",
    "observe",
    "run_client",
    "training_mode",
]
