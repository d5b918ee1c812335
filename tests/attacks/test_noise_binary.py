"""Noise robustness on binary features (Choquette-Choo et al. 2021, §3.4, on Purchase-like
data): noisy copies flip bits and stay in {0, 1}, the flip rate is the one asked for, the mode
is chosen from the data and recorded, and the attack finds the members of an overfit model."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch import Tensor, nn

from privacylab.attacks.membership import AttackError, MembershipTask, make_attack, run_attack
from privacylab.attacks.membership.label_only import flip_bits, is_binary
from privacylab.data import Dataset
from privacylab.data.purchase_like import make_purchase_like
from privacylab.models import build_model
from privacylab.target import Target
from privacylab.training import TrainConfig, train

MEMBERS = 800


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Spy(nn.Module):
    """A fixed linear model that keeps every input it is queried with."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)
        torch.nn.init.normal_(self.linear.weight, generator=torch.Generator().manual_seed(0))
        self.seen: list[Tensor] = []

    def forward(self, x: Tensor) -> Tensor:
        self.seen.append(x.detach().clone())
        return self.linear(x)


def _binary(n: int, d: int, seed: int = 0, density: float = 0.1) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand((n, d), generator=generator) < density).float()


def test_flip_bits_stay_binary_at_the_asked_rate() -> None:
    x = _binary(300, 200)
    p, count = 0.05, 20
    copies = flip_bits(x, p, count, torch.Generator().manual_seed(1))
    assert copies.shape == (count, 300, 200) and copies.dtype == x.dtype
    assert is_binary(copies)
    flipped = (copies != x.unsqueeze(0)).double()
    trials = flipped.numel()
    assert abs(flipped.mean().item() - p) < 4 * np.sqrt(p * (1 - p) / trials)
    ones, zeros = x.bool().expand_as(copies), ~x.bool().expand_as(copies)
    assert abs(flipped[ones].mean().item() - p) < 0.01
    assert abs(flipped[zeros].mean().item() - p) < 0.01


def test_is_binary() -> None:
    assert is_binary(torch.tensor([[0.0, 1.0], [1.0, 1.0]]))
    assert not is_binary(torch.tensor([[0.0, 0.5]]))
    assert not is_binary(torch.empty(0, 3))


def test_auto_flips_binary_features_and_records_it() -> None:
    x, y = _binary(40, 30), torch.arange(40) % 3
    spy = Spy(30, 3)
    task = MembershipTask(x, y, 3, _binary(20, 30, seed=2), torch.zeros(20, dtype=torch.long))
    result = run_attack(
        make_attack("noise", n_samples=25, flip_probability=0.1),
        Target(spy, "label", 3),
        task,
        np.r_[np.ones(20), np.zeros(20)],
    )
    assert result.params == {"kind": "flip", "n_samples": 25, "seed": 0, "flip_probability": 0.1}
    assert result.queries == 40 * 25
    queried = torch.cat(spy.seen)
    assert queried.shape == (40 * 25, 30) and is_binary(queried)
    rate = (queried.reshape(25, 40, 30) != x).double().mean().item()
    assert abs(rate - 0.1) < 0.02
    assert ((result.scores >= 0) & (result.scores <= 1)).all()


def test_references_calibrate_the_flip_threshold() -> None:
    """With reference models the threshold is chosen on the references' flip accuracies (the
    same flip rate, their own seeded noise): every reference sees only 0/1 copies, the
    prediction is `score >= threshold`, and a second run gives the same numbers."""
    x, y = _binary(40, 30), torch.arange(40) % 3
    pop_x, pop_y = _binary(20, 30, seed=2), torch.arange(20) % 3
    refs = [Spy(30, 3) for _ in range(2)]
    keep = np.zeros((2, 60), dtype=bool)
    keep[0, ::2], keep[1, 1::2] = True, True
    task = MembershipTask(x, y, 3, pop_x, pop_y, refs, keep)
    attack = make_attack("noise", n_samples=10, flip_probability=0.1)
    target = Target(Spy(30, 3), "label", 3)
    first = attack.score(target, task)
    assert first.params["kind"] == "flip" and "threshold" in first.params
    assert all(is_binary(torch.cat(ref.seen)) for ref in refs)
    assert all(torch.cat(ref.seen).shape == (60 * 10, 30) for ref in refs)
    seen = [len(ref.seen) for ref in refs]
    assert first.predictions is not None
    np.testing.assert_array_equal(
        first.predictions, (first.scores >= first.params["threshold"]).astype(np.int64)
    )
    again = attack.score(target, task)
    np.testing.assert_array_equal(again.scores, first.scores)
    assert again.params == first.params
    assert [len(ref.seen) for ref in refs] == [2 * k for k in seen]  # no memo between calls


