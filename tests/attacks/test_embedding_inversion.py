"""Embedding inversion on MiniLM's real weights (first layer) and real sentences (Du et al.
2023, Sec. 6.3): both attacks recover clear embeddings and fail under strong DP-Forward noise;
they never see the victims' tokens, run at logits access, and refuse bad configurations."""

from __future__ import annotations

import re
from pydoc_data.topics import topics

import pytest
import torch
from torch import nn

from privacylab.attacks.embedding import (
    EmbeddingError,
    EmbeddingTask,
    embedding_class,
    embedding_names,
    make_embedding,
    run_attribute,
    run_inversion,
)
from privacylab.mechanisms.matrix_gaussian import MatrixGaussianMechanism
from privacylab.models.encoder import EncoderClassifier
from privacylab.models.minilm import encode_texts, load_minilm, load_tokenizer
from privacylab.target import AccessError, EmbeddingTarget

L = 12
TEXTS = [
    "the battery of this phone died after two days",
    "a wonderful novel about love and war",
    "this pan is great for cooking eggs",
    "the shirt shrank after one wash",
]
CHEAP = {"steps": 25, "restarts": 1, "candidates": 8}


class Release(nn.Module):
    """C·M/‖M‖_F plus i.i.d. matrix Gaussian noise of sd `scale` (σ ≫ C: strong local DP)."""

    def __init__(self, rows: int, scale: float) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.mechanism = MatrixGaussianMechanism(rows, 384, scale, 2.0, generator=generator)

    def forward(self, matrix: torch.Tensor) -> torch.Tensor:
        return self.mechanism.release(matrix / matrix.flatten(1).norm(dim=1)[:, None, None])


@pytest.fixture(scope="module")
def setup() -> tuple[nn.Module, torch.Tensor, object]:
    tokenizer = load_tokenizer()
    return load_minilm(layers=1), encode_texts(tokenizer, TEXTS, L), tokenizer


def _game(setup: tuple, position: str, noisy: bool) -> tuple[EmbeddingTarget, EmbeddingTask]:
    encoder, ids, _ = setup
    release = Release(1 if position == "output" else L, 20.0) if noisy else None
    model = EncoderClassifier(encoder, 2, position=position, release=release)
    target = EmbeddingTarget(model, "logits", position=position, length=L)
    return target, EmbeddingTask(target.embeddings(ids), L, public_encoder=encoder)


def test_registry() -> None:
    assert embedding_names() == ["attribute", "inversion-nn", "inversion-opt"]
    assert embedding_names("inversion") == ["inversion-nn", "inversion-opt"]
    with pytest.raises(EmbeddingError, match="unknown embedding attack 'nope'") as info:
        make_embedding("nope")
    assert "\n" not in str(info.value)
    with pytest.raises(
        EmbeddingError,
        match="attribute is an attribute attack; choose one of inversion-nn, inversion-opt",
    ):
        embedding_class("attribute", "inversion")
    with pytest.raises(EmbeddingError, match="steps must be a whole number"):
        make_embedding("inversion-opt", steps=0)


@pytest.mark.parametrize("position", ["input", "layer:1"])
def test_nearest_neighbour(setup: tuple, position: str) -> None:
    ids = setup[1]
    target, task = _game(setup, position, noisy=False)
    before = target.queries
    result = run_inversion("inversion-nn", target, task, ids, decode=setup[2].decode)
    assert result.recall == 1.0
    assert result.queries == 0 and target.queries == before and result.access == "logits"
    assert result.examples[0]["truth"] == result.examples[0]["recovered"]
    content = [set(row.tolist()) - {0, 101, 102} for row in ids]
    shared = [len(content[i] & content[i - 1]) / len(content[i - 1]) for i in range(len(ids))]
    assert result.baseline_recall == pytest.approx(sum(shared) / len(shared))
    assert result.baseline_recall < 0.3
    target, task = _game(setup, position, noisy=True)
    assert run_inversion("inversion-nn", target, task, ids).recall < 0.05


def test_pooled_output_bag_of_words(setup: tuple) -> None:
    ids = setup[1]
    target, task = _game(setup, "output", noisy=False)
    clear = run_inversion("inversion-nn", target, task, ids)
    assert clear.tokens is not None and clear.tokens.shape == (4, L)
    assert clear.recall > 0.3
    target, task = _game(setup, "output", noisy=True)
    assert run_inversion("inversion-nn", target, task, ids).recall < 0.05


