"""Ghost clipping tells the batch dimension by provenance, not by size (issue 11, first item).

A layer whose input has a first dimension that merely equals the batch size — positions
`arange(L)` with L == B, a sequence-first (T, B, d) input with T == B — used to be clipped along
the wrong axis with no error. Now `ghost` refuses it in one line and `auto` falls back to the
exact per-sample computation; batch-first models are unchanged."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from privacylab.models import build_model
from privacylab.training.dp import DPSGD, GhostClippingError
from privacylab.training.dp.ghost.clipper import ghost_layers, probe_batch_first

C = 0.5


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="none")


def _brute_force_update(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Σ_i clip_C(∇ℓ_i) / B by a per-example autograd loop in float64 (σ = 0, lr = 1)."""
    model = copy.deepcopy(model).double()
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    for i in range(x.shape[0]):
        xi = x[i : i + 1] if x.is_floating_point() is False else x[i : i + 1].double()
        grads = torch.autograd.grad(_loss(model(xi), y[i : i + 1]).sum(), params, allow_unused=True)
        grads = [
            torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)
        ]
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        factor = min(1.0, C / float(norm))
        for t, g in zip(total, grads, strict=True):
            t += factor * g
    return [-(t / x.shape[0]).float() for t in total]


def _update(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clipping: str):
    model = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    engine = DPSGD(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        _loss,
        noise_multiplier=0.0,
        max_grad_norm=C,
        expected_batch_size=x.shape[0],
        clipping=clipping,
    )
    engine.step((x,), y)
    return engine, [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]


def _transformer(length: int) -> nn.Module:
    return build_model(
        "transformer", (length,), 3, vocab_size=20, max_len=length, dim=16, heads=2, blocks=1,
        seed=0,
    )  # fmt: skip


class UnexpandedPositions(nn.Module):
    """A position embedding called on `arange(L)` (shape (L,), not expanded over the batch)."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(20, 8)
        self.positions = nn.Embedding(length, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = self.positions(torch.arange(tokens.shape[-1]))
        return self.head(torch.tanh(self.tokens(tokens) + positions).mean(-2))


class SequenceFirst(nn.Module):
    """A GRU-style layout: (B, T, d) input turned sequence-first before a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = self.mix(x.transpose(0, 1))  # (T, B, 4): dimension 0 is time
        return self.head(steps.mean(0))


@pytest.mark.filterwarnings("ignore:clipping='auto' switches")
@pytest.mark.parametrize(
    ("make", "x"),
    [
        (lambda: UnexpandedPositions(6), torch.randint(0, 20, (6, 6))),  # L == B
        (SequenceFirst, torch.randn(5, 5, 4)),  # T == B
    ],
    ids=["positions-L-equals-B", "sequence-first-T-equals-B"],
)
def test_a_dimension_equal_to_the_batch_is_not_taken_for_it(make, x):
    torch.manual_seed(0)
    model = make()
    y = torch.randint(0, 3, (x.shape[0],))
    with pytest.raises(GhostClippingError, match="dimension 0 is not the batch"):
        _update(model, x, y, "ghost")
    engine, update = _update(model, x, y, "auto")
    assert engine.clipping == "per_sample"
    for got, want in zip(update, _brute_force_update(model, x, y), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("make", "x"),
    [
        (lambda: build_model("mlp", (1, 8, 8), 3, widths=(16,), seed=0), torch.randn(7, 1, 8, 8)),
        (lambda: _transformer(6), torch.randint(0, 20, (6, 6))),  # L == B, positions expanded
    ],
    ids=["mlp", "zoo-transformer-L-equals-B"],
)
def test_batch_first_models_keep_ghost_clipping_and_exact_sums(make, x):
    torch.manual_seed(0)
    model = make()
    y = torch.randint(0, 3, (x.shape[0],))
    engine, update = _update(model, x, y, "ghost")
    assert engine.clipping == "ghost"
    for got, want in zip(update, _brute_force_update(model, x, y), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_the_probe_leaves_the_rng_and_the_mode_alone():
    model = build_model("mlp", (1, 8, 8), 3, widths=(16,), dropout=0.5, seed=0).train()
    layers, _ = ghost_layers(model)
    x = torch.randn(4, 1, 8, 8)
    state = torch.get_rng_state()
    verdict = probe_batch_first(model, layers, (x,))
    assert torch.equal(state, torch.get_rng_state()) and model.training
    assert verdict == {(0, 0): True, (1, 0): True}
    one = probe_batch_first(model, layers, (torch.randn(1, 1, 8, 8),))  # a batch of one
    assert one == verdict


def test_an_empty_first_batch_does_not_fool_the_probe():
    model = build_model("mlp", (1, 8, 8), 3, widths=(16,), seed=0)
    engine = DPSGD(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        _loss,
        noise_multiplier=1.0,
        max_grad_norm=C,
        expected_batch_size=4,
    )
    engine.step((torch.zeros(0, 1, 8, 8),), torch.zeros(0, dtype=torch.int64))
    engine.step((torch.randn(4, 1, 8, 8),), torch.randint(0, 3, (4,)))
    assert engine.clipping == "ghost"


class Functional(nn.Module):
    """`fc` is used only through F.linear, never called: ghost clipping sees no call of it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(torch.tanh(self.body(x)), self.fc.weight, self.fc.bias)


class UnusedHead(nn.Module):
    """A head that is never used: its zero gradient is right, and ghost clipping keeps going."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 3)
        self.spare = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.filterwarnings("ignore:clipping='auto' switches")
def test_a_parameter_used_outside_its_layer_is_refused_not_zeroed():
    torch.manual_seed(0)
    model = Functional()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    with pytest.raises(GhostClippingError, match=r"parameter fc\.weight reaches the loss"):
        _update(model, x, y, "ghost")
    engine, update = _update(model, x, y, "auto")
    assert engine.clipping == "per_sample"
    for got, want in zip(update, _brute_force_update(model, x, y), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert update[-1].abs().sum() > 0  # fc.bias moved


def test_an_unused_layer_keeps_ghost_clipping():
    torch.manual_seed(0)
    model = UnusedHead()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    engine, update = _update(model, x, y, "ghost")
    assert engine.clipping == "ghost"
    for got, want in zip(update, _brute_force_update(model, x, y), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


class CalledAndFunctional(nn.Module):
    """`fc` is called once and its weight is also used through F.linear (a tied read-out)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.fc(x))
        return self.out(torch.tanh(F.linear(hidden, self.fc.weight)))


@pytest.mark.filterwarnings("ignore:clipping='auto' switches")
def test_a_parameter_used_by_its_layer_and_outside_it_is_refused_not_half_counted():
    torch.manual_seed(0)
    model = CalledAndFunctional()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    with pytest.raises(GhostClippingError, match=r"parameter fc\.weight is used outside") as caught:
        _update(model, x, y, "ghost")
    assert "\n" not in str(caught.value)
    engine, update = _update(model, x, y, "auto")
    assert engine.clipping == "per_sample"
    for got, want in zip(update, _brute_force_update(model, x, y), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
