"""LM membership inference (`privacylab.attacks.language.membership`, `privacylab.lm_membership`):
a tiny GPT overfitted on its members separates them (AUC of the loss attack > 0.8) while an
untrained one is at chance; a reference model beats the loss attack when members are
intrinsically harder than non-members (Carlini et al. 2021's calibration); Min-K%++ through
the target equals a torch computation on the model's own logits; the shared scoring pass runs
the model once but charges every attack its queries (budget included); the result goes through
the one metrics path (AUC equal to scikit-learn's); the job's run payload; bad input."""

from __future__ import annotations

import math
import string

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

import privacylab.lm_membership
from _tiny_lm import train_tiny_gpt
from privacylab.attacks.language import LanguageError, language_class, language_names
from privacylab.attacks.language.base import make_language
from privacylab.attacks.language.membership import (
    LMMembershipAttack,
    LMMembershipTask,
    lowercased,
    run_lm_membership,
)
from privacylab.data.corpus import Corpus, Record
from privacylab.data.tokenizer import ByteTokenizer
from privacylab.lm_membership import DEFAULT_ATTACKS, choose_attacks, membership_run, roc_points
from privacylab.models.gpt import CausalLM
from privacylab.report.metrics import membership_metrics
from privacylab.stats.roc import roc_curve
from privacylab.target import Access
from privacylab.target.language import LanguageTarget
from privacylab.target.target import QueryBudgetError

CONTEXT = 48
NAMES = ("loss", "lowercase", "min-k", "min-k++", "reference", "zlib")
WORDS = [
    "river",
    "stone",
    "Blue",
    "quiet",
    "North",
    "garden",
    "Lamp",
    "silver",
    "Harbor",
    "candle",
    "Maple",
    "winter",
]


def _documents(rng: np.random.Generator, n: int) -> list[str]:
    """Sentences of one distribution: random words and a random number (< 46 bytes)."""
    out = []
    for _ in range(n):
        words = " ".join(rng.choice(WORDS, 3))
        out.append(f"{words} {int(rng.integers(100, 999))}.")
    return out


def _random_letters(rng: np.random.Generator, n: int, length: int = 30) -> list[str]:
    return ["".join(rng.choice(list(string.ascii_lowercase), length)) for _ in range(n)]


def _repetitive(rng: np.random.Generator, n: int) -> list[str]:
    out = []
    for _ in range(n):
        unit = "".join(rng.choice(list("abc"), 2))
        out.append((unit * 20)[: int(rng.integers(26, 34))])
    return out


def _train(texts: list[str], steps: int, seed: int) -> CausalLM:
    return train_tiny_gpt(texts, steps, seed, CONTEXT)


@pytest.fixture(scope="module")
def split() -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(0)
    docs = _documents(rng, 120)
    return docs[:60], docs[60:]


@pytest.fixture(scope="module")
def overfitted(split: tuple[list[str], list[str]]) -> CausalLM:
    return _train(split[0], 80, seed=0)


def _task(split: tuple[list[str], list[str]], reference: nn.Module | None = None):
    members, heldout = split
    truth = np.r_[np.ones(len(members), int), np.zeros(len(heldout), int)]
    return LMMembershipTask(members + heldout, reference), truth


def test_registry_threat_models_and_aliases() -> None:
    assert tuple(language_names("membership")) == NAMES
    for name in NAMES:
        cls = language_class(name, "membership")
        assert cls.kind == "membership" and cls.threat_model.access is Access.SCORES
        side = ("reference-models",) if name == "reference" else ()
        assert cls.threat_model.side_information == side
    assert language_class("mink").name == "min-k"
    assert language_class("mink++").name == "min-k++"
    assert make_language("min-k").k == 0.2 and make_language("min-k++").k == 0.2


def test_overfitted_model_separates_members(
    overfitted: CausalLM, split: tuple[list[str], list[str]]
) -> None:
    task, truth = _task(split)
    target = LanguageTarget(overfitted, "scores", 259)
    aucs = {}
    for name in ("loss", "zlib", "lowercase", "min-k", "min-k++"):
        result = run_lm_membership(make_language(name), target, task, truth)
        metrics = membership_metrics(result)
        assert metrics.auc == pytest.approx(roc_auc_score(truth, result.scores), abs=1e-12)
        assert metrics.queries == result.queries and metrics.access == "scores"
        aucs[name] = metrics.auc
    assert aucs["loss"] > 0.8, aucs
    assert aucs["min-k"] > 0.7 and aucs["min-k++"] > 0.7 and aucs["zlib"] > 0.7, aucs


def test_untrained_model_is_at_chance() -> None:
    rng = np.random.default_rng(1)
    docs = _documents(rng, 400)
    task, truth = _task((docs[:200], docs[200:]))
    target = LanguageTarget(_train([], 0, seed=1), "scores", 259)
    for name in ("loss", "min-k", "min-k++", "zlib"):
        auc = membership_metrics(run_lm_membership(make_language(name), target, task, truth)).auc
        assert 0.3 <= auc <= 0.7, (name, auc)


