"""Issue 10 (c) and the output check: views only narrow access and share one budget, counter
and query monitor with their parent; white-box forward passes are queries; a target checks
what its model returns (logits vs probabilities, shape, finiteness)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from privacylab.errors import PrivacylabError
from privacylab.target import Access, AccessError, QueryBudgetError, Target, TargetError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def test_views_only_narrow_access() -> None:
    target = Target(_model(), "scores", 3)
    assert target.with_access("label").access is Access.LABEL
    assert target.with_access("scores").access is Access.SCORES
    with pytest.raises(AccessError, match="may only narrow access"):
        target.with_access("logits")
    with pytest.raises(AccessError, match="may only narrow access"):
        target.with_access("label").with_access("scores")


def test_views_share_one_budget_and_counter() -> None:
    target = Target(_model(), "white-box", 3, query_budget=10)
    view = target.with_access("scores")
    grandchild = view.with_access("label")
    view.probabilities(torch.randn(4, 4))
    grandchild.labels(torch.randn(3, 4))
    assert (grandchild.queries, view.queries, target.queries) == (3, 7, 7)
    target.labels(torch.randn(3, 4))
    assert target.queries == 10 and view.queries == 7
    with pytest.raises(QueryBudgetError, match="budget of 10 examples exhausted"):
        grandchild.labels(torch.randn(1, 4))
    assert view.query_budget == 10


def test_query_monitor_sees_every_batch_and_may_refuse() -> None:
    seen: list[int] = []

    def monitor(x: Tensor) -> None:
        if x.shape[0] > 5:
            raise AccessError("query pattern refused")
        seen.append(int(x.shape[0]))

    target = Target(_model(), "white-box", 3, query_monitor=monitor)
    target.with_access("label").labels(torch.randn(2, 4))
    target.probabilities(torch.randn(3, 4))
    target.model(torch.randn(4, 4))
    assert seen == [2, 3, 4]
    with pytest.raises(AccessError, match="refused"):
        target.with_access("scores").probabilities(torch.randn(6, 4))
    assert target.queries == 9  # a refused batch is not answered and not counted


def test_white_box_forward_passes_are_queries() -> None:
    target = Target(_model(), "white-box", 3, query_budget=20)
    model = target.model
    x = torch.randn(5, 4, requires_grad=True)
    model(x).sum().backward()  # gradients flow through the counting wrapper
    assert x.grad is not None and target.queries == 5
    assert [p.data_ptr() for p in model.parameters()] == [
        p.data_ptr() for p in target._model.parameters()
    ]
    model(torch.randn(15, 4))
    with pytest.raises(QueryBudgetError):
        model(torch.randn(1, 4))


def test_a_softmax_model_is_refused_as_logits_and_read_as_probabilities() -> None:
    """Issue 10 §1: a model ending in nn.Softmax was softmaxed twice (top probability 1.0 ->
    0.23)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 10), nn.Softmax(dim=1))
    with torch.no_grad():
        net[0].weight.mul_(100)
    x = torch.randn(8, 4)
    with pytest.raises(TargetError, match='pass outputs="probabilities"') as info:
        Target(net, "logits", 10).probabilities(x)
    assert isinstance(info.value, PrivacylabError) and "\n" not in str(info.value)
    target = Target(net, "logits", 10, outputs="probabilities")
    probs = target.probabilities(x)
    with torch.no_grad():
        expected = net(x)
    assert torch.allclose(probs, expected) and probs.max() > 0.99
    logits = target.logits(x)
    assert torch.allclose(torch.softmax(logits, 1), expected, atol=1e-6)
    assert torch.equal(target.labels(x), expected.argmax(1))


def test_logits_declared_as_probabilities_are_refused() -> None:
    with pytest.raises(TargetError, match='pass outputs="logits"'):
        Target(_model(), "scores", 3, outputs="probabilities").probabilities(torch.randn(4, 4))
    with pytest.raises(TargetError, match="outputs must be"):
        Target(_model(), "scores", 3, outputs="softmax")  # type: ignore[arg-type]


def test_shape_and_finiteness_are_checked() -> None:
    with pytest.raises(TargetError, match=r"shape \(4, 3\), expected \(n, 5\)"):
        Target(_model(), "scores", 5).probabilities(torch.randn(4, 4))

    class Broken(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return torch.full((x.shape[0], 3), float("nan"))

    with pytest.raises(TargetError, match="NaN or infinite"):
        Target(Broken(), "label", 3).labels(torch.randn(2, 4))
