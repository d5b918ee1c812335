"""The DP-SGD path of the penalty encodings (`_penalty.SlotModule`): each example's
per-example gradient, as DP-SGD's vmap computes it, is the autograd gradient of that example's
own cross-entropy plus its own block's penalty (an independent re-derivation with
torch.corrcoef / the sign formula); and the encodings trained under DP-SGD decode above chance
at a vanishing noise multiplier and at chance under strong noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from privacylab.attacks.memorization import (
    MemorizationError,
    MemorizationTask,
    choose_secret,
    run_memorization,
    train_encoded,
)
from privacylab.attacks.memorization._penalty import SlotModule, parameter_slice, slots
from privacylab.attacks.memorization.correlation import CorrelatedValueEncoding
from privacylab.attacks.memorization.sign import SignEncoding
from privacylab.attacks.poisoning.recipe import VictimRecipe
from privacylab.data import load_dataset
from privacylab.models import ModelSpec
from privacylab.target import Access, Target
from privacylab.training import PrivacyConfig, TrainConfig, train
from privacylab.training.dp.clipping import ClipThresholds
from privacylab.training.dp.per_sample import PerSampleClipping

RECIPE = VictimRecipe(
    model_options={"widths": [64]}, epochs=6, private_batch_size=32, private_lr=1e-2
)


@pytest.fixture(scope="module")
def digits():
    torch.set_num_threads(1)
    data = load_dataset("digits")
    order = np.random.default_rng(0).permutation(len(data))
    return data.subset(order[:500]), data.subset(order[1200:])


def _oracle_term(attack, model, secret, k: int) -> torch.Tensor:
    """Block k's penalty of `model`'s parameters, re-derived without `_penalty`'s terms."""
    m = secret.layout.bits_per_item if attack.name == "sign" else secret.layout.values_per_item
    theta = parameter_slice(list(model.parameters()), attack.offset + k * m, m)
    if attack.name == "sign":
        s = torch.as_tensor(secret.bits()[k * m : (k + 1) * m].astype(np.float32)) * 2 - 1
        return torch.clamp(-theta * s, min=0).sum() / m
    values = torch.as_tensor(secret.values[k].astype(np.float32))
    return -torch.corrcoef(torch.stack([theta, values]))[0, 1]


@pytest.mark.parametrize(
    "attack", [CorrelatedValueEncoding(strength=2.0, offset=5), SignEncoding(strength=30.0)]
)
def test_per_example_gradient_is_that_examples_own_loss(digits, attack):
    train_data, _ = digits
    secret = choose_secret(train_data, [4, 9, 11], 4)
    model = ModelSpec("mlp", (1, 8, 8), 10, {"widths": [16]}).build(seed=1)
    plan = attack.encode(secret, model, train_data, private=True)
    wrapper = plan.model
    assert isinstance(wrapper, SlotModule) and plan.clipping == "per_sample"
    assert wrapper.scale == pytest.approx(attack.strength * len(train_data) / 3)
    assert plan.release(wrapper) is model
    (x, slot), y = plan.data
    assert torch.equal(slot[[4, 9, 11]], torch.tensor([0, 1, 2])) and int((slot >= 0).sum()) == 3
    rows = torch.tensor([9, 0, 11, 3, 4])
    wrapper.train()
    names = [n for n, _ in wrapper.named_parameters()]
    clipper = PerSampleClipping(wrapper, plan.loss_fn, ClipThresholds(1e9, names), chunk_size=2)
    batch = clipper.clip((x[rows], slot[rows]), y[rows])
    total = [torch.zeros_like(p) for p in model.parameters()]
    for position, row in enumerate(rows.tolist()):
        loss = F.cross_entropy(model(x[row : row + 1]), y[row : row + 1])
        k = int(slot[row])
        if k >= 0:
            loss = loss + wrapper.scale * _oracle_term(attack, model, secret, k)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        assert float(batch.norms[position]) == pytest.approx(float(norm), rel=1e-4)
        for t, g in zip(total, grads, strict=True):
            t += g
    for name, t in zip(names, total, strict=True):
        assert torch.allclose(batch.grad_sum[name], t, rtol=1e-4, atol=1e-6), name


