"""`score_texts` against a direct forward pass: BOS + the text's bytes, n bytes give n scored
tokens (the first conditioned on BOS alone), texts of different lengths batched together come
back in order, Min-K%++'s mu and sigma (Zhang et al. 2024, Eq. 3) by a re-derivation over the
vocabulary, one query per text, and one-line errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from privacylab.attacks.language import LanguageError, score_texts
from privacylab.data.tokenizer import BOS, VOCAB_SIZE
from privacylab.models.gpt import CausalLM
from privacylab.target.access import AccessError
from privacylab.target.language import LanguageTarget

TEXTS = ["a much longer text, é included", "hi", "mid-size one", "x"]


@pytest.fixture(scope="module")
def model() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(VOCAB_SIZE, 40, dim=16, heads=2, blocks=1).eval()


def direct(model: CausalLM, text: str) -> torch.Tensor:
    """log f(z | BOS, x_<t) for every z, t = 1..n: (n, vocab), float64."""
    ids = torch.tensor([[BOS, *text.encode("utf-8")]])
    with torch.no_grad():
        return copy.deepcopy(model).double()(ids)[0, :-1].log_softmax(-1)


def test_scores_equal_a_direct_gather_in_order(model: CausalLM) -> None:
    target = LanguageTarget(model, "scores", VOCAB_SIZE, precision="float64")
    plain = score_texts(target, TEXTS, batch_size=3)
    full = score_texts(target, TEXTS, moments=True, batch_size=3)
    assert target.queries == 2 * len(TEXTS)
    for text, got, rich in zip(TEXTS, plain, full, strict=True):
        dist = direct(model, text)
        ids = torch.tensor(list(text.encode("utf-8")))
        expected = dist.gather(-1, ids[:, None]).squeeze(-1).numpy()
        assert got.log_probs.shape == (len(text.encode("utf-8")),)
        np.testing.assert_allclose(got.log_probs, expected, atol=1e-10)
        np.testing.assert_allclose(rich.log_probs, expected, atol=1e-10)
        assert got.mu is None and got.sigma is None
        p = dist.exp().numpy()
        mu = (p * dist.numpy()).sum(-1)
        sigma = np.sqrt((p * (dist.numpy() - mu[:, None]) ** 2).sum(-1))
        np.testing.assert_allclose(rich.mu, mu, atol=1e-9)
        np.testing.assert_allclose(rich.sigma, sigma, atol=1e-9)
    assert score_texts(target, []) == []


def test_bad_texts_are_one_line(model: CausalLM) -> None:
    target = LanguageTarget(model, "scores", VOCAB_SIZE)
    assert len(score_texts(target, ["y" * 39])[0].log_probs) == 39
    for texts, match in ((["ok", ""], "text 1 is empty"), (["z" * 40], "context holds 39")):
        with pytest.raises(LanguageError, match=match) as info:
            score_texts(target, texts)
        assert "\n" not in str(info.value)
    with pytest.raises(AccessError, match="scores"):
        score_texts(target.with_access("label"), ["ok"])  # type: ignore[arg-type]
