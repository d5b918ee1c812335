"""Label-only membership inference (Choquette-Choo et al. 2021): gap, augmentation, noise,
HopSkipJump boundary distance and the Carlini & Wagner white-box baseline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from privacylab.attacks.membership import (
    AttackError,
    MembershipTask,
    attack_names,
    make_attack,
    run_attack,
)
from privacylab.attacks.membership.boundary import carlini_wagner_l2, hop_skip_jump
from privacylab.attacks.membership.label_only import (
    augmentation_offsets,
    augmented_copies,
    best_threshold,
)
from privacylab.data import Dataset, load_dataset
from privacylab.models import build_model
from privacylab.target import AccessError, Target
from privacylab.training import TrainConfig, train

N_MEMBERS = 500


def _fit(data: Dataset, index: torch.Tensor, seed: int, epochs: int = 30) -> nn.Module:
    model = build_model("mlp", data.input_shape, data.num_classes, widths=(256,), seed=seed)
    train(model, data.subset(index), TrainConfig(epochs=epochs, batch_size=64, lr=0.05, seed=seed))
    return model.eval()


@dataclass
class World:
    """An overfit MNIST target (members: the first 500 candidates), a target trained on
    disjoint data, and three reference models on random 500-subsets of the attacker's data."""

    data: Dataset
    target: nn.Module
    disjoint: nn.Module
    task: MembershipTask
    truth: np.ndarray


@pytest.fixture(scope="module")
def world() -> World:
    data = load_dataset("mnist5k")
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))
    candidates, population = perm[: 2 * N_MEMBERS], perm[2 * N_MEMBERS : 3 * N_MEMBERS]
    target = _fit(data, candidates[:N_MEMBERS], seed=0)
    disjoint = _fit(data, perm[3 * N_MEMBERS : 4 * N_MEMBERS], seed=1)
    owned = torch.cat([candidates, population])
    rng = np.random.default_rng(0)
    keep = np.zeros((3, owned.numel()), dtype=bool)
    references = []
    for j in range(3):
        pick = rng.choice(owned.numel(), N_MEMBERS, replace=False)
        keep[j, pick] = True
        references.append(_fit(data, owned[torch.from_numpy(pick)], seed=10 + j))
    task = MembershipTask(
        data.features[candidates],
        data.labels[candidates],
        data.num_classes,
        data.features[population],
        data.labels[population],
        references,
        keep,
    )
    truth = np.r_[np.ones(N_MEMBERS), np.zeros(N_MEMBERS)].astype(np.int64)
    return World(data, target, disjoint, task, truth)


def _subtask(
    world: World, per_side: int, references: bool = False
) -> tuple[MembershipTask, np.ndarray]:
    """The first `per_side` members and `per_side` non-members as candidates."""
    index = torch.cat([torch.arange(per_side), N_MEMBERS + torch.arange(per_side)])
    task = world.task
    sub = MembershipTask(
        task.x[index],
        task.y[index],
        task.num_classes,
        task.population_x,
        task.population_y,
        task.references if references else [],
        task.keep[:, np.r_[index.numpy(), np.arange(task.n, task.n + task.m)]]
        if references
        else None,
    )
    return sub, world.truth[index.numpy()]


def _run(world: World, name: str, model: nn.Module | None = None, **options: object):
    target = Target(world.target if model is None else model, "label", 10)
    return run_attack(make_attack(name, **options), target, world.task, world.truth)


def _auc(result) -> float:
    return float(roc_auc_score(result.membership, result.scores))


def test_registered() -> None:
    assert {"gap", "augmentation", "noise", "boundary", "boundary-cw"} <= set(attack_names())


# --- gap ---------------------------------------------------------------------------------


def test_gap_score_is_correctness(world: World) -> None:
    result = _run(world, "gap")
    correct = (world.target(world.task.x).argmax(1) == world.task.y).numpy()
    np.testing.assert_array_equal(result.scores, correct.astype(float))
    np.testing.assert_array_equal(result.predictions, correct.astype(int))
    assert result.queries == world.task.n
    assert result.access == "label"
    assert _auc(result) > 0.53  # members 100 % correct, non-members ~87 %


# --- augmentation ------------------------------------------------------------------------