def test_reference_calibration_beats_loss_when_members_are_harder() -> None:
    """Members are random letters (hard), non-members repetitive text (easy): the target
    trained on the members plus public easy text gives the easy non-members lower loss than
    its (partly memorised) members, so the loss attack fails; a reference trained on other
    random letters and easy text knows each text's difficulty, so log P_ref - log P finds the
    members."""
    rng = np.random.default_rng(2)
    members = _random_letters(rng, 30)
    heldout = _repetitive(rng, 30)
    public_easy = _repetitive(rng, 30)
    target_model = _train(members + public_easy, 60, seed=2)
    reference_model = _train(_random_letters(rng, 30) + _repetitive(rng, 30), 60, seed=3)
    task, truth = _task((members, heldout), reference_model)
    target = LanguageTarget(target_model, "scores", 259)
    loss = membership_metrics(run_lm_membership(make_language("loss"), target, task, truth))
    ref_result = run_lm_membership(make_language("reference"), target, task, truth)
    reference = membership_metrics(ref_result)
    assert loss.auc < 0.5 and reference.auc > 0.9, (loss.auc, reference.auc)
    assert ref_result.params["reference_queries"] == 60 and ref_result.queries == 60


def test_min_k_plus_plus_equals_torch_on_the_model_logits(
    overfitted: CausalLM, split: tuple[list[str], list[str]]
) -> None:
    texts = split[0][:5] + split[1][:5]
    task = LMMembershipTask(texts)
    target = LanguageTarget(overfitted, "scores", 259)
    got = make_language("min-k++", k=0.3).run(target, task).scores
    tokenizer = ByteTokenizer()
    for text, score in zip(texts, got, strict=True):
        ids = torch.tensor([tokenizer.encode(text, bos=True)])
        with torch.no_grad():
            log_dist = torch.log_softmax(overfitted(ids[:, :-1])[0].double(), -1)
        picked = log_dist.gather(-1, ids[0, 1:, None])[:, 0]
        mu = (log_dist.exp() * log_dist).sum(-1)
        sigma = (log_dist.exp() * (log_dist - mu[:, None]) ** 2).sum(-1).sqrt()
        z = torch.sort((picked - mu) / sigma).values
        count = max(1, math.floor(0.3 * z.numel() + 1e-9))
        assert score == pytest.approx(float(z[:count].mean()), rel=1e-4, abs=1e-4)


