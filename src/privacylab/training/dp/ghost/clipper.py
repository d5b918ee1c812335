"""Ghost clipping with book-keeping: clipped gradient sums from one forward and one backward.

Algorithm (the book-keeping "BK" algorithm of Bu et al. 2023, "Differentially private
optimization on large model at small cost"; norms by the ghost clipping of Li et al. 2022):

1. Forward pass; forward hooks record, for every layer that has trainable parameters, its
   input a and the autograd edge of its output (taken when the layer runs, so an in-place op
   applied to the output later, e.g. ``ReLU(inplace=True)``, does not change what is captured).
2. One backward pass that forms no parameter gradient: ``torch.autograd.grad`` is asked only
   for the gradients of the recorded outputs that have no recorded layer upstream; every other
   recorded output's gradient g is read by a pre-hook on its autograd node as the pass goes by.
   As soon as all calls of a layer have their g, the layer's registered rule computes its
   per-example squared norms — during the backward pass, so that activations replaced by
   instantiated per-example gradients are released early.
3. The clipping factors c_i follow from the norms (flat or per-layer,
   :mod:`privacylab.training.dp.clipping`).
4. Each rule adds Σ_i c_i ∇L_i to its parameters' buffers from what it kept (a and g, or
   instantiated per-example gradients) — no second backward pass (Li et al.'s ghost clipping
   needs one; book-keeping does not).

Layers without a rule (and every layer of a tied-weight group) are handled by the exact
per-layer fallback of :mod:`privacylab.training.dp.ghost.fallback` inside the same pass: their
per-example gradients are instantiated by ``torch.func.vmap`` of a vjp of the layer alone,
and a parameter shared by several layers gets the per-example sum of their contributions
before its norm is taken.

Requirements, checked when the clipper is built or run: every trainable parameter belongs to a
layer, is used only through the ``forward`` of its layer(s) (counted on the autograd graph for
rule layers; for fallback layers, Σ_i ∇L_i must equal the ordinary parameter gradient), and
every layer sees the batch in dimension 0 (by provenance, :func:`probe_batch_first`).  The loss
is a sum of per-example losses and no operation mixes examples (BatchNorm is rejected by the
engine), so row i of an output gradient is ∂L_i/∂out_i.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.utils._pytree import tree_flatten, tree_unflatten

import privacylab.training.dp.ghost.rules  # noqa: F401  (registers the built-in rules)
from privacylab.training.dp.clipping import ClippedBatch, ClipThresholds, GradientBuffers
from privacylab.training.dp.errors import GhostClippingError
from privacylab.training.dp.ghost.fallback import (
    FALLBACK,
    close,
    describe_call_problem,
    fallback_check,
    per_example_gradients,
)
from privacylab.training.dp.ghost.registry import (
    LayerCall,
    LayerGradients,
    RegisteredRule,
    rule_for,
)
from privacylab.training.dp.ghost.rules import PerExampleGradients
from privacylab.training.dp.losses import per_example_losses


@dataclass
class GhostLayer:
    """A layer with trainable parameters and the rule that handles it."""

    path: str
    module: nn.Module
    rule: RegisteredRule
    trainable: tuple[str, ...]
    numel: int = 0
    fallback: bool = False
    """Handled by the exact per-layer per-sample fallback (:mod:`.fallback`), not a ghost rule."""
    tied: dict[str, str] = field(default_factory=dict)
    """Local name -> model name of trainable parameters shared with another layer (tied
    weights); the model name is the one ``model.named_parameters()`` reports."""


def describe(path: str, module: nn.Module) -> str:
    """``'encoder.fc1' (Linear)`` — how errors name a layer."""
    return f"'{path or '<model>'}' ({type(module).__name__})"


def ghost_layers(model: nn.Module) -> tuple[list[GhostLayer], list[str]]:
    """Layers ghost clipping would use, and the reasons it cannot handle this model (if any).

    A layer with trainable parameters of its own and no registered rule is handled by the exact
    per-layer fallback (:mod:`privacylab.training.dp.ghost.fallback`), unless its static check
    refuses it.  A parameter shared by several layers (tied weights, e.g. ``head.weight =
    embed.weight``) has as per-example gradient the sum of its layers' contributions, so norms
    cannot be added per layer: every layer of such a group uses the fallback, whose
    instantiated per-example gradients the clipper sums per example before taking norms.  That
    costs B × (size of the shared tensor) of memory for the step — what ``per_sample`` and
    Opacus's hooks pay for every parameter; a parameter shared between a layer and its own
    sub-layer is refused (recomputing the parent would count the child's use twice).
    """
    layers, problems = [], []
    canonical = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    owners: dict[int, list[tuple[str, str]]] = {}
    for path, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if param.requires_grad:
                owners.setdefault(id(param), []).append((path, name))
    tied_paths: dict[str, dict[str, str]] = {}
    for pid, places in owners.items():
        if len({path for path, _ in places}) < 2:
            continue
        paths = sorted({path for path, _ in places})
        for a in paths:
            for b in paths:
                if a != b and (a == "" or b.startswith(a + ".")):
                    problems.append(
                        f"parameter {canonical[pid]} is shared by layer '{a or '<model>'}' and "
                        f"its own sub-layer '{b}'; ghost clipping cannot separate the two uses "
                        "— use clipping='per_sample'"
                    )
        for path, name in places:
            tied_paths.setdefault(path, {})[name] = canonical[pid]
    for path, module in model.named_modules():
        trainable = tuple(n for n, p in module.named_parameters(recurse=False) if p.requires_grad)
        if not trainable:
            continue
        tied = tied_paths.get(path, {})
        rule = None if tied else rule_for(module)
        reason = rule.check(module) if rule is not None and rule.check is not None else None
        fallback = rule is None or reason is not None
        if fallback:
            fallback_reason = fallback_check(module)
            if fallback_reason is not None:
                if reason is not None:
                    why = reason
                elif tied:
                    why = "it has tied weights and " + fallback_reason
                else:
                    why = "it has no ghost rule and " + fallback_reason
                problems.append(
                    f"ghost clipping cannot handle layer {describe(path, module)}: {why}"
                )
                continue
        numel = sum(p.numel() for n, p in module.named_parameters(recurse=False) if n in trainable)
        if fallback:
            layers.append(GhostLayer(path, module, FALLBACK, trainable, numel, True, tied))
        else:
            layers.append(GhostLayer(path, module, rule, trainable, numel))
    return layers, problems


@dataclass
class _Record:
    layer: int
    activation: Tensor | None
    args: tuple
    kwargs: dict
    versions: tuple[tuple[Tensor, int], ...]
    edge: GradientEdge
    shape: torch.Size
    dtype: torch.dtype
    batched: frozenset[int] = frozenset()
    output: Tensor | None = None


LayerReady = Callable[[int, list[LayerCall]], None]


@dataclass
class ForwardTape:
    """What the forward pass of one batch recorded: explicit per-batch state, no attributes."""

    layers: Sequence[GhostLayer]
    batch_size: int
    records: list[_Record] = field(default_factory=list)
    probes: dict[tuple[int, int], CallProbe] | None = None
    """From `probe_calls`: how the k-th call of layer i relates to the batch."""
    _calls: Counter[int] = field(default_factory=Counter)
    _state: dict[int, list[list[tuple[int, int]]]] = field(default_factory=dict)

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record inputs and output edges of every ghost layer while the block runs."""
        handles = [
            layer.module.register_forward_hook(self._hook(i), with_kwargs=True)
            for i, layer in enumerate(self.layers)
        ]
        handles += [
            layer.module.register_forward_pre_hook(self._snapshot(i))
            for i, layer in enumerate(self.layers)
            if layer.fallback
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _snapshot(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:
            self._state.setdefault(index, []).append(_module_state(module))

        return hook

    def _refuse(self, index: int, why: str) -> GhostClippingError:
        layer = self.layers[index]
        return GhostClippingError(
            f"the per-layer fallback cannot handle layer {describe(layer.path, layer.module)}: "
            f"{why}; use clipping='per_sample'"
        )

    def _not_batch_first(self, index: int, shape: tuple[int, ...]) -> GhostClippingError:
        layer = self.layers[index]
        return GhostClippingError(
            f"layer {describe(layer.path, layer.module)} was called on a tensor of shape "
            f"{shape}, not batch-first with {self.batch_size} examples; "
            "ghost clipping needs every layer to see the batch in dimension 0 (expand "
            "e.g. position indices over the batch) — or use clipping='per_sample'"
        )

    def _hook(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            call = self._calls[index]
            self._calls[index] += 1
            fallback = self.layers[index].fallback
            before = self._state[index].pop() if fallback and self._state.get(index) else None
            if not torch.is_grad_enabled():
                return
            if fallback:
                self._record_fallback(index, call, module, args, kwargs, output, before)
                return
            if not isinstance(output, Tensor) or not output.requires_grad:
                return
            activation = args[0] if args else next(iter(kwargs.values()))
            probe = None if self.probes is None else self.probes.get((index, call))
            # An EmbeddingBag on flat tokens with offsets: its bags (output rows) are what must
            # follow the batch; its rule maps tokens to bags by the offsets.
            flat_bags = isinstance(module, nn.EmbeddingBag) and activation.dim() == 1
            follows = probe is not None and (
                probe.output_batched if flat_bags else probe.batch_first
            )
            if self.probes is not None and not follows:
                layer = self.layers[index]
                raise GhostClippingError(
                    f"layer {describe(layer.path, layer.module)} is called on a tensor whose "
                    "dimension 0 is not the batch (it kept its size when the batch size changed, "
                    "e.g. positions arange(L) or a sequence-first input), so per-example norms "
                    "would be taken along the wrong axis; expand it over the batch, make it "
                    "batch-first, or use clipping='per_sample'"
                )
            if output.shape[:1] != (self.batch_size,) or (
                not flat_bags and activation.shape[:1] != (self.batch_size,)
            ):
                raise self._not_batch_first(index, tuple(activation.shape))
            detached = activation.detach()
            self.records.append(
                _Record(
                    index,
                    detached,
                    tuple(detached if a is activation else _detach(a) for a in args),
                    {k: _detach(v) for k, v in kwargs.items()},
                    ((detached, activation._version),),
                    get_gradient_edge(output),
                    output.shape,
                    output.dtype,
                )
            )

        return hook

    def _record_fallback(
        self,
        index: int,
        call: int,
        module: nn.Module,
        args: tuple,
        kwargs: dict,
        output: object,
        before: list[tuple[int, int]] | None,
    ) -> None:
        """Record a call of a fallback layer, refusing what recomputation could not reproduce."""
        if isinstance(output, Tensor) and not output.requires_grad:
            return
        probe = None if self.probes is None else self.probes.get((index, call))
        if probe is None:
            raise self._refuse(index, "the batch-size probe did not see this call")
        problem = describe_call_problem(output, probe.batched, probe.mixed, probe.output_batched)
        if problem is not None:
            raise self._refuse(index, problem)
        if before is None or _module_state(module) != before:
            raise self._refuse(
                index,
                "its forward writes to or replaces its buffers or parameters (running "
                "statistics?), so recomputing it would not reproduce the forward pass",
            )
        assert isinstance(output, Tensor)
        leaves, spec = tree_flatten((args, kwargs))
        batched = frozenset(i for i, b in enumerate(probe.batched) if b)
        for i in sorted(batched):
            if leaves[i].shape[:1] != (self.batch_size,):
                raise self._not_batch_first(index, tuple(leaves[i].shape))
        if output.shape[:1] != (self.batch_size,):
            raise self._not_batch_first(index, tuple(output.shape))
        detached = [_detach(x) for x in leaves]
        detached_args, detached_kwargs = tree_unflatten(detached, spec)
        self.records.append(
            _Record(
                index,
                detached[min(batched)],
                detached_args,
                detached_kwargs,
                tuple(
                    (d, x._version)
                    for d, x in zip(detached, leaves, strict=True)
                    if isinstance(x, Tensor)
                ),
                get_gradient_edge(output),
                output.shape,
                output.dtype,
                batched,
                output.detach().clone(),
            )
        )

    def backward(
        self, losses: Tensor, on_layer: LayerReady, parameters: Sequence[Tensor] = ()
    ) -> list[Tensor | None]:
        """One backward pass to the recorded layer outputs, handing each layer over early.

        ``on_layer(index, calls)`` runs as soon as every call of layer ``index`` has its output
        gradient — during the backward pass for most layers (Bu et al. 2023's book-keeping
        order), so that a layer's activations can be dropped before the pass ends.  Outputs
        that feed other recorded layers are reached through node pre-hooks; only the
        "terminal" ones (no recorded layer upstream) are requested from ``torch.autograd.grad``,
        which therefore holds nothing else until it returns.  The only parameter gradients
        formed are those of ``parameters`` (the fallback layers', for their check); they are
        returned (``None`` where the loss does not depend on one).
        """
        records, self.records = self.records, []
        if not records:
            return [None] * len(parameters)
        expected = Counter(r.layer for r in records)
        pending: dict[int, list[LayerCall]] = {}

        def deliver(record: _Record, grad: Tensor | None) -> None:
            activation = record.activation
            if activation is None:
                return
            record.activation = None
            args, kwargs = record.args, record.kwargs
            record.args, record.kwargs = (), {}
            if any(t._version != version for t, version in record.versions):
                layer = self.layers[record.layer]
                raise GhostClippingError(
                    f"the input of layer {describe(layer.path, layer.module)} was modified in "
                    "place after the layer used it; avoid in-place ops on it or use "
                    "clipping='per_sample'"
                )
            record.versions = ()
            if grad is None:
                grad = torch.zeros(record.shape, dtype=record.dtype, device=activation.device)
            calls = pending.setdefault(record.layer, [])
            output, record.output = record.output, None
            calls.append(
                LayerCall(
                    activation,
                    grad,
                    args if args or record.batched else (activation,),
                    kwargs,
                    record.batched,
                    output,
                )
            )
            if len(calls) == expected[record.layer]:
                on_layer(record.layer, pending.pop(record.layer))

        if not losses.requires_grad:
            for record in records:
                deliver(record, None)
            return [None] * len(parameters)
        reaches, uses = _walk(losses.grad_fn, {r.edge.node for r in records})
        self._check_parameter_uses(uses, expected)
        terminal = []
        for record in records:
            node = record.edge.node
            if node not in reaches:
                continue
            if not reaches[node]:
                terminal.append(record)
                continue
            output_nr = record.edge.output_nr

            def prehook(grads: tuple, record: _Record = record, output_nr: int = output_nr):
                deliver(record, grads[output_nr])

            node.register_prehook(prehook)
        wanted = [r.edge for r in terminal] + list(parameters)
        grads = list(torch.autograd.grad(losses.sum(), wanted, allow_unused=True)) if wanted else []
        for record, grad in zip(terminal, grads, strict=False):
            deliver(record, grad)
        parameter_grads = grads[len(terminal) :]
        del grads
        for record in records:
            deliver(record, None)
        return parameter_grads

    def _check_parameter_uses(self, uses: dict[int, int], calls: Counter) -> None:
        """Each parameter of a rule layer must reach the loss only through its layer's calls.

        (Fallback layers may use a parameter several times per call; their check is that the
        per-example gradients sum to the parameter gradient, in :meth:`GhostClipping.clip`.)
        """
        for index, layer in enumerate(self.layers):
            if layer.fallback:
                continue
            for name, param in layer.module.named_parameters(recurse=False):
                if name in layer.trainable and uses.get(id(param), 0) > calls[index]:
                    raise GhostClippingError(
                        f"parameter {_join(layer.path, name)} is used outside the forward of "
                        f"its layer {describe(layer.path, layer.module)} (e.g. tied weights "
                        "used through a functional call); ghost clipping cannot see that use — use "
                        "clipping='per_sample'"
                    )


def _module_state(module: nn.Module) -> list[tuple[int, int]]:
    """Identity and version counter of every buffer and parameter (to see forward writes)."""
    return [(id(t), t._version) for t in (*module.buffers(), *module.parameters())]


def _walk(root: object, recorded: set[object]) -> tuple[dict[object, bool], dict[int, int]]:
    """One iterative post-order walk of the autograd graph (a DAG) from the loss.

    Returns, for every node reached, whether a recorded node lies strictly below it (upstream in
    the forward pass), and for every parameter, how many graph edges lead to its
    ``AccumulateGrad`` node (one per use).
    """
    reaches: dict[object, bool] = {}
    uses: dict[int, int] = {}
    stack: list[tuple[object, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        children = [child for child, _ in node.next_functions if child is not None]
        if expanded:
            reaches[node] = any(c in recorded or reaches.get(c, False) for c in children)
            for child in children:
                variable = getattr(child, "variable", None)
                if variable is not None:
                    uses[id(variable)] = uses.get(id(variable), 0) + 1
        elif node not in reaches:
            reaches[node] = False
            stack.append((node, True))
            stack.extend((c, False) for c in children if c not in reaches)
    return reaches, uses


@dataclass(frozen=True)
class CallProbe:
    """How one layer call relates to the batch, from runs on 1 and on 2 examples.

    Attributes:
        batch_first: the first input and the output have 1 row, then 2 (what rules need).
        batched: per leaf of ``tree_flatten((args, kwargs))``: a tensor of shape (1, *s), then
            (2, *s).
        mixed: some leaf changed between the runs otherwise (a sequence-first tensor, a
            non-tensor argument equal to the batch size): it cannot be recomputed per example.
        output_batched: the output is a tensor of shape (1, *s), then (2, *s).
    """

    batch_first: bool
    batched: tuple[bool, ...]
    mixed: bool
    output_batched: bool


def _signature(value: object) -> object:
    if isinstance(value, Tensor):
        return ("tensor", tuple(value.shape))
    return ("value", value)


def _same(a: object, b: object) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _follows_batch(first: object, second: object) -> bool:
    if not (first[0] == second[0] == "tensor"):  # type: ignore[index]
        return False
    s1, s2 = first[1], second[1]  # type: ignore[index]
    return len(s1) == len(s2) >= 1 and s1[0] == 1 and s2[0] == 2 and s1[1:] == s2[1:]


def probe_calls(
    model: nn.Module, layers: Sequence[GhostLayer], inputs: tuple[Tensor, ...]
) -> dict[tuple[int, int], CallProbe]:
    """Which layer calls, and which of their arguments, carry the batch in dimension 0.

    Told by provenance rather than by size: the model is run (without gradients, in eval mode,
    with the RNG state restored afterwards, so training is unchanged) on 1 and on 2 examples; a
    tensor carries the batch in dimension 0 exactly when it has 1 row in the first run and 2 in
    the second, its other dimensions unchanged.  Comparing sizes with the batch size instead is
    fooled whenever a non-batch dimension happens to equal it (positions ``arange(L)`` with
    L == B, a sequence-first (T, B, d) input with T == B), which clips along the wrong axis
    silently: the privacy bug this probe closes.  A model whose calls differ between the two
    runs is refused.
    """
    seen: list[list[tuple[int, list[object], object]]] = [[], []]

    def hook(index: int, run: int) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            leaves, _ = tree_flatten((args, kwargs))
            seen[run].append((index, [_signature(x) for x in leaves], _signature(output)))

        return record

    rows = [
        tuple(x[:1] for x in inputs),
        tuple(torch.cat([x[:1], x[-1:]]) if x.shape[0] < 2 else x[:2] for x in inputs),
    ]
    was_training = model.training
    devices = sorted({x.device.index for x in inputs if x.device.type == "cuda"} - {None})
    try:
        model.eval()
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            for run, batch in enumerate(rows):
                handles = [
                    layer.module.register_forward_hook(hook(i, run), with_kwargs=True)
                    for i, layer in enumerate(layers)
                ]
                try:
                    model(*batch)
                finally:
                    for handle in handles:
                        handle.remove()
    finally:
        model.train(was_training)
    if [(i, len(a)) for i, a, _ in seen[0]] != [(i, len(a)) for i, a, _ in seen[1]]:
        raise GhostClippingError(
            "the model calls its layers differently for 1 and 2 examples, so ghost clipping "
            "cannot tell which dimension is the batch; use clipping='per_sample'"
        )
    out: dict[tuple[int, int], CallProbe] = {}
    count: Counter[int] = Counter()
    for (index, leaves1, out1), (_, leaves2, out2) in zip(seen[0], seen[1], strict=True):
        batched = tuple(_follows_batch(a, b) for a, b in zip(leaves1, leaves2, strict=True))
        mixed = any(
            not f and not _same(a, b) for f, a, b in zip(batched, leaves1, leaves2, strict=True)
        )
        first = (leaves1[0], leaves2[0]) if leaves1 else (None, None)
        rows_of = [
            sig[1][0] if isinstance(sig, tuple) and sig[0] == "tensor" and sig[1] else -1
            for sig in (first[0], out1, first[1], out2)
        ]
        out[(index, count[index])] = CallProbe(
            tuple(rows_of) == (1, 1, 2, 2), batched, mixed, _follows_batch(out1, out2)
        )
        count[index] += 1
    return out


def probe_batch_first(
    model: nn.Module, layers: Sequence[GhostLayer], inputs: tuple[Tensor, ...]
) -> dict[tuple[int, int], bool]:
    """Whether the k-th call of layer i sees the batch in dimension 0 (see :func:`probe_calls`):
    its first input and its output have 1 row for 1 example and 2 rows for 2."""
    return {key: probe.batch_first for key, probe in probe_calls(model, layers, inputs).items()}


class GhostClipping:
    """Clipped per-example gradient sums by ghost clipping and book-keeping (Bu et al. 2023).

    Args:
        model: the network; a trainable parameter sits in a layer with a rule
            (:func:`~privacylab.training.dp.ghost.registry.register_rule`) or in a layer the
            exact per-layer fallback handles (:mod:`~privacylab.training.dp.ghost.fallback`).
        loss_fn: ``loss_fn(outputs, targets) -> (B,)`` per-example losses.
        thresholds: flat or per-layer clipping thresholds.

    Raises:
        GhostClippingError: naming the first layer (path and type) that cannot be handled.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        thresholds: ClipThresholds,
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.thresholds = thresholds
        self._probes: dict[tuple[int, int], CallProbe] | None = None
        self.layers, problems = ghost_layers(model)
        if problems:
            raise GhostClippingError(problems[0])
        unique: dict[int, Tensor] = {}
        for layer in self.layers:
            if layer.fallback:
                for name in layer.trainable:
                    param = getattr(layer.module, name)
                    unique.setdefault(id(param), param)
        self._fallback_params = list(unique.values())

    def clip(
        self,
        inputs: tuple[Tensor, ...],
        targets: Tensor,
        into: GradientBuffers | None = None,
    ) -> ClippedBatch:
        """Forward, one backward to the layer outputs, norms, factors, clipped sums.

        Args:
            inputs: the model's positional inputs, batch first.
            targets: (B, ...) targets for ``loss_fn``.
            into: buffers to add the clipped sums to (zeros by default); ``grad_sum`` of the
                result holds them.  Layers are summed in increasing order of parameter count,
                each buffer created just before its layer's sum and each layer's activations
                released right after, so the largest buffers appear when the least is held.
        """
        batch = inputs[0].shape[0]
        if into is None:
            into = GradientBuffers(
                {n: p for n, p in self.model.named_parameters() if p.requires_grad}
            )
        if self._probes is None and batch > 0:
            self._probes = probe_calls(self.model, self.layers, inputs)
        tape = ForwardTape(self.layers, batch, probes=self._probes)
        with torch.enable_grad(), tape.recording():
            outputs = self.model(*inputs)
            losses = per_example_losses(self.loss_fn, outputs, targets, batch, inputs)
        del outputs
        called = {record.layer for record in tape.records}
        shared = {
            id(getattr(layer.module, name))
            for i, layer in enumerate(self.layers)
            if i in called and layer.fallback
            for name in layer.trainable
        }
        idle = [layer for i, layer in enumerate(self.layers) if i not in called]
        if idle and losses.requires_grad:
            _refuse_use_outside_layers(idle, losses, shared)
        states: list[tuple[int, dict[str, str], LayerGradients]] = []
        sq_norms: dict[str, Tensor] = {}
        fallback_calls: list[tuple[int, list[LayerCall]]] = []

        def on_layer(index: int, calls: list[LayerCall]) -> None:
            layer = self.layers[index]
            if layer.fallback:
                fallback_calls.append((index, calls))
                return
            with torch.no_grad():
                state = layer.rule.rule(layer.module, calls, layer.trainable)
                calls.clear()
                for name, value in state.sq_norms().items():
                    sq_norms[_join(layer.path, name)] = value
            names = {n: _join(layer.path, n) for n in layer.trainable}
            states.append((layer.numel, names, state))

        with torch.enable_grad():
            true_grads = tape.backward(losses, on_layer, self._fallback_params)
        with torch.no_grad():
            reference = {id(p): g for p, g in zip(self._fallback_params, true_grads, strict=True)}
            del true_grads
            self._fallback_states(fallback_calls, reference, states, sq_norms)
            zero = losses.new_zeros(batch)
            for name in self.thresholds.parameter_names:
                sq_norms.setdefault(name, zero)
            norms, coef = self.thresholds.coefficients(sq_norms)
            states.sort(key=lambda item: item[0], reverse=True)
            while states:
                _, names, state = states.pop()
                local = {n: coef[full] for n, full in names.items()}
                state.clipped_sum(local, {n: into[full] for n, full in names.items()})
        return ClippedBatch(into.tensors(), norms, losses.detach(), batch)

    def _fallback_states(
        self,
        fallback_calls: list[tuple[int, list[LayerCall]]],
        reference: dict[int, Tensor | None],
        states: list[tuple[int, dict[str, str], LayerGradients]],
        sq_norms: dict[str, Tensor],
    ) -> None:
        """Per-example gradients of the fallback layers; tied parameters summed per example.

        Each parameter's Σ_i ∇L_i must equal its gradient from the backward pass (``reference``):
        a use of the parameter that recomputing its layers cannot see (a cache, a functional call
        outside the layer) would otherwise be clipped wrongly.
        """
        tied: dict[str, Tensor] = {}
        tied_ids: dict[str, int] = {}
        tied_owner: dict[str, str] = {}
        for index, calls in fallback_calls:
            layer = self.layers[index]
            grads = per_example_gradients(layer.module, calls, layer.trainable, layer.path)
            calls.clear()
            names: dict[str, str] = {}
            for name in layer.trainable:
                param_id = id(getattr(layer.module, name))
                if name in layer.tied:
                    full = layer.tied[name]
                    tied[full] = tied[full] + grads.pop(name) if full in tied else grads.pop(name)
                    tied_ids[full] = param_id
                    tied_owner.setdefault(full, describe(layer.path, layer.module))
                    continue
                full = _join(layer.path, name)
                _check_sum(
                    full, describe(layer.path, layer.module), grads[name], reference[param_id]
                )
                names[name] = full
            state = PerExampleGradients(grads)
            for name, value in state.sq_norms().items():
                sq_norms[names[name]] = value
            states.append((layer.numel, names, state))
        for full, grad in tied.items():
            _check_sum(full, tied_owner[full], grad, reference[tied_ids[full]])
            state = PerExampleGradients({full: grad})
            sq_norms.update(state.sq_norms())
            states.append((grad[0].numel(), {full: full}, state))


def _check_sum(name: str, owner: str, per_example: Tensor, reference: Tensor | None) -> None:
    """GhostClippingError unless Σ_i per_example_i equals the backward pass's gradient."""
    want = torch.zeros_like(per_example[0]) if reference is None else reference
    if not close(per_example.sum(0), want.to(per_example.dtype), per_example.abs().sum(0)):
        raise GhostClippingError(
            f"parameter {name} of layer {owner} gets gradient that the recorded calls of its "
            "layer(s) do not explain (used outside their forward, e.g. through a cache or a "
            "functional call?), so its per-example gradients would be wrong; use "
            "clipping='per_sample'"
        )


def _refuse_use_outside_layers(
    idle: Sequence[GhostLayer], losses: Tensor, verified: Collection[int] = ()
) -> None:
    """GhostClippingError if the loss depends on a parameter of a layer whose forward was not
    called (e.g. `F.linear(x, fc.weight, fc.bias)`): ghost clipping sees only layer calls, so
    such a parameter would get a zero norm and a zero gradient, silently.  Parameters in
    ``verified`` (shared with a called fallback layer, whose gradient check covers them) are
    skipped."""
    owned = [
        (layer, name)
        for layer in idle
        for name in layer.trainable
        if id(getattr(layer.module, name)) not in verified
    ]
    if not owned:
        return
    with torch.enable_grad():
        grads = torch.autograd.grad(
            losses.sum(),
            [getattr(layer.module, name) for layer, name in owned],
            allow_unused=True,
            retain_graph=True,
        )
    for (layer, name), grad in zip(owned, grads, strict=True):
        if grad is not None:
            raise GhostClippingError(
                f"parameter {_join(layer.path, name)} reaches the loss without its layer "
                f"{describe(layer.path, layer.module)} being called (a functional call such as "
                "F.linear(x, layer.weight)?); ghost clipping would give it a zero gradient — call "
                "the layer, or use clipping='per_sample'"
            )


def _detach(value: object) -> object:
    return value.detach() if isinstance(value, Tensor) else value


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
