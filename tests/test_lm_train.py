"""privacylab.lm: training byte-level GPTs on a corpus (non-private and DP-SGD), the model folder
contract, and reading it back as a target.

One tiny model per privacy setting (module-scoped) on a hand-made corpus where one record is
planted in 6 member documents and a control record of the same format is nowhere: the
non-private model memorises the planted record (its loss far below the control's), the DP
model (eps = 8) does not."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.data.corpus import Corpus, Record, load_corpus
from privacylab.data.tokenizer import BOS, EOS, PAD, VOCAB_SIZE
from privacylab.lm import (
    DP_BATCH,
    IGNORE,
    SIZES,
    LMConfig,
    LMError,
    document_perplexity,
    language_target,
    lm_examples,
    load_language_model,
    next_token_loss,
    target_facts,
    train_language_model,
)
from privacylab.models import ModelSpec, save_model
from privacylab.models.gpt import CausalLM
from privacylab.target.target import QueryBudgetError
from privacylab.training import TrainingError

CONTEXT = 48
WORDS = [
    "the",
    "a",
    "of",
    "model",
    "data",
    "train",
    "word",
    "text",
    "some",
    "other",
    "more",
    "less",
    "can",
    "will",
    "has",
]
PLANTED = "Ann Lee 555-0173"
CONTROL = "Bob Kay 555-0928"
COPIES = 6


def _corpus(seed: int = 0) -> Corpus:
    rng = np.random.default_rng(seed)
    documents = [" ".join(rng.choice(WORDS, size=5)) for _ in range(48)]
    members = np.zeros(48, dtype=bool)
    members[::2] = True
    hosts = tuple(int(i) for i in np.flatnonzero(members)[:COPIES])
    for i in hosts:
        documents[i] = documents[i][:20] + " " + PLANTED
    record = Record(PLANTED, {"name": "Ann Lee", "phone": "555-0173"}, COPIES, hosts)
    return Corpus(documents, members, records=[record], context=CONTEXT)


CONFIG = LMConfig(size="tiny", epochs=20, batch_size=8, lr=1e-2, seed=0)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return _corpus()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, corpus: Corpus) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("lm") / "tiny"
    return folder, train_language_model(corpus, CONFIG, folder)


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory, corpus: Corpus) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("lm") / "tiny-dp"
    config = LMConfig(
        size="tiny", epochs=10, batch_size=8, lr=1e-2, epsilon=8.0, seed=0, accountant="rdp"
    )
    return folder, train_language_model(corpus, config, folder)


def _string_nll(model: CausalLM, host: str, text: str) -> float:
    """Mean NLL (nats per token) of `text`'s tokens following BOS + `host` + space."""
    ids = [BOS, *(host + " ").encode(), *text.encode()]
    start = len(ids) - len(text.encode())
    tokens = torch.tensor([ids])
    with torch.no_grad():
        logp = F.log_softmax(model(tokens[:, :-1]), dim=-1)[0]
    picked = logp[torch.arange(len(ids) - 1), tokens[0, 1:]]
    return float(-picked[start - 1 :].mean())


def _gap(folder: Path, corpus: Corpus) -> float:
    """Control minus planted NLL, after the host text of a held-out document."""
    model = load_language_model(folder).model
    host = corpus.documents[int(corpus.heldout_indices[0])][:20]
    return _string_nll(model, host, CONTROL) - _string_nll(model, host, PLANTED)


# --- examples and loss ---------------------------------------------------------------------


def test_examples_frame_documents_and_ignore_padding(corpus: Corpus) -> None:
    x, y = lm_examples(corpus, [0, 1])
    assert x.shape == y.shape == (2, CONTEXT - 1)
    for row, text in enumerate(corpus.texts([0, 1])):
        ids = [BOS, *text.encode(), EOS]
        assert x[row, : len(ids) - 1].tolist() == ids[:-1]
        assert y[row, : len(ids) - 1].tolist() == ids[1:]
        assert (y[row, len(ids) - 1 :] == IGNORE).all()
        assert (x[row, len(ids) :] == PAD).all()


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=5),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_next_token_loss_is_each_documents_mean_cross_entropy(lengths: list[int], seed: int):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(lengths), 9, 7, generator=gen, dtype=torch.float64)
    y = torch.full((len(lengths), 9), IGNORE)
    for i, n in enumerate(lengths):
        y[i, :n] = torch.randint(0, 7, (n,), generator=gen)
    got = next_token_loss(logits, y)
    for i, n in enumerate(lengths):
        logp = logits[i, :n].log_softmax(-1)
        want = -float(sum(logp[t, int(y[i, t])] for t in range(n))) / n
        assert math.isclose(float(got[i]), want, rel_tol=1e-9)


