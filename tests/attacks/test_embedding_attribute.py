"""Attribute inference from released embeddings (Du et al. 2023, Sec. 6.4): a 3-layer MLP
trained on auxiliary embeddings reads a product category off clear sentence embeddings, and
falls to chance under strong DP-Forward noise; it queries the target once per auxiliary
sequence and never sees the victims' attributes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from privacylab.attacks.embedding import (
    EmbeddingError,
    EmbeddingTask,
    make_embedding,
    run_attribute,
    run_inversion,
)
from privacylab.mechanisms.matrix_gaussian import MatrixGaussianMechanism
from privacylab.models.encoder import EncoderClassifier
from privacylab.models.minilm import encode_texts, load_tokenizer, tiny_bert
from privacylab.target import AccessError, EmbeddingTarget

L = 12
NAMES = ("electronics", "books", "kitchen", "clothing")
WORDS = (
    ("phone", "laptop", "charger", "battery", "screen", "speaker"),
    ("novel", "author", "chapter", "story", "poem", "plot"),
    ("pan", "blender", "knife", "oven", "kettle", "spoon"),
    ("shirt", "jeans", "dress", "jacket", "shoes", "sweater"),
)
OPENINGS = ("i bought this", "my sister loved the", "we returned the", "honestly the")
ENDINGS = ("was great", "broke quickly", "is fine", "was a gift")


def _sentences(n: int, rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
    attributes = rng.integers(0, len(NAMES), n)
    texts = [
        f"{rng.choice(OPENINGS)} {rng.choice(WORDS[a])} {rng.choice(ENDINGS)}" for a in attributes
    ]
    return texts, attributes.astype(np.int64)


class Release(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(5)
        self.mechanism = MatrixGaussianMechanism(1, 32, scale, 2.0, generator=generator)

    def forward(self, matrix: torch.Tensor) -> torch.Tensor:
        return self.mechanism.release(matrix / matrix.flatten(1).norm(dim=1)[:, None, None])


@pytest.fixture(scope="module")
def data() -> dict:
    tokenizer = load_tokenizer()
    rng = np.random.default_rng(0)
    aux_texts, aux_attributes = _sentences(240, rng)
    victim_texts, victim_attributes = _sentences(100, rng)
    return {
        "encoder": tiny_bert(dim=32, layers=2, max_len=L),
        "aux": encode_texts(tokenizer, aux_texts, L),
        "aux_attributes": aux_attributes,
        "victims": encode_texts(tokenizer, victim_texts, L),
        "truth": victim_attributes,
    }


def _game(data: dict, scale: float | None, access: str = "logits") -> tuple:
    release = None if scale is None else Release(scale)
    model = EncoderClassifier(data["encoder"], 2, position="output", release=release)
    target = EmbeddingTarget(model, access, length=L)
    observed = EmbeddingTarget(model, "logits", length=L).embeddings(data["victims"])
    task = EmbeddingTask(
        observed,
        L,
        auxiliary_ids=data["aux"],
        auxiliary_attributes=data["aux_attributes"],
        attribute_names=NAMES,
    )
    return target, task


def test_reads_the_category_off_clear_embeddings(data: dict) -> None:
    target, task = _game(data, None)
    attack = make_embedding("attribute", epochs=60, patience=10)
    state = torch.get_rng_state()
    result = run_attribute(attack, target, task, data["truth"])
    assert torch.equal(torch.get_rng_state(), state)  # seeded without touching torch's own
    assert result.chance < 0.4
    assert result.accuracy > 0.85
    assert result.queries == 240 and target.queries == 240 and result.access == "logits"
    again = run_attribute(attack, target, task, np.roll(data["truth"], 1))
    assert again.predictions == result.predictions


def test_chance_under_strong_noise(data: dict) -> None:
    target, task = _game(data, 20.0)
    result = run_attribute("attribute", target, task, data["truth"])
    # 100 victims: the accuracy of a guess independent of the attribute is within
    # 0.15 (≈ 3.5 binomial sd) of the majority share
    assert result.accuracy < result.chance + 0.15


def test_refusals(data: dict) -> None:
    target, task = _game(data, None, access="scores")
    with pytest.raises(AccessError, match="needs logits access"):
        run_attribute("attribute", target, task, data["truth"])
    target, task = _game(data, None)
    bare = EmbeddingTask(task.observed, L)
    with pytest.raises(EmbeddingError, match="needs auxiliary data"):
        run_attribute("attribute", target, bare, data["truth"])
    with pytest.raises(EmbeddingError, match="true attributes"):
        run_attribute("attribute", target, task, data["truth"][:3])
    with pytest.raises(
        EmbeddingError, match="attribute is an attribute attack; choose one of inversion"
    ):
        run_inversion("attribute", target, task, data["victims"])
    with pytest.raises(EmbeddingError, match="validation must be in"):
        make_embedding("attribute", validation=1.5)
    with pytest.raises(EmbeddingError, match="both token ids and attributes"):
        EmbeddingTask(task.observed, L, auxiliary_ids=data["aux"])
    with pytest.raises(EmbeddingError, match="index attribute_names"):
        EmbeddingTask(
            task.observed,
            L,
            auxiliary_ids=data["aux"],
            auxiliary_attributes=data["aux_attributes"] + 4,
            attribute_names=NAMES,
        )
    with pytest.raises(EmbeddingError, match="unknown side information"):
        task.restricted_to(["labels"])
