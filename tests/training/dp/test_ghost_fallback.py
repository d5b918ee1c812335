"""The exact per-layer fallback of ghost clipping (issue 11, "Must build" 2).

A layer without a ghost rule is handled inside ghost mode by vmap of a vjp of the layer alone;
the oracle is an independent float64 per-example autograd loop over the whole model.  Every case
the fallback cannot make exact is refused in one line.
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

C = 0.7


def _loss(out: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(out, y, reduction="none")


def brute_force(
    model: nn.Module, x: Tensor, y: Tensor, per_layer: dict[str, float] | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-example norms and Σ_i clip(∇L_i) by a float64 loop over examples (the oracle)."""
    model = copy.deepcopy(model).double()
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    sums = {n: torch.zeros_like(p) for n, p in named.items()}
    norms = []
    for i in range(x.shape[0]):
        xi = x[i : i + 1].double() if x.is_floating_point() else x[i : i + 1]
        grads = torch.autograd.grad(
            _loss(model(xi), y[i : i + 1]).sum(), list(named.values()), allow_unused=True
        )
        grads = {
            n: torch.zeros_like(p) if g is None else g
            for (n, p), g in zip(named.items(), grads, strict=True)
        }
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
        norms.append(norm)
        for n, g in grads.items():
            if per_layer is None:
                factor = min(1.0, float(C / (norm + 1e-6)))
            else:
                factor = min(1.0, float(per_layer[n] / (g.norm() + 1e-6)))
            sums[n] += factor * g
    return torch.stack(norms), sums


def ghost(
    model: nn.Module, x: Tensor, y: Tensor, per_layer: dict[str, float] | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    clipper = GhostClipping(model, _loss, ClipThresholds(C, names, per_layer))
    result = clipper.clip((x,), y)
    return result.norms, result.grad_sum


def assert_matches_brute_force(model: nn.Module, x: Tensor, y: Tensor, **kwargs) -> None:
    norms, sums = ghost(model, x, y, **kwargs)
    want_norms, want_sums = brute_force(model, x, y, **kwargs)
    torch.testing.assert_close(norms.double(), want_norms, rtol=1e-4, atol=1e-6)
    assert set(sums) == set(want_sums)
    for name, want in want_sums.items():
        torch.testing.assert_close(sums[name].double(), want, rtol=1e-4, atol=1e-6, msg=name)


class Nonlinear(nn.Module):
    """A user layer using its weight nonlinearly and twice: x (W ⊙ tanh W)ᵀ + ‖W‖² b."""

    def __init__(self, d: int, p: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(p, d) / d**0.5)
        self.bias = nn.Parameter(torch.randn(p) * 0.1)

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight * torch.tanh(self.weight)
        return x @ w.T + self.weight.pow(2).sum() * self.bias


class Masked(nn.Module):
    """A layer with an argument that does not depend on the batch and a keyword argument."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(d))

    def forward(self, x: Tensor, mask: Tensor, *, shift: float = 0.0) -> Tensor:
        return torch.sin(x * self.scale) * mask + shift


class BilinearNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.bi = nn.Bilinear(5, 5, 4)
        self.act = nn.PReLU(4)
        self.custom = Nonlinear(4, 4)
        self.masked = Masked(4)
        self.head = nn.Linear(4, 3)
        self.register_buffer("mask", torch.tensor([1.0, 0.5, -1.0, 2.0]))

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.fc(x))
        h = self.act(self.bi(h, h * 2))
        h = self.custom(h)
        h = self.masked(h, self.mask, shift=0.25)
        h = self.custom(torch.tanh(h))  # a fallback layer called twice
        return self.head(h)


def _data(batch: int = 7, d: int = 6, classes: int = 3) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(batch, d, generator=gen), torch.randint(0, classes, (batch,), generator=gen)


def test_layers_without_rules_are_exact_against_a_float64_loop() -> None:
    torch.manual_seed(0)
    model = BilinearNet()
    layers, problems = ghost_layers(model)
    assert problems == []
    fallback = {layer.path for layer in layers if layer.fallback}
    assert fallback == {"bi", "act", "custom", "masked"}
    assert_matches_brute_force(model, *_data())


def test_per_layer_thresholds_with_fallback_layers() -> None:
    torch.manual_seed(1)
    model = BilinearNet()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    per_layer = {n: C / len(names) ** 0.5 for n in names}
    assert_matches_brute_force(model, *_data(), per_layer=per_layer)


def test_frozen_parameter_of_a_fallback_layer_is_left_alone() -> None:
    torch.manual_seed(2)
    model = BilinearNet()
    model.bi.bias.requires_grad_(False)
    model.custom.weight.requires_grad_(False)
    assert_matches_brute_force(model, *_data())


def test_depthwise_and_grouped_convolutions_are_exact() -> None:
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1),
        nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4),  # depthwise
        nn.ReLU(),
        nn.Conv2d(4, 6, 1, groups=2),  # grouped pointwise
        nn.Flatten(),
        nn.Linear(6 * 3 * 3, 3),
    )
    assert ghost_layers(model)[1] == []
    x, y = torch.randn(5, 2, 5, 5), torch.randint(0, 3, (5,))
    assert_matches_brute_force(model, x, y)


def test_auto_stays_ghost_and_the_engine_step_is_exact() -> None:
    torch.manual_seed(4)
    model = BilinearNet()
    x, y = _data(batch=6)
    trained = copy.deepcopy(model)
    before = [p.detach().clone() for p in trained.parameters()]
    engine = DPSGD(
        trained,
        torch.optim.SGD(trained.parameters(), lr=1.0),
        _loss,
        noise_multiplier=0.0,
        max_grad_norm=C,
        expected_batch_size=6,
        clipping="auto",
    )
    assert engine.clipping == "ghost"
    engine.step((x,), y)
    assert engine.clipping == "ghost"
    _, sums = brute_force(model, x, y)
    for p, b, want in zip(trained.parameters(), before, sums.values(), strict=True):
        torch.testing.assert_close((p.detach() - b).double(), -want / 6, rtol=1e-4, atol=1e-6)


class PeekThenUse(nn.Module):
    """Calls a fallback layer once without gradients (a statistic), then for real."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = Nonlinear(6, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            peek = self.layer(x).abs().mean(1, keepdim=True)
        return self.head(self.layer(x) / (1 + peek))


def test_a_call_without_gradients_is_not_recorded_and_the_rest_is_exact() -> None:
    torch.manual_seed(7)
    assert_matches_brute_force(PeekThenUse(), *_data())


# ---- refusals: one line each ----------------------------------------------------------------


class TupleOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 3))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = x @ self.weight
        return h, h.sum(1)


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 3))

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, 0.5, self.training) @ self.weight


