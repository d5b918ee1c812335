"""The threat model: access levels are enforced, every query is counted, budgets hold."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privacylab.target import Access, AccessError, QueryBudgetError, Target


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def test_access_order() -> None:
    assert Access.WHITEBOX.allows(Access.LABEL)
    assert Access.LOGITS.allows(Access.SCORES)
    assert not Access.LABEL.allows(Access.SCORES)
    assert not Access.SCORES.allows(Access.LOGITS)
    assert Access.parse("white-box") is Access.WHITEBOX
    with pytest.raises(AccessError, match="unknown access level 'root'"):
        Access.parse("root")


def test_each_level_gets_only_what_it_declared() -> None:
    x = torch.randn(5, 4)
    label = Target(_model(), "label", 3)
    assert label.labels(x).shape == (5,)
    with pytest.raises(AccessError, match="needs scores access"):
        label.probabilities(x)
    scores = Target(_model(), "scores", 3)
    probs = scores.probabilities(x)
    assert torch.allclose(probs.sum(1), torch.ones(5))
    with pytest.raises(AccessError, match="needs logits access"):
        scores.logits(x)
    with pytest.raises(AccessError, match="needs white-box access"):
        Target(_model(), "logits", 3).model  # noqa: B018
    assert isinstance(Target(_model(), "white-box", 3).model, nn.Module)


def test_queries_are_counted_per_example_and_views_share_the_count() -> None:
    target = Target(_model(), "logits", 3, batch_size=2)
    target.labels(torch.randn(5, 4))
    target.probabilities(torch.randn(3, 4))
    assert target.queries == 8
    view = target.with_access("label")
    view.labels(torch.randn(2, 4))
    assert view.queries == 2 and target.queries == 10  # issue 10 (c): one shared counter


def test_query_budget() -> None:
    target = Target(_model(), "scores", 3, query_budget=6)
    target.probabilities(torch.randn(6, 4))
    with pytest.raises(QueryBudgetError, match="budget of 6 examples exhausted"):
        target.labels(torch.randn(1, 4))
    with pytest.raises(ValueError, match="query budget"):
        Target(_model(), "scores", 3, query_budget=-1)


def test_output_defense_applies_and_hides_logits() -> None:
    def top1(probs: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(probs.argmax(1), probs.shape[1]).float()

    target = Target(_model(), "logits", 3, output_defense=top1)
    probs = target.probabilities(torch.randn(4, 4))
    assert set(probs.unique().tolist()) <= {0.0, 1.0}
    with pytest.raises(AccessError, match="hides its logits"):
        target.logits(torch.randn(1, 4))


def test_labels_skip_a_label_keeping_output_defence() -> None:
    import torch
    from torch import nn

    from privacylab.target import Target

    class Counting:
        keeps_label = True
        calls = 0

        def __call__(self, probs: torch.Tensor) -> torch.Tensor:
            Counting.calls += 1
            return probs

    class Moving:
        keeps_label = False

        def __call__(self, probs: torch.Tensor) -> torch.Tensor:
            return probs.flip(1)

    model = nn.Linear(4, 3)
    x = torch.randn(20, 4)
    own = model(x).argmax(1)
    kept = Target(model, "scores", 3, output_defense=Counting())
    assert torch.equal(kept.labels(x), own) and Counting.calls == 0
    kept.probabilities(x)
    assert Counting.calls == 1
    moved = Target(model, "scores", 3, output_defense=Moving())
    assert torch.equal(moved.labels(x), 2 - own)
    both = kept.with_output_defense(Moving(), "scores")
    assert torch.equal(both.labels(x), 2 - own)
    assert both.access.value == "scores" and both.queries == 20 and kept.queries == 60
