"""DP-Forward's release layer and accounting (Du et al. 2023, Sec. 3.2-3.4), checked against
independent oracles: the Frobenius norm, the closed form of the k-fold Gaussian composition
(Dong, Roth & Su 2022, Cor. 2.13 with Cor. 3.3) evaluated with scipy, Monte-Carlo noise and
label-flip rates with 5-sigma bounds, and a small classification task learned through the
noise layer (near the noiseless accuracy at huge ε, chance at tiny ε)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import norm

from privacylab.accounting import Composed, PldAccountant, SelfComposed
from privacylab.models.encoder import EncoderClassifier
from privacylab.models.minilm import CLS_ID, SEP_ID, tiny_bert
from privacylab.training import TrainConfig, TrainingError, train
from privacylab.training.dpforward import (
    ForwardNoise,
    forward_mechanism,
    forward_privacy,
    private_labels,
    release_accuracy_bound,
)

DELTA = 1e-5


def gaussian_composition_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of μ-GDP, the exact privacy curve of k Gaussian releases with μ = √k · S/σ."""
    return float(
        norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
    )


@given(
    batch=st.integers(1, 4),
    rows=st.integers(1, 6),
    columns=st.integers(1, 9),
    clip=st.floats(0.01, 50.0),
    seed=st.integers(0, 1000),
)
def test_normalise_to_exactly_c(
    batch: int, rows: int, columns: int, clip: float, seed: int
) -> None:
    torch.manual_seed(seed)
    matrix = torch.randn(batch, rows, columns, dtype=torch.float64) * 10 ** (seed % 7 - 3)
    out = ForwardNoise(clip, None).normalise(matrix)
    norms = torch.linalg.vector_norm(out.flatten(1), dim=1)
    assert torch.allclose(norms, torch.full_like(norms, clip), rtol=1e-12)
    # direction kept: a positive multiple of the input
    ratio = out / matrix
    assert torch.allclose(ratio, ratio.flatten(1)[:, :1, None].expand_as(ratio), rtol=1e-9)


@given(clip=st.floats(0.01, 20.0), seed=st.integers(0, 1000))
def test_replace_one_sensitivity_is_two_c(clip: float, seed: int) -> None:
    torch.manual_seed(seed)
    layer = ForwardNoise(clip, None)
    x, x_other = torch.randn(2, 1, 5, 7, dtype=torch.float64)
    gap = torch.linalg.vector_norm(layer.normalise(x) - layer.normalise(x_other))
    assert float(gap) <= 2 * clip * (1 + 1e-12)
    # the bound is attained by opposite sequences, so 2C (not C, not 1) is the sensitivity
    worst = torch.linalg.vector_norm(layer.normalise(x) - layer.normalise(-x))
    assert float(worst) == pytest.approx(2 * clip, rel=1e-12)


@pytest.mark.parametrize(("epsilon", "epochs"), [(8.0, 3), (1.0, 1), (3.0, 5)])
def test_calibration_matches_closed_form_and_pld(epsilon: float, epochs: int) -> None:
    mechanism = forward_mechanism(epsilon, DELTA, 1.0, 48, 384, releases=epochs)
    assert mechanism.sensitivity == 2.0
    # Dong, Roth & Su: k releases at scale σ with sensitivity S are μ-GDP with μ = √k S/σ
    mu = math.sqrt(epochs) * mechanism.sensitivity / mechanism.scale
    assert gaussian_composition_delta(epsilon, mu) == pytest.approx(DELTA, rel=1e-6)
    event = SelfComposed(mechanism.event, epochs)
    pld = PldAccountant().compose(event).epsilon(DELTA)
    assert pld == pytest.approx(epsilon, rel=1e-6)
    assert pld >= epsilon * (1 - 1e-9)  # the PLD bound never understates ε
    privacy = forward_privacy(mechanism, clip=1.0, delta=DELTA, releases=epochs).to_dict()
    assert privacy["epsilon"] == pytest.approx(epsilon, rel=1e-6)
    assert privacy["event"] == event.to_dict()
    assert privacy["accountant"] == "pld" and privacy["notion"] == "SeqLDP"
    assert privacy["sensitivity"] == 2.0 and privacy["releases"] == epochs
    # one inference release: a single Gaussian with μ₁ = S/σ; ε below the training ε (k > 1)
    mu_one = mechanism.sensitivity / mechanism.scale
    eps_one = privacy["inference_epsilon"]
    assert gaussian_composition_delta(eps_one, mu_one) == pytest.approx(DELTA, rel=1e-3)
    assert (eps_one < epsilon) if epochs > 1 else eps_one == pytest.approx(epsilon, rel=1e-6)
    assert privacy["label_epsilon"] is None and privacy["total_epsilon"] is None