def test_augmented_copies_match_the_paper() -> None:
    x = torch.zeros(2, 1, 7, 7)
    x[:, 0, 3, 3] = 1.0
    assert len(augmentation_offsets("translation", 0, 1)) == 5
    copies = augmented_copies(x, "translation", d=2)
    assert copies.shape == (9, 2, 1, 7, 7)
    torch.testing.assert_close(copies[0], x)
    for k, (i, j) in enumerate(augmentation_offsets("translation", 0, 2)):
        assert abs(i) + abs(j) in (0, 2)
        assert copies[k, 0, 0, 3 + int(i), 3 + int(j)] == 1.0
    rotated = augmented_copies(x, "rotation", r=15)
    assert rotated.shape == (3, 2, 1, 7, 7)
    torch.testing.assert_close(rotated[0], x)
    with pytest.raises(AttackError):
        augmented_copies(x.reshape(2, 49), "rotation")


@pytest.mark.parametrize(
    ("options", "copies"),
    [({"kind": "translation", "d": 2}, 9), ({"kind": "rotation", "r": 10}, 3)],
)
def test_augmentation_finds_members_with_references(
    world: World, options: dict, copies: int
) -> None:
    result = _run(world, "augmentation", **options)
    assert result.queries == world.task.n * copies
    assert result.params["classifier"].startswith("logistic regression")
    assert _auc(result) > 0.53
    assert result.predictions is not None
    disjoint = _run(world, "augmentation", model=world.disjoint, **options)
    assert abs(_auc(disjoint) - 0.5) < 0.06


def test_augmentation_without_references_counts_correct_copies(world: World) -> None:
    task, truth = _subtask(world, 100)
    target = Target(world.target, "label", 10)
    out = make_attack("augmentation", kind="translation", d=1).score(target, task)
    assert out.predictions is None and "no reference" in out.params["classifier"]
    assert set(np.unique(out.scores)) <= set(range(6))
    assert target.queries == 200 * 5
    assert roc_auc_score(truth, out.scores) > 0.5


# --- noise -------------------------------------------------------------------------------


def test_noise_robustness(world: World) -> None:
    result = _run(world, "noise", sigma=0.3, n_samples=10)
    assert result.queries == world.task.n * 10
    assert np.all((result.scores >= 0) & (result.scores <= 1))
    auc = _auc(result)
    assert auc > 0.58, auc
    members, outsiders = result.predictions[world.truth == 1], result.predictions[world.truth == 0]
    assert (members.mean() + 1 - outsiders.mean()) / 2 > 0.53  # threshold from references
    disjoint = _run(world, "noise", model=world.disjoint, sigma=0.3, n_samples=10)
    assert abs(_auc(disjoint) - 0.5) < 0.06


def test_noise_is_seeded(world: World) -> None:
    task, _ = _subtask(world, 30)
    target = Target(world.target, "label", 10)
    first = make_attack("noise", sigma=0.5, n_samples=8, seed=3).score(target, task).scores
    again = make_attack("noise", sigma=0.5, n_samples=8, seed=3).score(target, task).scores
    other = make_attack("noise", sigma=0.5, n_samples=8, seed=4).score(target, task).scores
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_best_threshold() -> None:
    scores = np.array([0.1, 0.2, 0.3, 0.7, 0.8, 0.9])
    assert best_threshold(scores, np.array([0, 0, 0, 1, 1, 1])) == 0.7
    assert best_threshold(scores, np.ones(6)) == np.inf


# --- boundary distance -------------------------------------------------------------------


def test_boundary_distance_finds_members(world: World) -> None:
    task, truth = _subtask(world, 100)
    target = Target(world.target, "label", 10)
    result = run_attack(make_attack("boundary", max_queries=400), target, task, truth)
    assert result.access == "label"
    assert 0 < result.queries <= task.n * 400
    correct = (world.target(task.x).argmax(1) == task.y).numpy()
    assert np.all(result.scores[~correct] == 0) and np.all(result.scores[correct] > 0)
    assert result.params["no_adversarial_found"] == 0
    auc = _auc(result)
    assert auc > 0.6, auc
    unseen = run_attack(
        make_attack("boundary", max_queries=400), Target(world.disjoint, "label", 10), task, truth
    )
    assert abs(_auc(unseen) - 0.5) < 0.06


