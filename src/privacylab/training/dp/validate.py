"""Model validator: what stops a model from DP-SGD training, and a fixed copy on request.

DP-SGD (Abadi et al. 2016, Alg. 1) clips each example's gradient, which is only the example's
own contribution if no layer mixes the examples of a batch, and the released model is only
private if no state is updated from the data without noise.  Ghost clipping (Li et al. 2022)
additionally needs every parameter to sit in a layer that forward hooks can see.  The checks,
one per layer family, and the fix that :func:`fix` applies:

* BatchNorm (any dimension, also SyncBatchNorm): normalises with batch statistics (mixes
  examples) and tracks running statistics without noise → ``nn.GroupNorm`` (Wu & He 2018,
  "Group Normalization"), which normalises each example on its own.  Group count: for
  BatchNorm2d/3d/SyncBatchNorm Wu & He's default G = 32 where it divides the channels, else the
  largest divisor of C that divides 32, i.e. G = gcd(32, C) (C = 64 → 32, C = 48 → 16, C = 3 →
  1).  For BatchNorm1d G = 1 (the layer-norm end of Wu & He's family): its input may be (N, C)
  without positions, where groups of one channel would normalise every feature to 0.  The
  affine weight and bias are copied.  For a pretrained model this changes the function (the
  statistics differ); fine-tune after fixing.
* InstanceNorm with ``track_running_stats=True``: the running statistics are non-private data
  statistics → the same layer with ``track_running_stats=False``.
* stock nn.LSTM/GRU/RNN (fused kernels) and nn.MultiheadAttention (parameters used through a
  functional call): no hook sees their per-example gradients → the drop-ins of
  :mod:`privacylab.training.dp.modules`, weights copied, outputs unchanged.
* Embedding/EmbeddingBag with ``max_norm``: rewrites rows of its weight in place during the
  forward pass, from the tokens of the batch — a data-dependent parameter update outside the
  noisy step.  No fix (changing it changes the model): set ``max_norm=None`` by hand.
* Embedding/EmbeddingBag with ``sparse=True`` → ``sparse=False`` (same gradient, dense).
* a layer with trainable parameters and no ghost-clipping rule (or a configuration its rule
  refuses): not an error — its per-example gradients are computed exactly by the per-layer
  fallback of ghost clipping, at a higher cost.

:func:`fix` never rewrites the user's model: it returns a fixed deep copy, or raises
:class:`~privacylab.training.dp.errors.DPSGDError` with one line naming every problem it cannot
fix (this is the ``privacylab train --fix`` path).  Opacus's ``ModuleValidator`` offers the same
service for its users; this is our own implementation.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from privacylab.models.transforms import register_transform
from privacylab.training.dp.errors import DPSGDError
from privacylab.training.dp.ghost.registry import rule_for
from privacylab.training.dp.modules import REPLACEMENTS

__all__ = ["Finding", "describe", "fix", "group_count", "validate"]

GROUPNORM_GROUPS = 32
"""Wu & He 2018's default number of groups."""


@dataclass(frozen=True)
class Finding:
    """One problem of one layer.

    Attributes:
        path: the layer's name in ``model.named_modules()`` (``''`` for the model itself).
        module_type: the layer's class name.
        problem: why DP-SGD cannot (or can only slowly) train it as it is.
        fix: what :func:`fix` does about it, or ``None`` when it cannot be fixed automatically.
        blocking: ``False`` for notes that do not stop training (a layer without a ghost rule
            is clipped exactly by the per-layer fallback); ``True`` otherwise.
    """

    path: str
    module_type: str
    problem: str
    fix: str | None
    blocking: bool = True

    def line(self) -> str:
        """The finding as one line, for the CLI."""
        where = f"'{self.path or '<model>'}' ({self.module_type})"
        if not self.blocking:
            return f"note: {where}: {self.problem}"
        action = f"fix: {self.fix}" if self.fix is not None else "cannot be fixed automatically"
        return f"{where}: {self.problem} -> {action}"


@dataclass(frozen=True)
class _Diagnosis:
    problem: str
    fix: str | None
    fixer: Callable[[nn.Module], nn.Module] | None
    blocking: bool = True


def group_count(channels: int, *, positions: bool = True) -> int:
    """GroupNorm groups replacing a BatchNorm over ``channels``: gcd(32, C) when the input has
    positions (BatchNorm2d/3d), 1 when it may not (BatchNorm1d); see the module docstring."""
    return math.gcd(GROUPNORM_GROUPS, channels) if positions else 1


