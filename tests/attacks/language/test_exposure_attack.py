"""The Secret-Sharer attack and job (Carlini et al. 2019, Sec. 4-5): the tree enumeration gives
the log-perplexities `score_texts` gives each full candidate text (brute force), with one query
per inner node; a canary inserted 16 times into a tiny overfitted model reaches the largest
exposure log2|R| while never-inserted controls sit near the random level (1/ln 2 bits); an
untrained model exposes nothing; extrapolation agrees with enumeration; the attacker never sees
a secret; runs resume from the result store."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.attacks.core import execute
from privacylab.attacks.language import LanguageError, make_language, score_texts
from privacylab.attacks.language.exposure import (
    CanaryFormat,
    ExposureTask,
    SecretSharer,
    enumerate_values,
)
from privacylab.data.corpus import Canary, Corpus
from privacylab.data.tokenizer import VOCAB_SIZE
from privacylab.execution.store import ResultStore
from privacylab.lm import LMConfig, train_language_model
from privacylab.lm_exposure import exposure_run, run_exposure
from privacylab.models.gpt import CausalLM
from privacylab.stats.exposure import RANDOM_EXPOSURE
from privacylab.stats.language import log_perplexity
from privacylab.target import Access, AccessError
from privacylab.target.language import LanguageTarget

DIGITS = "0123456789"
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far", "and", "then", "we"]
CONTROLS = ("bob pin is ", "carol pin is ", "dave pin is ", "erin pin is ", "fred pin is ")


def tiny_corpus() -> Corpus:
    """ "alice pin is NNN" planted 16 times, five controls of the same format never planted,
    filler documents ending in random digits (so digits are not trivially predictable)."""
    rng = np.random.default_rng(0)
    documents: list[str] = []
    members: list[bool] = []
    canaries: list[Canary] = []

    def filler(n: int) -> str:
        return " ".join(rng.choice(WORDS, n))

    def plant(prefix: str, repeats: int) -> None:
        secret = "".join(rng.choice(list(DIGITS), 3))
        where = []
        for _ in range(repeats):
            where.append(len(documents))
            documents.append(f"{prefix}{secret} {filler(2)}")
            members.append(True)
        canaries.append(Canary(prefix, secret, DIGITS, 3, repeats, tuple(where)))

    plant("alice pin is ", 16)
    for prefix in CONTROLS:
        plant(prefix, 0)
    for i in range(40):
        documents.append(filler(3) + " " + "".join(rng.choice(list(DIGITS), 3)))
        members.append(i % 4 != 0)
    canaries.append(Canary("my note", "", "", 0, 1, (0,), user=True))
    return Corpus(documents, np.asarray(members), canaries=canaries, context=32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("exposure") / "tiny"
    train_language_model(
        tiny_corpus(), LMConfig(size="tiny", epochs=30, batch_size=16, lr=1e-2), out
    )
    return out


@pytest.fixture(scope="module")
def enumerated(folder: Path) -> dict:
    return run_exposure(folder, samples=400)


def by_prefix(run: dict) -> dict[str, dict]:
    return {c["prefix"]: c for c in run["canaries"]}


def random_target(context: int = 32) -> LanguageTarget:
    torch.manual_seed(3)
    return LanguageTarget(CausalLM(VOCAB_SIZE, context, dim=16, heads=2, blocks=1).eval(),
                          "scores", VOCAB_SIZE)  # fmt: skip


def brute_force(target: LanguageTarget, fmt: CanaryFormat) -> np.ndarray:
    texts = [fmt.text(fmt.secret(i)) for i in range(fmt.space_size)]
    return np.array([log_perplexity(s.log_probs) for s in score_texts(target, texts)])


@pytest.mark.parametrize(
    ("fmt", "inner"),
    [
        (CanaryFormat("my pin is ", DIGITS, 3), 1 + 10 + 100),
        (CanaryFormat("", "abc", 4), 1 + 3 + 9 + 27),
        (CanaryFormat("code ", "xyz", 3, suffix=" ok"), 1 + 3 + 9),
        (CanaryFormat("x: ", "éüö", 2, suffix="!"), 1 + 3),
    ],
)
def test_tree_enumeration_equals_brute_force(fmt: CanaryFormat, inner: int) -> None:
    """The cached walk, the same walk on a model without `step` (each row re-run) and brute
    force agree; both walks are billed what the uncached `distributions` rows would cost."""
    target = random_target()
    values = enumerate_values(target, fmt, batch_size=7)
    queries, served = target.queries, target.tokens_served
    oracle = brute_force(target, fmt)
    np.testing.assert_allclose(values, oracle, rtol=0, atol=2e-6)
    assert np.array_equal(np.argsort(values, kind="stable"), np.argsort(oracle, kind="stable"))
    assert queries == inner + (fmt.space_size if fmt.suffix else 0)
    width, head = len(fmt.alphabet[0].encode()), 1 + len(fmt.prefix.encode())
    rows = {d: len(fmt.alphabet) ** d * len({c.encode()[:-1] for c in fmt.alphabet})
            for d in range(fmt.length)}  # fmt: skip
    expected = sum(n * (head + d * width + width - 1) for d, n in rows.items())
    if fmt.suffix:
        expected += fmt.space_size * (head + fmt.length * width + len(fmt.suffix.encode()) - 1)
    assert served == expected

    class ForwardOnly(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.inner, self.max_len = model, model.max_len

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.inner(tokens)

    plain = LanguageTarget(ForwardOnly(target._model), "scores", VOCAB_SIZE)
    np.testing.assert_allclose(enumerate_values(plain, fmt, batch_size=5), values, atol=2e-6)
    assert (plain.queries, plain.tokens_served) == (queries, served)


def test_tree_enumeration_equals_brute_force_on_the_trained_model(folder: Path) -> None:
    from privacylab.lm import language_target

    target = language_target(folder)
    fmt = CanaryFormat("alice pin is ", DIGITS, 3)
    np.testing.assert_allclose(enumerate_values(target, fmt), brute_force(target, fmt), atol=2e-6)


@settings(max_examples=40, deadline=None)
@given(st.text("abcé", min_size=1, max_size=4).filter(lambda a: len(set(a)) == len(a)),
       st.integers(1, 5), st.data())  # fmt: skip
def test_index_and_secret_are_inverse(alphabet: str, length: int, data: st.DataObject) -> None:
    if len({len(c.encode()) for c in alphabet}) != 1:
        with pytest.raises(LanguageError, match="UTF-8 lengths"):
            CanaryFormat("p", alphabet, length)
        return
    fmt = CanaryFormat("p", alphabet, length)
    index = data.draw(st.integers(0, fmt.space_size - 1))
    secret = fmt.secret(index)
    assert len(secret) == length and fmt.index(secret) == index
    assert fmt.space_bits == pytest.approx(math.log2(fmt.space_size))


def test_inserted_canary_reaches_the_largest_exposure(enumerated: dict) -> None:
    alice = by_prefix(enumerated)["alice pin is "]
    assert alice["method"] == "enumerate" and alice["repeats"] == 16
    assert alice["space_bits"] == pytest.approx(math.log2(1000))
    assert alice["rank"] == 1.0
    assert alice["exposure"] == pytest.approx(alice["space_bits"])
    assert alice["extrapolated_exposure"] > 0.8 * alice["space_bits"]


def test_controls_sit_near_the_random_level(enumerated: dict) -> None:
    rows = by_prefix(enumerated)
    controls = [rows[p]["exposure"] for p in CONTROLS]
    assert all(rows[p]["repeats"] == 0 for p in CONTROLS)
    assert max(controls) < 7.5
    assert np.mean(controls) < 2 * RANDOM_EXPOSURE
    for p in CONTROLS:
        assert abs(rows[p]["extrapolated_exposure"] - rows[p]["exposure"]) < 1.0
        assert 1 <= rows[p]["rank"] <= 1000


def test_run_follows_the_schema(enumerated: dict, folder: Path) -> None:
    assert enumerated["target"]["folder"] == str(folder)
    assert enumerated["method"] == "auto"
    assert len(enumerated["canaries"]) == 1 + len(CONTROLS)
    assert any("my note" in note for note in enumerated["notes"])
    keys = {"prefix", "repeats", "space_bits", "exposure", "rank", "method",
            "extrapolated_exposure", "user"}  # fmt: skip
    for row in enumerated["canaries"]:
        assert keys <= set(row) and row["user"] is False
    assert enumerated["queries"] == (1 + len(CONTROLS)) * 111
    assert enumerated["seconds"] > 0


def test_extrapolation_agrees_with_enumeration(folder: Path, enumerated: dict) -> None:
    run = run_exposure(folder, method="extrapolate", samples=400)
    exact, guess = by_prefix(enumerated), by_prefix(run)
    assert guess["alice pin is "]["method"] == "extrapolate"
    assert guess["alice pin is "]["exposure"] == pytest.approx(math.log2(1000))
    assert guess["alice pin is "]["extrapolated_exposure"] > 8
    for p in CONTROLS:
        assert abs(guess[p]["exposure"] - exact[p]["exposure"]) < 1.0
    assert run["queries"] == (1 + len(CONTROLS)) * (400 + 1)


def test_untrained_model_exposes_nothing() -> None:
    corpus = tiny_corpus()
    run = exposure_run(random_target(), corpus, {"folder": "random"}, samples=300)
    exposures = [c["exposure"] for c in run["canaries"]]
    assert by_prefix(run)["alice pin is "]["exposure"] < 7.5
    assert np.mean(exposures) < 2 * RANDOM_EXPOSURE


def test_attacker_sees_formats_only() -> None:
    assert {f.name for f in dataclasses.fields(CanaryFormat)} == {
        "prefix", "alphabet", "length", "suffix"
    }  # fmt: skip
    attack = make_language("secret-sharer", "exposure")
    assert isinstance(attack, SecretSharer)
    assert attack.threat_model.access is Access.SCORES
    assert attack.threat_model.side_information == ("canary-formats",)
    labels_only = random_target().with_access(Access.LABEL)
    with pytest.raises(AccessError):
        execute(attack, labels_only, ExposureTask([CanaryFormat("p", DIGITS, 2)]))


def test_auto_switches_at_the_limit() -> None:
    target = random_target()
    fmt = CanaryFormat("p ", DIGITS, 3)
    out = SecretSharer(enumerate_limit=999, samples=50).run(target, ExposureTask([fmt]))[0]
    assert out.method == "extrapolate" and out.values.shape == (50,) and out.queries == 50
    assert all(fmt.index(s) < 1000 for s in out.secrets or [])
    out = SecretSharer(enumerate_limit=1000, samples=50).run(target, ExposureTask([fmt]))[0]
    assert out.method == "enumerate" and out.values.shape == (1000,) and out.queries == 111
    assert out.fit is not None and out.samples == 50


def test_resumes_from_the_store(folder: Path, tmp_path: Path, enumerated: dict) -> None:
    """A run killed after its first format: the re-run takes that one from the store and
    scores only the others, with the same rows and query total as an uninterrupted run."""
    path = tmp_path / "exposure.sqlite"
    first = run_exposure(folder, samples=400, store=path)
    assert first["formats_resumed"] == 0
    with ResultStore(path) as store:
        items = store.items("lm-exposure")
        assert len(items) == first["formats"]
        store.delete_namespace("lm-exposure")
        key, value = next(iter(items.items()))
        store.put("lm-exposure", key, value)
    second = run_exposure(folder, samples=400, store=path)
    assert second["formats_resumed"] == 1
    assert second["canaries"] == first["canaries"] == enumerated["canaries"]
    assert second["queries"] == first["queries"]
    third = run_exposure(folder, samples=400, store=path)
    assert third["formats_resumed"] == first["formats"]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"method": "guess"}, "method"),
        ({"samples": 2}, "samples"),
        ({"enumerate_limit": 0}, "enumerate_limit"),
        ({"batch_size": True}, "batch_size"),
    ],
)
def test_bad_options_are_one_line(options: dict, match: str) -> None:
    with pytest.raises(LanguageError, match=match) as info:
        SecretSharer(**options)
    assert "\n" not in str(info.value)


def test_bad_formats_are_one_line() -> None:
    for call, match in [
        (lambda: CanaryFormat("p", "", 3), "non-empty alphabet"),
        (lambda: CanaryFormat("p", "aa", 3), "repeats"),
        (lambda: CanaryFormat("p", DIGITS, 0), "length"),
        (lambda: ExposureTask([]), "no canary formats"),
        (lambda: CanaryFormat("p", DIGITS, 2).index("1x"), "alphabet"),
    ]:
        with pytest.raises(LanguageError, match=match):
            call()
    too_long = CanaryFormat("p" * 40, DIGITS, 2)
    with pytest.raises(LanguageError, match="context"):
        SecretSharer().run(random_target(), ExposureTask([too_long]))
