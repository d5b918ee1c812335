"""The import graph of privacylab points one way (DESIGN.md, "Dependencies point one way").

Every module under src/privacylab is parsed with `ast`; each `import`/`from ... import` of a
privacylab module (at module level or inside a function; imports under `if TYPE_CHECKING:` are
type annotations only and are left out) is an edge between top-level packages. The edges must
follow the layering below: a package may import packages of strictly lower layers only,
except the same-layer edges listed (with their reason) in SAME_LAYER.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import privacylab

SRC = Path(privacylab.__file__).parent

LAYERS: dict[str, int] = {
    # 0: the error root and the package's own __init__ (its version)
    "errors": 0,
    "privacylab": 0,
    # 1: the generic registry; statistics (numpy/scipy only)
    "registry": 1,
    "stats": 1,
    # 2: privacy accounting (numpy/scipy only)
    "accounting": 2,
    # 3: building blocks: noise mechanisms, datasets, models, executors and the result store
    "mechanisms": 3,
    "data": 3,
    "models": 3,
    "execution": 3,
    # 4: what is trained and what an attacker may touch
    "target": 4,
    "training": 4,
    # 5: federated learning, simulated (clients train, the server observes updates)
    "federated": 5,
    # 6: the families that use them
    "attacks": 6,
    "audit": 6,
    "defenses": 6,
    "report": 6,
    # 7: the main job; 8: bring-your-own-model entry points built on it
    "experiment": 7,
    "defend": 7,
    "extract": 7,
    "reconstruct": 7,
    "invert": 7,
    "infer_property": 7,
    "lm": 7,
    "lm_extract": 7,
    "lm_exposure": 7,
    "lm_membership": 7,
    "dpforward": 7,
    "embedding": 7,
    "jobfiles": 7,
    "backdoor": 7,
    "memorize": 7,
    "byo": 8,
    # 9: the command line; 10: `python -m privacylab`
    "cli": 9,
    "__main__": 10,
}
"""The allowed direction, bottom to top:
errors <- registry, stats <- accounting <- mechanisms/data/models/execution <- target/training
<- federated <- attacks/audit/defenses/report <- experiment/defend/extract/reconstruct <- byo
<- cli <- __main__."""

SAME_LAYER: dict[tuple[str, str], str] = {
    ("experiment", "defend"): "the main job's defence section is the defend job on its targets",
    ("invert", "extract"): "the inversion job loads its target with the extraction job's loader",
    ("lm_extract", "lm"): "LM attack jobs load model and corpus with the LM job's loader",
    ("lm_exposure", "lm"): "LM attack jobs load model and corpus with the LM job's loader",
    ("lm_membership", "lm"): "LM attack jobs load model and corpus with the LM job's loader",
    ("embedding", "dpforward"): "embedding attacks load their target with the DP-Forward loader",
    ("backdoor", "jobfiles"): "resumable jobs share their run-folder files and option checks",
    ("memorize", "jobfiles"): "resumable jobs share their run-folder files and option checks",
}
"""Same-layer edges that are allowed, with why."""

ONLY: dict[str, set[str]] = {
    "stats": {"errors"},
    "accounting": {"errors", "registry"},
    "registry": {"errors"},
    "errors": set(),
}
"""Packages whose imports of privacylab are limited to exactly these (accounting may use the
generic registry, which itself imports only errors)."""


def _package(path: Path) -> tuple[str, list[str]]:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    module = ["privacylab", *parts]
    if parts[-1] == "__init__":
        module = module[:-1]
    top = parts[0] if len(parts) > 1 or parts[0] != "__init__" else "privacylab"
    return top, module


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: list[str], is_package: bool) -> list[str]:
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            found.append(name)
            if node.module is None or name == "privacylab":
                found.extend(f"{name}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def package_edges() -> dict[str, dict[str, list[str]]]:
    """{importer: {imported: [files]}} between top-level packages of privacylab."""
    edges: dict[str, dict[str, list[str]]] = {}
    for path in sorted(SRC.rglob("*.py")):
        top, module = _package(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name in _imports(tree, module, path.name == "__init__.py"):
            parts = name.split(".")
            if parts[0] != "privacylab":
                continue
            target = parts[1] if len(parts) > 1 else "privacylab"
            if target != top:
                rel = str(path.relative_to(SRC))
                edges.setdefault(top, {}).setdefault(target, []).append(rel)
    return edges


EDGES = package_edges()


def test_every_package_has_a_layer() -> None:
    packages = {_package(p)[0] for p in SRC.rglob("*.py")}
    missing = sorted(packages - set(LAYERS))
    assert not missing, f"add these packages to LAYERS in {__file__}: {missing}"


@pytest.mark.parametrize("importer", sorted(EDGES))
def test_imports_point_down(importer: str) -> None:
    bad = []
    for target, files in EDGES[importer].items():
        if target not in LAYERS or importer not in LAYERS:
            continue
        if LAYERS[target] < LAYERS[importer]:
            continue
        if LAYERS[target] == LAYERS[importer] and (importer, target) in SAME_LAYER:
            continue
        bad.append(f"{importer} -> {target} ({', '.join(sorted(set(files)))})")
    assert not bad, "imports against the layering: " + "; ".join(bad)


def test_nothing_imports_cli() -> None:
    importers = [p for p, targets in EDGES.items() if "cli" in targets and p != "__main__"]
    assert not importers, f"cli is imported by {importers}"


@pytest.mark.parametrize("package", sorted(ONLY))
def test_bottom_packages_import_only_the_foundation(package: str) -> None:
    extra = set(EDGES.get(package, {})) - ONLY[package]
    assert not extra, f"{package} imports {sorted(extra)}: {EDGES[package]}"


def test_no_cycles_between_packages() -> None:
    graph = {p: set(t) for p, t in EDGES.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_checker_sees_function_level_and_relative_imports() -> None:
    code = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from privacylab.cli import app\n"
        "def f():\n    from privacylab.report import metrics\n"
        "from ..stats import roc\n"
    )
    found = _imports(ast.parse(code), ["privacylab", "attacks", "x"], False)
    assert "privacylab.report" in found and "privacylab.stats" in found
    assert not any(name.startswith("privacylab.cli") for name in found)