def test_continuous_features_keep_gaussian() -> None:
    x = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    spy = Spy(8, 2)
    task = MembershipTask(x, torch.zeros(30, dtype=torch.long), 2)
    scores = make_attack("noise", sigma=0.2, n_samples=5).score(Target(spy, "label", 2), task)
    assert scores.params["kind"] == "gaussian" and scores.params["sigma"] == 0.2
    assert "flip_probability" not in scores.params
    assert not is_binary(torch.cat(spy.seen))
    forced = make_attack("noise", kind="gaussian", n_samples=5)
    binary_task = MembershipTask(_binary(10, 8), torch.zeros(10, dtype=torch.long), 2)
    assert forced.score(Target(Spy(8, 2), "label", 2), binary_task).params["kind"] == "gaussian"


def test_flip_on_continuous_features_is_refused() -> None:
    task = MembershipTask(torch.rand(10, 4), torch.zeros(10, dtype=torch.long), 2)
    with pytest.raises(AttackError, match="0 or 1"):
        make_attack("noise", kind="flip").score(Target(Spy(4, 2), "label", 2), task)


@pytest.mark.parametrize(
    "options",
    [{"kind": "bits"}, {"flip_probability": 0.0}, {"flip_probability": 0.6},
     {"flip_probability": float("nan")}, {"flip_probability": "x"}],
)  # fmt: skip
def test_bad_options_are_one_line(options: dict[str, object]) -> None:
    with pytest.raises(AttackError) as caught:
        make_attack("noise", **options)
    assert "\n" not in str(caught.value)


def test_seeded() -> None:
    x, y = _binary(30, 20), torch.zeros(30, dtype=torch.long)
    task = MembershipTask(x, y, 2)
    target = Target(Spy(20, 2), "label", 2)

    def scores(seed: int) -> np.ndarray:
        attack = make_attack("noise", flip_probability=0.2, n_samples=10, seed=seed)
        return attack.score(target, task).scores

    np.testing.assert_array_equal(scores(3), scores(3))
    assert not np.array_equal(scores(3), scores(4))


def test_finds_members_of_an_overfit_purchase_like_model() -> None:
    """An MLP on 800 Purchase-like members (train accuracy 1): its labels survive bit flips
    more often on members than on non-members, so the label-only attack beats chance."""
    features, labels = (torch.from_numpy(a) for a in make_purchase_like(2_000, seed=2))
    members = slice(0, MEMBERS)
    model = build_model("mlp", (600,), 100, widths=(256,), seed=0)
    data = Dataset("purchase-like", features[members], labels[members], 100, (600,), "tabular")
    train(model, data, TrainConfig(epochs=30, batch_size=64, lr=0.05, seed=0))
    model.eval()
    task = MembershipTask(features[: 2 * MEMBERS], labels[: 2 * MEMBERS], 100)
    truth = np.r_[np.ones(MEMBERS), np.zeros(MEMBERS)]
    result = run_attack(
        make_attack("noise", n_samples=20), Target(model, "label", 100), task, truth
    )
    assert result.params["kind"] == "flip"
    noise_auc = roc_auc_score(truth, result.scores)
    gap = run_attack(make_attack("gap"), Target(model, "label", 100), task, truth)
    assert noise_auc > 0.7
    assert noise_auc > roc_auc_score(truth, gap.scores)
