"""The DP-SGD step: equals SGD without privacy, noise of the right size, hooks, errors."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from _dp_models import Transformer, cnn, cross_entropy, mlp
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from privacylab.training.dp import (
    DPSGD,
    DPSGDError,
    GhostClippingError,
    PoissonSampler,
    StepInfo,
    secure_standard_normal,
    split_threshold,
)

STRATEGIES = ["ghost", "per_sample"]


def _engine(model: nn.Module, lr: float = 0.1, loss_fn=cross_entropy, **options) -> DPSGD:
    settings = dict(noise_multiplier=0.0, max_grad_norm=1e6, expected_batch_size=8.0)
    settings.update(options)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return DPSGD(model, optimizer, loss_fn, **settings)


def _batch(n: int = 6) -> tuple[Tensor, Tensor]:
    return torch.randn(n, 1, 12, 12), torch.randint(0, 5, (n,))


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("clipping", STRATEGIES)
@pytest.mark.parametrize("build", [mlp, cnn])
def test_no_noise_no_clipping_is_sgd_on_sum_over_expected_batch(clipping, build) -> None:
    model = build()
    reference = copy.deepcopy(model)
    x, y = _batch()
    result = _engine(model, clipping=clipping).step(x, y)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses = cross_entropy(reference(x), y)
    (losses.sum() / 8.0).backward()
    optimizer.step()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert result.batch_size == 6 and result.norms.shape == (6,)
    assert result.loss_mean == pytest.approx(losses.mean().item(), rel=1e-6)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("clipping", STRATEGIES)
def test_noise_std_is_sigma_c_over_expected_batch(clipping) -> None:
    model = nn.Linear(40, 50)
    engine = _engine(
        model,
        lr=1.0,
        loss_fn=lambda out, y: (out * 0).sum(1),
        noise_multiplier=2.0,
        max_grad_norm=0.5,
        expected_batch_size=4.0,
        clipping=clipping,
        generator=torch.Generator().manual_seed(1),
    )
    x, y = torch.zeros(5, 40), torch.zeros(5)
    updates = []
    for _ in range(20):
        before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        engine.step(x, y)
        after = torch.cat([p.detach().flatten() for p in model.parameters()])
        updates.append(before - after)
    updates = torch.cat(updates)
    assert updates.std().item() == pytest.approx(2.0 * 0.5 / 4.0, rel=0.03)
    assert abs(updates.mean().item()) < 0.01
    assert engine.steps == 20


def test_same_generator_seed_same_model() -> None:
    models = []
    for _ in range(2):
        torch.manual_seed(3)
        model = mlp()
        engine = _engine(
            model,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            generator=torch.Generator().manual_seed(7),
        )
        torch.manual_seed(4)
        for _ in range(3):
            engine.step(*_batch())
        models.append(model)
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("clipping", STRATEGIES)
def test_virtual_batches_equal_one_physical_batch(clipping) -> None:
    model = cnn()
    split = copy.deepcopy(model)
    x, y = _batch(7)
    one = _engine(model, clipping=clipping, max_grad_norm=0.05).step(x, y)
    many = _engine(split, clipping=clipping, max_grad_norm=0.05, physical_batch_size=2).step(x, y)
    for p, q in zip(model.parameters(), split.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(one.norms, many.norms)
    assert many.batch_size == 7
    assert one.loss_mean == pytest.approx(many.loss_mean)


@pytest.mark.parametrize("clipping", STRATEGIES)
def test_empty_batch_adds_noise_and_steps(clipping) -> None:
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    engine = _engine(model, clipping=clipping, noise_multiplier=1.0, max_grad_norm=1.0)
    x, y = _batch(6)
    none = torch.zeros(0, dtype=torch.long)
    result = engine.step(x[none], y[none])
    assert result.batch_size == 0 and result.norms.shape == (0,)
    assert result.loss_mean != result.loss_mean
    assert engine.steps == 1
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_poisson_batches_with_empty_ones_train() -> None:
    sampler = PoissonSampler(10, 0.05, torch.Generator().manual_seed(0))
    x, y = _batch(10)
    engine = _engine(mlp(), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=0.5)
    sizes = [engine.step(x[i], y[i]).batch_size for _ in range(3) for i in sampler]
    assert 0 in sizes and max(sizes) > 0
    assert engine.steps == len(sizes) == 3 * sampler.steps_per_epoch


@pytest.mark.parametrize("clipping", STRATEGIES)
def test_step_hook_sees_clipped_sum_and_noise(clipping) -> None:
    model = cnn()
    engine = _engine(model, clipping=clipping, noise_multiplier=0.7, max_grad_norm=0.1)
    seen: list[StepInfo] = []

    def hook(info: StepInfo) -> None:
        seen.append(info)
        for name, p in model.named_parameters():
            applied = (info.clipped_sum[name] + info.noise[name]) / 8.0
            torch.testing.assert_close(p.grad, applied)
            assert info.noise[name].abs().sum() > 0

    handle = engine.add_step_hook(hook)
    x, y = _batch()
    reference = engine.clipped_batch(x, y)
    result = engine.step(x, y)
    assert len(seen) == 1 and seen[0].step == 1 and seen[0].batch_size == 6
    for name, value in reference.grad_sum.items():
        torch.testing.assert_close(seen[0].clipped_sum[name], value, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(seen[0].norms, result.norms)
    total = torch.sqrt(sum(v.pow(2).sum() for v in seen[0].noise.values()))
    assert total > 0
    handle.remove()
    engine.step(x, y)
    assert len(seen) == 1


def test_hook_does_not_change_the_trajectory() -> None:
    runs = []
    for watch in (False, True):
        torch.manual_seed(0)
        model = mlp()
        engine = _engine(
            model,
            noise_multiplier=1.0,
            max_grad_norm=0.1,
            generator=torch.Generator().manual_seed(1),
        )
        if watch:
            engine.add_step_hook(lambda info: None)
        engine.step(*_batch())
        runs.append(model)
    for p, q in zip(runs[0].parameters(), runs[1].parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.factor = nn.Parameter(torch.ones(5))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.factor


def _with_scale() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(144, 5), Scale())


class NoisyScale(nn.Module):
    """A layer without a ghost rule whose forward draws random numbers: the exact per-layer
    fallback cannot recompute it one example at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.factor = nn.Parameter(torch.ones(5))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.dropout(x * self.factor, 0.5, self.training)


