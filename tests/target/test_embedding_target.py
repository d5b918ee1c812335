"""`EmbeddingTarget`: what users release at the cut (Du et al. 2023, Sec. 3.2 and 6.1), behind
logits access, counted one query per row; the deployed classifier as any Target."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privacylab.mechanisms.matrix_gaussian import MatrixGaussianMechanism
from privacylab.models.encoder import EncoderClassifier
from privacylab.models.minilm import tiny_bert
from privacylab.target import AccessError, EmbeddingTarget, QueryBudgetError, TargetError

L = 8


class Release(nn.Module):
    """C·M/‖M‖_F plus matrix Gaussian noise (the DP-Forward release, written independently)."""

    def __init__(self, rows: int, scale: float, clip: float = 1.0) -> None:
        super().__init__()
        self.clip = clip
        generator = torch.Generator().manual_seed(1)
        self.mechanism = MatrixGaussianMechanism(rows, 32, scale, 2 * clip, generator=generator)

    def forward(self, matrix: torch.Tensor) -> torch.Tensor:
        norms = matrix.flatten(1).norm(dim=1)[:, None, None]
        return self.mechanism.release(self.clip * matrix / norms)


@pytest.fixture(scope="module")
def encoder() -> nn.Module:
    return tiny_bert(dim=32, layers=2, max_len=16)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    out = torch.randint(1000, 3000, (5, L), generator=g)
    out[:, 0] = 101
    out[:, 6] = 102
    out[:, 7] = 0
    return out


@pytest.mark.parametrize("position", ["input", "layer:1", "output"])
def test_clear_embeddings_are_f_of_x(encoder: nn.Module, ids: torch.Tensor, position: str) -> None:
    model = EncoderClassifier(encoder, 2, position="output")
    target = EmbeddingTarget(model, "logits", position=position, length=L)
    got = target.embeddings(ids)
    with torch.no_grad():
        want = model.eval().before(ids, position)
    rows = 1 if position == "output" else L
    assert got.shape == (5, rows, 32) and target.rows == rows
    torch.testing.assert_close(got, want)
    assert target.queries == 5 and target.dim == 32 and str(target.position) == position


def test_default_position_and_classifier(encoder: nn.Module, ids: torch.Tensor) -> None:
    model = EncoderClassifier(encoder, 3, position="input")
    target = EmbeddingTarget(model, "logits")
    assert str(target.position) == "output" and target.length == 16
    with torch.no_grad():
        logits = model.eval()(ids)
    torch.testing.assert_close(target.logits(ids), logits)
    torch.testing.assert_close(target.probabilities(ids), logits.softmax(1))
    assert torch.equal(target.labels(ids), logits.argmax(1))
    assert target.queries == 15


def test_release_layer_noise_in_eval_mode(encoder: nn.Module, ids: torch.Tensor) -> None:
    scale = 0.05
    model = EncoderClassifier(encoder, 2, position="layer:1", release=Release(L, scale))
    target = EmbeddingTarget(model, "logits", length=L)
    assert str(target.position) == "layer:1"
    first, second = target.embeddings(ids), target.embeddings(ids)
    assert not torch.equal(first, second)
    with torch.no_grad():
        clear = model.before(ids)
    clear = clear / clear.flatten(1).norm(dim=1)[:, None, None]
    noise = torch.cat([first - clear, second - clear])
    # 2·5·8·32 = 2560 N(0, scale²) draws: the sample sd is within 6% of scale (≈ 4 standard errors)
    assert abs(float(noise.std()) / scale - 1) < 0.06
    assert abs(float(noise.mean())) < 4 * scale / 2560**0.5
    with pytest.raises(TargetError, match="releases its embeddings at layer:1"):
        EmbeddingTarget(model, "logits", position="output")


def test_access_budget_and_views(encoder: nn.Module, ids: torch.Tensor) -> None:
    model = EncoderClassifier(encoder, 2)
    with pytest.raises(AccessError, match="needs logits access"):
        EmbeddingTarget(model, "scores").embeddings(ids)
    target = EmbeddingTarget(model, "white-box", query_budget=12)
    view = target.with_access("logits")
    view.embeddings(ids)
    assert view.queries == 5 and target.queries == 5
    with pytest.raises(AccessError):
        view.with_access("scores").embeddings(ids)
    with pytest.raises(QueryBudgetError):
        view.embeddings(torch.cat([ids, ids]))


def test_bad_input_one_line(encoder: nn.Module, ids: torch.Tensor) -> None:
    model = EncoderClassifier(encoder, 2)
    target = EmbeddingTarget(model, "logits", length=L)
    for bad, match in [
        (ids.float(), "integers"),
        (ids[:, :4], "exactly 8"),
        (ids + 40000, "vocabulary"),
        (ids[0], "shape"),
    ]:
        with pytest.raises(TargetError, match=match) as info:
            target.embeddings(bad)
        assert "\n" not in str(info.value)
    assert target.queries == 0
    with pytest.raises(TargetError, match="unknown position"):
        EmbeddingTarget(model, "logits", position="middle")
    with pytest.raises(TargetError, match="out of range"):
        EmbeddingTarget(model, "logits", position="layer:3")
    with pytest.raises(TargetError, match="max_len"):
        EmbeddingTarget(model, "logits", length=17)
    with pytest.raises(TargetError, match="EncoderClassifier"):
        EmbeddingTarget(nn.Linear(2, 2), "logits")  # type: ignore[arg-type]


def test_float64_precision(encoder: nn.Module, ids: torch.Tensor) -> None:
    target = EmbeddingTarget(EncoderClassifier(encoder, 2), "logits", precision="float64")
    assert target.embeddings(ids).dtype == torch.float64
    assert target.logits(ids).dtype == torch.float64
