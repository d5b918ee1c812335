"""ghost == per_sample == a naive loop over single examples, for every supported layer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from _dp_models import (
    Mixed,
    Transformer,
    cnn,
    cross_entropy,
    logreg,
    mlp,
    naive_clipped_sum,
    naive_per_layer_clipped_sum,
    squared_error,
)
from torch import Tensor, nn

from privacylab.training.dp import ClipThresholds, GhostClipping, PerSampleClipping
from privacylab.training.dp.clipping import split_threshold
from privacylab.training.dp.ghost.rules import instantiate

B = 6
Case = tuple[nn.Module, Tensor, Tensor, Callable[[Tensor, Tensor], Tensor]]


def _regression(layer: nn.Module, x: Tensor) -> Case:
    with torch.no_grad():
        y = torch.randn_like(layer(x))
    return layer, x, y, squared_error


def _frozen_weight() -> Case:
    layer = nn.Linear(5, 3)
    layer.weight.requires_grad_(False)
    return _regression(layer, torch.randn(B, 4, 5))


def _embedding(layer: nn.Embedding, tokens: Tensor) -> Case:
    y = torch.randn(*tokens.shape, layer.embedding_dim)
    return layer, tokens, y, squared_error


CASES: dict[str, Callable[[], Case]] = {
    "linear_2d": lambda: _regression(nn.Linear(7, 5), torch.randn(B, 7)),
    "linear_3d_instantiated": lambda: _regression(nn.Linear(4, 3), torch.randn(B, 6, 4)),
    "linear_3d_gram": lambda: _regression(nn.Linear(8, 9), torch.randn(B, 2, 8)),
    "linear_4d": lambda: _regression(nn.Linear(3, 4), torch.randn(B, 2, 3, 3)),
    "linear_no_bias": lambda: _regression(nn.Linear(5, 3, bias=False), torch.randn(B, 4, 5)),
    "linear_frozen_weight": _frozen_weight,
    "conv_stride_padding": lambda: _regression(
        nn.Conv2d(2, 3, 3, stride=2, padding=1), torch.randn(B, 2, 7, 7)
    ),
    "conv_gram": lambda: _regression(nn.Conv2d(6, 8, 3, stride=2), torch.randn(B, 6, 5, 5)),
    "conv_same_dilation_reflect": lambda: _regression(
        nn.Conv2d(2, 3, 3, padding="same", dilation=2, padding_mode="reflect"),
        torch.randn(B, 2, 6, 6),
    ),
    "conv_circular_no_bias": lambda: _regression(
        nn.Conv2d(2, 2, 2, stride=(1, 2), padding=(1, 0), bias=False, padding_mode="circular"),
        torch.randn(B, 2, 5, 6),
    ),
    "embedding_repeated_tokens": lambda: _embedding(
        nn.Embedding(4, 3), torch.tensor([[0, 1, 1, 3, 1, 0, 2, 2, 2]] * B) % 4
    ),
    "embedding_padding_idx": lambda: _embedding(
        nn.Embedding(5, 3, padding_idx=0), torch.randint(0, 5, (B, 8))
    ),
    "embedding_one_token": lambda: _embedding(nn.Embedding(5, 3), torch.randint(0, 5, (B,))),
    "layernorm_2d": lambda: _regression(nn.LayerNorm(5), torch.randn(B, 5)),
    "layernorm_multi_dim": lambda: _regression(nn.LayerNorm((3, 4)), torch.randn(B, 2, 3, 4)),
    "groupnorm": lambda: _regression(nn.GroupNorm(2, 4), torch.randn(B, 4, 3, 3)),
    "groupnorm_2d": lambda: _regression(nn.GroupNorm(2, 4), torch.randn(B, 4)),
    "rmsnorm": lambda: _regression(nn.RMSNorm(5), torch.randn(B, 3, 5)),
    "mixed": lambda: (Mixed(), torch.randn(B, 2, 8, 8), torch.randint(0, 3, (B,)), cross_entropy),
    "logreg": lambda: (
        logreg(),
        torch.randn(B, 1, 12, 12),
        torch.randint(0, 5, (B,)),
        cross_entropy,
    ),
    "mlp": lambda: (mlp(), torch.randn(B, 1, 12, 12), torch.randint(0, 5, (B,)), cross_entropy),
    "cnn": lambda: (cnn(), torch.randn(B, 1, 12, 12), torch.randint(0, 5, (B,)), cross_entropy),
    "transformer": lambda: (
        Transformer(11, 7, 8, 2, 2, 3),
        torch.randint(0, 11, (B, 7)),
        torch.randint(0, 3, (B,)),
        cross_entropy,
    ),
}


@pytest.fixture(autouse=True)
def float64():
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _randomise_affine(model: nn.Module) -> None:
    """Move norm-layer weights/biases away from 1/0 so their gradients are generic."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)):
                for p in module.parameters():
                    p.add_(0.3 * torch.randn_like(p))


