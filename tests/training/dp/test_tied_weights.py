"""Tied weights under ghost clipping (issue 11, "Must build" 2): exact, or refused in one line.

The per-example gradient of a tensor shared by several layers is the sum of its layers'
contributions, so its norm is not the sum of per-layer norms; the clipper instantiates each
layer's contribution and sums them per example before taking norms.  Oracle: a float64
per-example autograd loop over the whole model.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.training.dp import DPSGD, GhostClippingError
from privacylab.training.dp.clipping import ClipThresholds
from privacylab.training.dp.ghost import GhostClipping, ghost_layers

C = 0.3
VOCAB, DIM, LENGTH = 11, 6, 5


def next_token_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """Per-example next-token cross-entropy summed over positions."""
    return F.cross_entropy(logits.transpose(1, 2), tokens, reduction="none").sum(1)


class TinyLM(nn.Module):
    """Embedding, a block, and a read-out head whose weight IS the embedding matrix."""

    def __init__(self, head_bias: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.positions = nn.Embedding(LENGTH, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=head_bias)
        self.head.weight = self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        pos = torch.arange(tokens.shape[1]).expand(tokens.shape)
        h = self.embed(tokens) + self.positions(pos)
        h = h + torch.tanh(self.mix(self.norm(h)))
        return self.head(h)


def _tokens(batch: int = 6) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (batch, LENGTH), generator=gen)
    x[0, :2] = 3  # repeated tokens
    x[1, -1] = 0  # padding
    return x, torch.roll(x, -1, 1)


def brute_force(
    model: nn.Module, x: Tensor, y: Tensor, per_layer: dict[str, float] | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Norms and Σ_i clip(∇L_i) by a float64 per-example loop (tied tensors appear once)."""
    model = copy.deepcopy(model).double()
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    sums = {n: torch.zeros_like(p) for n, p in named.items()}
    norms = []
    for i in range(x.shape[0]):
        loss = next_token_loss(model(x[i : i + 1]), y[i : i + 1]).sum()
        grads = dict(zip(named, torch.autograd.grad(loss, list(named.values())), strict=True))
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
        norms.append(norm)
        for n, g in grads.items():
            bound, size = (C, norm) if per_layer is None else (per_layer[n], g.norm())
            sums[n] += min(1.0, float(bound / (size + 1e-6))) * g
    return torch.stack(norms), sums


def _check(model: nn.Module, per_layer: dict[str, float] | None = None) -> None:
    x, y = _tokens()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    result = GhostClipping(model, next_token_loss, ClipThresholds(C, names, per_layer)).clip(
        (x,), y
    )
    norms, sums = brute_force(model, x, y, per_layer)
    torch.testing.assert_close(result.norms.double(), norms, rtol=1e-4, atol=1e-6)
    assert set(result.grad_sum) == set(sums)
    for name, want in sums.items():
        torch.testing.assert_close(
            result.grad_sum[name].double(), want, rtol=1e-4, atol=1e-6, msg=name
        )


def test_tied_embedding_and_head_are_exact() -> None:
    torch.manual_seed(0)
    model = TinyLM()
    layers, problems = ghost_layers(model)
    assert problems == []
    tied = {layer.path: layer.tied for layer in layers if layer.tied}
    assert tied == {"embed": {"weight": "embed.weight"}, "head": {"weight": "embed.weight"}}
    _check(model)


def test_tied_without_head_bias_and_with_per_layer_thresholds() -> None:
    torch.manual_seed(1)
    model = TinyLM(head_bias=False)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    _check(model, {n: C / len(names) ** 0.5 for n in names})