def test_calibration_scales_with_clip() -> None:
    one = forward_mechanism(2.0, DELTA, 1.0, 4, 8, releases=3)
    three = forward_mechanism(2.0, DELTA, 3.0, 4, 8, releases=3)
    assert three.sensitivity == 6.0
    assert three.scale == pytest.approx(3.0 * one.scale, rel=1e-12)
    assert three.noise_multiplier == pytest.approx(one.noise_multiplier, rel=1e-12)


def test_empirical_noise_std_is_the_calibrated_scale() -> None:
    mechanism = forward_mechanism(4.0, DELTA, 0.5, 16, 32, releases=2)
    layer = ForwardNoise(0.5, mechanism, seed=11)
    x = torch.randn(200, 16, 32)
    noise = (layer(x) - layer.normalise(x)).double().flatten()
    n = noise.numel()
    std = float(noise.std())
    # the sample std of n normals has relative standard error 1/sqrt(2n)
    assert abs(std / mechanism.scale - 1) < 5 / math.sqrt(2 * n)
    assert abs(float(noise.mean())) < 5 * mechanism.scale / math.sqrt(n)


def test_noisy_in_train_and_eval_mode_and_seeded() -> None:
    mechanism = forward_mechanism(8.0, DELTA, 1.0, 3, 4)
    x = torch.randn(2, 3, 4)
    layer = ForwardNoise(1.0, mechanism, seed=5)
    layer.train()
    first = layer(x)
    layer.eval()
    second = layer(x)
    for out in (first, second):
        assert not torch.allclose(out, layer.normalise(x))
    assert not torch.allclose(first, second)  # fresh noise at every release
    again = ForwardNoise(1.0, forward_mechanism(8.0, DELTA, 1.0, 3, 4), seed=5)
    assert torch.equal(again(x), first) and torch.equal(again(x), second)
    other = ForwardNoise(1.0, forward_mechanism(8.0, DELTA, 1.0, 3, 4), seed=6)
    assert not torch.allclose(other(x), first)
    # the call counter travels with the weights: a restored layer continues the stream
    restored = ForwardNoise(1.0, forward_mechanism(8.0, DELTA, 1.0, 3, 4), seed=5)
    restored.load_state_dict(layer.state_dict())
    assert torch.equal(restored(x), layer(x))


def test_label_randomized_response_and_composition() -> None:
    labels = np.arange(20_000) % 2
    noisy, event = private_labels(labels, 1.5, 2, seed=0)
    flip = 1 / (1 + math.exp(1.5))
    rate = float((noisy != labels).mean())
    assert abs(rate - flip) < 5 * math.sqrt(flip * (1 - flip) / len(labels))
    assert np.array_equal(noisy, private_labels(labels, 1.5, 2, seed=0)[0])
    mechanism = forward_mechanism(3.0, DELTA, 1.0, 1, 8, releases=2)
    privacy = forward_privacy(mechanism, clip=1.0, delta=DELTA, releases=2, label_event=event)
    data = privacy.to_dict()
    assert data["label_epsilon"] == 1.5 and data["label_event"] == event.to_dict()
    composed = Composed([SelfComposed(mechanism.event, 2), event])
    assert data["total_epsilon"] == pytest.approx(PldAccountant().compose(composed).epsilon(DELTA))
    # basic composition bounds the pair: max(ε_X, ε_y) < ε_(X,y) <= ε_X + ε_y
    assert data["epsilon"] < data["total_epsilon"] <= data["epsilon"] + 1.5 + 1e-6


