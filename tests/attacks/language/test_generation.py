"""Sampling strategies of Carlini et al. 2021 (Sec. 4.1, 5.1) against independent oracles: top-n
never leaves the n most likely tokens, the temperature schedule is the linear 10 -> 1 decay,
empirical token frequencies match the served (renormalised / tempered) distribution by a
chi-square test, a model trained on one sentence regurgitates it, prefix samples start with
their public prefix, runs are reproducible and resumable, and every sample is one query."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare
from torch import Tensor, nn

from _tiny_lm import train_tiny_gpt
from privacylab.attacks.language import LanguageError
from privacylab.attacks.language.generation import (
    STRATEGIES,
    Sample,
    Sampling,
    chooser,
    generate_samples,
    generation_namespace,
    temperature_at,
)
from privacylab.data.tokenizer import BOS, EOS, PAD, VOCAB_SIZE, ByteTokenizer
from privacylab.execution.store import ResultStore
from privacylab.models.gpt import CausalLM
from privacylab.target.access import AccessError, QueryBudgetError
from privacylab.target.language import LanguageTarget

SENTENCE = "the quick brown fox jumps over the lazy dog."
CONTEXT = 48
PUBLIC = ["alpha beta gamma delta", "one two three four five six", "é accents ü"]


class FixedLM(nn.Module):
    """Every position gets the same next-token logits `z` (no `step`: uncached generation)."""

    def __init__(self, logits: Tensor, max_len: int = 16) -> None:
        super().__init__()
        self.register_buffer("z", logits.float())
        self.max_len = max_len

    def forward(self, tokens: Tensor) -> Tensor:
        return self.z.expand(*tokens.shape, -1).clone()


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's chi-square p-value of `counts` against `probs`, bins expecting < 5 pooled."""
    rows = counts.sum()
    expected = probs / probs.sum() * rows
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum()).astype(float)
    wanted = np.append(expected[big], expected[~big].sum())
    keep = wanted > 0
    return float(
        chisquare(observed[keep], wanted[keep] * observed.sum() / wanted[keep].sum()).pvalue
    )


def fixed_logits() -> Tensor:
    z = torch.full((VOCAB_SIZE,), -8.0)
    z[[ord(c) for c in "abcdefg"]] = torch.tensor([3.0, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0])
    return z


@pytest.fixture(scope="module")
def parrot() -> CausalLM:
    """A one-block GPT trained to near-zero loss on BOS + SENTENCE + EOS."""
    return train_tiny_gpt([SENTENCE], steps=120, seed=0, context=CONTEXT)


def random_target() -> LanguageTarget:
    torch.manual_seed(1)
    return LanguageTarget(CausalLM(VOCAB_SIZE, 32, dim=16, heads=2, blocks=1), "scores", VOCAB_SIZE)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-30, 30, allow_nan=False), min_size=12, max_size=12),
    st.integers(1, 12),
    st.integers(0, 2**31 - 1),
)
def test_top_n_never_leaves_the_n_most_likely(values: list[float], n: int, seed: int) -> None:
    logits = torch.tensor(values).reshape(1, 12).repeat(4, 1)
    logits[1] = logits[1].flip(0)
    logits[2] = logits[2].roll(5)
    log_probs = logits.log_softmax(-1)
    choose = chooser(Sampling(top_n=n), torch.Generator().manual_seed(seed))
    picked = choose(log_probs, 0)
    assert picked.shape == (4,) and picked.dtype == torch.int64
    nth = log_probs.sort(-1, descending=True).values[:, n - 1]
    assert bool((log_probs.gather(-1, picked[:, None]).squeeze(-1) >= nth).all())


def test_temperature_schedule() -> None:
    sampling = Sampling(strategy="temperature")
    assert temperature_at(0, sampling) == 10.0
    assert temperature_at(10, sampling) == pytest.approx(5.5)
    for step in range(20):
        assert temperature_at(step, sampling) == pytest.approx(10.0 - 9.0 * step / 20)
    assert all(temperature_at(step, sampling) == 1.0 for step in (20, 21, 100))
    quick = Sampling(
        strategy="temperature", temperature_start=4.0, temperature_end=2.0, decay_tokens=0
    )
    assert temperature_at(0, quick) == 2.0


