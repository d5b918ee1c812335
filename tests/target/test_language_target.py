"""`LanguageTarget` (Carlini et al. 2021, Sec. 3.1: black-box access to next-token
probabilities): what each access level allows, scores against a direct log-softmax gather,
cached generation against uncached generation through the same chooser, EOS/PAD handling, the
context cap, one-line errors, and the query and token ledgers shared by views."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.data.tokenizer import BOS, EOS, PAD, VOCAB_SIZE, ByteTokenizer
from privacylab.errors import PrivacylabError
from privacylab.models.gpt import CausalLM
from privacylab.target import AccessError, QueryBudgetError, TargetError
from privacylab.target.language import Chooser, LanguageTarget

CONTEXT = 24


def gpt(seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(VOCAB_SIZE, CONTEXT, dim=16, heads=2, blocks=2).eval()


class NoCache(nn.Module):
    """The same network seen only through `forward` (generation re-runs the whole prefix)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.max_len = inner.max_len

    def forward(self, tokens: Tensor) -> Tensor:
        return self.inner(tokens)


class Broken(nn.Module):
    """A model returning `make(tokens)` (wrong shapes, NaN)."""

    def __init__(self, make: Callable[[Tensor], Tensor], max_len: int = 8) -> None:
        super().__init__()
        self.make = make
        self.max_len = max_len

    def forward(self, tokens: Tensor) -> Tensor:
        return self.make(tokens)


def sampler(seed: int) -> Chooser:
    generator = torch.Generator().manual_seed(seed)

    def choose(log_probs: Tensor, step: int) -> Tensor:
        return torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1)

    return choose


def texts(n: int = 5) -> Tensor:
    words = ["a", "hello there", "privacy", "the cat sat", "xyz" * 5][:n]
    return ByteTokenizer().batch(words, 18)


def test_access_levels() -> None:
    x = texts()
    prefix = torch.full((2, 1), BOS)
    label = LanguageTarget(gpt(), "label", VOCAB_SIZE)
    for call in (
        lambda: label.token_log_probs(x),
        lambda: label.distributions(x),
        lambda: label.sample(prefix, 3, sampler(0)),
        lambda: label.logits(x),
    ):
        with pytest.raises(AccessError, match=r"needs (scores|logits) access"):
            call()
    assert label.complete(prefix, 3).shape[0] == 2 and label.queries == 2
    scores = LanguageTarget(gpt(), "scores", VOCAB_SIZE)
    scores.token_log_probs(x)
    scores.distributions(x)
    scores.sample(prefix, 2, sampler(0))
    with pytest.raises(AccessError, match="logits"):
        scores.logits(x)
    with pytest.raises(AccessError, match="white-box"):
        _ = scores.model
    with pytest.raises(TargetError, match="no class labels"):
        scores.labels(x)
    with pytest.raises(TargetError, match="distributions"):
        scores.probabilities(x)
    with pytest.raises(AccessError, match="classifiers"):
        scores.with_output_defense(lambda p: p, "scores")
    logits = LanguageTarget(gpt(), "logits", VOCAB_SIZE, batch_size=2)
    with torch.no_grad():
        assert torch.allclose(logits.logits(x), gpt()(x), atol=1e-6)
    assert logits.queries == 5 and logits.tokens_served == 5 * 18
    assert logits.logits(torch.zeros(0, 3, dtype=torch.int64)).shape == (0, 3, VOCAB_SIZE)