def _positions(module: nn.Module) -> bool:
    return not isinstance(module, (nn.BatchNorm1d, nn.LazyBatchNorm1d))


def _carry_over(module: nn.Module, replacement: nn.Module) -> nn.Module:
    """Copy the affine weight and bias (values and requires_grad) and the train/eval mode."""
    for name in ("weight", "bias"):
        source, target = getattr(module, name, None), getattr(replacement, name, None)
        if source is not None and target is not None:
            with torch.no_grad():
                target.copy_(source)
            target.requires_grad_(source.requires_grad)
    return replacement.train(module.training)


def _factory(module: nn.modules.batchnorm._NormBase) -> dict[str, Any]:
    """The device and dtype of a norm layer's weight (or running mean), for its replacement."""
    reference = module.weight if module.weight is not None else module.running_mean
    return {} if reference is None else {"device": reference.device, "dtype": reference.dtype}


def _batch_norm_to_group_norm(module: nn.Module) -> nn.Module:
    assert isinstance(module, nn.modules.batchnorm._BatchNorm)
    channels = module.num_features
    replacement = nn.GroupNorm(
        group_count(channels, positions=_positions(module)),
        channels,
        eps=module.eps,
        affine=module.affine,
        **_factory(module),
    )
    return _carry_over(module, replacement)


def _instance_norm_without_stats(module: nn.Module) -> nn.Module:
    assert isinstance(module, nn.modules.instancenorm._InstanceNorm)
    replacement = type(module)(
        module.num_features,
        eps=module.eps,
        momentum=module.momentum,
        affine=module.affine,
        track_running_stats=False,
        **_factory(module),
    )
    return _carry_over(module, replacement)


def _dense_embedding(module: nn.Module) -> nn.Module:
    replacement = copy.deepcopy(module)
    replacement.sparse = False
    return replacement


def _lazy(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.lazy.LazyModuleMixin) and module.has_uninitialized_params()


def _diagnose(module: nn.Module) -> _Diagnosis | None:
    """The problem of this layer itself (not of its children), if any."""
    name = type(module).__name__
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        problem = (
            "normalises with batch statistics (mixes the examples of a batch, so per-example "
            "clipping does not bound one example's influence) and keeps non-private running "
            "statistics"
        )
        if _lazy(module):
            return _Diagnosis(problem + "; its channel count is not known yet (lazy)", None, None)
        positions = _positions(module)
        groups = group_count(module.num_features, positions=positions)
        rule = "gcd(32, C)" if positions else "1, as the input may have no positions"
        return _Diagnosis(
            problem,
            f"replace by GroupNorm({groups}, {module.num_features}) (Wu & He 2018, groups = "
            f"{rule}), affine parameters copied",
            _batch_norm_to_group_norm,
        )
    if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
        problem = "tracks running statistics of the data without noise"
        if _lazy(module):
            return _Diagnosis(problem + "; its channel count is not known yet (lazy)", None, None)
        return _Diagnosis(
            problem,
            f"replace by {name}(..., track_running_stats=False), affine parameters copied",
            _instance_norm_without_stats,
        )
    replacement = REPLACEMENTS.get(type(module))
    if replacement is not None:
        problem = (
            "runs its parameters through a fused kernel that no hook can clip per example"
            if isinstance(module, nn.RNNBase)
            else "uses its parameters through F.multi_head_attention_forward, which no hook "
            "can clip per example"
        )
        return _Diagnosis(
            problem,
            f"replace by privacylab.training.dp.modules.{replacement.__name__} (weights copied, "
            "same outputs)",
            replacement.from_module,  # type: ignore[attr-defined]
        )
    for stock in REPLACEMENTS:
        if isinstance(module, stock):
            return _Diagnosis(
                f"subclasses nn.{stock.__name__}, whose fused computation no hook can clip per "
                f"example; fix() replaces only the stock class (build it on "
                f"{REPLACEMENTS[stock].__name__} instead)",
                None,
                None,
            )
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        if module.max_norm is not None:
            return _Diagnosis(
                f"max_norm={module.max_norm} rewrites rows of its weight in place during the "
                "forward pass, from the batch's tokens (a data-dependent update outside the "
                "noisy step); set max_norm=None",
                None,
                None,
            )
        if module.sparse:
            return _Diagnosis(
                "sparse=True gradients cannot be clipped per example",
                "set sparse=False (same gradient, dense)",
                _dense_embedding,
            )
    trainable = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
    if not trainable:
        return None
    rule = rule_for(module)
    reason = None
    if rule is None:
        reason = "ghost clipping has no rule for this layer"
    elif rule.check is not None:
        refused = rule.check(module)
        if refused is not None:
            reason = f"ghost clipping's rule does not cover it ({refused})"
    if reason is None:
        return None
    return _Diagnosis(
        f"{reason}; its per-example gradients ({', '.join(trainable)}) are computed exactly by "
        "the per-layer per-sample fallback of ghost clipping (slower; not an error — a call it "
        "cannot recompute per example, e.g. not batch-first, is refused in one line at the "
        "first step)",
        None,
        None,
        blocking=False,
    )


