"""Learning-based extraction (random, copycat, jacobian, knockoff) on a small digits MLP."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from privacylab.attacks.extraction import (
    ExtractionError,
    ExtractionTask,
    Truth,
    extraction_names,
    make_extraction,
    run_extraction,
)
from privacylab.attacks.extraction.learning import (
    RunningNorm,
    certainty_reward,
    diversity_reward,
    loss_reward,
)
from privacylab.attacks.extraction.pools import (
    extraction_split,
    in_distribution_pool,
    out_of_distribution_pool,
)
from privacylab.attacks.extraction.thief import log_ratio_loss, soft_cross_entropy
from privacylab.data import load_dataset
from privacylab.data.dataset import train_test_indices
from privacylab.errors import PrivacylabError
from privacylab.models import ModelSpec
from privacylab.target import AccessError, Target
from privacylab.training import TrainConfig, train

SHAPE = (1, 8, 8)
SPEC = ModelSpec("mlp", SHAPE, 10, {"widths": [32]})
FAST = {"min_steps": 150, "epochs": 5}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup() -> dict:
    """A 64-32-10 victim trained on digits' training rows by the project trainer; the
    thief's pool and the evaluator's rows from `extraction_split`."""
    data = load_dataset("digits")
    train_rows, _ = train_test_indices(data, seed=0)
    victim = SPEC.build(seed=0)
    config = TrainConfig(epochs=8, batch_size=64, lr=0.05, seed=0)
    victim = train(victim, data.subset(train_rows), config).model.eval()
    pool_rows, eval_rows = extraction_split(data, 0)
    truth = Truth(victim, data.features[eval_rows], data.labels[eval_rows])
    return {
        "victim": victim,
        "pool": in_distribution_pool(data, pool_rows),
        "ood": out_of_distribution_pool(SHAPE, 300, seed=0),
        "truth": truth,
    }


def _task(pool: torch.Tensor | None, budget: int, seed: int = 0, **kw: object) -> ExtractionTask:
    return ExtractionTask(SHAPE, 10, pool=pool, architecture=SPEC, budget=budget, seed=seed, **kw)


def _run(setup: dict, name: str, access: str, budget: int, pool=None, seed=0, target=None, **opt):
    target = target or Target(setup["victim"], access, 10)
    answers = "scores" if access == "scores" else "labels"
    attack = make_extraction(name, answers=answers, **{**FAST, **opt})
    pool = setup["pool"] if pool is None else pool
    kind = "out-of-distribution" if pool is setup["ood"] else "in-distribution"
    return run_extraction(attack, target, _task(pool, budget, seed, pool_kind=kind), setup["truth"])


def test_registered() -> None:
    assert {"random", "copycat", "jacobian", "knockoff"} <= set(extraction_names())


def test_victim_is_a_fair_target(setup: dict) -> None:
    truth = setup["truth"]
    accuracy = float((truth.model(truth.x).argmax(1) == truth.y).float().mean())
    assert accuracy > 0.9


def test_copycat_from_scores_beats_labels(setup: dict) -> None:
    """CopycatCNN's setting (non-problem-domain images): at the same budget the probability
    vectors teach the copy more than the arg-max labels, on every seed."""
    for seed in (0, 1):
        options = {"pool": setup["ood"], "seed": seed, "min_steps": 200, "epochs": 10}
        scores = _run(setup, "copycat", "scores", 300, **options)
        labels = _run(setup, "copycat", "label", 300, **options)
        assert scores.queries == labels.queries == 300
        assert scores.params["answers"] == "probabilities"
        assert labels.params["answers"] == "labels"
        assert scores.fidelity > labels.fidelity + 0.03, (scores.fidelity, labels.fidelity)


def test_in_distribution_copycat_beats_random_queries(setup: dict) -> None:
    """Owned in-distribution data is worth far more than uniform noise (Tramèr et al.'s
    random queries mostly land in one class of a digits model)."""
    copycat = _run(setup, "copycat", "label", 300)
    random = _run(setup, "random", "label", 300)
    assert copycat.fidelity > 0.8
    assert random.fidelity < copycat.fidelity - 0.2
    assert copycat.params["mixup_queries"] == 300 - len(setup["pool"])


def test_curve_points_at_checkpoints(setup: dict) -> None:
    attack = make_extraction("copycat", answers="scores", **FAST)
    task = _task(setup["pool"], 300, checkpoints=(50, 100, 300))
    result = run_extraction(attack, Target(setup["victim"], "scores", 10), task, setup["truth"])
    assert [p.queries for p in result.curve] == [50, 100, 300]
    assert result.curve[-1].fidelity == result.fidelity


def test_jacobian_grows_the_set_within_bounds(setup: dict) -> None:
    """Alg. 1: the set doubles each round (seed 20: 20, 40, 80, 160, then the budget), every
    synthetic query lies in the bounds and is not a pool row."""
    seen: list[torch.Tensor] = []
    target = Target(setup["victim"], "label", 10).with_monitor(lambda x: seen.append(x.clone()))
    task = ExtractionTask(SHAPE, 10, pool=setup["pool"], architecture=SPEC, budget=250)
    attack = make_extraction("jacobian", answers="labels", seed_size=20, lam=0.1, **FAST)
    result = run_extraction(attack, target, task, setup["truth"])
    assert result.params["set_sizes"] == [20, 40, 80, 160, 250]
    assert result.queries == 250
    queries = torch.cat(seen)
    assert len(queries) == 250
    assert float(queries.min()) >= 0.0 and float(queries.max()) <= 1.0
    pool = setup["pool"].reshape(len(setup["pool"]), -1)
    synthetic = queries[20:].reshape(230, -1)
    distance = torch.cdist(synthetic.double(), pool.double()).min(1).values
    assert bool((distance > 1e-6).all())
    # each point moved by lambda per pixel from its parent, unless clipped at a bound
    step = (queries[20:40] - queries[:20]).abs()
    at_bound = (queries[20:40] == 0) | (queries[20:40] == 1)
    assert bool(((step - 0.1).abs() < 1e-6)[~at_bound].all())
    assert result.fidelity > 0.5


def test_jacobian_reservoir_grows_linearly(setup: dict) -> None:
    attack = make_extraction(
        "jacobian", answers="labels", seed_size=20, reservoir=30, sigma=2, tau=2, **FAST
    )
    task = ExtractionTask(SHAPE, 10, pool=setup["pool"], architecture=SPEC, budget=200)
    result = run_extraction(attack, Target(setup["victim"], "label", 10), task, setup["truth"])
    assert result.params["set_sizes"] == [20, 40, 80, 110, 140, 170, 200]


@pytest.mark.parametrize(
    "probs",
    [
        F.one_hot(torch.arange(6) % 3, 3).double(),
        torch.tensor([[0.3, 0.3, 0.3], [0.0, 0.0, 1.0], [0.1, 0.0, 0.9]], dtype=torch.float64),
        torch.zeros(4, 3, dtype=torch.float64),
        torch.tensor([[float("nan"), 0.5, 0.5], [float("inf"), 0.0, 0.0]]),
    ],
    ids=["one-hot", "rounded", "zero", "non-finite"],
)
def test_knockoff_rewards_are_finite(probs: torch.Tensor) -> None:
    """Eq. (3)-(5) on one-hot, rounded, all-zero and non-finite answers, with extreme thief
    logits: finite, and in their ranges (cert, div in [0, 1]; loss >= 0)."""
    logits = torch.tensor([[1e30, -1e30, 0.0]]).repeat(len(probs), 1)
    logits[0] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    cert = certainty_reward(probs)
    div = diversity_reward(probs, torch.full((3,), 1 / 3))
    loss = loss_reward(probs, logits)
    for reward in (cert, div, loss):
        assert bool(torch.isfinite(reward).all())
    assert bool(((cert >= 0) & (cert <= 1)).all()) and bool(((div >= 0) & (div <= 1)).all())
    assert bool((loss >= 0).all())


def test_rewards_closed_forms() -> None:
    probs = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)
    assert float(certainty_reward(probs)) == pytest.approx(0.5)
    mean = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    assert float(diversity_reward(probs, mean)) == pytest.approx(0.2 + 0.1)
    logits = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    expected = -(probs * torch.log(torch.softmax(logits, 1))).sum()
    assert float(loss_reward(probs, logits)) == pytest.approx(float(expected))


def test_running_norm_matches_numpy_and_constant_is_zero() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(3.0, 2.0, size=200)
    norm = RunningNorm()
    norm.update(values)
    assert norm.mean == pytest.approx(values.mean())
    assert norm.variance == pytest.approx(values.var())
    constant = RunningNorm()
    for _ in range(5):
        assert np.all(constant.normalise(np.ones(4)) == 0.0)


@pytest.mark.parametrize(
    "defense", [None, lambda p: torch.round(p * 10) / 10, torch.zeros_like], ids=str
)
@pytest.mark.parametrize("access", ["scores", "label"])
def test_knockoff_adaptive_rewards_stay_finite(setup: dict, access: str, defense) -> None:
    """The adaptive policy under probabilities, labels (one-hot), rounded probabilities and
    all-zero answers: every reward and preference finite, every action tried."""
    if access == "label" and defense is not None:
        pytest.skip("labels are the same under every defence here")
    target = Target(setup["victim"], access, 10, output_defense=defense)
    result = _run(setup, "knockoff", access, 200, target=target, policy="adaptive", clusters=5)
    params = result.params
    assert result.queries == 200
    assert np.isfinite(params["mean_reward"])
    assert np.all(np.isfinite(params["preferences"]))
    assert sum(params["action_counts"]) == 200 and min(params["action_counts"]) > 0


def test_knockoff_adaptive_prefers_the_rewarding_cluster() -> None:
    """A gradient bandit with the "cert" reward on a victim that is certain on one pool
    cluster and uniform on the other ends up preferring the certain cluster."""
    torch.manual_seed(0)
    pool = torch.cat([torch.zeros(100, 1, 8, 8) + 0.1, torch.ones(100, 1, 8, 8) * 0.9])
    pool = pool + 0.01 * torch.rand(pool.shape)

    class Victim(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            bright = (x.flatten(1).mean(1, keepdim=True) > 0.5).float()
            return bright * 20.0 * F.one_hot(torch.zeros(len(x), dtype=torch.int64), 10)

    target = Target(Victim(), "scores", 10)
    task = ExtractionTask(SHAPE, 10, pool=pool, architecture=SPEC, budget=150)
    attack = make_extraction(
        "knockoff", answers="scores", policy="adaptive", rewards="cert", clusters=2, alpha=0.5
    )
    truth = Truth(Victim(), pool[:10], torch.zeros(10, dtype=torch.int64))
    params = run_extraction(attack, target, task, truth).params
    centres = [float(pool[:100].mean()), float(pool[100:].mean())]
    assert centres[0] < centres[1]
    counts = params["action_counts"]
    bright_cluster = int(np.argmax(params["preferences"]))
    assert counts[bright_cluster] > counts[1 - bright_cluster]


def test_budget_exhaustion_stops_cleanly(setup: dict) -> None:
    """The target allows 120 of the 300 planned queries: the attack spends exactly 120,
    reports "budget" and returns a copy trained on them that is far above chance."""
    target = Target(setup["victim"], "scores", 10, query_budget=120)
    result = _run(setup, "copycat", "scores", 300, target=target, query_batch=64)
    assert result.stopped == "budget"
    assert result.queries == 120
    assert result.params["answered"] == 120
    assert result.fidelity > 0.6


def test_monitor_refusal_stops_cleanly(setup: dict) -> None:
    class FlaggedError(PrivacylabError):
        pass

    sent = [0]

    def monitor(x: torch.Tensor) -> None:
        if sent[0] + len(x) > 100:
            raise FlaggedError("client flagged by the query monitor")
        sent[0] += len(x)

    target = Target(setup["victim"], "label", 10).with_monitor(monitor)
    result = _run(setup, "knockoff", "label", 300, target=target, query_batch=50)
    assert result.stopped == "refused"
    assert result.queries == 100
    assert result.params["refusal"] == "client flagged by the query monitor"
    assert result.fidelity > 0.5


@pytest.mark.parametrize("name", ["random", "copycat", "jacobian", "knockoff"])
def test_seeded_runs_are_identical(setup: dict, name: str) -> None:
    """Same task seed: the same queries and bit-identical copies; another seed: another copy."""
    options = {"policy": "adaptive"} if name == "knockoff" else {}

    def steal(seed: int) -> dict[str, torch.Tensor]:
        attack = make_extraction(name, answers="scores", **FAST, **options)
        stolen = attack.steal(
            Target(setup["victim"], "scores", 10), _task(setup["pool"], 120, seed)
        )
        return stolen.model.state_dict()

    first, second, other = steal(0), steal(0), steal(1)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_bad_input_one_line(setup: dict) -> None:
    with pytest.raises(ExtractionError, match="policy must be one of"):
        make_extraction("knockoff", policy="greedy")
    with pytest.raises(ExtractionError, match="answers must be one of"):
        make_extraction("copycat", answers="logits")
    with pytest.raises(ExtractionError, match="lambda must be"):
        make_extraction("jacobian", lam=0)
    with pytest.raises(ExtractionError, match="needs data the attacker owns"):
        run_extraction(
            make_extraction("copycat"),
            Target(setup["victim"], "label", 10),
            _task(None, 10),
            setup["truth"],
        )
    with pytest.raises(AccessError, match="needs scores access"):
        run_extraction(
            make_extraction("copycat", answers="scores"),
            Target(setup["victim"], "label", 10),
            _task(setup["pool"], 10),
            setup["truth"],
        )


def test_soft_cross_entropy_closed_form() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    one_hot = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert float(soft_cross_entropy(logits, one_hot)) == pytest.approx(
        float(F.cross_entropy(logits, torch.tensor([0, 2])))
    )
    zero = torch.zeros(1, 3)
    assert float(soft_cross_entropy(logits[1:], zero)) == pytest.approx(np.log(3.0))
    unnormalised = torch.tensor([[0.2, 0.2, 0.0]])
    half = torch.tensor([[0.5, 0.5, 0.0]])
    assert float(soft_cross_entropy(logits[:1], unnormalised)) == pytest.approx(
        float(soft_cross_entropy(logits[:1], half))
    )


def test_auto_answers_follow_the_target(setup: dict) -> None:
    """answers="auto": probability vectors from a target that serves scores, labels from one
    that serves labels only."""
    attack = make_extraction("copycat", **FAST)
    task = _task(setup["pool"], 40)
    assert attack.steal(Target(setup["victim"], "scores", 10), task).params["answers"] == (
        "probabilities"
    )
    assert attack.steal(Target(setup["victim"], "label", 10), task).params["answers"] == "labels"


def test_log_ratio_loss_is_zero_exactly_at_the_logits_up_to_a_constant() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, 4, dtype=torch.float64)
    probs = torch.softmax(logits, 1)
    assert float(log_ratio_loss(logits + 3.0, probs)) == pytest.approx(0.0, abs=1e-20)
    shifted = logits.clone()
    shifted[:, 0] += 1.0
    # centred difference (1 - 1/4, -1/4, -1/4, -1/4): mean square 3/16
    assert float(log_ratio_loss(shifted, probs)) == pytest.approx(3 / 16)
