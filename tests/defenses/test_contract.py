"""One contract run over every registered defence (scikit-learn's `parametrize_with_checks`
habit): it declares its kind, what it changes, its parameters and its paper; its spec round-trips
through the parser; every declared bound refuses a value outside it in one line."""

from __future__ import annotations

import inspect

import pytest

from privacylab.defenses import (
    DEFENSES,
    DefenseError,
    NoDefense,
    OutputDefense,
    QueryDefense,
    TrainingDefense,
    parse_defense,
    parse_defenses,
)
from privacylab.target import Access

NAMES = DEFENSES.names()


def test_the_issue_list_is_registered() -> None:
    wanted = {
        "none", "topk", "rounding", "label-only", "temperature", "noise", "reverse-sigmoid",
        "memguard", "l2", "dropout", "label-smoothing", "early-stopping", "augmentation",
        "stacking", "advreg", "dmp", "selena", "dp",
    }  # fmt: skip
    assert wanted <= set(NAMES), wanted - set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_declarations(name: str) -> None:
    cls = DEFENSES.get(name)
    defense = cls()
    assert defense.name == name
    if issubclass(cls, OutputDefense):
        assert defense.kind == "output" and defense.changes == ("outputs",)
        assert defense.serves in (Access.LABEL, Access.SCORES)
    elif issubclass(cls, TrainingDefense):
        assert defense.kind == "training" and defense.changes == ("training",)
        assert set(defense.needs) <= {"holdout", "public"}
    elif issubclass(cls, QueryDefense):
        assert defense.kind == "query" and defense.changes == ("queries",)
    else:
        assert cls is NoDefense and defense.changes == ()
    if cls is not NoDefense:
        assert defense.paper, f"{name} names no paper"
    assert (cls.__doc__ or "").strip(), f"{name} has no docstring"
    info = defense.to_dict()
    assert set(info) == {"name", "label", "spec", "kind", "changes", "params", "paper"}
    assert set(info["params"]) == {p.name for p in cls.parameters}


@pytest.mark.parametrize("name", NAMES)
def test_spec_round_trips(name: str) -> None:
    defense = DEFENSES.get(name)()
    again = parse_defense(defense.spec)
    assert type(again) is type(defense)
    assert again.params == defense.params
    assert again.spec == defense.spec


@pytest.mark.parametrize("name", NAMES)
def test_bounds_refuse_in_one_line(name: str) -> None:
    cls = DEFENSES.get(name)
    for parameter in cls.parameters:
        bad: list[object] = ["not-a-number"] if parameter.kind is not str else []
        if parameter.low is not None:
            bad.append(parameter.low if parameter.low_open else parameter.low - 1)
        if parameter.high is not None:
            bad.append(parameter.high if parameter.high_open else parameter.high + 1)
        if parameter.kind is int:
            bad.append(1.5 if (parameter.low or 0) < 1.5 else (parameter.low or 0) + 0.5)
        if parameter.choices:
            bad.append("no-such-choice")
        for value in bad:
            with pytest.raises(DefenseError) as caught:
                parse_defense(f"{name}:{parameter.name}={value}")
            assert "\n" not in str(caught.value)
            assert name in str(caught.value)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_parameter_and_too_many_positionals(name: str) -> None:
    cls = DEFENSES.get(name)
    with pytest.raises(DefenseError, match="unknown parameter"):
        parse_defense(f"{name}:no_such_parameter=1")
    too_many = ":".join([name, *["1"] * (len(cls.parameters) + 1)])
    with pytest.raises(DefenseError):
        parse_defense(too_many)


def test_training_defences_override_something() -> None:
    base = TrainingDefense
    hooks = ("configure", "model_options", "regularizer", "callbacks", "fit")
    for name in NAMES:
        cls = DEFENSES.get(name)
        if issubclass(cls, TrainingDefense):
            changed = [h for h in hooks if getattr(cls, h) is not getattr(base, h)]
            assert changed, f"{name} changes nothing about training"


def test_output_defences_implement_transform() -> None:
    for name in NAMES:
        cls = DEFENSES.get(name)
        if issubclass(cls, OutputDefense):
            assert not inspect.isabstract(cls)


def test_query_defences_watch_one_client() -> None:
    """Every query watch (issue 13: PRADA, budgets) starts clean, says so in its verdict, and
    `fresh()` is an unused watch with the same parameters for another client."""
    assert {"prada", "budget"} <= set(NAMES)
    for name in NAMES:
        cls = DEFENSES.get(name)
        if not issubclass(cls, QueryDefense):
            continue
        assert not inspect.isabstract(cls)
        defense = cls()
        verdict = defense.verdict()
        assert verdict["detected"] is False and verdict["queries_until_detection"] is None
        other = defense.fresh()
        assert type(other) is cls and other is not defense and other.params == defense.params


def test_list_parsing() -> None:
    parsed = parse_defenses("none, topk:1 ,topk:k=1,,l2:1e-3")
    assert [d.label for d in parsed] == ["none", "topk:1", "l2:1e-3"]
    for bad, message in (
        ("", "no defences given"),
        ("topk:", "empty parameter"),
        ("topk:k=1:k=2", "given twice"),
        ("frobnicate", "unknown defense 'frobnicate'"),
    ):
        with pytest.raises(DefenseError, match=message):
            parse_defenses(bad)