def _walk(model: nn.Module) -> list[tuple[str, nn.Module, _Diagnosis]]:
    """Diagnosed layers in model order.  The children of a stock module that gets replaced are
    skipped; a replacement that would untie a parameter shared with another layer is refused."""
    owners: dict[int, dict[int, str]] = {}
    for path, module in model.named_modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), {})[id(module)] = path
    found: list[tuple[str, nn.Module, _Diagnosis]] = []
    replaced: list[str] = []
    for path, module in model.named_modules():
        if any(p == "" or path.startswith(p + ".") for p in replaced):
            continue
        diagnosis = _diagnose(module)
        if diagnosis is None:
            continue
        if diagnosis.fixer is not None:
            replaced.append(path)
            inside = {id(m) for m in module.modules()}
            shared = sorted(
                other
                for param in module.parameters()
                for owner, other in owners.get(id(param), {}).items()
                if owner not in inside
            )
            if shared:
                diagnosis = _Diagnosis(
                    f"{diagnosis.problem}; it shares a parameter with '{shared[0] or '<model>'}', "
                    "which replacing it would untie",
                    None,
                    None,
                )
        found.append((path, module, diagnosis))
    return found


def validate(model: nn.Module) -> list[Finding]:
    """Every layer of ``model`` that DP-SGD cannot train as it is, in model order.

    Findings with ``blocking=False`` are notes (training works, more slowly); the others must
    be fixed — by :func:`fix` where ``finding.fix`` is not None, by hand otherwise.
    """
    if not isinstance(model, nn.Module):
        raise DPSGDError(f"validate needs a torch.nn.Module, got {type(model).__name__}")
    return [
        Finding(path, type(module).__name__, d.problem, d.fix, d.blocking)
        for path, module, d in _walk(model)
    ]


def fix(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every fixable finding of :func:`validate` fixed.

    The user's model is never modified.  A layer shared at several paths is replaced by one
    shared replacement.  Raises:
        DPSGDError: one line naming every blocking problem that cannot be fixed (nothing is
            left unfixed silently); notes (``blocking=False``) do not raise.
    """
    findings = validate(model)
    unfixable = [f for f in findings if f.blocking and f.fix is None]
    if unfixable:
        listed = "; ".join(
            f"'{f.path or '<model>'}' ({f.module_type}): {f.problem}" for f in unfixable
        )
        raise DPSGDError(f"cannot fix {len(unfixable)} layer(s) automatically: {listed}")
    fixed = copy.deepcopy(model)
    replacements: dict[int, nn.Module] = {}
    for _, module, diagnosis in _walk(fixed):
        if diagnosis.fixer is not None and id(module) not in replacements:
            replacements[id(module)] = diagnosis.fixer(module)
    if id(fixed) in replacements:
        return replacements[id(fixed)]
    for module in fixed.modules():
        for name, child in list(module._modules.items()):
            if child is not None and id(child) in replacements:
                module._modules[name] = replacements[id(child)]
    left = [f for f in validate(fixed) if f.blocking]
    if left:
        raise DPSGDError(f"fix left a problem: {left[0].line()}")
    return fixed


def describe(findings: list[Finding]) -> str:
    """One line per finding (blocking ones first), or one line saying there is nothing to do."""
    if not findings:
        return "model check: no problems found for DP-SGD"
    ordered = sorted(findings, key=lambda f: not f.blocking)
    return "\n".join(f.line() for f in ordered)


register_transform("dp-fix")(fix)
"""A model saved after `fix` records ``"dp-fix"`` in its spec, so `load_model` rebuilds the fixed
architecture before loading its weights."""
