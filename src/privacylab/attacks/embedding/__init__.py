"""Attacks on released text embeddings (Du et al. 2023, "DP-Forward", Sec. 6): embedding
inversion — token-wise nearest neighbour (`inversion-nn`) and the gradient-based continuous
relaxation (`inversion-opt`) — and sensitive-attribute inference (`attribute`). Each declares
its threat model; one registry (`EMBEDDING_ATTACKS`) holds both kinds.

Every module of this package is imported on import (`discover`), so an attack registered with
`@register_embedding` in a new file joins `embedding_names()` with no other edit.
"""

from privacylab.attacks.embedding.base import (
    EMBEDDING_ATTACKS,
    KINDS,
    SIDE_INFORMATION,
    AttributeOutput,
    AttributeResult,
    EmbeddingAttack,
    EmbeddingError,
    EmbeddingTask,
    InversionOutput,
    InversionResult,
    embedding_class,
    embedding_names,
    make_embedding,
    register_embedding,
    run_attribute,
    run_inversion,
)
from privacylab.registry import discover

discover(__name__)

__all__ = [
    "EMBEDDING_ATTACKS",
    "KINDS",
    "SIDE_INFORMATION",
    "AttributeOutput",
    "AttributeResult",
    "EmbeddingAttack",
    "EmbeddingError",
    "EmbeddingTask",
    "InversionOutput",
    "InversionResult",
    "embedding_class",
    "embedding_names",
    "make_embedding",
    "register_embedding",
    "run_attribute",
    "run_inversion",
]