@pytest.mark.parametrize("strategy", ["top-n", "temperature"])
def test_frequencies_match_the_served_distribution(strategy: str) -> None:
    z = fixed_logits()
    target = LanguageTarget(FixedLM(z), "scores", VOCAB_SIZE)
    sampling = Sampling(strategy=strategy, top_n=5)
    rows = 6000
    prefix = torch.full((rows, 1), BOS)
    out = target.sample(prefix, 1, chooser(sampling, torch.Generator().manual_seed(7)))
    assert out.shape == (rows, 2) and target.queries == rows
    counts = np.bincount(out[:, 1].numpy(), minlength=VOCAB_SIZE)
    if strategy == "top-n":
        expected = np.zeros(VOCAB_SIZE)
        top = z.double().topk(5)
        expected[top.indices.numpy()] = top.values.softmax(-1).numpy()
        assert counts[expected == 0].sum() == 0
    else:
        expected = (z.double() / 10.0).softmax(-1).numpy()
        expected[[BOS, PAD]] = 0.0
    assert counts[BOS] == counts[PAD] == 0
    assert chi_square_p(counts, expected) > 1e-3
    if strategy == "temperature":
        # from step 20 on t = 1: the served distribution itself, whose tail is far lighter
        log_probs = z.log_softmax(-1).repeat(rows, 1)
        late = chooser(sampling, torch.Generator().manual_seed(8))(log_probs, 30)
        late_counts = np.bincount(late.numpy(), minlength=VOCAB_SIZE)
        served = z.double().softmax(-1).numpy()
        served[[BOS, PAD]] = 0.0
        assert chi_square_p(late_counts, served) > 1e-3
        tail = np.ones(VOCAB_SIZE, dtype=bool)
        tail[[ord(c) for c in "abcdefg"]] = False
        assert counts[tail].sum() > 10 * max(late_counts[tail].sum(), 1)


@pytest.mark.parametrize("strategy", ["top-n", "temperature"])
def test_bos_and_pad_are_never_drawn(strategy: str) -> None:
    """Only bytes and EOS continue a document, however much mass the model puts elsewhere."""
    z = torch.full((VOCAB_SIZE,), -5.0)
    z[[BOS, PAD]] = 5.0
    log_probs = z.log_softmax(-1).repeat(2000, 1)
    choose = chooser(Sampling(strategy=strategy, top_n=3), torch.Generator().manual_seed(0))
    for step in (0, 30):
        drawn = choose(log_probs, step)
        assert not bool(((drawn == BOS) | (drawn == PAD)).any())
        assert len(set(drawn.tolist())) > 2


def test_a_parrot_regurgitates_its_sentence(parrot: CausalLM) -> None:
    target = LanguageTarget(parrot, "scores", VOCAB_SIZE)
    samples = generate_samples(target, Sampling(length=80), 40, batch_size=16)
    assert [s.index for s in samples] == list(range(40))
    assert all(s.strategy == "top-n" and s.prefix == "" for s in samples)
    assert sum(s.text == SENTENCE for s in samples) >= 30
    assert target.queries == 40
    untrained = generate_samples(random_target(), Sampling(length=40), 20)
    assert not any(SENTENCE[:10] in s.text for s in untrained)


def test_temperature_explores_then_falls_back_on_memorised_text(parrot: CausalLM) -> None:
    target = LanguageTarget(parrot, "scores", VOCAB_SIZE)
    samples = generate_samples(target, Sampling(strategy="temperature", length=80), 40)
    top_n = generate_samples(target, Sampling(length=80), 40)
    assert len({s.text for s in samples}) == 40 > 4 * len({s.text for s in top_n})
    # t = 10 scrambles the beginning; once t reaches 1 the model finishes its sentence
    assert sum(s.text.endswith("the lazy dog.") for s in samples) >= 24
    assert target.queries == 80


