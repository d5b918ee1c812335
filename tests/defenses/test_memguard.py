"""MemGuard (Jia et al. 2019): Phase I keeps the label and drives the defender's classifier g to
0.5, Phase II respects the expected-L1 budget, and — seed 000's finding (Choquette-Choo et al.
2021, "Are CB defenses always effective against LO attacks?") — a confidence-vector attack
calibrated on undefended reference outputs falls to chance while the gap and the label-only
noise attack see exactly the same answers as without the defence."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from privacylab.attacks.membership import MembershipTask, make_attack, run_attack
from privacylab.data import Dataset, load_dataset
from privacylab.defenses import DefenseData, DefenseError, make_defense, parse_defense
from privacylab.defenses.output import memguard
from privacylab.defenses.output.memguard import MemGuard
from privacylab.models import build_model
from privacylab.report import membership_metrics
from privacylab.target import Target
from privacylab.training import TrainConfig, train

MEMBERS = 150
REFERENCES = 4


@dataclass
class Scenario:
    data: Dataset
    model: nn.Module
    members: np.ndarray
    holdout: np.ndarray
    task: MembershipTask
    membership: np.ndarray
    defense: MemGuard
    probs: torch.Tensor


def _train(data: Dataset, rows: np.ndarray, seed: int) -> nn.Module:
    model = build_model("mlp", data.input_shape, data.num_classes, seed=seed, widths=(256,))
    config = TrainConfig(epochs=100, batch_size=32, lr=0.05, seed=seed)
    return train(model, data.subset(rows), config).model.eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: the small matrices here run slower on oversubscribed cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def scenario(one_thread: None) -> Scenario:
    """An MLP overfit on 150 digits (train accuracy 1.0, test about 0.9); 150 other digits are
    the defender's holdout, 150 more the evaluation non-members; the attacker owns the rest and
    trains 4 references like the target on 150 of them each."""
    data = load_dataset("digits")
    perm = np.random.default_rng(0).permutation(len(data))
    members, holdout = perm[:MEMBERS], perm[MEMBERS : 2 * MEMBERS]
    others, population = perm[2 * MEMBERS : 3 * MEMBERS], perm[3 * MEMBERS :]
    model = _train(data, members, 0)
    candidates = np.concatenate([members, others])
    n = len(candidates)
    references, keep = [], []
    for r in range(REFERENCES):
        inside = np.zeros(len(population), dtype=bool)
        inside[np.random.default_rng(100 + r).permutation(len(population))[:MEMBERS]] = True
        references.append(_train(data, population[inside], 100 + r))
        keep.append(np.concatenate([np.zeros(n, dtype=bool), inside]))
    task = MembershipTask(
        data.features[candidates],
        data.labels[candidates],
        data.num_classes,
        data.features[population],
        data.labels[population],
        references,
        np.array(keep),
    )
    membership = np.r_[np.ones(MEMBERS), np.zeros(MEMBERS)].astype(np.int64)
    defense = MemGuard()
    defense.fit(model, data.subset(members), DefenseData(holdout=data.subset(holdout)))
    probs = Target(model, "scores", data.num_classes).probabilities(task.x)
    return Scenario(data, model, members, holdout, task, membership, defense, probs)


def _with_budget(defense: MemGuard, budget: float) -> MemGuard:
    return defense.with_budget(budget)


# ------------------------------------------------------------------ Phase I and Phase II


@pytest.mark.parametrize("budget", [0.05, 1.0, 2.0])
def test_label_kept_and_rows_valid(scenario: Scenario, budget: float) -> None:
    out = _with_budget(scenario.defense, budget).transform(scenario.probs)
    assert out.shape == scenario.probs.shape and out.dtype == scenario.probs.dtype
    assert torch.equal(out.argmax(1), scenario.probs.argmax(1))
    assert (out >= 0).all()
    assert torch.allclose(out.sum(1), torch.ones(len(out)), atol=1e-5)


def test_edge_rows_keep_the_label(scenario: Scenario) -> None:
    k = scenario.data.num_classes
    edge = torch.full((4, k), 1.0 / k)  # uniform: a tie everywhere
    edge[1] = torch.nn.functional.one_hot(torch.tensor(3), k).float()  # one-hot, zeros
    edge[2, :2], edge[2, 2:] = 0.4, 0.2 / (k - 2)  # tie at the top
    edge[3] = torch.linspace(1, 2, k) / torch.linspace(1, 2, k).sum()
    out = _with_budget(scenario.defense, 2.0).transform(edge)
    assert torch.equal(out.argmax(1), edge.argmax(1))
    assert (out >= 0).all() and torch.allclose(out.sum(1), torch.ones(4), atol=1e-5)


def test_budget_zero_is_the_identity_even_unfitted(scenario: Scenario) -> None:
    rows = scenario.probs.double()
    assert torch.equal(_with_budget(scenario.defense, 0.0).transform(rows), rows)
    assert torch.equal(MemGuard(budget=0).transform(rows), rows)


def test_phase_one_drives_g_to_one_half_on_members(scenario: Scenario) -> None:
    """Algorithm 1 on the training members' vectors: almost every row finds noise, g crosses
    0.5 on each, and on average ends within a few hundredths of it."""
    defense = scenario.defense
    members = scenario.probs[:MEMBERS]
    noisy, found = defense.phase_one(members)
    before = defense.membership_probability(members)
    after = defense.membership_probability(noisy)
    assert found.float().mean() >= 0.95
    assert (before - 0.5).abs().mean() > 0.05
    assert (after[found] - 0.5).abs().mean() < 0.03
    crossed = (after[found] - 0.5) * (before[found] - 0.5) <= 0
    assert crossed.all()


def test_expected_distortion_is_within_the_budget(scenario: Scenario) -> None:
    """Phase II: row i is perturbed with p_i = min(1, ε/||r_i||₁), so its expected distortion
    p_i·||r_i||₁ = min(ε, ||r_i||₁) <= ε; the realised mean stays near it, and the share of rows
    perturbed matches the mean p_i."""
    noisy, found = scenario.defense.phase_one(scenario.probs)
    norms = (noisy - scenario.probs).abs().sum(1).double()
    for budget in (0.005, 0.02, 1.0):
        out = _with_budget(scenario.defense, budget).transform(scenario.probs)
        distortion = (out - scenario.probs).abs().sum(1).double()
        p = torch.where(found, (budget / norms.clamp_min(1e-300)).clamp(max=1.0), 0.0)
        assert float((p * norms).max()) <= budget + 1e-12
        assert float(distortion.mean()) <= budget * 1.3 + 2e-3
        perturbed = (distortion > 0).double().mean()
        assert abs(float(perturbed) - float(p.mean())) < 0.08


def test_phase_two_keeps_rows_whose_noise_moves_g_away_from_one_half(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Phase II (Sec. 4.3, the authors' `evaluate_nn_attack.py`): p = 0 where g(s + r) is not
    closer to 0.5 than g(s), whatever the budget. A Phase I answer that crosses 0.5 but lands
    farther from it (an overshoot) is not served; one that lands closer is."""
    defense = _with_budget(scenario.defense, 2.0)
    g = defense.membership_probability(scenario.probs)
    label = scenario.probs.argmax(1)
    order = (g - 0.5).abs().argsort()
    near = int(order[0])
    far = next(
        int(i)
        for i in order.flip(0)
        if label[i] == label[near] and (g[i] - 0.5) * (g[near] - 0.5) < 0
    )
    assert (g[far] - 0.5).abs() > (g[near] - 0.5).abs()
    rows = scenario.probs[[near, far]]
    swapped = scenario.probs[[far, near]]
    monkeypatch.setattr(defense, "phase_one", lambda probs: (swapped, torch.tensor([True, True])))
    out = defense.transform(rows)
    assert torch.equal(out[0], rows[0])  # overshoot: unchanged
    assert torch.equal(out[1], swapped[1])  # closer to 0.5 within budget 2: always served