@pytest.mark.parametrize("clip", [0.0, -1.0, math.nan, math.inf])
def test_bad_clip_is_one_line(clip: float) -> None:
    with pytest.raises(TrainingError, match="clip C must be a finite number > 0") as info:
        ForwardNoise(clip, None)
    assert "\n" not in str(info.value)
    with pytest.raises(TrainingError, match="clip C"):
        forward_mechanism(1.0, DELTA, clip, 2, 2)


def test_mechanism_must_use_sensitivity_two_c() -> None:
    with pytest.raises(TrainingError, match="not 2C"):
        ForwardNoise(2.0, forward_mechanism(1.0, DELTA, 1.0, 2, 2))
    with pytest.raises(TrainingError, match="epsilon must be a finite number > 0"):
        forward_mechanism(0.0, DELTA, 1.0, 2, 2)


def _token_task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Class 0 sequences draw their words from one block of ids, class 1 from another."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    words = torch.randint(0, 40, (n, 8), generator=gen) + 2000 + 1000 * y[:, None]
    ids = torch.cat([torch.full((n, 1), CLS_ID), words, torch.full((n, 1), SEP_ID)], dim=1).long()
    return ids, y


@pytest.fixture(scope="module")
def task() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    return _token_task(192, 0), _token_task(128, 1)


def _accuracy(epsilon: float | None, task: tuple) -> float:
    (x, y), (x_test, y_test) = task
    epochs = 3
    release = None
    if epsilon is not None:
        mechanism = forward_mechanism(epsilon, DELTA, 1.0, 1, 32, releases=epochs)
        release = ForwardNoise(1.0, mechanism, seed=0)
    model = EncoderClassifier(tiny_bert(seed=0), 2, position="output", release=release)
    config = TrainConfig(epochs=epochs, batch_size=32, lr=3e-3, optimizer="adam", seed=0)
    result = train(model, (x, y), config, eval_data=(x_test, y_test))
    assert result.eval_accuracy is not None
    return result.eval_accuracy


def test_huge_epsilon_near_noiseless_tiny_epsilon_chance(task: tuple) -> None:
    clear = _accuracy(None, task)
    assert clear >= 0.9
    assert _accuracy(1e4, task) >= clear - 0.05
    assert abs(_accuracy(0.01, task) - 0.5) <= 0.15


def test_shuffling_reported_where_it_applies() -> None:
    mechanism = forward_mechanism(1.0, DELTA, 1.0, 1, 8, releases=2)
    many = forward_privacy(mechanism, clip=1.0, delta=DELTA, releases=2, users=10**6).shuffled
    assert many is not None
    assert many["theorem"].endswith("Theorem 3.8") and "shuffler" in many["assumption"]
    assert many["n"] == 10**6 and many["delta0"] == pytest.approx(DELTA / 4e6)
    # ε0 is one release's ε at δ0 (closed form of one Gaussian release), amplified below it
    mu_one = mechanism.sensitivity / mechanism.scale
    assert gaussian_composition_delta(many["epsilon0"], mu_one) == pytest.approx(
        many["delta0"], rel=1e-2
    )
    assert many["epsilon"] < many["epsilon0"]
    assert many["composed_epsilon"] == pytest.approx(2 * many["epsilon"])
    assert many["composed_delta"] == pytest.approx(2 * many["delta"]) and many["rounds"] == 2
    few = forward_privacy(mechanism, clip=1.0, delta=DELTA, releases=2, users=50)
    assert few.shuffled is None


