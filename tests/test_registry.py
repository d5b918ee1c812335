"""The one generic registry: the same name normalisation for registration and lookup, one
clear error naming the choices, used by datasets, models, attacks, audits, accountants and
executors."""

from __future__ import annotations

import pytest

from privacylab.accounting.calibration import ACCOUNTANTS
from privacylab.attacks.membership import ATTACKS
from privacylab.audit.job import AUDITS, METHODS
from privacylab.data import Dataset, load_dataset
from privacylab.data.errors import DataError
from privacylab.data.registry import DATASETS, register_dataset
from privacylab.errors import PrivacylabError
from privacylab.execution.executor import EXECUTOR_FACTORIES, EXECUTORS
from privacylab.models.registry import MODELS
from privacylab.registry import Registry, RegistryError, normalise_name


def test_registration_and_lookup_normalise_alike() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("My-Widget", 1)
    for spelling in ("My-Widget", "my_widget", " MY-WIDGET ", "my-widget"):
        assert reg.get(spelling) == 1 and spelling in reg
    assert reg.names() == ["My-Widget"] and reg.canonical("my_widget") == "My-Widget"
    with pytest.raises(RegistryError, match="widget 'my_widget' is registered twice"):
        reg.register("my_widget", 2)


def test_unknown_names_get_one_line_naming_the_choices() -> None:
    reg: Registry[int] = Registry("widget", error=DataError, choices="available:")
    reg.register("b", 1)
    reg.register("a", 2)
    with pytest.raises(DataError, match=r"^unknown widget 'c'; available: a, b$") as info:
        reg.make("c")
    assert isinstance(info.value, PrivacylabError) and "\n" not in str(info.value)


def test_decorator_aliases_make_and_mapping() -> None:
    reg: Registry[type] = Registry("thing")

    @reg.register("box", aliases=("crate",))
    class Box:
        def __init__(self, size: int = 1) -> None:
            self.size = size

    assert reg.make("CRATE", size=3).size == 3
    assert dict(reg) == {"box": Box} and len(reg) == 1 and reg.aliases() == {"crate": "box"}
    with pytest.raises(RegistryError, match="'crate' is registered twice"):
        reg.register("crate", int)
    reg.unregister("crate")
    assert "box" not in reg and "crate" not in reg


def test_a_dataset_registered_with_a_dash_loads() -> None:
    """Issue 10: `my-digits` registered could never be loaded (lookup normalised, registration
    did not)."""

    @register_dataset("my-digits")
    def _load(root: object) -> Dataset:
        return load_dataset("digits")

    try:
        for spelling in ("my-digits", "my_digits", "My-Digits"):
            assert isinstance(load_dataset(spelling), Dataset)
        assert "my-digits" in DATASETS.names()
    finally:
        DATASETS.unregister("my-digits")


def test_every_named_family_uses_the_registry() -> None:
    for registry in (DATASETS, MODELS, ATTACKS, AUDITS, ACCOUNTANTS, EXECUTOR_FACTORIES):
        assert isinstance(registry, Registry)
    assert tuple(EXECUTOR_FACTORIES) == EXECUTORS
    assert tuple(AUDITS) == METHODS
    assert normalise_name(" Fashion_MNIST ") == "fashion-mnist"
    assert load_dataset("breast-cancer").labels.shape == (569,)
