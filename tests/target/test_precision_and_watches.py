"""Target's float64 answers and the per-view watches (`with_monitor`, `with_budget`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privacylab.target import QueryBudgetError, Target, TargetError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def test_float64_target_answers_in_float64_and_leaves_the_model_alone() -> None:
    model = _model()
    target = Target(model, "logits", 3, precision="float64")
    x = torch.rand(11, 5, dtype=torch.float64)
    logits = target.logits(x)
    assert logits.dtype == torch.float64
    assert next(model.parameters()).dtype == torch.float32
    expected = model.double()(x).detach()
    assert torch.equal(logits, expected)  # same float64 arithmetic, bit for bit
    assert target.probabilities(x).dtype == torch.float64


def test_float32_default_still_answers_float32() -> None:
    target = Target(_model(), "logits", 3)
    assert target.logits(torch.rand(2, 5, dtype=torch.float64)).dtype == torch.float32


def test_float64_resolves_what_float32_rounds_away() -> None:
    """A step of 1e-12 along the input changes float64 logits, not float32 ones: what the
    cryptanalytic attacks rely on."""
    model = _model()
    x = torch.rand(1, 5, dtype=torch.float64)
    step = torch.zeros_like(x)
    step[0, 0] = 1e-12
    t64 = Target(model, "logits", 3, precision="float64")
    t32 = Target(model, "logits", 3)
    assert not torch.equal(t64.logits(x), t64.logits(x + step))
    assert torch.equal(t32.logits(x), t32.logits(x + step))


def test_unknown_precision_is_one_line() -> None:
    with pytest.raises(TargetError, match="precision"):
        Target(_model(), "logits", 3, precision="float16")  # type: ignore[arg-type]


def test_view_budget_is_its_own_and_the_parent_counts_everything() -> None:
    target = Target(_model(), "scores", 3)
    view = target.with_budget(10)
    view.labels(torch.rand(6, 5))
    with pytest.raises(QueryBudgetError, match="budget of 10"):
        view.probabilities(torch.rand(5, 5))
    view.labels(torch.rand(4, 5))
    target.labels(torch.rand(50, 5))  # the parent is not limited by its view's budget
    assert (view.queries, target.queries) == (10, 60)
    with pytest.raises(ValueError, match=">= 1"):
        target.with_budget(0)


def test_view_budget_and_shared_budget_both_apply() -> None:
    target = Target(_model(), "scores", 3, query_budget=8)
    view = target.with_budget(100)
    with pytest.raises(QueryBudgetError, match="budget of 8"):
        view.labels(torch.rand(9, 5))


def test_view_monitor_sees_only_its_queries_after_the_shared_one() -> None:
    order: list[tuple[str, int]] = []
    target = Target(_model(), "scores", 3, query_monitor=lambda x: order.append(("shared", len(x))))
    view = target.with_monitor(lambda x: order.append(("view", len(x))))
    inner = view.with_monitor(lambda x: order.append(("inner", len(x))))
    target.labels(torch.rand(2, 5))
    inner.labels(torch.rand(3, 5))
    assert order == [("shared", 2), ("shared", 3), ("view", 3), ("inner", 3)]


def test_refusing_monitor_blocks_the_query_and_counts_nothing() -> None:
    class RefusedError(RuntimeError):
        pass

    def refuse(x: torch.Tensor) -> None:
        if len(x) > 2:
            raise RefusedError("too many")

    target = Target(_model(), "scores", 3)
    view = target.with_monitor(refuse)
    view.labels(torch.rand(2, 5))
    with pytest.raises(RefusedError):
        view.labels(torch.rand(3, 5))
    assert (view.queries, target.queries) == (2, 2)


def test_watched_view_narrows_further_and_keeps_its_watch() -> None:
    seen: list[int] = []
    view = Target(_model(), "logits", 3).with_monitor(lambda x: seen.append(len(x)))
    label_view = view.with_access("label")
    label_view.labels(torch.rand(4, 5))
    assert seen == [4]


def test_labelled_monitor_gets_the_models_labels_uncounted() -> None:
    model = _model()
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    target = Target(model, "label", 3, query_budget=5, precision="float64")
    view = target.with_monitor(lambda x, labels: seen.append((x, labels)), labelled=True)
    x = torch.rand(5, 5, dtype=torch.float64)
    answered = view.labels(x)
    assert torch.equal(seen[0][1], answered)
    assert torch.equal(seen[0][1], model.double()(x).argmax(1))
    assert (view.queries, target.queries) == (5, 5)  # the monitor's labels cost nothing
