"""per_sample (torch.func.vmap) failures are one-line DPSGDErrors that name the layer and the fix;
clipping='auto' reports both what stopped ghost clipping and what stopped per_sample."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from privacylab.training.dp import DPSGD, ClipThresholds, DPSGDError, GhostClipping


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, target, reduction="none")


class Recurrent(nn.Module):
    def __init__(self, cell: type[nn.RNNBase]) -> None:
        super().__init__()
        self.rnn = cell(4, 5, batch_first=True)
        self.fc = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0][:, -1])


class Bag(nn.Module):
    def __init__(self, **options: object) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4, **options)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embed(x).mean(1))


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = checkpoint(lambda h: torch.tanh(self.inner(h)), x, use_reentrant=False)
        return self.fc(hidden)


def _step(model: nn.Module, x: torch.Tensor, clipping: str) -> DPSGD:
    engine = DPSGD(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _loss,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=len(x),
        clipping=clipping,  # type: ignore[arg-type]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.step(x, torch.randint(0, 3, (len(x),)))
    return engine


@pytest.mark.parametrize("clipping", ["per_sample", "auto"])
@pytest.mark.parametrize(
    ("cell", "dtype", "replacement"),
    [
        (nn.GRU, torch.float32, "DPGRU"),
        (nn.RNN, torch.float32, "DPRNN"),
        (nn.LSTM, torch.float64, "DPLSTM"),
    ],
)
def test_stock_recurrent_layers_get_one_line_naming_the_replacement(
    cell: type[nn.RNNBase], dtype: torch.dtype, replacement: str, clipping: str
) -> None:
    torch.manual_seed(0)
    model = Recurrent(cell).to(dtype)
    with pytest.raises(DPSGDError) as caught:
        _step(model, torch.randn(6, 7, 4, dtype=dtype), clipping)
    message = str(caught.value)
    assert "\n" not in message
    assert replacement in message and "--fix" in message
    if clipping == "auto":
        assert "ghost clipping:" in message


@pytest.mark.parametrize("options", [{"max_norm": 1.0}, {"sparse": True}])
def test_embedding_options_vmap_cannot_run_are_named(options: dict[str, object]) -> None:
    torch.manual_seed(0)
    with pytest.raises(DPSGDError) as caught:
        _step(Bag(**options), torch.randint(0, 10, (6, 5)), "per_sample")
    message = str(caught.value)
    assert "\n" not in message and "max_norm=None and sparse=False" in message


def test_activation_checkpointing_is_exact_under_ghost_and_refused_by_per_sample() -> None:
    torch.manual_seed(0)
    model = Checkpointed().double()
    x = torch.randn(6, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (6,))
    names = [n for n, _ in model.named_parameters()]
    clipped = GhostClipping(model, _loss, ClipThresholds(0.1, names)).clip((x,), y)
    brute = []
    for i in range(6):
        grads = torch.autograd.grad(
            _loss(model(x[i : i + 1]), y[i : i + 1]).sum(), list(model.parameters())
        )
        brute.append(torch.sqrt(sum((g**2).sum() for g in grads)))
    torch.testing.assert_close(clipped.norms, torch.stack(brute), rtol=1e-10, atol=1e-12)
    with pytest.raises(DPSGDError, match="activation checkpointing works with clipping='ghost'"):
        _step(Checkpointed(), torch.randn(6, 4), "per_sample")