def test_per_layer_norms_would_be_wrong_for_tied_weights() -> None:
    """The oracle tells the difference: adding the two layers' norms is not the tied norm."""
    torch.manual_seed(2)
    model = TinyLM().double()
    x, y = _tokens()
    loss = next_token_loss(model(x[:1]), y[:1]).sum()
    (g,) = torch.autograd.grad(loss, [model.embed.weight])
    untied = copy.deepcopy(model)
    untied.head.weight = nn.Parameter(model.embed.weight.detach().clone())
    loss = next_token_loss(untied(x[:1]), y[:1]).sum()
    g_embed, g_head = torch.autograd.grad(loss, [untied.embed.weight, untied.head.weight])
    torch.testing.assert_close(g, g_embed + g_head)
    assert abs(float(g.pow(2).sum() - g_embed.pow(2).sum() - g_head.pow(2).sum())) > 1e-6


def test_the_engine_keeps_ghost_under_auto_and_steps_exactly() -> None:
    torch.manual_seed(3)
    model = TinyLM()
    x, y = _tokens()
    trained = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in trained.named_parameters()}
    engine = DPSGD(
        trained,
        torch.optim.SGD(trained.parameters(), lr=1.0),
        next_token_loss,
        noise_multiplier=0.0,
        max_grad_norm=C,
        expected_batch_size=x.shape[0],
        clipping="auto",
    )
    assert engine.clipping == "ghost"
    engine.step((x,), y)
    assert engine.clipping == "ghost"
    assert trained.head.weight is trained.embed.weight
    _, sums = brute_force(model, x, y)
    for name, p in trained.named_parameters():
        want = -sums[name] / x.shape[0]
        torch.testing.assert_close((p.detach() - before[name]).double(), want, rtol=1e-4, atol=1e-6)


class Shared(nn.Module):
    """A Linear's weight shared with a second Linear of another shape role (both called)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight
        self.head = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))


def test_two_linears_sharing_a_weight_are_exact() -> None:
    torch.manual_seed(4)
    model = Shared()
    x, y = torch.randn(7, 4), torch.randint(0, 3, (7,))
    names = [n for n, p in model.named_parameters() if p.requires_grad]

    def loss(out: Tensor, t: Tensor) -> Tensor:
        return F.cross_entropy(out, t, reduction="none")

    result = GhostClipping(model, loss, ClipThresholds(C, names)).clip((x,), y)
    ref = copy.deepcopy(model).double()
    params = [p for p in ref.parameters()]
    total = [torch.zeros_like(p) for p in params]
    for i in range(7):
        grads = torch.autograd.grad(loss(ref(x[i : i + 1].double()), y[i : i + 1]).sum(), params)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        for t, g in zip(total, grads, strict=True):
            t += min(1.0, float(C / (norm + 1e-6))) * g
    for name, want in zip(names, total, strict=True):
        torch.testing.assert_close(result.grad_sum[name].double(), want, rtol=1e-4, atol=1e-6)


class Nested(nn.Module):
    """A module whose own parameter is also its child's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4, bias=False)
        self.gate = self.inner.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x) * torch.sigmoid(self.gate.sum())


def test_a_parent_sharing_its_childs_weight_is_refused_in_one_line() -> None:
    model = nn.Sequential(Nested(), nn.Linear(4, 3))
    _, problems = ghost_layers(model)
    assert len(problems) == 1 and "own sub-layer" in problems[0] and "\n" not in problems[0]
    with pytest.raises(GhostClippingError, match="own sub-layer"):
        GhostClipping(model, F.cross_entropy, ClipThresholds(C, ["0.gate", "1.weight"]))


class TiedPlusFunctional(nn.Module):
    """Tied head, and the shared matrix also read through a functional call: refused."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.head.weight = self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.embed(tokens)
        return self.head(h) + F.linear(h, self.embed.weight)


def test_a_tied_weight_also_used_outside_its_layers_is_refused() -> None:
    model = TiedPlusFunctional()
    x, y = _tokens()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    clipper = GhostClipping(model, next_token_loss, ClipThresholds(C, names))
    with pytest.raises(GhostClippingError, match=r"embed\.weight") as error:
        clipper.clip((x,), y)
    assert "\n" not in str(error.value)
