"""Small models built from the supported layers, and naive per-example references."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    """Per-example cross-entropy; sequence outputs (B, T, K) are summed over T."""
    if outputs.dim() == 3:
        return F.cross_entropy(outputs.transpose(1, 2), targets, reduction="none").sum(1)
    return F.cross_entropy(outputs, targets, reduction="none")


def squared_error(outputs: Tensor, targets: Tensor) -> Tensor:
    """Per-example sum of squared errors over every non-batch dimension."""
    return (outputs - targets).pow(2).flatten(1).sum(1)


class Attention(nn.Module):
    """Multi-head self-attention from Linear layers only."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), -1)
        return self.out((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Token classifier: embeddings, blocks, final LayerNorm, mean pooling, linear head."""

    def __init__(self, vocab: int, length: int, dim: int, heads: int, blocks: int, classes: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(length, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(blocks)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: Tensor) -> Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        x = self.tokens(tokens) + self.positions(positions)
        return self.head(self.ln(self.blocks(x)).mean(1))


class Mixed(nn.Module):
    """Conv2d (stride, padding), GroupNorm, a Linear used twice, LayerNorm and an Embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.proj = nn.Linear(4, 6)
        self.ln = nn.LayerNorm(6)
        self.emb = nn.Embedding(5, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.gn(self.conv(x)))
        seq = h.flatten(2).transpose(1, 2)
        h = self.ln(self.proj(seq) + self.proj(seq.flip(1)))
        tokens = (x[:, 0, :4, 0].abs() * 10).long() % 5
        return self.head(h.mean(1) + self.emb(tokens).sum(1))


def cnn() -> nn.Module:
    """The small CNN of the DP literature, GroupNorm instead of BatchNorm, for 1×12×12 inputs."""
    return nn.Sequential(
        nn.Conv2d(1, 4, 4, 2, padding=1),
        nn.GroupNorm(2, 4),
        nn.ReLU(),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(4, 8, 3, 1, dilation=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8, 5),
    )


def _example_grads(
    model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor
) -> Iterator[dict[str, Tensor]]:
    """Each example's gradient by autograd on that example alone (zeros where unused)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    for i in range(x.shape[0]):
        loss = loss_fn(model(x[i : i + 1]), y[i : i + 1]).sum()
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        yield {
            n: torch.zeros_like(p) if g is None else g
            for (n, p), g in zip(params.items(), grads, strict=True)
        }


def naive_clipped_sum(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    max_grad_norm: float,
) -> tuple[dict[str, Tensor], Tensor]:
    """Loop over examples: autograd on each, clip (Opacus' convention), sum."""
    total = {n: torch.zeros_like(p) for n, p in model.named_parameters() if p.requires_grad}
    norms = []
    for grads in _example_grads(model, loss_fn, x, y):
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
        factor = (max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
        for name, g in grads.items():
            total[name] += factor * g
        norms.append(norm)
    return total, torch.stack(norms)


def naive_per_layer_clipped_sum(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    thresholds: dict[str, float],
) -> dict[str, Tensor]:
    """Loop over examples; clip each parameter's gradient to its own threshold; sum."""
    total = {n: torch.zeros_like(p) for n, p in model.named_parameters() if p.requires_grad}
    for grads in _example_grads(model, loss_fn, x, y):
        for name, g in grads.items():
            total[name] += (thresholds[name] / (g.norm() + 1e-6)).clamp(max=1.0) * g
    return total


def logreg() -> nn.Module:
    """Multinomial logistic regression on 1×12×12 inputs."""
    return nn.Sequential(nn.Flatten(), nn.Linear(144, 5))


def mlp() -> nn.Module:
    """Two hidden layers with in-place activations (which must not confuse ghost clipping)."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(144, 16),
        nn.ReLU(inplace=True),
        nn.Linear(16, 8),
        nn.LeakyReLU(0.1, inplace=True),
        nn.Linear(8, 5),
    )
