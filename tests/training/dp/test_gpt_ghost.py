"""Ghost clipping (Li et al. 2022, Sec. 4; with Bu et al. 2023's book-keeping) on the causal
language model of the LM family: each document's gradient norm equals the norm of its
gradient computed alone by autograd (a python loop, PAD targets ignored), and one DP-SGD step
with ghost clipping equals one with per-sample (vmap) clipping."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from privacylab.data.tokenizer import BOS, EOS, PAD, VOCAB_SIZE
from privacylab.lm import IGNORE, next_token_loss
from privacylab.models.gpt import CausalLM
from privacylab.training.dp import (
    DPSGD,
    ClipThresholds,
    GhostClipping,
    PerSampleClipping,
    StepInfo,
)

B, CONTEXT = 5, 12


@pytest.fixture(autouse=True)
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _model(seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    model = CausalLM(VOCAB_SIZE, CONTEXT, dim=8, heads=2, blocks=2, mlp_ratio=2)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.add_(0.3 * torch.randn_like(module.weight))
                module.bias.add_(0.3 * torch.randn_like(module.bias))
    return model


def _batch(seed: int = 1) -> tuple[Tensor, Tensor]:
    """Documents of different lengths (BOS + bytes + EOS, PAD after), one repeating a byte."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.full((B, CONTEXT + 1), PAD, dtype=torch.int64)
    for i, length in enumerate([3, 11, 6, 1, 8]):
        body = torch.randint(32, 127, (length,), generator=gen)
        if i == 4:
            body[:] = 65
        rows[i, : length + 2] = torch.cat([torch.tensor([BOS]), body, torch.tensor([EOS])])
    x, y = rows[:, :-1], rows[:, 1:].clone()
    y[y == PAD] = IGNORE
    return x, y


def _loop_gradients(model: nn.Module, x: Tensor, y: Tensor) -> list[dict[str, Tensor]]:
    """Independent oracle: each document's gradient of its own loss, computed alone."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for i in range(len(x)):
        logits = model(x[i : i + 1])
        keep = y[i] != IGNORE
        loss = nn.functional.cross_entropy(logits[0][keep], y[i][keep])
        grads.append(dict(zip(names, torch.autograd.grad(loss, params), strict=True)))
    return grads


def _norm(grads: dict[str, Tensor]) -> Tensor:
    return torch.sqrt(sum((g**2).sum() for g in grads.values()))


def test_ghost_norms_and_clipped_sum_match_a_loop_of_single_documents() -> None:
    model = _model()
    x, y = _batch()
    loop = _loop_gradients(model, x, y)
    norms = torch.stack([_norm(g) for g in loop])
    clip = float(norms.median())
    thresholds = ClipThresholds(clip, [n for n, _ in model.named_parameters()])
    ghost = GhostClipping(model, next_token_loss, thresholds).clip((x,), y)
    torch.testing.assert_close(ghost.norms, norms, rtol=1e-5, atol=0)
    assert (norms > clip).any() and (norms < clip).any()
    for name, summed in ghost.grad_sum.items():
        want = sum(g[name] * min(1.0, clip / float(n)) for g, n in zip(loop, norms, strict=True))
        assert float((summed - want).norm() / want.norm().clamp_min(1e-12)) < 1e-5, name
    per_sample = PerSampleClipping(model, next_token_loss, thresholds).clip((x,), y)
    torch.testing.assert_close(per_sample.norms, norms, rtol=1e-5, atol=0)


def test_ghost_ignores_padding_targets() -> None:
    """A document's norm does not change when more PAD is appended after its EOS."""
    model = _model(3)
    x, y = _batch(4)
    thresholds = ClipThresholds(1.0, [n for n, _ in model.named_parameters()])
    short = GhostClipping(model, next_token_loss, thresholds).clip((x[:, :9],), y[:, :9])
    full = GhostClipping(model, next_token_loss, thresholds).clip((x,), y)
    fits = (y[:, 9:] == IGNORE).all(dim=1)
    assert fits.sum() >= 2
    torch.testing.assert_close(short.norms[fits], full.norms[fits], rtol=1e-5, atol=0)


def _one_step(clipping: str, sigma: float, optimizer: str) -> tuple[CausalLM, StepInfo]:
    x, y = _batch(7)
    model = _model(5)
    opt = (
        torch.optim.Adam(model.parameters(), lr=1e-2)
        if optimizer == "adam"
        else torch.optim.SGD(model.parameters(), lr=1.0)
    )
    engine = DPSGD(
        model,
        opt,
        next_token_loss,
        noise_multiplier=sigma,
        max_grad_norm=0.5,
        expected_batch_size=B,
        clipping=clipping,
        generator=torch.Generator().manual_seed(11),
        sample_rate=0.5,
    )
    assert engine.clipping == clipping
    infos: list[StepInfo] = []
    engine.add_step_hook(infos.append)
    engine.step((x,), y)
    return model, infos[0]


def test_one_noiseless_dp_step_ghost_equals_per_sample() -> None:
    """Adam after one clipped step (sigma = 0): the same weights either way, all moved."""
    ghost, _ = _one_step("ghost", 0.0, "adam")
    per_sample, _ = _one_step("per_sample", 0.0, "adam")
    before = dict(_model(5).named_parameters())
    for name, p in ghost.named_parameters():
        q = dict(per_sample.named_parameters())[name]
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-9)
    assert any(not torch.equal(p, before[n]) for n, p in ghost.named_parameters())


def test_one_noisy_dp_step_ghost_equals_per_sample() -> None:
    """sigma > 0: the same clipped sums, noise of std sigma*C, and each update is exactly
    -(clipped sum + noise) / expected batch (plain SGD, lr 1). The two strategies draw the
    per-parameter noise in different orders, so their noise tensors are not compared."""
    steps = {c: _one_step(c, 0.7, "sgd") for c in ("ghost", "per_sample")}
    before = dict(_model(5).named_parameters())
    (_, ghost), (_, per_sample) = steps["ghost"], steps["per_sample"]
    for name in ghost.clipped_sum:
        torch.testing.assert_close(
            ghost.clipped_sum[name], per_sample.clipped_sum[name], rtol=1e-6, atol=1e-12
        )
    for model, info in steps.values():
        noise = torch.cat([n.reshape(-1) for n in info.noise.values()])
        assert 0.3 < float(noise.std()) < 0.4
        for name, p in model.named_parameters():
            want = before[name] - (info.clipped_sum[name] + info.noise[name]) / B
            torch.testing.assert_close(p, want, rtol=1e-9, atol=1e-12)
