"""Your own model: a factory named by an import path, built like a zoo model.

A model name of the form `package.module:function` (or `path/to/file.py:function`) names a
*factory*: a callable that returns a fresh `nn.Module`. It may take no arguments, or any of the
keywords `input_shape` and `num_classes`, which are then passed. Because the factory is named by
a string, worker processes that train reference models resolve it again by themselves (nothing is
pickled), a saved model's sidecar records it, and `load_model` rebuilds it. The model must return
logits of shape (batch, num_classes) unless its `Target` is told it returns probabilities.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from privacylab.models.errors import ModelError
from privacylab.models.storage import shape_mismatch

MAX_WEIGHTS_BYTES = 8 * 1024**3
"""Largest weights file `load_weights` reads (8 GiB)."""


def is_factory(name: object) -> bool:
    """Whether a model name names a user factory (`module:function`) rather than a zoo model."""
    return isinstance(name, str) and ":" in name and not name.startswith(":")


def _split(reference: str) -> tuple[str, str]:
    module, _, attribute = reference.rpartition(":")
    if not module or not attribute or not attribute.replace(".", "_").isidentifier():
        raise ModelError(
            f"model factory {reference!r} must look like package.module:function "
            "or path/to/file.py:function"
        )
    return module, attribute


def _import_file(path: Path) -> Any:
    path = path.resolve()
    if not path.is_file():
        raise ModelError(f"model factory file {path} does not exist")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    name = f"privacylab_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelError(f"cannot import model factory file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise ModelError(f"importing {path} failed: {type(error).__name__}: {error}") from None
    return module


def resolve_factory(reference: str) -> Callable[..., nn.Module]:
    """The callable named by `reference` (`package.module:function` or `file.py:function`).

    A dotted module is imported with the current directory on `sys.path` (as `python -m` does),
    so a factory in the user's own project resolves from where the command is run.
    """
    module_name, attribute = _split(reference)
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        module = _import_file(Path(module_name).expanduser())
    else:
        cwd = str(Path.cwd())
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ModelError(f"cannot import {module_name!r} for model factory: {error}") from None
        except Exception as error:
            raise ModelError(
                f"importing {module_name!r} failed: {type(error).__name__}: {error}"
            ) from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ModelError(f"{module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ModelError(f"model factory {reference!r} is not callable")
    return target  # type: ignore[no-any-return]


def absolute_reference(reference: str) -> str:
    """`reference` with a file path made absolute, so worker processes and later runs started
    elsewhere find the same factory."""
    module_name, attribute = _split(reference)
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        return f"{Path(module_name).expanduser().resolve()}:{attribute}"
    return reference


def build_from_factory(
    reference: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    seed: int | None = None,
    **options: Any,
) -> nn.Module:
    """A fresh model from the factory `reference`, initialised under `torch.manual_seed(seed)`
    (inside `fork_rng`, so the caller's RNG is untouched), as `build_model` does for the zoo."""
    factory = resolve_factory(reference)
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        accepted = {}  # type: ignore[assignment]
    kwargs = dict(options)
    if "input_shape" in accepted:
        kwargs["input_shape"] = tuple(int(s) for s in input_shape)
    if "num_classes" in accepted:
        kwargs["num_classes"] = int(num_classes)

    def make() -> Any:
        try:
            return factory(**kwargs)
        except TypeError as error:
            raise ModelError(f"model factory {reference!r} failed: {error}") from None

    if seed is None:
        model = make()
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model = make()
    if not isinstance(model, nn.Module):
        raise ModelError(
            f"model factory {reference!r} returned {type(model).__name__}, not a torch nn.Module"
        )
    return model


def load_weights(model: nn.Module, path: str | Path) -> nn.Module:
    """Fill `model` with the state dict in the safetensors file `path` (strict: every name and
    shape must match); returns the model in eval mode. Nothing is unpickled."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ModelError(f"no weights file {file}")
    if file.stat().st_size > MAX_WEIGHTS_BYTES:
        raise ModelError(f"weights file {file} is larger than {MAX_WEIGHTS_BYTES} bytes")
    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise ModelError(f"{file} is not a readable safetensors file: {error}") from None
    problems = shape_mismatch(
        {k: tuple(v.shape) for k, v in model.state_dict().items()},
        {k: tuple(v.shape) for k, v in tensors.items()},
    )
    if problems:
        raise ModelError(f"weights in {file} do not fit the model: {'; '.join(problems)}")
    model.load_state_dict(tensors, strict=True)
    return model.eval()