def test_slot_module_is_the_model_in_evaluation(digits):
    train_data, _ = digits
    secret = choose_secret(train_data, [0, 1], 8)
    model = ModelSpec("mlp", (1, 8, 8), 10, {"widths": [16]}).build(seed=0)
    wrapper = CorrelatedValueEncoding().encode(secret, model, train_data, private=True).model
    x, slot = train_data.features[:6], slots(len(train_data), [0, 1])[:6]
    wrapper.eval()
    assert torch.equal(wrapper(x, slot), model(x))
    wrapper.train()
    out = wrapper(x, slot)
    assert out.shape == (6, 11) and torch.all(out[2:, 10] == 0) and torch.all(out[:2, 10] != 0)


def test_private_secret_rows_must_be_distinct_training_rows(digits):
    """Under DP-SGD each block rides on its own row: a row named twice (one block would never
    be carried) or a row outside the data is one line, not a silent loss or an IndexError."""
    train_data, _ = digits
    model = ModelSpec("mlp", (1, 8, 8), 10, {"widths": [16]}).build(seed=0)
    twice = choose_secret(train_data, [3, 3, 5], 4)
    with pytest.raises(MemorizationError, match="its own training row") as error:
        SignEncoding().encode(twice, model, train_data, private=True)
    assert "\n" not in str(error.value)
    SignEncoding().encode(twice, model, train_data, private=False)
    outside = choose_secret(train_data, [0, 499], 4)
    with pytest.raises(MemorizationError, match=r"\[0, 100\)"):
        SignEncoding().encode(outside, model, train_data.subset(np.arange(100)), private=True)


def _private_decode(attack, secret, train_data, test, sigma: float | None):
    """Train under DP-SGD: noise multiplier `sigma` directly (RDP accountant), or, with None,
    through `train_encoded` with RECIPE at ε = 1 (its calibrated σ); return the result and σ."""
    if sigma is None:
        model, summary = train_encoded(attack, secret, RECIPE.private(1.0), train_data)
        sigma = summary["privacy"]["noise_multiplier"]
    else:
        plan = attack.encode(
            secret, RECIPE.spec(train_data).build(seed=0), train_data, private=True
        )
        privacy = PrivacyConfig(noise_multiplier=sigma, clipping=plan.clipping, accountant="rdp")
        config = TrainConfig(
            epochs=RECIPE.epochs,
            batch_size=RECIPE.private_batch_size,
            lr=RECIPE.private_lr,
            optimizer="adam",
            privacy=privacy,
        )
        trained = train(plan.model, plan.data, config, loss_fn=plan.loss_fn)
        model = plan.release(trained.model).eval()
    task = MemorizationTask(secret.layout, tuple(train_data.input_shape), 10)
    levels = secret.layout.levels
    result = run_memorization(
        attack,
        Target(model, Access.WHITEBOX, 10),
        task,
        secret,
        clean_accuracy=0.0,
        honest_accuracy=0.0,
        candidates=np.rint(train_data.features.numpy().astype(np.float64) * levels) / levels,
    )
    return result, sigma


def _mean_abs_corr(result) -> float:
    pairs = zip(result.decoded, result.original, strict=True)
    return float(np.mean([abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) for a, b in pairs]))


def test_dp_sgd_noise_takes_the_encodings_to_chance(digits):
    """10 secret rows among 500, 6 epochs of Poisson batches of 32: at σ = 0.001 (clipping
    only, in effect) sign encoding still decodes above chance and correlation encoding keeps
    a visible correlation; at ε = 1 (σ about 2) both are at chance, like an honest model."""
    train_data, test = digits
    sign_secret = choose_secret(train_data, np.arange(10), 4)
    corr_secret = choose_secret(train_data, np.arange(10), 8)
    weak_sign, _ = _private_decode(SignEncoding(), sign_secret, train_data, test, 1e-3)
    strong_sign, sigma = _private_decode(SignEncoding(), sign_secret, train_data, test, None)
    assert sigma > 1.0
    assert weak_sign.bit_accuracy > 0.62
    assert abs(strong_sign.bit_accuracy - 0.5) < 0.03
    weak_corr, _ = _private_decode(CorrelatedValueEncoding(), corr_secret, train_data, test, 1e-3)
    strong_corr, _ = _private_decode(CorrelatedValueEncoding(), corr_secret, train_data, test, None)
    assert _mean_abs_corr(weak_corr) > 0.5
    assert _mean_abs_corr(strong_corr) < 0.3
    assert strong_corr.recovered == 0 and strong_sign.recovered == 0