class Running(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 3))
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        self.seen += 1
        return x @ self.weight


class Centred(nn.Module):
    """Mixes examples: subtracts the batch mean."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 3))

    def forward(self, x: Tensor) -> Tensor:
        return (x - x.mean(0)) @ self.weight + x @ self.weight


class Cached(nn.Module):
    """Uses a tensor computed from its weight on the first call, then reused (stale)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 3))
        self.cache: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.cache is None:
            self.cache = self.weight * 2
        return x @ self.cache


class SequenceFirstScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3))

    def forward(self, x: Tensor, steps: Tensor) -> Tensor:
        return x * self.weight + steps.mean(0)


class Wrap(nn.Module):
    def __init__(self, layer: nn.Module, out: int = 3) -> None:
        super().__init__()
        self.layer = layer
        self.head = nn.Linear(out, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.layer(x)
        if isinstance(h, tuple):
            h = h[0]
        return self.head(h)


class ParentUses(nn.Module):
    """The fallback layer's parameter is also read outside its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = Nonlinear(6, 3)
        self.head = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.layer(x)) + x[:, :3] * self.layer.bias


class SeqFirstModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = SequenceFirstScale()
        self.head = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        steps = x[:, :3].unsqueeze(0).expand(4, -1, -1).transpose(0, 1).transpose(0, 1)
        return self.head(self.layer(x[:, :3], steps))


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (Wrap(TupleOut()), "returns a tuple"),
        (Wrap(Noisy()), "random"),
        (Wrap(Running()), "buffers or parameters"),
        (Wrap(Centred()), "one example at a time"),
        (Wrap(Cached()), "do not explain"),
        (ParentUses(), "do not explain"),
        (SeqFirstModel(), "batch-first dimension"),
    ],
    ids=["tuple", "random", "buffer", "mixes", "cache", "outside-use", "sequence-first"],
)
def test_what_cannot_be_exact_is_refused_in_one_line(model: nn.Module, match: str) -> None:
    torch.manual_seed(5)
    model.train()
    x, y = _data()
    if isinstance(model, Wrap) and isinstance(model.layer, Cached):
        model(x)  # the cache is filled on an earlier step
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    clipper = GhostClipping(model, _loss, ClipThresholds(C, names))
    with pytest.raises(GhostClippingError, match=match) as error:
        clipper.clip((x,), y)
    assert "\n" not in str(error.value)


@pytest.mark.filterwarnings("ignore:clipping='auto' switches")
def test_auto_turns_a_refusal_into_exact_per_sample() -> None:
    torch.manual_seed(6)
    model = Wrap(Centred())
    engine = DPSGD(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        _loss,
        noise_multiplier=0.0,
        max_grad_norm=C,
        expected_batch_size=7,
        clipping="auto",
    )
    engine.step(*_data())
    assert engine.clipping == "per_sample"


def test_stock_recurrent_layers_are_refused_before_training_naming_the_drop_in() -> None:
    _, problems = ghost_layers(nn.Sequential(nn.LSTM(3, 4, batch_first=True)))
    assert len(problems) == 1 and "DPLSTM" in problems[0] and "\n" not in problems[0]
    _, problems = ghost_layers(nn.Sequential(nn.MultiheadAttention(4, 2)))
    assert len(problems) == 1 and "tuple" in problems[0]