def _relative_error(a: Tensor, b: Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


def _assert_close(got: dict[str, Tensor], want: dict[str, Tensor], what: str) -> None:
    assert set(got) == set(want), what
    for name in want:
        assert _relative_error(got[name], want[name]) < 1e-5, f"{what}: {name}"


@pytest.mark.parametrize("case", list(CASES))
def test_flat_clipping_matches_naive_loop(case: str) -> None:
    model, x, y, loss_fn = CASES[case]()
    _randomise_affine(model)
    _, norms = naive_clipped_sum(model, loss_fn, x, y, 1.0)
    clip = norms.median().item()
    want, norms = naive_clipped_sum(model, loss_fn, x, y, clip)
    assert (norms > clip).any() and (norms < clip).any()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    thresholds = ClipThresholds(clip, names)
    ghost = GhostClipping(model, loss_fn, thresholds).clip((x,), y)
    per_sample = PerSampleClipping(model, loss_fn, thresholds).clip((x,), y)
    for result, what in ((ghost, "ghost"), (per_sample, "per_sample")):
        assert _relative_error(result.norms, norms) < 1e-5, what
        _assert_close(result.grad_sum, want, what)
        assert result.batch_size == B
        torch.testing.assert_close(result.loss, loss_fn(model(x), y).detach())
    _assert_close(ghost.grad_sum, per_sample.grad_sum, "ghost vs per_sample")
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("case", ["mixed", "cnn", "transformer", "linear_3d_gram", "conv_gram"])
def test_per_layer_clipping_matches_naive_loop(case: str) -> None:
    model, x, y, loss_fn = CASES[case]()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    per_layer = split_threshold(names, 0.5)
    want = naive_per_layer_clipped_sum(model, loss_fn, x, y, per_layer)
    thresholds = ClipThresholds(0.5, names, per_layer)
    ghost = GhostClipping(model, loss_fn, thresholds).clip((x,), y)
    per_sample = PerSampleClipping(model, loss_fn, thresholds).clip((x,), y)
    _assert_close(ghost.grad_sum, want, "ghost")
    _assert_close(per_sample.grad_sum, want, "per_sample")


def test_cases_cover_both_sequence_branches() -> None:
    assert instantiate(3, 4, 6) and not instantiate(9, 8, 2)
    assert instantiate(3, 2 * 9, 16) and not instantiate(8, 6 * 9, 4)


def test_per_sample_chunks_give_the_same_sum() -> None:
    model, x, y, loss_fn = CASES["cnn"]()
    thresholds = ClipThresholds(0.1, [n for n, _ in model.named_parameters()])
    whole = PerSampleClipping(model, loss_fn, thresholds).clip((x,), y)
    chunked = PerSampleClipping(model, loss_fn, thresholds, chunk_size=4).clip((x,), y)
    _assert_close(chunked.grad_sum, whole.grad_sum, "chunked")
    torch.testing.assert_close(chunked.norms, whole.norms)