def test_memo_overflow_computes_each_row_once(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch larger than the memo (or arriving at a full memo) is optimised chunk by chunk,
    each row once (it was optimised twice: the batch's early chunks were evicted, then the
    whole batch redone in one piece), and answers as a fresh defence does up to the last bits
    of the floats (matrix kernels round differently for other batch sizes)."""
    rows = scenario.probs[:10]
    expected = _with_budget(scenario.defense, 2.0).transform(rows)
    monkeypatch.setattr(memguard, "CHUNK", 4)
    monkeypatch.setattr(memguard, "CACHE_ROWS", 5)
    defense = MemGuard(**{**scenario.defense.params, "budget": 2.0})
    defense.classifier, defense.num_classes = scenario.defense.classifier, 10
    defense._shift, defense._scale = scenario.defense._shift, scenario.defense._scale
    sizes: list[int] = []
    inner = defense._phase_one_chunk

    def counted(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sizes.append(len(probs))
        return inner(probs)

    monkeypatch.setattr(defense, "_phase_one_chunk", counted)
    out = defense.transform(rows)
    assert torch.allclose(out, expected, atol=1e-6) and torch.equal(out.argmax(1), rows.argmax(1))
    assert sizes == [4, 4, 2]
    assert sum(map(len, defense._memo.values())) <= 5


def test_seeded_deterministic_and_order_free(scenario: Scenario) -> None:
    """Same seed, same answers; an answer depends only on the query, not on the batch it came
    in (the Phase II coin is a keyed hash of the row); another seed draws other coins."""
    rows = scenario.probs[torch.from_numpy(np.r_[np.arange(20), MEMBERS + np.arange(20)])]
    defense = _with_budget(scenario.defense, 0.01)
    out = defense.transform(rows)
    perm = torch.from_numpy(np.random.default_rng(1).permutation(len(rows)))
    assert torch.equal(defense.transform(rows[perm]), out[perm])
    refit = MemGuard(budget=0.01)
    refit.fit(
        scenario.model,
        scenario.data.subset(scenario.members),
        DefenseData(holdout=scenario.data.subset(scenario.holdout)),
    )
    assert torch.equal(refit.transform(rows), out)
    other = MemGuard(**{**refit.params, "seed": 1})
    other.fit(
        scenario.model,
        scenario.data.subset(scenario.members),
        DefenseData(holdout=scenario.data.subset(scenario.holdout)),
    )
    assert not torch.equal(other.transform(rows), out)


def test_bad_input_is_one_line(scenario: Scenario) -> None:
    data = scenario.data.subset(scenario.members)
    for extra in (DefenseData(), DefenseData(holdout=data.subset([]))):
        with pytest.raises(DefenseError, match="holdout") as caught:
            MemGuard().fit(scenario.model, data, extra)
        assert "\n" not in str(caught.value)
    with pytest.raises(DefenseError, match="fit"):
        MemGuard().transform(scenario.probs)
    with pytest.raises(DefenseError, match="shape"):
        scenario.defense.transform(scenario.probs[:, :3])
    with pytest.raises(DefenseError, match="NaN"):
        scenario.defense.transform(torch.full_like(scenario.probs[:2], float("nan")))
    for spec in ("memguard:-0.1", "memguard:budget=nan", "memguard:step=0", "memguard:seed=1.5"):
        with pytest.raises(DefenseError) as caught:
            parse_defense(spec)
        assert "\n" not in str(caught.value)
    assert make_defense("memguard", budget=0.5).label == "memguard:0.5"


# ------------------------------------------------------------------ seed 000's finding


def _metrics(attack: str, target: Target, task: MembershipTask, membership: np.ndarray, **kw):
    return membership_metrics(run_attack(make_attack(attack, **kw), target, task, membership))


def test_confidence_attack_falls_to_chance_label_only_attacks_unchanged(
    scenario: Scenario,
) -> None:
    """Choquette-Choo et al. 2021, Table "MemGuard": the confidence-vector attack (label-free
    entropy of the vector, its threshold chosen on the attacker's undefended references) drops
    to about 50% under MemGuard; the gap attack and the noise-robustness attack get identical
    scores, because MemGuard never changes a label."""
    k = scenario.data.num_classes
    plain = Target(scenario.model, "scores", k)
    defended = _with_budget(scenario.defense, 1.0).defend(Target(scenario.model, "scores", k))
    task, truth = scenario.task, scenario.membership

    before = _metrics("entropy", plain, task, truth, thresholds="global")
    after = _metrics("entropy", defended, task, truth, thresholds="global")
    assert before.threshold_source == "attack" and before.balanced_accuracy >= 0.6
    assert abs(after.balanced_accuracy - 0.5) <= 0.05
    assert after.auc <= 0.56 < before.auc

    gap_before = run_attack(make_attack("gap"), plain, task, truth)
    gap_after = run_attack(make_attack("gap"), defended, task, truth)
    assert np.array_equal(gap_before.scores, gap_after.scores)
    assert membership_metrics(gap_after).balanced_accuracy > 0.52

    rows = np.r_[np.arange(20), MEMBERS + np.arange(20)]
    small = task.subset(rows).restricted_to(())
    noise = {"sigma": 0.3, "n_samples": 5}
    noisy_before = run_attack(make_attack("noise", **noise), plain, small, truth[rows])
    noisy_after = run_attack(make_attack("noise", **noise), defended, small, truth[rows])
    assert np.array_equal(noisy_before.scores, noisy_after.scores)


def test_budget_curve_falls(scenario: Scenario) -> None:
    """MemGuard's own curve shape (README, Location: 0.73 -> 0.50 as the budget goes 0 -> 1):
    the attack's balanced accuracy does not rise as the budget grows, and ends near 0.5."""
    k = scenario.data.num_classes
    curve = []
    for budget in (0.0, 0.05, 0.1, 1.0):
        target = _with_budget(scenario.defense, budget).defend(Target(scenario.model, "scores", k))
        m = _metrics("entropy", target, scenario.task, scenario.membership, thresholds="global")
        curve.append(m.balanced_accuracy)
    assert all(b <= a + 0.01 for a, b in itertools.pairwise(curve)), curve
    assert curve[0] >= 0.6 and curve[-1] <= 0.55, curve