@pytest.mark.parametrize("position", ["input", "layer:1"])
def test_optimisation(setup: tuple, position: str) -> None:
    ids = setup[1]
    attack = make_embedding("inversion-opt", **CHEAP)
    target, task = _game(setup, position, noisy=False)
    clear = run_inversion(attack, target, task, ids)
    assert clear.recall > 0.8 and clear.params["similarity"] > 0.9
    target, task = _game(setup, position, noisy=True)
    noisy = run_inversion(attack, target, task, ids)
    assert noisy.recall < 0.1 and noisy.queries == 0


def test_never_sees_the_truth(setup: tuple) -> None:
    ids = setup[1]
    assert not {"ids", "truth", "tokens"} & set(EmbeddingTask.__dataclass_fields__)
    target, task = _game(setup, "input", noisy=True)
    attack = make_embedding("inversion-opt", steps=5, restarts=1, candidates=4)
    first = run_inversion(attack, target, task, ids)
    other = run_inversion(attack, target, task, torch.flip(ids, [0]))
    assert torch.equal(first.tokens, other.tokens)


def test_refusals(setup: tuple) -> None:
    encoder, ids, _ = setup
    target, task = _game(setup, "input", noisy=False)
    with pytest.raises(AccessError, match="needs logits access"):
        run_inversion("inversion-nn", target.with_access("scores"), task, ids)
    bare = EmbeddingTask(task.observed, L)
    with pytest.raises(EmbeddingError, match="needs the public encoder"):
        run_inversion("inversion-nn", target, bare, ids)
    with pytest.raises(EmbeddingError, match="rows per embedding"):
        run_inversion("inversion-nn", target, EmbeddingTask(task.observed, L + 1, encoder), ids)
    with pytest.raises(EmbeddingError, match="true sequences"):
        run_inversion("inversion-nn", target, task, ids[:2])
    with pytest.raises(EmbeddingError, match="inversion-nn is not an attribute attack"):
        run_attribute(make_embedding("inversion-nn"), target, task, ids[:, 0].numpy())
    with pytest.raises(EmbeddingError, match=r"float tensor \(m, r, d\)"):
        EmbeddingTask(task.observed[0], L)


def test_expanded_layernorm_cosines_match_tables(setup: tuple) -> None:
    from privacylab.attacks.embedding.inversion import _cosines

    encoder = setup[0]
    emb = encoder.embeddings
    shifts = emb.position_embeddings.weight[:3] + emb.token_type_embeddings.weight[0]
    rows = torch.randn(5, 384, generator=torch.Generator().manual_seed(0))
    where = torch.tensor([0, 2, 1, 1, 0])
    got = _cosines(encoder, rows, where, shifts)
    with torch.no_grad():
        tables = [
            torch.nn.functional.normalize(emb.LayerNorm(emb.word_embeddings.weight + s), dim=-1)
            for s in shifts
        ]
        want = torch.stack(
            [
                tables[int(i)] @ torch.nn.functional.normalize(r, dim=0)
                for r, i in zip(rows, where, strict=True)
            ]
        )
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def _aux_sentences() -> list[str]:
    text = " ".join(topics.values())
    found = (x.strip() for x in re.split(r"(?<=[.!?])\s+", text))
    return [x for x in found if 40 < len(x) < 120 and "\n" not in x][:80]


def test_linear_map_from_the_cut_to_input_rows(setup: tuple) -> None:
    encoder, ids, tokenizer = setup
    aux = encode_texts(tokenizer, _aux_sentences(), L)
    attack = make_embedding("inversion-opt", **CHEAP)
    recalls = {}
    for noisy in (False, True):
        target, task = _game(setup, "layer:1", noisy=noisy)
        task = EmbeddingTask(
            task.observed,
            L,
            encoder,
            auxiliary_ids=aux,
            auxiliary_attributes=torch.zeros(80).long().numpy(),
        )
        before = target.queries
        result = run_inversion(attack, target, task, ids)
        assert result.params["mapped"] and result.queries == 80 == target.queries - before
        recalls[noisy] = result.recall
    assert recalls[False] > 0.8 and recalls[True] < 0.1
    with pytest.raises(EmbeddingError, match="needs auxiliary data"):
        run_inversion(
            make_embedding("inversion-opt", linear_map=True),
            target,
            EmbeddingTask(task.observed, L, encoder),
            ids,
        )