def test_layer_without_rule_is_clipped_by_the_per_layer_fallback() -> None:
    engine = _engine(_with_scale(), clipping="ghost")
    engine.step(*_batch())
    assert engine.clipping == "ghost"


def test_layer_the_fallback_cannot_recompute_is_named() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(144, 5), NoisyScale())
    with pytest.raises(GhostClippingError, match=r"'2' \(NoisyScale\).*random") as caught:
        _engine(model, clipping="ghost").step(*_batch())
    assert "\n" not in str(caught.value)


def test_auto_falls_back_to_per_sample_and_warns_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = _engine(
            nn.Sequential(nn.Flatten(), nn.Linear(144, 5), NoisyScale()), clipping="auto"
        )
        engine.step(*_batch())
        engine.step(*_batch())
    assert engine.clipping == "per_sample"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "NoisyScale" in messages[0] and "per_sample" in messages[0]
    assert _engine(mlp(), clipping="auto").clipping == "ghost"
    assert _engine(_with_scale(), clipping="auto").clipping == "ghost"


def test_batch_norm_is_rejected_with_a_hint() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(200, 5))
    for clipping in ("ghost", "per_sample", "auto"):
        with pytest.raises(DPSGDError, match="GroupNorm"):
            _engine(model, clipping=clipping)


def test_tied_weights_and_grouped_conv_stay_on_ghost() -> None:
    """Exactness against brute force is in test_tied_weights.py and test_layer_battery.py."""
    tied = nn.Sequential(nn.Embedding(5, 5), nn.Linear(5, 5))
    tied[1].weight = tied[0].weight
    engine = _engine(tied, clipping="auto")
    engine.step(torch.randint(0, 5, (4,)), torch.randint(0, 5, (4,)))
    assert engine.clipping == "ghost"
    grouped = nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4 * 10 * 10, 5))
    engine = _engine(grouped, clipping="auto")
    engine.step(torch.randn(4, 2, 12, 12), torch.randint(0, 5, (4,)))
    assert engine.clipping == "ghost"


class TiedOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 5)
        self.unused = nn.Linear(5, 5)

    def forward(self, tokens: Tensor) -> Tensor:
        return nn.functional.linear(self.embed(tokens).mean(1), self.embed.weight)


def test_parameter_used_outside_its_layer_is_an_error_for_ghost() -> None:
    x, y = torch.randint(0, 7, (4, 3)), torch.randint(0, 7, (4,))
    with pytest.raises(GhostClippingError, match=r"embed\.weight is used outside"):
        _engine(TiedOutput(), clipping="ghost").step(x, y)
    model = TiedOutput()
    before = copy.deepcopy(model)
    _engine(model, clipping="per_sample").step(x, y)
    assert torch.equal(model.unused.weight, before.unused.weight)
    assert not torch.equal(model.embed.weight, before.embed.weight)


def test_layer_input_modified_in_place_is_an_error_for_ghost() -> None:
    class Sneaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(4, 4)
            self.second = nn.Linear(4, 3)

        def forward(self, x: Tensor) -> Tensor:
            h = self.first(x)
            out = self.second(h)
            h.mul_(2.0)
            return out

    with pytest.raises(GhostClippingError, match=r"'second' \(Linear\) was modified in place"):
        _engine(Sneaky(), clipping="ghost").step(torch.randn(5, 4), torch.randint(0, 3, (5,)))