def test_hop_skip_jump_is_close_to_carlini_wagner() -> None:
    """On an 8×8 digits MLP (d = 64, where HopSkipJump converges in ~1k queries) the label-only
    distance is within 15 % of the white-box C&W distance, and every point is adversarial."""
    data = load_dataset("digits")
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(1))
    model = _fit(data, perm[:300], seed=0, epochs=20)
    x, y = data.features[perm[300:360]], data.labels[perm[300:360]]
    target = Target(model, "label", 10)
    hsj = hop_skip_jump(target, x, y, max_queries=1000, clip=(0.0, 1.0), seed=0)
    assert target.queries == hsj.queries.sum() and hsj.queries.max() <= 1000
    cw = carlini_wagner_l2(model, x, y, steps=300, search_steps=8, clip=(0.0, 1.0))
    ok = cw.correct
    assert ok.sum() >= 50 and np.array_equal(hsj.correct, cw.correct)
    with torch.no_grad():
        assert bool((model(hsj.adversarial[ok]).argmax(1) != y[ok]).all())
        assert bool((model(cw.adversarial[ok]).argmax(1) != y[ok]).all())
    hsj_norm = (hsj.adversarial - x).flatten(1).norm(dim=1).numpy()
    np.testing.assert_allclose(hsj.distance[ok], hsj_norm[ok], rtol=1e-4)
    assert hsj.adversarial.min() >= 0 and hsj.adversarial.max() <= 1
    ratio = np.median(hsj.distance[ok] / cw.distance[ok])
    assert 0.85 < ratio < 1.15, ratio
    assert np.all(hsj.distance[~ok] == 0) and np.all(cw.distance[~ok] == 0)


def test_boundary_is_seeded_and_calibrates(world: World) -> None:
    task, truth = _subtask(world, 10, references=True)
    options = {"max_queries": 200, "calibrate": True, "calibration_size": 20, "seed": 5}
    first = run_attack(
        make_attack("boundary", **options), Target(world.target, "label", 10), task, truth
    )
    again = run_attack(
        make_attack("boundary", **options), Target(world.target, "label", 10), task, truth
    )
    np.testing.assert_array_equal(first.scores, again.scores)
    assert first.queries == again.queries <= 20 * 200  # reference queries are not the target's
    assert np.isfinite(first.params["threshold"])
    assert first.predictions is not None and first.predictions.shape == (20,)


def test_noise_init_gives_adversarial_points(world: World) -> None:
    task, _ = _subtask(world, 10)
    target = Target(world.target, "label", 10)
    points = hop_skip_jump(target, task.x, task.y, max_queries=300, init="noise", seed=0)
    found = points.correct & points.found
    with torch.no_grad():
        labels = world.target(points.adversarial[found]).argmax(1)
    assert bool((labels != task.y[found]).all())


def test_carlini_wagner_needs_white_box(world: World) -> None:
    task, truth = _subtask(world, 10)
    attack = make_attack("boundary-cw", steps=50, search_steps=3)
    with pytest.raises(AccessError):
        run_attack(attack, Target(world.target, "label", 10), task, truth)
    with pytest.raises(AccessError):
        attack.score(Target(world.target, "logits", 10), task)
    result = run_attack(attack, Target(world.target, "white-box", 10), task, truth)
    # issue 10: forward passes through the white-box model are counted, one query per example
    # each: the correctness pass, one pass on x[:1] for the class count, steps × search_steps
    assert result.access == "white-box" and result.queries == task.n * (1 + 3 * 50) + 1
    correct = (world.target(task.x).argmax(1) == task.y).numpy()
    assert np.all(result.scores[correct] > 0) and np.all(result.scores[~correct] == 0)


# --- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("augmentation", {"kind": "flip"}),
        ("augmentation", {"kind": "rotation", "r": 0}),
        ("augmentation", {"kind": "rotation", "r": float("nan")}),
        ("augmentation", {"d": 0}),
        ("noise", {"sigma": -1.0}),
        ("noise", {"n_samples": 0}),
        ("noise", {"clip": (1.0, 0.0)}),
        ("boundary", {"max_queries": 10}),
        ("boundary", {"init": "zeros"}),
        ("boundary", {"iterations": 1.5}),
        ("boundary-cw", {"lr": 0}),
        ("boundary-cw", {"confidence": -1}),
    ],
)
def test_bad_options(name: str, options: dict) -> None:
    with pytest.raises(AttackError) as info:
        make_attack(name, **options)
    assert "\n" not in str(info.value)


def test_augmentation_rejects_non_images(world: World) -> None:
    flat = MembershipTask(world.task.x[:4].flatten(1), world.task.y[:4], 10)
    flat_model = nn.Sequential(nn.Linear(784, 10))
    with pytest.raises(AttackError, match="images"):
        make_attack("augmentation").score(Target(flat_model, "label", 10), flat)