def test_views_narrow_and_share_the_ledgers() -> None:
    target = LanguageTarget(gpt(), "white-box", VOCAB_SIZE, query_budget=20)
    view = target.with_access("scores")
    assert isinstance(view, LanguageTarget) and view.context == CONTEXT
    narrow = view.with_access("label")
    with pytest.raises(AccessError, match="may only narrow"):
        narrow.with_access("scores")
    with pytest.raises(AccessError, match="scores"):
        narrow.token_log_probs(texts())
    view.token_log_probs(texts())
    narrow.complete(torch.full((3, 1), BOS), 4)
    assert (view.queries, narrow.queries, target.queries) == (8, 3, 8)
    assert narrow.tokens_served == view.tokens_served == target.tokens_served
    with pytest.raises(QueryBudgetError, match="budget of 20 examples exhausted"):
        view.token_log_probs(ByteTokenizer().batch(["x"] * 13, 4))
    small = view.with_budget(4)
    small.distributions(texts(4))
    with pytest.raises(QueryBudgetError, match="budget of 4"):
        small.sample(torch.full((1, 1), BOS), 2, sampler(1))


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_token_log_probs_is_a_log_softmax_gather(precision: str) -> None:
    model = gpt()
    x = texts()
    target = LanguageTarget(model, "scores", VOCAB_SIZE, precision=precision, batch_size=2)
    got = target.token_log_probs(x)
    with torch.no_grad():
        logits = model.double()(x[:, :-1]) if precision == "float64" else model(x[:, :-1])
    direct = torch.log_softmax(logits, -1)
    assert got.shape == (5, 17) and got.dtype == direct.dtype
    for i in range(5):
        for t in range(17):
            nxt = int(x[i, t + 1])
            if nxt == PAD:
                assert torch.isnan(got[i, t])
            else:
                assert torch.allclose(got[i, t], direct[i, t, nxt], atol=1e-6)
    assert int(torch.isnan(got).sum()) == int((x[:, 1:] == PAD).sum()) > 0
    dists = target.distributions(x)
    assert dists.shape == (5, 17, VOCAB_SIZE)
    assert torch.allclose(dists, direct, atol=1e-6)
    assert torch.allclose(dists.exp().sum(-1), torch.ones(5, 17, dtype=dists.dtype), atol=1e-5)
    assert target.queries == 10 and target.tokens_served == 2 * 5 * 17


def test_cached_generation_equals_uncached() -> None:
    model = gpt(3)
    prefix = torch.tensor([[BOS, 104, 105]] * 6)
    cached = LanguageTarget(model, "scores", VOCAB_SIZE, batch_size=4)
    plain = LanguageTarget(NoCache(model), "scores", VOCAB_SIZE, batch_size=4)
    a = cached.sample(prefix, 15, sampler(11))
    b = plain.sample(prefix, 15, sampler(11))
    assert torch.equal(a, b) and a.shape == (6, 18)
    assert torch.equal(a[:, :3], prefix)
    assert torch.equal(cached.complete(prefix, 10), plain.complete(prefix, 10))
    assert cached.tokens_served == plain.tokens_served


def test_complete_is_greedy_by_recomputation() -> None:
    model = gpt(4)
    target = LanguageTarget(model, "label", VOCAB_SIZE)
    out = target.complete(torch.tensor([[BOS, 97]]), 6)
    seq = [BOS, 97]
    with torch.no_grad():
        for _ in range(6):
            nxt = int(model(torch.tensor([seq]))[0, -1].argmax())
            seq.append(nxt)
            if nxt == EOS:
                break
    expected = seq + [PAD] * (out.shape[1] - len(seq))
    assert out[0].tolist() == expected