def test_layer_not_called_gets_zero_clipped_sum() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 3))
    model.forward = lambda x: model[0](x)
    engine = _engine(model, clipping="ghost")
    batch = engine.clipped_batch(torch.randn(5, 4), torch.randint(0, 3, (5,)))
    assert (
        batch.grad_sum["1.weight"].abs().sum() == 0 and batch.grad_sum["0.weight"].abs().sum() > 0
    )


def test_unbatched_layer_call_is_an_error_for_ghost() -> None:
    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(7, 5)
            self.head = nn.Linear(5, 5)

        def forward(self, tokens: Tensor) -> Tensor:
            return self.head((self.embed(torch.arange(7)) + tokens[..., None]).mean(1))

    x, y = torch.randn(4, 7), torch.randint(0, 5, (4,))
    with pytest.raises(GhostClippingError, match="batch-first"):
        _engine(Positions(), clipping="ghost").step(x, y)
    _engine(Positions(), clipping="per_sample").step(x, y)
    engine = _engine(Positions(), clipping="auto")
    assert engine.clipping == "ghost"
    with pytest.warns(UserWarning, match="switches to per_sample"):
        assert engine.step(x, y).batch_size == 4
    assert engine.clipping == "per_sample" and engine.steps == 1


@pytest.mark.parametrize("clipping", STRATEGIES)
def test_reduced_loss_is_rejected(clipping) -> None:
    engine = _engine(
        mlp(),
        loss_fn=nn.CrossEntropyLoss(),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=6,
        clipping=clipping,
    )
    with pytest.raises(DPSGDError, match="reduction='none'"):
        engine.step(*_batch())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": float("nan")}, "noise_multiplier"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
        ({"expected_batch_size": 0}, "expected_batch_size"),
        ({"clipping": "fast"}, "clipping"),
        ({"physical_batch_size": 0}, "physical_batch_size"),
        ({"per_layer_thresholds": [1.0]}, "per_layer_thresholds"),
        ({"per_layer_thresholds": {"1.weight": 1.0}}, "no threshold"),
        ({"secure_noise": True, "generator": torch.Generator()}, "secure_noise"),
    ],
)
def test_bad_settings_get_one_clear_line(options, message) -> None:
    with pytest.raises(DPSGDError, match=message) as error:
        _engine(mlp(), **options)
    assert "\n" not in str(error.value)


def test_per_layer_thresholds_must_have_norm_c() -> None:
    model = mlp()
    names = [n for n, _ in model.named_parameters()]
    engine = _engine(model, max_grad_norm=2.0, per_layer_thresholds=split_threshold(names, 2.0))
    assert engine.thresholds.per_layer
    with pytest.raises(DPSGDError, match="L2 norm"):
        _engine(mlp(), max_grad_norm=1.0, per_layer_thresholds=split_threshold(names, 2.0))


def test_secure_noise() -> None:
    z = secure_standard_normal(200_001)
    assert z.shape == (200_001,) and z.dtype == torch.float32
    assert abs(z.mean().item()) < 0.01
    assert z.std().item() == pytest.approx(1.0, abs=0.01)
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    _engine(model, noise_multiplier=1.0, max_grad_norm=1.0, secure_noise=True).step(*_batch())
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@settings(max_examples=25, deadline=None)
@given(
    clip=st.floats(1e-3, 10.0),
    scale=st.floats(1e-3, 1e3),
    clipping=st.sampled_from(STRATEGIES),
    per_layer=st.booleans(),
)
def test_clipped_example_norm_is_at_most_c(clip, scale, clipping, per_layer) -> None:
    torch.manual_seed(0)
    model = Transformer(11, 5, 8, 2, 1, 3).double()
    names = [n for n, _ in model.named_parameters()]
    thresholds = split_threshold(names, clip) if per_layer else None
    engine = _engine(
        model,
        lr=0.0,
        loss_fn=lambda out, y: scale * cross_entropy(out, y),
        noise_multiplier=0.0,
        max_grad_norm=clip,
        expected_batch_size=1,
        clipping=clipping,
        per_layer_thresholds=thresholds,
    )
    x, y = torch.randint(0, 11, (3, 5)), torch.randint(0, 3, (3,))
    for i in range(3):
        clipped = engine.clipped_batch(x[i : i + 1], y[i : i + 1]).grad_sum
        total = torch.sqrt(sum(g.pow(2).sum() for g in clipped.values()))
        assert total <= clip * (1 + 1e-9)
        if per_layer:
            for name, g in clipped.items():
                assert g.norm() <= thresholds[name] * (1 + 1e-9)


def test_numpy_inputs_give_the_tensor_step() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 1, 12, 12)), rng.integers(0, 5, 6)
    runs = []
    for as_numpy in (True, False):
        torch.manual_seed(0)
        model = mlp()
        engine = _engine(model, noise_multiplier=1.0, generator=torch.Generator().manual_seed(1))
        if as_numpy:
            engine.step(x, y)  # float64 features take the weights' float32
        else:
            engine.step(torch.tensor(x, dtype=torch.float32), torch.tensor(y))
        runs.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(DPSGDError, match="must be tensors or arrays, got str"):
        _engine(mlp()).step("not data", y)
