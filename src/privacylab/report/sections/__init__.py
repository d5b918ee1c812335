"""The report page as sections, one module per attack family.

A section is an object with a `key`, a `title`, an `order` (position on the page, smaller
first), `applies(payload)` (whether the payload holds anything for it) and
`render(folder, payload) -> str` (an HTML fragment; images are plain file names in `folder`),
and optionally `css`, a string added to the page's style sheet. The page links each applying
section from its top by `key` (the fragment should be `<section id="{key}">`). Registering one
is one module in this package::

    from privacylab.report.sections import register_section

    @register_section
    class ExtractionSection:
        key, title, order = "extraction", "Model extraction", 30

        def applies(self, payload): return bool(payload.get("extraction"))
        def render(self, folder, payload): return "<section>...</section>"

Every module of this package not starting with "_" is imported when the page is rendered, so
a new family's section needs no edit anywhere else.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable


@runtime_checkable
class Section(Protocol):
    """One part of the report page, for one family of results."""

    key: str
    title: str
    order: int

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether `payload` holds anything this section shows."""
        ...

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """The section's HTML fragment; image links are checked against files in `folder`."""
        ...


_REGISTRY: dict[str, Section] = {}
_loaded = False

T = TypeVar("T")


def register_section(cls: type[T]) -> type[T]:
    """Class decorator: register an instance of `cls` (a `Section`) under its `key`."""
    section = cls()
    if not isinstance(section, Section):
        raise TypeError(f"{cls.__name__} is not a report Section (key, title, order, render)")
    if section.key in _REGISTRY and type(_REGISTRY[section.key]) is not cls:
        raise ValueError(f"a report section named {section.key!r} is already registered")
    _REGISTRY[section.key] = section
    return cls


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    _loaded = True


def sections() -> list[Section]:
    """Every registered section, in page order."""
    _load_all()
    return sorted(_REGISTRY.values(), key=lambda s: (s.order, s.key))


__all__ = ["Section", "register_section", "sections"]
