"""Confidence-based membership attacks: metric thresholds (Yeom et al. 2018; Song & Mittal 2021),
shadow models (Shokri et al. 2017), LiRA (Carlini et al. 2022) and RMIA (Zarifzadeh et al. 2024),
on an overfit target and on a target that never saw the candidates."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from privacylab.attacks.membership import (
    AttackError,
    MembershipResult,
    MembershipTask,
    make_attack,
    run_attack,
)
from privacylab.attacks.membership.outputs import (
    best_threshold,
    entropy,
    logit_confidence,
    modified_entropy,
)
from privacylab.attacks.membership.references import Recipe, reference_keep, train_references
from privacylab.data import Dataset, load_dataset, membership_split
from privacylab.execution import ResultStore, SerialExecutor
from privacylab.models import build_model
from privacylab.report import membership_metrics, roc_curve, tpr_at_fpr
from privacylab.target import AccessError, Target
from privacylab.training import TrainConfig, train

CONFIDENCE_ATTACKS = ("loss", "confidence", "entropy", "modified-entropy")
REFERENCES = 16
MEMBERS = 200
CONFIG = TrainConfig(epochs=60, batch_size=32, lr=0.1, seed=0)


@dataclass
class World:
    """Digits: an overfit MLP trained on the member candidates, one trained on none of them,
    and 16 references on random halves of the candidates."""

    data: Dataset
    target: torch.nn.Module
    outsider: torch.nn.Module
    task: MembershipTask
    truth: np.ndarray
    store: Path
    records: list[dict]


def _fit(data: Dataset, rows: np.ndarray, seed: int) -> torch.nn.Module:
    model = build_model("mlp", data.input_shape, data.num_classes, widths=(128,), seed=seed)
    train(model, data.subset(rows), TrainConfig(**{**CONFIG.to_dict(), "seed": seed}))
    return model.eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    data = load_dataset("digits")
    split = membership_split(len(data), target_size=MEMBERS, seed=0)
    candidates, truth = split.target_indices()
    folder = tmp_path_factory.mktemp("references")
    recipe = Recipe("digits", "mlp", CONFIG.to_dict(), {"widths": [128]})
    with ResultStore(folder / "store.sqlite") as store:
        pool = train_references(
            recipe,
            candidates,
            REFERENCES,
            MEMBERS,
            folder,
            store=store,
            executor=SerialExecutor(),
        )
    outsider_rows = split.population[:MEMBERS]
    task = MembershipTask(
        data.features[candidates],
        data.labels[candidates],
        data.num_classes,
        data.features[split.population],
        data.labels[split.population],
        pool.models,
        pool.task_keep(len(split.population)),
    )
    return World(
        data,
        _fit(data, split.target_members, 0),
        _fit(data, outsider_rows, 5),
        task,
        truth,
        folder,
        pool.records,
    )


def _attack(world: World, name: str, model: torch.nn.Module | None = None) -> MembershipResult:
    target = Target(model if model is not None else world.target, "white-box", 10)
    return run_attack(make_attack(name), target, world.task, world.truth)


def _tpr(result: MembershipResult, fpr: float) -> float:
    f, t, _ = roc_curve(result.scores, result.membership)
    return tpr_at_fpr(f, t, fpr)


# --- statistics against closed forms -----------------------------------------------------------


@given(st.floats(1e-6, 1 - 1e-6))
def test_logit_confidence_is_the_log_odds_for_two_classes(p: float) -> None:
    probs = np.array([[p, 1 - p]])
    assert logit_confidence(probs, np.array([0]))[0] == pytest.approx(np.log(p / (1 - p)), 1e-9)


def test_logit_confidence_stays_finite_and_ordered_when_p_rounds_to_one() -> None:
    probs = np.array([[1.0, 1e-20, 1e-30], [1.0, 1e-25, 1e-30]])
    phi = logit_confidence(probs, np.array([0, 0]))
    assert np.isfinite(phi).all() and phi[1] > phi[0]


def test_entropy_and_modified_entropy_closed_forms() -> None:
    probs = np.array([[0.5, 0.25, 0.25]])
    assert entropy(probs)[0] == pytest.approx(1.5 * np.log(2))
    expected = -0.5 * np.log(0.5) - 2 * 0.25 * np.log(0.75)
    assert modified_entropy(probs, np.array([0]))[0] == pytest.approx(expected)
    # A confident wrong prediction has a large modified entropy, a confident right one a small.
    wrong = modified_entropy(np.array([[0.01, 0.99]]), np.array([0]))[0]
    right = modified_entropy(np.array([[0.99, 0.01]]), np.array([0]))[0]
    assert wrong > 1.0 > right


def test_best_threshold_maximises_balanced_accuracy() -> None:
    values = np.array([0.1, 0.2, 0.3, 0.8, 0.9, 0.35])
    member = np.array([0, 0, 0, 1, 1, 1])
    tau = best_threshold(values, member)
    assert tau == pytest.approx(0.35)
    assert best_threshold(np.array([1.0, 2.0]), np.array([1, 0])) == np.inf


@given(st.integers(2, 20), st.integers(2, 200), st.data())
def test_reference_keep_puts_every_example_in_the_same_number_of_models(
    count: int, universe: int, data: st.DataObject
) -> None:
    train_size = data.draw(st.integers(1, universe))
    keep = reference_keep(count, universe, train_size, seed=3)
    per_example = keep.sum(0)
    assert keep.shape == (count, universe)
    assert (per_example == per_example[0]).all()
    assert 1 <= per_example[0] <= max(count - 1, 1)
    assert (keep == reference_keep(count, universe, train_size, seed=3)).all()


# --- attacks succeed where they should ------------------------------------------------------


def test_every_attack_beats_chance_on_the_overfit_target(world: World) -> None:
    for name in (*CONFIDENCE_ATTACKS, "shadow", "lira-online", "lira-offline", "rmia"):
        result = _attack(world, name)
        assert roc_auc_score(result.membership, result.scores) > 0.56, name


def test_lira_and_rmia_beat_every_metric_attack_at_low_fpr(world: World) -> None:
    """Carlini et al. 2022's point: calibrated per-example tests dominate at low FPR."""
    metric_best = max(_tpr(_attack(world, name), 0.01) for name in CONFIDENCE_ATTACKS)
    for name in ("lira-online", "lira-offline", "rmia"):
        tpr = _tpr(_attack(world, name), 0.01)
        assert tpr > max(2 * metric_best, 0.03), (name, tpr, metric_best)