def test_perplexity_of_a_uniform_model_is_the_vocabulary(corpus: Corpus) -> None:
    model = CausalLM(VOCAB_SIZE, CONTEXT, dim=8, heads=2, blocks=1)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
    assert math.isclose(document_perplexity(model, corpus.documents, CONTEXT), VOCAB_SIZE)
    assert math.isnan(document_perplexity(model, [], CONTEXT))


def test_perplexity_pools_the_targets_token_log_probs(
    trained: tuple[Path, dict], corpus: Corpus
) -> None:
    """Re-derived through the target's scores: exp(-mean over all predicted tokens)."""
    folder, language = trained
    target = language_target(folder)
    texts = corpus.texts(corpus.heldout_indices)
    logp = target.token_log_probs(target.tokenizer.batch(texts, CONTEXT))
    want = math.exp(-float(torch.nansum(logp.double())) / int((~torch.isnan(logp)).sum()))
    assert math.isclose(language["perplexity"]["heldout"], want, rel_tol=1e-4)


# --- training --------------------------------------------------------------------------------


def test_non_private_model_memorises_the_planted_record(
    trained: tuple[Path, dict], corpus: Corpus
) -> None:
    folder, language = trained
    assert language["perplexity"]["members"] < language["perplexity"]["heldout"]
    assert _gap(folder, corpus) > 3.0
    history = language["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]


def test_dp_model_reports_its_budget_and_does_not_memorise(
    private: tuple[Path, dict], trained: tuple[Path, dict], corpus: Corpus
) -> None:
    folder, language = private
    assert language["private"] and language["accountant"] == "rdp"
    assert 0 < language["epsilon"] <= 8.0 and language["target_epsilon"] == 8.0
    assert language["delta"] == 1e-5 and language["noise_multiplier"] > 0.3
    assert language["steps"] > 0 and language["max_grad_norm"] > 0
    assert abs(_gap(folder, corpus)) < 1.5 and 4 * abs(_gap(folder, corpus)) < _gap(
        trained[0], corpus
    )
    gap = language["perplexity"]["heldout"] - language["perplexity"]["members"]
    non_private = trained[1]["perplexity"]
    assert gap < non_private["heldout"] - non_private["members"]


def test_folder_round_trip(trained: tuple[Path, dict], corpus: Corpus) -> None:
    folder, language = trained
    loaded = load_language_model(folder)
    assert isinstance(loaded.model, CausalLM) and not loaded.model.training
    assert loaded.spec == ModelSpec("gpt", (CONTEXT,), VOCAB_SIZE, SIZES["tiny"])
    assert loaded.corpus.to_dict() == corpus.to_dict()
    assert load_corpus(folder).to_dict() == corpus.to_dict()
    stored = loaded.metadata["language"]
    for key in ("size", "parameters", "context", "private", "epsilon", "delta", "accountant"):
        assert key in stored
    assert stored["perplexity"] == language["perplexity"]
    assert stored["parameters"] == sum(p.numel() for p in loaded.model.parameters()) < 100_000
    assert stored["epochs"] == 20 and stored["seconds"] > 0 and stored["context"] == CONTEXT
    x, _ = lm_examples(corpus, [0, 1, 2])
    again = load_language_model(folder).model
    torch.testing.assert_close(loaded.model(x), again(x), rtol=0, atol=0)
    facts = target_facts(folder)
    assert {"folder", "size", "parameters", "private", "epsilon", "perplexity"} <= set(facts)
    assert facts["size"] == "tiny" and facts["private"] is False and facts["epsilon"] is None


def test_target_counts_queries_and_keeps_its_budget(trained: tuple[Path, dict]) -> None:
    folder, _ = trained
    target = language_target(folder, query_budget=5)
    tokens = target.tokenizer.batch(["ab", "cd", "ef"], 8)
    target.token_log_probs(tokens)
    assert target.queries == 3 and target.tokens_served == 3 * 7
    with pytest.raises(QueryBudgetError):
        target.token_log_probs(tokens)
    with pytest.raises(Exception, match="access"):
        language_target(folder, "label").token_log_probs(tokens)


def test_a_killed_run_resumes_to_the_same_weights(tmp_path: Path, corpus: Corpus) -> None:
    class Killed(BaseException):
        pass

    config = LMConfig(
        size="tiny", epochs=3, batch_size=8, lr=1e-2, epsilon=8.0, seed=3, accountant="rdp"
    )

    def kill(stage: str, done: float, total: float) -> None:
        if done == 2:
            raise Killed

    with pytest.raises(Killed):
        train_language_model(corpus, config, tmp_path / "killed", progress=kill)
    assert not (tmp_path / "killed" / "model.json").exists()
    epochs: list[float] = []
    resumed = train_language_model(
        corpus, config, tmp_path / "killed", progress=lambda s, d, t: epochs.append(d)
    )
    assert epochs == [0, 2, 3]
    whole = train_language_model(corpus, config, tmp_path / "whole")
    again = train_language_model(corpus, config, tmp_path / "whole")
    assert again["seconds"] >= whole["seconds"] and again["history"] == whole["history"]
    assert again["perplexity"] == whole["perplexity"] and again["epsilon"] == whole["epsilon"]
    assert resumed["epsilon"] == whole["epsilon"] and resumed["steps"] == whole["steps"]
    assert resumed["accountant"] == "rdp" and resumed["epsilon"] <= 8.0
    a = load_language_model(tmp_path / "killed").model.state_dict()
    b = load_language_model(tmp_path / "whole").model.state_dict()
    for name in b:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)