def test_prefix_samples_start_with_their_public_prefix(parrot: CausalLM) -> None:
    target = LanguageTarget(parrot, "scores", VOCAB_SIZE)
    sampling = Sampling(strategy="prefix", length=20, prefix_tokens=(3, 8))
    samples = generate_samples(target, sampling, 50, public_text=PUBLIC, batch_size=20)
    lengths = set()
    for s in samples:
        assert s.strategy == "prefix" and s.text.startswith(s.prefix)
        assert any(doc.encode().startswith(s.prefix.encode()) for doc in PUBLIC)
        lengths.add(len(s.prefix.encode()))
    assert len(lengths) > 2 and min(lengths) >= 3 and max(lengths) <= 8
    assert target.queries == 50
    with pytest.raises(LanguageError, match="public text"):
        generate_samples(target, sampling, 5)
    with pytest.raises(LanguageError, match="public text"):
        generate_samples(target, sampling, 5, public_text=["", ""])
    with pytest.raises(LanguageError, match="context"):
        generate_samples(
            target, Sampling(strategy="prefix", prefix_tokens=(5, 47)), 2, public_text=PUBLIC
        )


def test_forced_prefixes_equal_prefilled_prefixes(parrot: CausalLM) -> None:
    """Greedy (top-1) prefix samples equal `complete` from BOS + the same prefix, prefilled."""
    target = LanguageTarget(parrot, "scores", VOCAB_SIZE, batch_size=7)
    sampling = Sampling(strategy="prefix", top_n=1, length=9, prefix_tokens=(1, 12))
    public = [SENTENCE, "the quick red", "over the"]
    samples = generate_samples(target, sampling, 30, public_text=public, batch_size=16)
    assert len({len(s.prefix) for s in samples}) > 4
    tokenizer = ByteTokenizer()
    for s in samples:
        prefix = torch.tensor([tokenizer.encode(s.prefix, bos=True)])
        expected = tokenizer.decode(target.complete(prefix, 9)[0].tolist())
        assert s.text == expected


def test_exactly_length_tokens_follow_each_prefix() -> None:
    z = fixed_logits()
    target = LanguageTarget(FixedLM(z, max_len=16), "scores", VOCAB_SIZE)
    sampling = Sampling(strategy="prefix", top_n=1, length=6, prefix_tokens=(2, 5))
    samples = generate_samples(target, sampling, 20, public_text=["0123456789"])
    assert {len(s.prefix) for s in samples} == {2, 3, 4, 5}
    assert all(s.text == s.prefix + "a" * 6 for s in samples)
    long = generate_samples(
        target, Sampling(strategy="prefix", top_n=1, length=99), 8, public_text=["0123456789"]
    )
    assert all(s.text == s.prefix + "a" * (15 - len(s.prefix)) for s in long)


def test_prefix_of_a_short_document_is_the_whole_document(parrot: CausalLM) -> None:
    target = LanguageTarget(parrot, "scores", VOCAB_SIZE)
    samples = generate_samples(
        target, Sampling(strategy="prefix", length=5, prefix_tokens=(5, 10)), 6, public_text=["ab"]
    )
    assert all(s.prefix == "ab" and s.text.startswith("ab") for s in samples)


def test_text_is_cut_at_eos_and_decoded_after_bos() -> None:
    z = torch.full((VOCAB_SIZE,), -20.0)
    z[EOS] = -1.0
    z[ord("x")] = 0.0
    target = LanguageTarget(FixedLM(z, max_len=12), "scores", VOCAB_SIZE)
    samples = generate_samples(target, Sampling(length=30, top_n=2), 200)
    assert {set(s.text) <= {"x"} for s in samples} == {True}
    lengths = {len(s.text) for s in samples}
    assert 0 in lengths and max(lengths) == 11
    assert target.tokens_served < 200 * 11


