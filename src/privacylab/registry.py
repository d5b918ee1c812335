"""One generic registry of things built by name: datasets, models, attacks, audits, accountants,
executors.

A `Registry[T]` maps names to objects (a loader, a builder, a class). Registration and lookup
normalise a name the same way (`Registry.key`: case-folded, surrounding space stripped, `_` and
`-` equal), so `my-digits` registered is found as `my_digits`, `My-Digits` or `my-digits`, and
two spellings of one key cannot both be registered. An unknown name raises the family's own
error (a `PrivacylabError`) with one line naming the choices. Like scikit-learn's estimators
checks, a contract test can iterate a registry and run over every entry.

This module sits at the bottom of the import graph beside `privacylab.errors`: it imports
nothing else of ours, so every package, `accounting` included, may use it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, Generic, TypeVar, overload

from privacylab.errors import PrivacylabError

T = TypeVar("T")

__all__ = ["Registry", "RegistryError", "discover", "normalise_name"]


class RegistryError(PrivacylabError, ValueError):
    """An unknown name, or a name registered twice."""


def normalise_name(name: object) -> str:
    """The lookup key of `name`: stripped, lower-case, with `_` written as `-`."""
    return str(name).strip().lower().replace("_", "-")


class Registry(Mapping[str, T], Generic[T]):
    """Named objects of one kind (`kind`, e.g. "dataset"), in registration order.

    `error` is the exception raised for an unknown name (the family's own `PrivacylabError`);
    `choices` is the phrase before the list of names in that message (sorted unless
    `sort_choices` is False: then in registration order). It is a read-only
    mapping from the registered spellings to the objects; `get`, `make` and `in` accept any
    spelling with the same `normalise_name` key, and aliases.
    """

    def __init__(
        self,
        kind: str,
        *,
        error: type[Exception] = RegistryError,
        choices: str = "choose one of",
        sort_choices: bool = True,
    ) -> None:
        self.kind = kind
        self.error = error
        self.choices = choices
        self.sort_choices = sort_choices
        self._items: dict[str, T] = {}
        self._names: dict[str, str] = {}
        self._aliases: dict[str, str] = {}

    @staticmethod
    def key(name: object) -> str:
        """The normalised form of `name` used by registration and lookup alike."""
        return normalise_name(name)

    @overload
    def register(
        self, name: str, obj: None = None, *, aliases: tuple[str, ...] = ()
    ) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T, *, aliases: tuple[str, ...] = ()) -> T: ...

    def register(self, name: str, obj: T | None = None, *, aliases: tuple[str, ...] = ()) -> Any:
        """Register `obj` under `name` (and `aliases`); without `obj`, a decorator doing so.
        A name or alias whose key is taken raises RegistryError."""

        def decorate(item: T) -> T:
            key = self.key(name)
            if not key:
                raise RegistryError(f"a {self.kind} needs a non-empty name")
            for taken in (name, *aliases):
                if self.key(taken) in self._items or self.key(taken) in self._aliases:
                    raise RegistryError(f"{self.kind} {taken!r} is registered twice")
            self._items[key] = item
            self._names[key] = str(name).strip()
            for alias in aliases:
                self._aliases[self.key(alias)] = key
            return item

        return decorate if obj is None else decorate(obj)

    def unregister(self, name: str) -> None:
        """Remove `name` and its aliases (for tests and plug-ins that replace an entry)."""
        key = self.canonical_key(name)
        del self._items[key], self._names[key]
        self._aliases = {a: k for a, k in self._aliases.items() if k != key}

    def names(self) -> list[str]:
        """The registered names as spelled at registration, in registration order."""
        return list(self._names.values())

    def aliases(self) -> dict[str, str]:
        """Alias key -> registered name."""
        return {alias: self._names[key] for alias, key in self._aliases.items()}

    def canonical_key(self, name: object) -> str:
        """The key under which `name` (or the alias `name`) is registered, or the family error
        naming the choices."""
        key = self.key(name)
        key = self._aliases.get(key, key)
        if key not in self._items:
            names = sorted(self.names()) if self.sort_choices else self.names()
            raise self.error(f"unknown {self.kind} {name!r}; {self.choices} {', '.join(names)}")
        return key

    def canonical(self, name: object) -> str:
        """The registered spelling of `name` (aliases resolved), or the family error."""
        return self._names[self.canonical_key(name)]

    def get(self, name: object, default: Any = None) -> T:  # type: ignore[override]
        """The object registered as `name`, or the family error naming the choices (`default`
        is accepted for Mapping compatibility but never returned: unknown names raise)."""
        return self._items[self.canonical_key(name)]

    def make(self, name: object, *args: Any, **kwargs: Any) -> Any:
        """Call the object registered as `name` with `args` and `kwargs` (build it)."""
        return self.get(name)(*args, **kwargs)  # type: ignore[operator]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        key = self.key(name)
        return self._aliases.get(key, key) in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()!r})"


def discover(package: str) -> list[ModuleType]:
    """Import every module of `package` (by dotted name) whose name does not start with "_",
    so that what they define registers itself; returns the modules, in name order."""
    root = importlib.import_module(package)
    return [
        importlib.import_module(f"{package}.{info.name}")
        for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda i: i.name)
        if not info.name.startswith("_")
    ]
