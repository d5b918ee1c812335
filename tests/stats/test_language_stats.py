"""privacylab.stats.language against independent re-derivations: token log-probabilities from
torch's log_softmax and explicit Python loops, zlib entropy from the zlib module's streaming
compressor, Min-K%++'s moments as a central second moment over the full vocabulary in torch;
hypothesis properties (Min-K% at k = 1 is -log-perplexity, a window as long as the text is the
log-perplexity, the minimum window is at most the mean window, ratio rankings do not change
when every log-probability is scaled) and one-line errors for bad input."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.errors import PrivacylabError
from privacylab.stats.language import (
    MEMBERSHIP_SCORES,
    distribution_moments,
    extraction_metrics,
    log_perplexity,
    membership_scores,
    min_k_percent,
    min_k_plus_plus,
    window_log_perplexity,
    zlib_entropy,
)

VOCAB = 259

log_prob_lists = st.lists(
    st.floats(min_value=-30.0, max_value=-1e-3, allow_nan=False), min_size=1, max_size=80
)


def _picked(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Random next-token logits (n, VOCAB), the observed tokens, and log f(x_t|x_<t) picked by
    a Python loop over torch.log_softmax rows."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, VOCAB, generator=gen, dtype=torch.float64) * 3
    tokens = torch.randint(0, VOCAB, (n,), generator=gen)
    rows = torch.log_softmax(logits, dim=-1)
    return logits, tokens, [float(rows[t, int(tokens[t])]) for t in range(n)]


def test_log_perplexity_is_the_mean_negative_log_likelihood_of_torch() -> None:
    logits, tokens, picked = _picked(0, 40)
    total = 0.0
    for value in picked:
        total -= value
    assert log_perplexity(np.asarray(picked)) == pytest.approx(total / len(picked), rel=1e-12)
    nll = torch.nn.functional.cross_entropy(logits, tokens, reduction="mean")
    assert log_perplexity(np.asarray(picked)) == pytest.approx(float(nll), rel=1e-12)


@pytest.mark.parametrize(
    "text", ["", "a", "aaaaaaaaaaaaaaaaaaaaaaaaaaaa", "The quick brown fox, é ü 😀", "x" * 500]
)
def test_zlib_entropy_is_eight_times_the_compressed_byte_count(text: str) -> None:
    stream = zlib.compressobj()
    blob = stream.compress(text.encode("utf-8")) + stream.flush()
    assert zlib_entropy(text) == 8 * len(blob)
    assert zlib.decompress(blob).decode("utf-8") == text


def test_zlib_entropy_uses_the_default_level_of_the_reference_code() -> None:
    """LM_Memorization and mimir call zlib.compress(text) at its default level (6), which
    compresses some texts differently from level 9."""
    text = "-" * 31 + "+" + "-" * 32
    assert zlib_entropy(text) == 8 * len(zlib.compress(text.encode(), 6))
    assert zlib_entropy(text) != 8 * len(zlib.compress(text.encode(), 9))


def test_repetitive_text_compresses_below_random_text() -> None:
    rng = np.random.default_rng(0)
    noise = "".join(chr(c) for c in rng.integers(33, 127, 120))
    assert zlib_entropy("ab" * 60) < zlib_entropy(noise)


@pytest.mark.parametrize(("n", "window"), [(1, 1), (7, 3), (60, 50), (120, 50), (50, 50)])
def test_window_is_the_lowest_window_mean_by_a_loop(n: int, window: int) -> None:
    _, _, picked = _picked(n + window, n)
    if n <= window:
        expected = -sum(picked) / n
    else:
        expected = min(-sum(picked[i : i + window]) / window for i in range(n - window + 1))
    assert window_log_perplexity(np.asarray(picked), window) == pytest.approx(expected)


@pytest.mark.parametrize(("k", "percent"), [(0.2, 20), (0.1, 10), (0.3, 30), (0.5, 50), (1, 100)])
@pytest.mark.parametrize("n", [1, 4, 10, 37, 100])
def test_min_k_is_the_mean_of_the_floor_k_n_lowest(k: float, percent: int, n: int) -> None:
    _, _, picked = _picked(n, n)
    count = max(1, percent * n // 100)
    lowest = sorted(picked)[:count]
    assert min_k_percent(np.asarray(picked), k) == pytest.approx(sum(lowest) / count)


def test_min_k_plus_plus_against_torch_over_the_full_vocabulary() -> None:
    logits, _, picked = _picked(3, 30)
    log_dist = torch.log_softmax(logits, dim=-1)
    probs = log_dist.exp()
    mu = (probs * log_dist).sum(-1)
    sigma = (probs * (log_dist - mu[:, None]) ** 2).sum(-1).sqrt()
    z = [(picked[t] - float(mu[t])) / float(sigma[t]) for t in range(30)]
    got_mu, got_sigma = distribution_moments(log_dist.numpy())
    np.testing.assert_allclose(got_mu, mu.numpy(), rtol=1e-10)
    np.testing.assert_allclose(got_sigma, sigma.numpy(), rtol=1e-8)
    for k, count in [(0.2, 6), (0.5, 15), (1.0, 30), (0.01, 1)]:
        expected = sum(sorted(z)[:count]) / count
        assert min_k_plus_plus(np.asarray(picked), got_mu, got_sigma, k) == pytest.approx(
            expected, rel=1e-9
        )


def test_moments_of_a_distribution_with_zero_probability_tokens() -> None:
    log_dist = np.full((1, 4), -np.inf)
    log_dist[0, :2] = math.log(0.5)
    mu, sigma = distribution_moments(log_dist)
    assert mu[0] == pytest.approx(math.log(0.5)) and sigma[0] == pytest.approx(0.0, abs=1e-12)
    assert min_k_plus_plus(np.array([math.log(0.5)]), mu, sigma) == pytest.approx(0.0)


def test_membership_scores_re_derived_and_oriented_member_high() -> None:
    _, _, picked = _picked(5, 24)
    _, _, ref = _picked(6, 24)
    _, _, low = _picked(7, 24)
    mu = np.linspace(-6, -4, 24)
    sigma = np.linspace(1, 2, 24)
    text = "Some document text, 24 b"
    out = membership_scores(
        text,
        np.asarray(picked),
        reference_log_probs=np.asarray(ref),
        lowercase_log_probs=np.asarray(low),
        mu=mu,
        sigma=sigma,
        k=0.25,
    )
    assert tuple(sorted(out)) == tuple(sorted(MEMBERSHIP_SCORES))
    nll = -sum(picked) / 24
    assert out["loss"] == pytest.approx(-nll)
    assert out["zlib"] == pytest.approx(-nll / (8 * len(zlib.compress(text.encode()))))
    assert out["reference"] == pytest.approx(-sum(ref) / 24 - nll)
    assert out["lowercase"] == pytest.approx((-sum(low) / 24) / nll)
    assert out["min-k"] == pytest.approx(sum(sorted(picked)[:6]) / 6)
    z = sorted((p - m) / s for p, m, s in zip(picked, mu, sigma, strict=True))
    assert out["min-k++"] == pytest.approx(sum(z[:6]) / 6)
    partial = membership_scores(text, np.asarray(picked))
    assert set(partial) == {"loss", "zlib", "min-k"}


def test_a_likelier_text_scores_higher_on_every_membership_score() -> None:
    likely = np.full(20, -0.5)
    unlikely = np.full(20, -3.0)
    text = "same text for both!!"
    reference = np.full(20, -3.5)
    a = membership_scores(text, likely, reference_log_probs=reference)
    b = membership_scores(text, unlikely, reference_log_probs=reference)
    assert all(a[key] > b[key] for key in a)


def test_extraction_metrics_re_derived() -> None:
    _, _, picked = _picked(8, 60)
    _, _, small = _picked(9, 60)
    _, _, low = _picked(10, 60)
    text = "x" * 60
    out = extraction_metrics(
        text,
        np.asarray(picked),
        lowercase_log_probs=np.asarray(low),
        references={"small": np.asarray(small)},
        window=10,
    )
    nll = -sum(picked) / 60
    assert out["perplexity"] == pytest.approx(-nll)
    assert out["small"] == pytest.approx((-sum(small) / 60) / nll)
    assert out["zlib"] == pytest.approx(8 * len(zlib.compress(text.encode())) / nll)
    assert out["lowercase"] == pytest.approx((-sum(low) / 60) / nll)
    windows = [-sum(picked[i : i + 10]) / 10 for i in range(51)]
    assert out["window"] == pytest.approx(-min(windows))
    certain = extraction_metrics("abc", np.zeros(3), references={"tiny": np.full(3, -1.0)})
    assert certain["tiny"] == math.inf and certain["zlib"] == math.inf


@settings(max_examples=60, deadline=None)
@given(log_prob_lists)
def test_min_k_at_k_one_is_minus_the_log_perplexity(values: list[float]) -> None:
    arr = np.asarray(values)
    assert min_k_percent(arr, 1.0) == pytest.approx(-log_perplexity(arr), rel=1e-12)
    assert min_k_plus_plus(arr, np.zeros_like(arr), np.ones_like(arr), 1.0) == pytest.approx(
        -log_perplexity(arr), rel=1e-12
    )


@settings(max_examples=60, deadline=None)
@given(log_prob_lists, st.floats(0.01, 1.0), st.floats(0.01, 1.0))
def test_min_k_grows_with_k_and_is_at_most_the_mean(
    values: list[float], k1: float, k2: float
) -> None:
    arr = np.asarray(values)
    low, high = sorted((k1, k2))
    assert min_k_percent(arr, low) <= min_k_percent(arr, high) + 1e-12
    assert min_k_percent(arr, high) <= -log_perplexity(arr) + 1e-12


@settings(max_examples=60, deadline=None)
@given(log_prob_lists, st.integers(1, 100))
def test_window_properties(values: list[float], window: int) -> None:
    arr = np.asarray(values)
    n = arr.size
    got = window_log_perplexity(arr, window)
    if window >= n:
        assert got == pytest.approx(log_perplexity(arr), rel=1e-12)
        return
    means = [-arr[i : i + window].mean() for i in range(n - window + 1)]
    assert got == pytest.approx(min(means), rel=1e-9)
    assert got <= float(np.mean(means)) + 1e-9
    whole = arr[: (n // window) * window]
    assert got <= log_perplexity(whole) + 1e-9


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(log_prob_lists, st.floats(-30.0, -1e-3)),
        min_size=2,
        max_size=8,
    ),
    st.floats(0.05, 20.0),
)
def test_ratio_rankings_do_not_change_when_log_probs_are_scaled(
    docs: list[tuple[list[float], float]], scale: float
) -> None:
    def scores(c: float) -> dict[str, np.ndarray]:
        rows = []
        for i, (values, ref) in enumerate(docs):
            arr = c * np.asarray(values)
            rows.append(
                membership_scores(
                    f"document number {i}",
                    arr,
                    reference_log_probs=c * np.full(arr.size, ref),
                    lowercase_log_probs=c * np.asarray(values[::-1]) * 1.1,
                )
            )
        return {key: np.asarray([r[key] for r in rows]) for key in rows[0]}

    base, scaled = scores(1.0), scores(scale)
    for key in ("loss", "zlib", "reference", "min-k"):
        np.testing.assert_allclose(scaled[key], scale * base[key], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(scaled["lowercase"], base["lowercase"], rtol=1e-9)
    for key in base:
        a, b = base[key], scaled[key]
        apart = (a[:, None] - a[None, :]) < -1e-9 * np.maximum(abs(a[:, None]), abs(a[None, :]))
        assert (b[:, None] < b[None, :])[apart].all(), key


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: log_perplexity(np.array([])), "at least one scored token"),
        (lambda: log_perplexity(np.array([-1.0, np.nan])), "must be finite"),
        (lambda: min_k_percent(np.array([-1.0]), 0.0), "k must be a fraction"),
        (lambda: min_k_percent(np.array([-1.0]), 1.5), "k must be a fraction"),
        (lambda: min_k_percent(np.array([-1.0]), True), "k must be a fraction"),
        (lambda: min_k_percent(np.array([-1.0]), "0.2"), "k must be a fraction"),
        (lambda: window_log_perplexity(np.array([-1.0]), 0), "window must be"),
        (lambda: window_log_perplexity(np.array([-1.0]), 2.5), "window must be"),
        (
            lambda: min_k_plus_plus(np.array([-1.0, -2.0]), np.zeros(1), np.ones(2)),
            "one value per scored token",
        ),
        (
            lambda: extraction_metrics("a", np.array([-1.0]), references={"zlib": np.ones(1)}),
            "may not be named",
        ),
    ],
)
def test_bad_input_is_one_line(call: object, message: str) -> None:
    with pytest.raises(PrivacylabError, match=message) as info:
        call()  # type: ignore[operator]
    assert "\n" not in str(info.value)