def test_reproducible_and_seeded() -> None:
    target = random_target()
    for strategy in STRATEGIES:
        sampling = Sampling(strategy=strategy, length=12)
        a = generate_samples(target, sampling, 10, public_text=PUBLIC, seed=3, batch_size=4)
        b = generate_samples(target, sampling, 10, public_text=PUBLIC, seed=3, batch_size=4)
        c = generate_samples(target, sampling, 10, public_text=PUBLIC, seed=4, batch_size=4)
        assert a == b and a != c
        assert all(isinstance(s, Sample) for s in a)
        # batch b depends only on (seed, b): the first 8 of 12 samples are those of a run of 8
        d = generate_samples(target, sampling, 8, public_text=PUBLIC, seed=3, batch_size=4)
        assert d == a[:8]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_resume_after_a_killed_run(tmp_path: Path, strategy: str) -> None:
    sampling = Sampling(strategy=strategy, length=10)
    options = {"public_text": PUBLIC, "seed": 5, "batch_size": 3}
    whole = generate_samples(random_target(), sampling, 11, **options)

    class KilledError(Exception):
        pass

    def kill_after_two(stage: str, done: float, total: float) -> None:
        assert total == 11 and stage == f"sampling ({strategy})"
        if done >= 6:
            raise KilledError

    with ResultStore(tmp_path / "store.sqlite") as store:
        first = random_target()
        with pytest.raises(KilledError):
            generate_samples(first, sampling, 11, store=store, progress=kill_after_two, **options)
        assert first.queries == 6
        namespace = generation_namespace(sampling, 11, seed=5, batch_size=3, public_text=PUBLIC)
        assert store.keys(namespace) == {"0", "1"}
        seen: list[float] = []
        second = random_target()
        resumed = generate_samples(
            second, sampling, 11, store=store, progress=lambda s, d, t: seen.append(d), **options
        )
        assert resumed == whole and seen == [0, 3, 6, 9, 11]
        assert second.queries == 5
        third = random_target()
        assert generate_samples(third, sampling, 11, store=store, **options) == whole
        assert third.queries == 0


def test_namespace_separates_runs_that_differ() -> None:
    base = generation_namespace(Sampling(), 10)
    assert base == generation_namespace(Sampling(), 10)
    assert base.startswith("lm-generation/")
    others = [
        generation_namespace(Sampling(top_n=20), 10),
        generation_namespace(Sampling(), 11),
        generation_namespace(Sampling(), 10, seed=1),
        generation_namespace(Sampling(), 10, batch_size=8),
        generation_namespace(Sampling(), 10, key={"target": "a"}),
    ]
    assert len({base, *others}) == 6
    prefix = Sampling(strategy="prefix")
    assert generation_namespace(prefix, 10, public_text=["a"]) != generation_namespace(
        prefix, 10, public_text=["b"]
    )


def test_queries_and_access() -> None:
    for strategy in STRATEGIES:
        target = random_target()
        generate_samples(
            target, Sampling(strategy=strategy, length=5), 13, public_text=PUBLIC, batch_size=5
        )
        assert target.queries == 13 and target.tokens_served > 13
    label_only = random_target().with_access("label")
    with pytest.raises(AccessError, match="scores"):
        generate_samples(label_only, Sampling(), 2)  # type: ignore[arg-type]
    budget = random_target().with_budget(10)
    with pytest.raises(QueryBudgetError, match="budget of 10"):
        generate_samples(budget, Sampling(length=3), 12, batch_size=4)  # type: ignore[arg-type]
    assert budget.queries == 8


@pytest.mark.parametrize(
    ("sampling", "match"),
    [
        (Sampling(strategy="beam"), "top-n, temperature, prefix"),
        (Sampling(length=0), "length"),
        (Sampling(top_n=0), "top_n"),
        (Sampling(top_n=2.5), "top_n"),  # type: ignore[arg-type]
        (Sampling(temperature_start=0.0), "temperature_start"),
        (Sampling(temperature_end=float("nan")), "temperature_end"),
        (Sampling(decay_tokens=-1), "decay_tokens"),
        (Sampling(prefix_tokens=(5,)), "pair"),  # type: ignore[arg-type]
        (Sampling(prefix_tokens=(0, 4)), "prefix_tokens"),
        (Sampling(prefix_tokens=(6, 4)), "empty range"),
    ],
)
def test_bad_sampling_is_one_line(sampling: Sampling, match: str) -> None:
    with pytest.raises(LanguageError, match=match) as info:
        sampling.validate()
    assert "\n" not in str(info.value)
    with pytest.raises(LanguageError, match=match):
        generate_samples(random_target(), sampling, 2, public_text=PUBLIC)


@pytest.mark.parametrize(
    ("options", "match"),
    [({"count": 0}, "count"), ({"batch_size": 0}, "batch_size"), ({"seed": -1}, "seed")],
)
def test_bad_run_options(options: dict[str, int], match: str) -> None:
    arguments = {"count": 2, **options}
    count = arguments.pop("count")
    with pytest.raises(LanguageError, match=match):
        generate_samples(random_target(), Sampling(), count, **arguments)  # type: ignore[arg-type]
