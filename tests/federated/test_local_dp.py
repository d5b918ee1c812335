"""DP-SGD inside a federated client (Abadi et al. 2016, Alg. 1) through `local_update(...,
privacy=...)`: per-example gradients equal Opacus's per-sample gradients and an explicit loop,
clipping is over all parameters together, the noise has standard deviation σC/B per coordinate,
FedAvg steps are DP-SGD steps, the same generator gives the same update, and what cannot be
done privately is refused in one line."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from torch import Tensor, nn

from privacylab.federated import FederatedError, LocalPrivacy, LocalTraining, local_update
from privacylab.federated.local import cross_entropy, private_gradient
from privacylab.models import build_model

TINY = 1e-12
"""A noise multiplier whose noise (σC/B per coordinate) is far below float32 resolution."""


def _setup(
    name: str = "lenet", seed: int = 0, n: int = 6, width: int = 32
) -> tuple[nn.Module, dict[str, Tensor], Tensor, Tensor]:
    options = {"widths": (width,)} if name == "mlp" else {}
    model = build_model(name, (1, 8, 8), 10, seed=seed, **options)
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.rand(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    return model, state, x, y


def _loop_gradients(model: nn.Module, x: Tensor, y: Tensor) -> list[dict[str, Tensor]]:
    """Each example's gradient, one backward pass per example (the explicit oracle)."""
    out = []
    for i in range(len(x)):
        loss = cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        grads = torch.autograd.grad(loss, list(model.parameters()))
        out.append({k: g for (k, _), g in zip(model.named_parameters(), grads, strict=True)})
    return out


def _opacus_gradients(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """Opacus's per-sample gradients (`GradSampleModule`, sum reduction) of the same loss."""
    wrapped = GradSampleModule(copy.deepcopy(model), batch_first=True, loss_reduction="sum")
    F.cross_entropy(wrapped(x), y, reduction="sum").backward()
    return {k: p.grad_sample.detach() for k, p in wrapped._module.named_parameters()}


def _clipped_mean(per_example: list[dict[str, Tensor]], clip: float) -> dict[str, Tensor]:
    total: dict[str, Tensor] = {}
    for grads in per_example:
        norm = torch.sqrt(sum((g**2).sum() for g in grads.values()))
        factor = min(1.0, clip / float(norm))
        for k, g in grads.items():
            total[k] = total.get(k, 0) + factor * g
    return {k: v / len(per_example) for k, v in total.items()}


def _close(actual: Tensor, expected: Tensor, rtol: float = 1e-4) -> None:
    """Equal up to float32 summation order: `rtol` relative to the tensor's largest entry."""
    scale = float(expected.abs().max()) or 1.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * scale)


def _norms(per_example: list[dict[str, Tensor]]) -> Tensor:
    return torch.stack([torch.sqrt(sum((g**2).sum() for g in d.values())) for d in per_example])


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_per_example_gradients_match_opacus_and_an_explicit_loop() -> None:
    model, state, x, y = _setup()
    loop = _loop_gradients(model, x, y)
    opacus = _opacus_gradients(model, x, y)
    for i, grads in enumerate(loop):
        for k, g in grads.items():
            _close(opacus[k][i], g)
    # a clip between the smallest and largest norm: some examples are clipped, some are not
    norms = _norms(loop)
    clip = float(norms.median())
    assert (norms > clip).any() and (norms < clip).any()
    expected = _clipped_mean(loop, clip)
    sent = local_update(
        model,
        state,
        x,
        y,
        LocalTraining(),
        privacy=LocalPrivacy(clip, TINY),
        generator=torch.Generator().manual_seed(0),
    )
    for k in state:
        _close(sent[k], expected[k])


def test_clipping_is_over_all_parameters_together_and_off_when_the_clip_is_large() -> None:
    model, state, x, y = _setup("mlp", seed=1)
    plain = local_update(model, state, x, y, LocalTraining())
    loose = local_update(
        model,
        state,
        x,
        y,
        LocalTraining(),
        privacy=LocalPrivacy(1e6, TINY),
        generator=torch.Generator().manual_seed(0),
    )
    for k in state:
        _close(loose[k], plain[k])
    # a clip far below every norm: each example contributes a unit-direction times C, so the
    # per-example contributions (B * update, here with B = 1) have norm exactly C
    tight = LocalPrivacy(1e-3, TINY)
    one = local_update(
        model,
        state,
        x[:1],
        y[:1],
        LocalTraining(),
        privacy=tight,
        generator=torch.Generator().manual_seed(0),
    )
    norm = torch.sqrt(sum((g**2).sum() for g in one.values()))
    assert float(norm) == pytest.approx(1e-3, rel=1e-4)
    alone = _loop_gradients(model, x[:1], y[:1])
    direction = float(_norms(alone)[0])
    for k in state:  # the direction of that example's unclipped gradient
        _close(one[k] / 1e-3, alone[0][k] / direction)