class _Counting(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.rows = 0
        self.max_len = model.max_len

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.rows += int(tokens.shape[0])
        return self.inner(tokens)


def test_one_scoring_pass_serves_every_attack_and_each_is_charged(
    overfitted: CausalLM, split: tuple[list[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    task, truth = _task(split, _train([], 0, seed=4))
    counting = _Counting(overfitted)
    target = LanguageTarget(counting, "scores", 259)
    fresh = LanguageTarget(overfitted, "scores", 259)
    given: dict[str, object] = {}
    run = LMMembershipAttack.run

    def spy(self: LMMembershipAttack, target: LanguageTarget, task: LMMembershipTask):
        given[self.name] = task.reference
        return run(self, target, task)

    monkeypatch.setattr(LMMembershipAttack, "run", spy)
    n = len(task.texts)
    results = {}
    for name in NAMES:
        results[name] = run_lm_membership(make_language(name), target, task, truth)
        alone = run_lm_membership(
            make_language(name), fresh, _task(split, task.reference)[0], truth
        )
        np.testing.assert_allclose(results[name].scores, alone.scores, rtol=1e-9)
        assert results[name].queries == alone.queries == (2 * n if name == "lowercase" else n)
        assert (given[name] is task.reference) == (name == "reference")
    assert counting.rows == 2 * n
    assert target.queries == fresh.queries == 7 * n
    assert target.tokens_served == fresh.tokens_served
    for queried in (target, fresh):
        run_lm_membership(make_language("min-k", batch_size=7), queried, task, truth)
    assert counting.rows == 3 * n and target.tokens_served == fresh.tokens_served
    budget = LanguageTarget(overfitted, "scores", 259, query_budget=n + n // 2)
    task2, _ = _task(split)
    run_lm_membership(make_language("loss"), budget, task2, truth)
    with pytest.raises(QueryBudgetError):
        run_lm_membership(make_language("min-k"), budget, task2, truth)


def test_membership_run_payload(
    overfitted: CausalLM, split: tuple[list[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    members, heldout = split
    planted = "Jane Roe, jane@roe.org"
    documents = [m if i > 2 else f"{planted} {i}" for i, m in enumerate(members)] + heldout
    flags = np.r_[np.ones(len(members), bool), np.zeros(len(heldout), bool)]
    record = Record(planted, {"name": "Jane Roe"}, 3, (0, 1, 2))
    corpus = Corpus(documents, flags, records=[record], context=CONTEXT)
    target = LanguageTarget(overfitted, "scores", 259)
    seen: list[tuple[str, float, float]] = []
    given: list[tuple[tuple[str, ...], np.ndarray]] = []

    def spy(attack, target, task, membership):
        given.append((task.texts, np.asarray(membership)))
        return run_lm_membership(attack, target, task, membership)

    monkeypatch.setattr(privacylab.lm_membership, "run_lm_membership", spy)
    run = membership_run(
        target,
        corpus,
        facts={"folder": "x"},
        attacks="loss,mink,min-k++,loss",
        documents=50,
        seed=3,
        progress=lambda *a: seen.append(a),
    )
    assert run["documents"] == {"members": 50, "heldout": 50}
    assert run["reference"] is None and run["target"] == {"folder": "x"}
    assert [a["name"] for a in run["attacks"]] == ["loss", "min-k", "min-k++"]
    aucs = {a["name"]: a["auc"] for a in run["attacks"]}
    assert run["order"] == sorted(aucs, key=lambda k: -aucs[k])
    assert run["queries"] == 3 * 50 * 2 and run["seconds"] > 0
    for row in run["attacks"]:
        assert len(row["roc"]["fpr"]) <= 200 and row["roc"]["fpr"][0] == 0.0
        assert row["roc"]["tpr"][-1] == 1.0 and row["examples"] == 100
        assert {"tpr_at_1pct_fpr", "advantage", "epsilon_lower_bound"} <= set(row)
    assert seen[-1] == ("membership", 3, 3)
    texts, truth = given[0]
    assert truth.sum() == 50 and 0.3 < truth[:50].mean() < 0.7  # members are not listed first
    assert [text in documents[:60] for text in texts] == truth.astype(bool).tolist()
    again = membership_run(target, corpus, facts={}, attacks=["loss"], documents=50, seed=3)
    assert again["attacks"][0]["auc"] == aucs["loss"]
    small = membership_run(target, corpus, facts={}, attacks=["loss"], documents=1000)
    assert small["documents"] == {"members": 57, "heldout": 57}


def test_roc_points_thin_to_at_most_200_and_keep_the_ends() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=2000)
    truth = rng.integers(0, 2, 2000)
    points = roc_points(scores, truth)
    fpr, tpr, _ = roc_curve(scores, truth)
    assert 150 <= len(points["fpr"]) <= 200 and fpr.size > 200
    assert points["fpr"][:11] == fpr[:11].tolist() and points["tpr"][:11] == tpr[:11].tolist()
    assert (points["fpr"][0], points["tpr"][0]) == (0.0, 0.0)
    assert (points["fpr"][-1], points["tpr"][-1]) == (1.0, 1.0)
    assert np.all(np.diff(points["fpr"]) >= 0)
    assert set(zip(points["fpr"], points["tpr"], strict=True)) <= set(
        zip(fpr.tolist(), tpr.tolist(), strict=True)
    )
    assert roc_points([0.2, 0.1], [1, 0]) == {"fpr": [0.0, 0.0, 1.0], "tpr": [0.0, 1.0, 1.0]}


def test_lowercased_keeps_the_byte_length_bound() -> None:
    assert lowercased("Hello World") == "hello world"
    text = "İstanbul ABC"
    assert len(lowercased(text).encode()) <= len(text.encode())
    assert lowercased(text).endswith("abc")


def test_bad_input(overfitted: CausalLM, split: tuple[list[str], list[str]]) -> None:
    target = LanguageTarget(overfitted, "scores", 259)
    task, truth = _task(split)
    with pytest.raises(LanguageError, match="no reference model"):
        run_lm_membership(make_language("reference"), target, task, truth)
    with pytest.raises(LanguageError, match="3 membership labels for 120 texts"):
        run_lm_membership(make_language("loss"), target, task, [1, 0, 1])
    with pytest.raises(LanguageError, match="k must be in"):
        make_language("min-k", k=1.5)
    with pytest.raises(LanguageError, match="batch_size must be"):
        make_language("loss", batch_size=0)
    with pytest.raises(LanguageError, match="no texts"):
        LMMembershipTask([])
    with pytest.raises(LanguageError, match="text 1 is not"):
        LMMembershipTask(["a", ""])
    with pytest.raises(LanguageError, match="context holds"):
        make_language("loss").run(target, LMMembershipTask(["x" * 60]))
    short = CausalLM(259, 16, dim=8, heads=1, blocks=1)
    with pytest.raises(LanguageError, match=r"^reference: the reference model: text 0 is 30 "):
        make_language("reference").run(target, LMMembershipTask(["y" * 30], short))
    with pytest.raises(LanguageError, match="unknown membership attack 'nope'; choose one of"):
        choose_attacks("loss,nope", reference=False)
    with pytest.raises(LanguageError, match="needs a reference model"):
        choose_attacks("loss,reference", reference=False)
    assert "reference" not in choose_attacks(DEFAULT_ATTACKS, reference=False)
    assert choose_attacks(DEFAULT_ATTACKS, reference=True) == list(DEFAULT_ATTACKS)
    with pytest.raises(LanguageError, match="carlini-extraction is a extraction attack"):
        choose_attacks("carlini-extraction", reference=False)
    label_only = LanguageTarget(overfitted, "label", 259)
    with pytest.raises(PermissionError):
        run_lm_membership(make_language("loss"), label_only, task, truth)