def test_dimension_reduction_releases_d_prime_columns() -> None:
    mechanism = forward_mechanism(8.0, DELTA, 1.0, 3, 4)
    layer = ForwardNoise(1.0, mechanism, seed=2, reduce=4, dim=10)
    assert layer.down is not None and layer.up is not None
    x = torch.randn(400, 3, 10, dtype=torch.float64)
    layer.double()
    with torch.no_grad():
        out = layer(x)
        clear = layer.normalise(layer.down(x))
        # what follows the noise is M2 (post-processing): out = M2(normalise(M1 x) + Z), and
        # M2 (10 x 4) has full column rank, so Z is recovered exactly by least squares
        shift = (out - layer.up(clear)).reshape(-1, 10).T
        noise = torch.linalg.lstsq(layer.up.weight, shift).solution
    assert out.shape == (400, 3, 10)
    norms = torch.linalg.vector_norm(clear.flatten(1), dim=1)
    assert torch.allclose(norms, torch.ones_like(norms))
    assert abs(float(noise.std()) / mechanism.scale - 1) < 5 / math.sqrt(2 * noise.numel())
    same = ForwardNoise(1.0, forward_mechanism(8.0, DELTA, 1.0, 3, 4), seed=2, reduce=4, dim=10)
    assert torch.equal(same.down.weight, layer.down.weight)
    assert torch.equal(same.up.weight, layer.up.weight)
    other = ForwardNoise(1.0, None, seed=3, reduce=4, dim=10)
    assert not torch.equal(other.down.weight, layer.down.weight)
    small = torch.randn(5, 3, 10)
    assert torch.allclose(other(small), other.up(other.normalise(other.down(small))))
    with pytest.raises(TrainingError, match="releases 4 columns, not reduce = 5"):
        ForwardNoise(1.0, forward_mechanism(8.0, DELTA, 1.0, 3, 4), reduce=5, dim=10)
    with pytest.raises(TrainingError, match="dim must be a whole number"):
        ForwardNoise(1.0, None, reduce=5)


def test_release_accuracy_bound_is_attained_by_the_likelihood_ratio_test() -> None:
    mechanism = forward_mechanism(8.0, DELTA, 1.0, 1, 16, releases=3)
    bound = release_accuracy_bound(mechanism, 1.0)
    assert bound == pytest.approx(norm.cdf(1 / (2 * mechanism.noise_multiplier)))
    # antipodal sequences (‖Δ‖ = 2C) and the optimal test: the sign along Δ
    layer = ForwardNoise(1.0, mechanism, seed=4)
    direction = torch.randn(1, 1, 16, dtype=torch.float64)
    x = torch.cat([direction.expand(10_000, 1, 16), -direction.expand(10_000, 1, 16)])
    truth = torch.cat([torch.ones(10_000), -torch.ones(10_000)])
    with torch.no_grad():
        guess = torch.sign((layer(x) * direction).sum((1, 2)))
    accuracy = float((guess == truth).double().mean())
    assert abs(accuracy - bound) < 5 * math.sqrt(bound * (1 - bound) / len(truth))


def test_sessions_draw_their_own_noise() -> None:
    """A reloaded layer restarts at its saved call counter: without a session of its own, two
    sessions add the same Z to different sequences (their difference then carries no noise).
    `start_session` gives each session its own reproducible stream."""

    def layer(session: int | None = None) -> ForwardNoise:
        noise = ForwardNoise(1.0, forward_mechanism(4.0, 1e-5, 1.0, 3, 5), seed=7)
        if session is not None:
            noise.start_session(session)
        return noise

    x, y = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    first, second = layer(), layer()
    leak = (first(x) - second(y)) - (first.normalise(x) - second.normalise(y))
    assert torch.allclose(leak, torch.zeros_like(leak), atol=1e-6)
    one, two = layer(1), layer(2)
    noise_one = one(x) - one.normalise(x)
    noise_two = two(y) - two.normalise(y)
    assert not torch.allclose(noise_one, noise_two, atol=1e-3)
    assert torch.equal(layer(1)(x), layer(1)(x))
    assert int(one.calls) == 1
    with pytest.raises(TrainingError, match="session must be a whole number"):
        layer().start_session(-1)