def test_attacks_are_at_chance_on_a_model_that_never_saw_the_candidates(world: World) -> None:
    for name in (*CONFIDENCE_ATTACKS, "shadow", "lira-online", "lira-offline", "rmia"):
        result = _attack(world, name, world.outsider)
        assert abs(roc_auc_score(result.membership, result.scores) - 0.5) < 0.07, name


def test_thresholds_come_from_references_and_decide_sensibly(world: World) -> None:
    for name in CONFIDENCE_ATTACKS:
        result = _attack(world, name)
        assert result.predictions is not None
        assert len(result.params["threshold"]) == 10
        metrics = membership_metrics(result)
        assert metrics.threshold_source == "attack"
        assert metrics.balanced_accuracy > 0.53, name
    glob = run_attack(
        make_attack("loss", thresholds="global"),
        Target(world.target, "scores", 10),
        world.task,
        world.truth,
    )
    assert isinstance(glob.params["threshold"], float)


def test_rmia_tunes_a_and_counts_population_queries(world: World) -> None:
    result = _attack(world, "rmia")
    assert 0.0 <= result.params["a"] <= 1.0
    assert result.queries == world.task.n + result.params["population"]
    fixed = run_attack(
        make_attack("rmia", a=0.3, gamma=2.0),
        Target(world.target, "scores", 10),
        world.task,
        world.truth,
    )
    assert fixed.params["a"] == 0.3


def test_lira_variants_and_query_counts(world: World) -> None:
    online = _attack(world, "lira-online")
    assert online.queries == world.task.n * online.params["queries_per_example"]
    assert online.params["queries_per_example"] == 5  # the image and four one-pixel shifts
    assert online.params["fixed_variance"] is True  # 16 references: fewer than 32 a side
    plain = run_attack(
        make_attack("lira-online", shifts=0, fixed_variance=False),
        Target(world.target, "scores", 10),
        world.task,
        world.truth,
    )
    assert plain.queries == world.task.n
    assert roc_auc_score(plain.membership, plain.scores) > 0.55