# --- configuration and bad input -------------------------------------------------------------


def test_defaults_follow_the_privacy() -> None:
    plain, dp = LMConfig(size="medium").resolved(), LMConfig(epsilon=8.0).resolved()
    assert plain.batch_size == 64 and plain.epochs and plain.lr
    assert dp.batch_size == DP_BATCH > plain.batch_size and dp.lr > plain.lr  # type: ignore[operator]
    assert LMConfig(epsilon=8.0, batch_size=32).resolved().batch_size == 32
    assert LMConfig(epsilon=8.0).resolved(members=200).batch_size == 66
    assert LMConfig(epsilon=8.0).resolved(members=3000).batch_size == DP_BATCH
    assert LMConfig().resolved(members=200).batch_size == 64
    privacy = LMConfig(epsilon=8.0).train_config().privacy
    assert privacy is not None and privacy.clipping == "ghost" and privacy.accountant == "pld"


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        (LMConfig(size="huge"), LMError, "unknown model size 'huge'"),
        (LMConfig(epochs=0), TrainingError, "epochs"),
        (LMConfig(lr=-1.0), TrainingError, "learning rate"),
        (LMConfig(epsilon=0.0), TrainingError, "epsilon"),
        (LMConfig(epsilon=8.0, delta=2.0), TrainingError, "delta"),
        (LMConfig(options={"depth": 2}), LMError, "unknown gpt option"),
        (LMConfig(epsilon=1.0, accountant="nope"), LMError, "unknown accountant 'nope'"),
    ],
)
def test_bad_configurations_are_refused(config: LMConfig, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        config.validate()


def test_bad_input_is_refused(tmp_path: Path, corpus: Corpus, trained: tuple[Path, dict]) -> None:
    trained_folder = trained[0]
    too_large = LMConfig(size="tiny", epsilon=8.0, batch_size=25)
    with pytest.raises(LMError, match="batch size 25 exceeds the 24 member documents"):
        train_language_model(corpus, too_large, tmp_path / "a")
    with pytest.raises(LMError, match="needs a Corpus"):
        train_language_model(corpus.documents, CONFIG, tmp_path / "b")  # type: ignore[arg-type]
    with pytest.raises(LMError, match="holds a model of another corpus"):
        train_language_model(_corpus(seed=1), CONFIG, trained_folder)
    with pytest.raises(LMError, match="no language-model folder"):
        load_language_model(tmp_path / "missing")
    mlp = ModelSpec("mlp", (4,), 2, {})
    save_model(mlp.build(seed=0), tmp_path / "mlp", mlp)
    with pytest.raises(LMError, match="not a language model"):
        load_language_model(tmp_path / "mlp")


def test_a_folder_without_its_corpus_is_refused(tmp_path: Path, trained: tuple[Path, dict]) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(trained[0], copy)
    (copy / "corpus.json").unlink()
    with pytest.raises(LMError, match=r"no corpus\.json"):
        load_language_model(copy)
