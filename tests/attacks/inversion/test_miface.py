"""MI-Face (Fredrikson et al. 2015, Alg. 1) on 8x8 digits, in its own setting: a softmax
regression target, inverted class by class from scores access (NES gradient estimates) and
white-box, judged by an independent MLP trained on other rows.

Checks: both variants raise the target's confidence in each class far above the blank start;
the evaluator labels most inversions as their class; queries are counted exactly (one per
white-box step, 1 + 2n per NES step); the NES estimate points along autograd's gradient; the
stopping rule (alpha, beta, gamma) is honoured; the access is enforced; the run is
reproducible under its seed; the declared prior is where it starts; bad input is one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.attacks.inversion import INVERSION_ATTACKS, InversionError, make_inversion
from privacylab.attacks.inversion.miface import (
    InversionTruth,
    ModelInversionTask,
    run_model_inversion,
)
from privacylab.stats.images import mse
from privacylab.target import Access, AccessError, Target

FAST = {"alpha": 60, "beta": 60}
NES = {**FAST, "directions": 10}


@dataclass
class Game:
    target: nn.Module
    truth: InversionTruth
    start_confidence: Tensor


def _fit(model: nn.Module, x: Tensor, y: Tensor, steps: int, lr: float, wd: float) -> nn.Module:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def game() -> Game:
    torch.set_num_threads(1)
    from privacylab.data import load_dataset

    x, y = load_dataset("digits").to_tensors()
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(y)))
    mine, theirs = order[:1000], order[1000:]
    torch.manual_seed(0)
    target = _fit(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), x[mine], y[mine], 80, 0.1, 1e-3)
    torch.manual_seed(1)
    evaluator = nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.Tanh(), nn.Linear(48, 10))
    evaluator = _fit(evaluator, x[theirs], y[theirs], 120, 0.02, 1e-4)
    with torch.no_grad():
        assert (evaluator(x[mine]).argmax(1) == y[mine]).float().mean() > 0.9
        start = F.softmax(target(torch.zeros(1, 1, 8, 8)), 1)[0]
    means = torch.stack([x[theirs][y[theirs] == c].mean(0) for c in range(10)])
    return Game(target, InversionTruth(evaluator, means), start)


def _task(**kw: object) -> ModelInversionTask:
    return ModelInversionTask((1, 8, 8), 10, **kw)  # type: ignore[arg-type]


def test_registered_as_model_attacks_with_their_access() -> None:
    assert INVERSION_ATTACKS.get("miface").kind == "model"
    assert INVERSION_ATTACKS.get("miface").threat_model.access is Access.SCORES
    assert INVERSION_ATTACKS.get("miface-whitebox").threat_model.access is Access.WHITEBOX
    assert "Fredrikson" in INVERSION_ATTACKS.get("miface").paper


@pytest.mark.parametrize(
    ("name", "options", "least_accuracy"),
    [("miface-whitebox", FAST, 0.9), ("miface", NES, 0.7)],
)
def test_inversions_are_confident_and_recognised(
    game: Game, name: str, options: dict, least_accuracy: float
) -> None:
    target = Target(game.target, Access.WHITEBOX, 10)
    result = run_model_inversion(make_inversion(name, **options), target, _task(), game.truth)
    confidence = np.array([row["confidence"] for row in result.classes])
    start = game.start_confidence.numpy()
    assert start.max() < 0.35
    assert confidence.mean() > 0.7, confidence
    assert (confidence > 2 * start).all(), (confidence, start)
    assert result.evaluator_accuracy >= least_accuracy, [r["predicted"] for r in result.classes]
    # the evaluator's verdict agrees with the result's rows, and the distance to the mean is
    # `stats.images.mse` in [0, 1] pixels
    row = result.classes[3]
    with torch.no_grad():
        predicted = game.truth.evaluator(result.images[3][None]).argmax(1).item()
    assert row["predicted"] == predicted and row["correct"] == (predicted == 3)
    expected = mse(result.images[3][None].numpy(), game.truth.class_means[3][None].numpy())
    assert row["distance_to_mean"] == pytest.approx(float(expected[0]))
    # closer to its own class mean than to the other classes' on average
    others = [
        float(mse(result.images[3][None].numpy(), game.truth.class_means[c][None].numpy())[0])
        for c in range(10)
        if c != 3
    ]
    assert row["distance_to_mean"] < np.mean(others)
    images = torch.stack(list(result.images.values()))
    assert images.min() >= 0.0 and images.max() <= 1.0
    assert set(result.to_dict()) >= {"method", "evaluator_accuracy", "classes", "queries"}


def test_queries_are_counted(game: Game) -> None:
    root = Target(game.target, Access.WHITEBOX, 10)
    white = run_model_inversion(
        make_inversion("miface-whitebox", alpha=7, beta=50), root, _task(classes=(1, 2)), game.truth
    )
    assert [r["iterations"] for r in white.classes] == [7, 7]
    assert white.queries == 14 and root.queries == 14
    nes = run_model_inversion(
        make_inversion("miface", alpha=5, beta=50, directions=3),
        root,
        _task(classes=(4,)),
        game.truth,
    )
    assert nes.access == "scores"
    assert nes.queries == 5 * (1 + 2 * 3)
    assert root.queries == 14 + 35


def test_stopping_rule(game: Game) -> None:
    target = Target(game.target, Access.WHITEBOX, 10)
    task = _task(classes=(0,))
    # alpha: the iteration cap
    capped = make_inversion("miface-whitebox", alpha=12, beta=1000, gamma=-1.0).run(target, task)
    assert (capped.classes[0].iterations, capped.classes[0].stopped) == (12, "alpha")
    # gamma: the first iteration whose cost (the paper's 1 - f) is <= gamma ends the run
    attack = make_inversion("miface-whitebox", alpha=500, beta=1000, gamma=0.5, cost="confidence")
    done = attack.run(target, task).classes[0]
    assert done.stopped == "gamma" and done.iterations < 500
    assert done.history[-1] <= 0.5 and all(c > 0.5 for c in done.history[:-1])
    assert done.cost == done.history[-1] and done.confidence == pytest.approx(1 - done.cost)
    # beta: with no step the cost never improves; the run ends beta iterations after its best
    still = make_inversion("miface-whitebox", alpha=500, beta=9, step=0.0).run(target, task)
    inv = still.classes[0]
    assert (inv.stopped, inv.iterations, inv.best_iteration) == ("beta", 10, 0)
    # the best image is returned, not the last
    assert inv.cost == min(inv.history)


def test_access_is_enforced(game: Game) -> None:
    labels_only = Target(game.target, Access.LABEL, 10)
    scores = Target(game.target, Access.SCORES, 10)
    with pytest.raises(AccessError):
        run_model_inversion(make_inversion("miface", **NES), labels_only, _task(), game.truth)
    with pytest.raises(AccessError):
        run_model_inversion(make_inversion("miface-whitebox"), scores, _task(), game.truth)


def test_reproducible_and_prior_is_the_start(game: Game) -> None:
    def once(seed: int) -> Tensor:
        target = Target(game.target, Access.SCORES, 10)
        attack = make_inversion("miface", alpha=8, directions=4)
        return attack.run(target, _task(classes=(5,), seed=seed)).classes[0].x

    assert torch.equal(once(3), once(3))
    assert not torch.equal(once(3), once(4))
    prior = game.truth.class_means[2]
    attack = make_inversion("miface-whitebox", alpha=1)
    start = attack.run(Target(game.target, Access.WHITEBOX, 10), _task(classes=(2,), prior=prior))
    assert torch.allclose(start.classes[0].x, prior)
    assert _task(prior=prior).restricted_to(()).prior is None


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: _task(classes=(10,)), "out of range"),
        (lambda: _task(bounds=(1.0, 0.0)), "bounds"),
        (lambda: _task(prior=torch.zeros(1, 4, 4)), "prior has shape"),
        (lambda: make_inversion("miface", cost="hinge"), "unknown cost"),
        (lambda: make_inversion("miface", alpha=0), "alpha"),
        (lambda: make_inversion("miface", denoise=2.0), "denoise"),
        (lambda: make_inversion("miface", "gradients"), "model attack"),
    ],
)
def test_bad_input_is_one_line(build: object, message: str) -> None:
    with pytest.raises(InversionError, match=message) as info:
        build()  # type: ignore[operator]
    assert "\n" not in str(info.value)


def test_nes_estimate_follows_the_true_gradient(game: Game) -> None:
    """The scores-only gradient (antithetic NES at full resolution) points where autograd's
    does: cosine close to sqrt(n / (n + d)) for n pairs in d = 64 pixels; same cost."""
    x = game.truth.class_means[3][None].clone()
    generator = torch.Generator().manual_seed(0)
    nes = make_inversion("miface", directions=300, sigma=0.01, resolution=8)
    white = make_inversion("miface-whitebox")
    target = Target(game.target, Access.WHITEBOX, 10)
    cost, confidence, estimate = nes._cost_and_gradient(target, x, 7, generator, 1.0)
    exact_cost, exact_confidence, exact = white._cost_and_gradient(target, x, 7, generator, 1.0)
    assert cost == pytest.approx(exact_cost, rel=1e-4)
    assert confidence == pytest.approx(exact_confidence, rel=1e-4)
    cosine = F.cosine_similarity(estimate.flatten(), exact.flatten(), dim=0)
    assert cosine > 0.8, float(cosine)
    assert target.queries == 1 + 2 * 300 + 1