def test_metric_attacks_query_each_candidate_once(world: World) -> None:
    for name in CONFIDENCE_ATTACKS:
        assert _attack(world, name).queries == world.task.n


# --- the threat model is enforced ------------------------------------------------------------


def test_score_attacks_refuse_a_label_only_target(world: World) -> None:
    target = Target(world.target, "label", 10)
    for name in (*CONFIDENCE_ATTACKS, "shadow", "lira-online", "rmia"):
        with pytest.raises(AccessError, match="needs scores access"):
            run_attack(make_attack(name), target, world.task, world.truth)


def test_reference_attacks_need_references(world: World) -> None:
    bare = MembershipTask(world.task.x, world.task.y, 10)
    target = Target(world.target, "scores", 10)
    for name in ("shadow", "lira-online", "lira-offline"):
        with pytest.raises(AttackError, match="reference models"):
            run_attack(make_attack(name), target, bare, world.truth)
    with pytest.raises(AttackError, match=r"reference models|population"):
        run_attack(make_attack("rmia"), target, bare, world.truth)
    # Metric attacks still score without references, but make no decisions.
    result = run_attack(make_attack("loss"), target, bare, world.truth)
    assert result.predictions is None


def test_bad_options_are_one_line_errors() -> None:
    for name, options in (
        ("loss", {"thresholds": "best"}),
        ("rmia", {"a": 2.0}),
        ("rmia", {"gamma": 0.0}),
        ("lira-online", {"shifts": -1}),
        ("shadow", {"shadows": 0}),
    ):
        with pytest.raises(AttackError) as info:
            make_attack(name, **options)
        assert "\n" not in str(info.value)
    with pytest.raises(AttackError, match="unknown membership attack 'lyra'"):
        make_attack("lyra")


def test_results_validate_their_arrays() -> None:
    with pytest.raises(AttackError, match="2 scores but 3 labels"):
        MembershipResult("x", np.zeros(2), np.zeros(3), "scores", 0)
    with pytest.raises(AttackError, match="NaN"):
        MembershipResult("x", np.array([np.nan]), np.array([1]), "scores", 0)
    with pytest.raises(AttackError, match="0 or 1"):
        MembershipResult("x", np.zeros(1), np.array([2]), "scores", 0)


def test_same_seed_same_scores(world: World) -> None:
    for name in ("shadow", "rmia", "lira-online"):
        a, b = _attack(world, name), _attack(world, name)
        assert np.array_equal(a.scores, b.scores), name


# --- references are durable ----------------------------------------------------------------


def test_a_second_run_reuses_every_reference(world: World) -> None:
    data = world.data
    split = membership_split(len(data), target_size=MEMBERS, seed=0)
    candidates, _ = split.target_indices()
    cached: list[bool] = []
    with ResultStore(world.store / "store.sqlite") as store:
        pool = train_references(
            Recipe("digits", "mlp", CONFIG.to_dict(), {"widths": [128]}),
            candidates,
            REFERENCES,
            MEMBERS,
            world.store,
            store=store,
            executor=SerialExecutor(),
            on_done=lambda key, value, hit: cached.append(hit),
        )
        assert store.count("references") == REFERENCES
    assert cached == [True] * REFERENCES
    assert pool.records == world.records
    assert np.array_equal(pool.task_keep(world.task.m), world.task.keep)


def test_label_only_attacks_come_close_to_confidence_attacks(world: World) -> None:
    """Choquette-Choo et al. 2021 (seed 000, "Can label-only MI attacks match prior attacks?"):
    on an undefended model, boundary distance and noise robustness, seeing labels only, come
    within a few points of the confidence attack and beat the gap baseline."""
    confidence = roc_auc_score(world.truth, _attack(world, "confidence").scores)
    gap = roc_auc_score(world.truth, _attack(world, "gap").scores)
    label_only = {
        name: roc_auc_score(world.truth, _attack(world, name).scores)
        for name in ("noise", "boundary")
    }
    assert max(label_only.values()) > confidence - 0.05, (label_only, confidence)
    assert min(label_only.values()) > gap, (label_only, gap)