def test_noise_has_standard_deviation_sigma_clip_over_batch_size() -> None:
    model, state, x, y = _setup("mlp", seed=2, n=8, width=256)
    privacy = LocalPrivacy(clip=0.5, noise_multiplier=1.3)
    clean = _clipped_mean(_loop_gradients(model, x, y), 0.5)
    sent = local_update(
        model,
        state,
        x,
        y,
        LocalTraining(),
        privacy=privacy,
        generator=torch.Generator().manual_seed(5),
    )
    noise = torch.cat([(sent[k] - clean[k]).flatten() for k in state])
    assert noise.numel() > 15_000
    assert float(noise.std()) == pytest.approx(1.3 * 0.5 / 8, rel=0.03)
    assert abs(float(noise.mean())) < 4 * 1.3 * 0.5 / 8 / noise.numel() ** 0.5


def test_fedavg_steps_are_dp_sgd_steps_and_the_seed_fixes_the_update() -> None:
    model, state, x, y = _setup(seed=3, n=5)
    training = LocalTraining("fedavg", epochs=2, batch_size=2, lr=0.1)
    privacy = LocalPrivacy(clip=0.2, noise_multiplier=0.8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state_before = {k: v.clone() for k, v in state.items()}
    sent = local_update(
        model, state, x, y, training, privacy=privacy, generator=torch.Generator().manual_seed(9)
    )
    again = local_update(
        model, state, x, y, training, privacy=privacy, generator=torch.Generator().manual_seed(9)
    )
    other = local_update(
        model, state, x, y, training, privacy=privacy, generator=torch.Generator().manual_seed(10)
    )
    # by hand: the same generator, one private gradient per local batch, plain SGD steps
    gen = torch.Generator().manual_seed(9)
    params = dict(state)
    buffers = dict(model.named_buffers())
    for start, stop in training.batches(len(x)):
        grads = private_gradient(model, params, buffers, x[start:stop], y[start:stop], privacy, gen)
        params = {k: params[k] - 0.1 * grads[k] for k in params}
    assert len(training.batches(len(x))) == 6
    for k in state:
        _close(sent[k], state[k] - params[k])
        assert torch.equal(sent[k], again[k])
        assert not sent[k].requires_grad
    assert any(not torch.equal(sent[k], other[k]) for k in state)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    for k, v in state.items():
        assert torch.equal(v, state_before[k])


def test_soft_labels_follow_the_same_path() -> None:
    model, state, x, y = _setup("mlp", seed=4, n=4)
    soft = F.one_hot(y, 10).float() * 0.8 + 0.02
    loop = _loop_gradients(model, x, soft)
    sent = local_update(
        model,
        state,
        x,
        soft,
        LocalTraining(),
        privacy=LocalPrivacy(float(_norms(loop).median()), TINY),
        generator=torch.Generator().manual_seed(0),
    )
    expected = _clipped_mean(loop, float(_norms(loop).median()))
    for k in state:
        _close(sent[k], expected[k])


def test_what_cannot_be_done_privately_is_one_line() -> None:
    model, state, x, y = _setup()
    privacy = LocalPrivacy(1.0, 1.0)
    gen = torch.Generator().manual_seed(0)
    cases = [
        ({"privacy": privacy, "generator": gen, "create_graph": True}, "create_graph=True"),
        ({"privacy": privacy}, "pass generator"),
        ({"privacy": (1.0, 1.0), "generator": gen}, "privacy must be a LocalPrivacy"),
    ]
    for kwargs, fragment in cases:
        with pytest.raises(FederatedError) as info:
            local_update(model, state, x, y, LocalTraining(), **kwargs)  # type: ignore[arg-type]
        assert fragment in str(info.value) and "\n" not in str(info.value)
    normed = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))
    normed_state = {k: v.detach().clone() for k, v in normed.named_parameters()}
    with pytest.raises(FederatedError, match="BatchNorm mixes the examples"):
        local_update(normed, normed_state, x, y, LocalTraining(), privacy=privacy, generator=gen)
    # without privacy nothing changes: BatchNorm models still train as before
    assert set(local_update(normed, normed_state, x, y, LocalTraining())) == set(normed_state)
