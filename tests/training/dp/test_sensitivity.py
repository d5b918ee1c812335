"""Sensitivity of the clipped sum on every model of the zoo: ‖S(D) − S(D′)‖₂ ≤ C.

S(D) = Σ_{i∈D} clip_C(∇L_i) is what DP-SGD adds Gaussian noise N(0, σ²C²) to (Abadi et al. 2016,
Alg. 1); the Gaussian mechanism's guarantee holds only if one example changes S by at most C
(add/remove adjacency). Each case removes every example of a batch in turn and adds a fresh one,
with C far below the gradient norms so that every example is clipped and the bound is tight. The
transformer with batch size == sequence length is the case that a size-based batch-dimension test
got wrong (sensitivity measured at 2.8·C before the batch dimension was told by provenance).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.models import build_model
from privacylab.training.dp import DPSGD, GhostClippingError, split_threshold

C = 1e-3
BATCH = 6


def _loss(out: Tensor, target: Tensor) -> Tensor:
    return F.cross_entropy(out, target, reduction="none")


def _case(name: str, length: int = 5) -> tuple[nn.Module, Tensor]:
    generator = torch.Generator().manual_seed(1)
    if name == "transformer":
        model = build_model(
            "transformer", (length,), 3, seed=0, vocab_size=11, dim=8, heads=2, blocks=1
        )
        return model, torch.randint(0, 11, (BATCH + 1, length), generator=generator)
    shapes = {"cnn": (1, 16, 16), "lenet": (1, 8, 8)}
    options = {"mlp": {"widths": (16, 8)}, "cnn": {"norm": "group"}}
    shape = shapes.get(name, (1, 8, 8))
    model = build_model(name, shape, 3, seed=0, **options.get(name, {}))
    return model, 3 * torch.randn(BATCH + 1, *shape, generator=generator)


CASES = [
    ("logreg", 5),
    ("mlp", 5),
    ("cnn", 5),
    ("lenet", 5),
    ("scatnet", 5),
    ("transformer", 5),
    ("transformer", BATCH),  # L == B
    ("transformer", BATCH - 1),  # L == B of the neighbouring (removed) batch
]


def _clipped_sum(engine: DPSGD, x: Tensor, y: Tensor) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = engine.clipped_batch(x, y)
    return torch.cat([t.flatten() for t in batch.grad_sum.values()])


@pytest.mark.parametrize("per_layer", [False, True], ids=["flat", "per_layer"])
@pytest.mark.parametrize("clipping", ["ghost", "per_sample"])
@pytest.mark.parametrize(("name", "length"), CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_one_example_moves_the_clipped_sum_by_at_most_c(
    name: str, length: int, clipping: str, per_layer: bool
) -> None:
    model, x = _case(name, length)
    model = model.double()
    if x.is_floating_point():
        x = x.double()
    y = torch.arange(BATCH + 1) % 3
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    engine = DPSGD(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        _loss,
        noise_multiplier=1.0,
        max_grad_norm=C,
        expected_batch_size=BATCH,
        clipping=clipping,  # type: ignore[arg-type]
        per_layer_thresholds=split_threshold(names, C) if per_layer else None,
    )
    full = _clipped_sum(engine, x[:BATCH], y[:BATCH])
    added = _clipped_sum(engine, x, y)
    distances = [torch.linalg.vector_norm(added - full).item()]
    for j in range(BATCH):
        keep = [i for i in range(BATCH) if i != j]
        distances.append(torch.linalg.vector_norm(full - _clipped_sum(engine, x[keep], y[keep])))
    distances = [float(d) for d in distances]
    assert max(distances) <= C * (1 + 1e-9), (name, clipping, distances)
    # every example is clipped: flat clipping reaches the bound (up to the 1e-6 added to norms)
    if not per_layer:
        assert min(distances) >= C * (1 - 1e-4), distances


class UnexpandedPositions(nn.Module):
    """Position embedding called on arange(L), not expanded over the batch (dim 0 is not it)."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(11, 4)
        self.positions = nn.Embedding(length, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, tokens: Tensor) -> Tensor:
        positions = self.positions(torch.arange(tokens.shape[-1]))
        return self.head(torch.tanh(self.tokens(tokens) + positions).mean(-2))


@pytest.mark.parametrize("length", [BATCH, BATCH - 1, 4])
def test_a_layer_called_off_the_batch_axis_is_refused_by_ghost_and_bounded_by_auto(
    length: int,
) -> None:
    model = UnexpandedPositions(length).double()
    x = torch.randint(0, 11, (BATCH + 1, length), generator=torch.Generator().manual_seed(2))
    y = torch.arange(BATCH + 1) % 3

    def engine(clipping: str) -> DPSGD:
        return DPSGD(
            model,
            torch.optim.SGD(model.parameters(), lr=0.0),
            _loss,
            noise_multiplier=1.0,
            max_grad_norm=C,
            expected_batch_size=BATCH,
            clipping=clipping,  # type: ignore[arg-type]
        )

    with pytest.raises(GhostClippingError) as caught:
        _clipped_sum(engine("ghost"), x[:BATCH], y[:BATCH])
    assert "\n" not in str(caught.value) and "'positions'" in str(caught.value)
    auto = engine("auto")
    full = _clipped_sum(auto, x[:BATCH], y[:BATCH])
    assert auto.clipping == "per_sample"
    for j in range(BATCH):
        keep = [i for i in range(BATCH) if i != j]
        distance = torch.linalg.vector_norm(full - _clipped_sum(auto, x[keep], y[keep]))
        assert C * (1 - 1e-4) <= float(distance) <= C * (1 + 1e-9)