def test_eos_then_pad_and_the_context_cap() -> None:
    target = LanguageTarget(gpt(), "scores", VOCAB_SIZE)
    prefix = torch.full((4, 2), BOS)
    # row 0 ends at step 1, row 1 at step 3, the others never
    ends = {0: 1, 1: 3}

    def choose(log_probs: Tensor, step: int) -> Tensor:
        out = torch.full((log_probs.shape[0],), ord("z"))
        for row, at in ends.items():
            if step == at:
                out[row] = EOS
            elif step > at:
                out[row] = ord("!")
        return out

    out = target.sample(prefix, 100, choose)
    assert out.shape == (4, CONTEXT)
    assert out[0, 2:5].tolist() == [ord("z"), EOS, PAD] and bool((out[0, 4:] == PAD).all())
    assert out[1, 5] == EOS and bool((out[1, 6:] == PAD).all())
    assert bool((out[2:, 2:] == ord("z")).all())
    served = 4 * 2 + 3 * 2 + 2 * (CONTEXT - 2 - 4)
    assert target.tokens_served == served and target.queries == 4

    def all_end(log_probs: Tensor, step: int) -> Tensor:
        return torch.full((log_probs.shape[0],), EOS)

    short = target.sample(prefix, 50, all_end)
    assert short.shape == (4, 3) and bool((short[:, 2] == EOS).all())
    full = target.sample(torch.full((1, CONTEXT), 65), 5, all_end)
    assert torch.equal(full, torch.full((1, CONTEXT), 65))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda t: t.token_log_probs(torch.zeros(3, dtype=torch.int64)), "shape \\(n, L\\)"),
        (lambda t: t.token_log_probs(torch.zeros(2, 4)), "integer token ids"),
        (lambda t: t.token_log_probs([[1, 2], [3]]), "integer token ids"),
        (lambda t: t.token_log_probs(torch.full((1, 4), VOCAB_SIZE)), "outside the vocabulary"),
        (lambda t: t.token_log_probs(torch.full((1, 4), -1)), "outside the vocabulary"),
        (lambda t: t.token_log_probs(torch.zeros(1, CONTEXT + 1, dtype=torch.int64)), "context"),
        (lambda t: t.distributions(torch.zeros(2, 1, dtype=torch.int64)), "at least 2"),
        (lambda t: t.sample(torch.zeros(2, 0, dtype=torch.int64), 3, sampler(0)), "at least one"),
        (lambda t: t.sample(torch.full((1, 1), BOS), 0, sampler(0)), "new_tokens"),
        (lambda t: t.sample(torch.full((1, 1), BOS), True, sampler(0)), "new_tokens"),
        (lambda t: t.sample(torch.tensor([[BOS, PAD]]), 3, sampler(0)), "PAD"),
        (lambda t: t.sample(torch.full((2, 1), BOS), 3, lambda lp, s: lp[:1, 0]), "chooser"),
        (lambda t: t.sample(torch.full((2, 1), BOS), 3, lambda lp, s: lp[:, 0]), "chooser"),
        (
            lambda t: t.sample(torch.full((2, 1), BOS), 3, lambda lp, s: torch.full((2,), 999)),
            "outside the vocabulary",
        ),
    ],
)
def test_bad_input_is_one_line(call: Callable[[LanguageTarget], object], match: str) -> None:
    target = LanguageTarget(gpt(), "scores", VOCAB_SIZE)
    with pytest.raises(PrivacylabError, match=match) as info:
        call(target)
    assert "\n" not in str(info.value)


def test_models_that_break_their_declaration() -> None:
    wrong = Broken(lambda x: torch.zeros(*x.shape, 5))
    with pytest.raises(TargetError, match="expected"):
        LanguageTarget(wrong, "scores", VOCAB_SIZE).token_log_probs(texts(1)[:, :8])
    nan = Broken(lambda x: torch.full((*x.shape, VOCAB_SIZE), float("nan")))
    with pytest.raises(TargetError, match="NaN"):
        LanguageTarget(nan, "scores", VOCAB_SIZE).sample(torch.full((1, 1), BOS), 2, sampler(0))
    with pytest.raises(TargetError, match="context"):
        LanguageTarget(nn.Linear(2, 2), "scores", VOCAB_SIZE)
    assert LanguageTarget(nn.Linear(2, 2), "scores", VOCAB_SIZE, context=9).context == 9


def test_numpy_inputs_and_empty_batches() -> None:
    target = LanguageTarget(gpt(), "scores", VOCAB_SIZE)
    x = texts(2)
    torch.testing.assert_close(
        target.token_log_probs(x.numpy()), target.token_log_probs(x), equal_nan=True
    )
    assert target.sample(np.full((2, 1), BOS), np.int64(3), sampler(0)).shape[0] == 2
    empty = target.token_log_probs(torch.zeros(0, 5, dtype=torch.int64))
    assert empty.shape == (0, 4)
    assert target.sample(torch.zeros(0, 1, dtype=torch.int64), 3, sampler(0)).shape == (0, 1)


def test_log_probs_feed_a_perplexity() -> None:
    """Exp of the mean negative log-probability of the real tokens is the perplexity a direct
    cross-entropy gives (PAD targets ignored)."""
    model = gpt(5)
    x = texts()
    target = LanguageTarget(model, "scores", VOCAB_SIZE)
    logp = target.token_log_probs(x)
    with torch.no_grad():
        loss = F.cross_entropy(
            model(x[:, :-1]).reshape(-1, VOCAB_SIZE), x[:, 1:].reshape(-1), ignore_index=PAD
        )
    assert float(-torch.nanmean(logp)) == pytest.approx(float(loss), rel=1e-5)
