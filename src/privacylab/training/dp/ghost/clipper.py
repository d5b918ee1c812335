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

Requirements, checked when the clipper is built or run: every trainable parameter belongs to a
layer with a rule, is used only through that layer's ``forward`` and is not shared between
layers (tied weights), and every layer sees the batch in dimension 0.  The loss is a sum of
per-example losses and no operation mixes examples (BatchNorm is rejected by the engine), so row
i of an output gradient is ∂L_i/∂out_i.  A parameter used outside its layer's ``forward`` (e.g.
``F.linear(h, self.embed.weight)``) cannot be detected and would be clipped wrongly: use
``per_sample`` for such models.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

import privacylab.training.dp.ghost.rules  # noqa: F401  (registers the built-in rules)
from privacylab.training.dp.clipping import ClippedBatch, ClipThresholds, GradientBuffers
from privacylab.training.dp.errors import GhostClippingError
from privacylab.training.dp.ghost.registry import (
    LayerCall,
    LayerGradients,
    RegisteredRule,
    rule_for,
)
from privacylab.training.dp.losses import per_example_losses


@dataclass
class GhostLayer:
    """A layer with trainable parameters and the rule that handles it."""

    path: str
    module: nn.Module
    rule: RegisteredRule
    trainable: tuple[str, ...]
    numel: int = 0


def describe(path: str, module: nn.Module) -> str:
    """``'encoder.fc1' (Linear)`` — how errors name a layer."""
    return f"'{path or '<model>'}' ({type(module).__name__})"


def ghost_layers(model: nn.Module) -> tuple[list[GhostLayer], list[str]]:
    """Layers ghost clipping would use, and the reasons it cannot handle this model (if any)."""
    layers, problems = [], []
    owners: dict[int, str] = {}
    for path, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False, remove_duplicate=False):
            if not param.requires_grad:
                continue
            full = _join(path, name)
            if id(param) in owners:
                problems.append(
                    f"parameter {full} is the same tensor as {owners[id(param)]} (tied "
                    "weights); ghost clipping needs each parameter used by one layer"
                )
            owners.setdefault(id(param), full)
        trainable = tuple(n for n, p in module.named_parameters(recurse=False) if p.requires_grad)
        if not trainable:
            continue
        rule = rule_for(module)
        if rule is None:
            problems.append(
                f"ghost clipping has no rule for layer {describe(path, module)}; use "
                "clipping='per_sample' or 'auto', or register one with @register_rule("
                f"{type(module).__name__})"
            )
            continue
        reason = rule.check(module) if rule.check is not None else None
        if reason is not None:
            problems.append(
                f"ghost clipping cannot handle layer {describe(path, module)}: {reason}"
            )
            continue
        numel = sum(p.numel() for n, p in module.named_parameters(recurse=False) if n in trainable)
        layers.append(GhostLayer(path, module, rule, trainable, numel))
    return layers, problems


@dataclass
class _Record:
    layer: int
    activation: Tensor | None
    args: tuple
    kwargs: dict
    version: int
    edge: GradientEdge
    shape: torch.Size
    dtype: torch.dtype


LayerReady = Callable[[int, list[LayerCall]], None]


@dataclass
class ForwardTape:
    """What the forward pass of one batch recorded: explicit per-batch state, no attributes."""

    layers: Sequence[GhostLayer]
    batch_size: int
    records: list[_Record] = field(default_factory=list)
    batch_first: dict[tuple[int, int], bool] | None = None
    """From `probe_batch_first`: whether the k-th call of layer i carries the batch in dim 0."""
    _calls: Counter[int] = field(default_factory=Counter)

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record inputs and output edges of every ghost layer while the block runs."""
        handles = [
            layer.module.register_forward_hook(self._hook(i), with_kwargs=True)
            for i, layer in enumerate(self.layers)
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _hook(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> None:
            call = self._calls[index]
            self._calls[index] += 1
            if not torch.is_grad_enabled() or not isinstance(output, Tensor):
                return
            if not output.requires_grad:
                return
            activation = args[0] if args else next(iter(kwargs.values()))
            if self.batch_first is not None and not self.batch_first.get((index, call), False):
                layer = self.layers[index]
                raise GhostClippingError(
                    f"layer {describe(layer.path, layer.module)} is called on a tensor whose "
                    "dimension 0 is not the batch (it kept its size when the batch size changed, "
                    "e.g. positions arange(L) or a sequence-first input), so per-example norms "
                    "would be taken along the wrong axis; expand it over the batch, make it "
                    "batch-first, or use clipping='per_sample'"
                )
            if activation.shape[:1] != (self.batch_size,) or output.shape[:1] != (self.batch_size,):
                layer = self.layers[index]
                raise GhostClippingError(
                    f"layer {describe(layer.path, layer.module)} was called on a tensor of shape "
                    f"{tuple(activation.shape)}, not batch-first with {self.batch_size} examples; "
                    "ghost clipping needs every layer to see the batch in dimension 0 (expand "
                    "e.g. position indices over the batch) — or use clipping='per_sample'"
                )
            detached = activation.detach()
            self.records.append(
                _Record(
                    index,
                    detached,
                    tuple(detached if a is activation else _detach(a) for a in args),
                    {k: _detach(v) for k, v in kwargs.items()},
                    activation._version,
                    get_gradient_edge(output),
                    output.shape,
                    output.dtype,
                )
            )

        return hook

    def backward(self, losses: Tensor, on_layer: LayerReady) -> None:
        """One backward pass to the recorded layer outputs, handing each layer over early.

        ``on_layer(index, calls)`` runs as soon as every call of layer ``index`` has its output
        gradient — during the backward pass for most layers (Bu et al. 2023's book-keeping
        order), so that a layer's activations can be dropped before the pass ends.  Outputs
        that feed other recorded layers are reached through node pre-hooks; only the
        "terminal" ones (no recorded layer upstream) are requested from ``torch.autograd.grad``,
        which therefore holds nothing else until it returns.  No parameter gradient is formed.
        """
        records, self.records = self.records, []
        if not records:
            return
        expected = Counter(r.layer for r in records)
        pending: dict[int, list[LayerCall]] = {}

        def deliver(record: _Record, grad: Tensor | None) -> None:
            activation = record.activation
            if activation is None:
                return
            record.activation = None
            args, kwargs = record.args, record.kwargs
            record.args, record.kwargs = (), {}
            if activation._version != record.version:
                layer = self.layers[record.layer]
                raise GhostClippingError(
                    f"the input of layer {describe(layer.path, layer.module)} was modified in "
                    "place after the layer used it; avoid in-place ops on it or use "
                    "clipping='per_sample'"
                )
            if grad is None:
                grad = torch.zeros(record.shape, dtype=record.dtype, device=activation.device)
            calls = pending.setdefault(record.layer, [])
            calls.append(LayerCall(activation, grad, args or (activation,), kwargs))
            if len(calls) == expected[record.layer]:
                on_layer(record.layer, pending.pop(record.layer))

        if not losses.requires_grad:
            for record in records:
                deliver(record, None)
            return
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
        grads = torch.autograd.grad(losses.sum(), [r.edge for r in terminal], allow_unused=True)
        for record, grad in zip(terminal, grads, strict=True):
            deliver(record, grad)
        del grads
        for record in records:
            deliver(record, None)

    def _check_parameter_uses(self, uses: dict[int, int], calls: Counter) -> None:
        """Each parameter must reach the loss only through its own layer's calls."""
        for index, layer in enumerate(self.layers):
            for name, param in layer.module.named_parameters(recurse=False):
                if name in layer.trainable and uses.get(id(param), 0) > calls[index]:
                    raise GhostClippingError(
                        f"parameter {_join(layer.path, name)} is used outside the forward of "
                        f"its layer {describe(layer.path, layer.module)} (e.g. tied weights "
                        "used through a functional call); ghost clipping cannot see that use — use "
                        "clipping='per_sample'"
                    )


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


def probe_batch_first(
    model: nn.Module, layers: Sequence[GhostLayer], inputs: tuple[Tensor, ...]
) -> dict[tuple[int, int], bool]:
    """Which layer calls see the batch in dimension 0, told by provenance rather than by size.

    A layer input's dimension 0 is the batch exactly when it follows the batch size: the model
    is run (without gradients, in eval mode, with the RNG state restored afterwards, so training
    is unchanged) on 1 and on 2 examples, and the k-th call of layer i is batch-first iff its
    input and output have 1 row in the first run and 2 in the second. Comparing sizes with the
    batch size instead is fooled whenever a non-batch dimension happens to equal it (positions
    `arange(L)` with L == B, a sequence-first (T, B, d) input with T == B), which clips along the
    wrong axis silently: the privacy bug this probe closes. A model whose calls differ between
    the two runs is refused.
    """
    sizes: list[list[tuple[int, int, int]]] = [[], []]

    def hook(index: int, run: int) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            activation = args[0] if args else next(iter(kwargs.values()), None)
            first = (
                activation.shape[0] if isinstance(activation, Tensor) and activation.ndim else -1
            )
            out = output.shape[0] if isinstance(output, Tensor) and output.ndim else -1
            sizes[run].append((index, first, out))

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
    if [i for i, _, _ in sizes[0]] != [i for i, _, _ in sizes[1]]:
        raise GhostClippingError(
            "the model calls its layers differently for 1 and 2 examples, so ghost clipping "
            "cannot tell which dimension is the batch; use clipping='per_sample'"
        )
    out: dict[tuple[int, int], bool] = {}
    seen: Counter[int] = Counter()
    for (index, a1, o1), (_, a2, o2) in zip(sizes[0], sizes[1], strict=True):
        out[(index, seen[index])] = (a1, o1, a2, o2) == (1, 1, 2, 2)
        seen[index] += 1
    return out


class GhostClipping:
    """Clipped per-example gradient sums by ghost clipping and book-keeping (Bu et al. 2023).

    Args:
        model: the network; every trainable parameter must sit in a layer with a rule
            (:func:`~privacylab.training.dp.ghost.registry.register_rule`).
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
        self._batch_first: dict[tuple[int, int], bool] | None = None
        self.layers, problems = ghost_layers(model)
        if problems:
            raise GhostClippingError(problems[0])

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
        if self._batch_first is None and batch > 0:
            self._batch_first = probe_batch_first(self.model, self.layers, inputs)
        tape = ForwardTape(self.layers, batch, batch_first=self._batch_first)
        with torch.enable_grad(), tape.recording():
            outputs = self.model(*inputs)
            losses = per_example_losses(self.loss_fn, outputs, targets, batch, inputs)
        del outputs
        called = {record.layer for record in tape.records}
        idle = [layer for i, layer in enumerate(self.layers) if i not in called]
        if idle and losses.requires_grad:
            _refuse_use_outside_layers(idle, losses)
        states: list[tuple[GhostLayer, LayerGradients]] = []
        sq_norms: dict[str, Tensor] = {}

        def on_layer(index: int, calls: list[LayerCall]) -> None:
            layer = self.layers[index]
            with torch.no_grad():
                state = layer.rule.rule(layer.module, calls, layer.trainable)
                calls.clear()
                for name, value in state.sq_norms().items():
                    sq_norms[_join(layer.path, name)] = value
            states.append((layer, state))

        with torch.enable_grad():
            tape.backward(losses, on_layer)
        with torch.no_grad():
            zero = losses.new_zeros(batch)
            for name in self.thresholds.parameter_names:
                sq_norms.setdefault(name, zero)
            norms, coef = self.thresholds.coefficients(sq_norms)
            states.sort(key=lambda item: item[0].numel, reverse=True)
            while states:
                layer, state = states.pop()
                local = {n: coef[_join(layer.path, n)] for n in layer.trainable}
                state.clipped_sum(local, {n: into[_join(layer.path, n)] for n in layer.trainable})
        return ClippedBatch(into.tensors(), norms, losses.detach(), batch)


def _refuse_use_outside_layers(idle: Sequence[GhostLayer], losses: Tensor) -> None:
    """GhostClippingError if the loss depends on a parameter of a layer whose forward was not
    called (e.g. `F.linear(x, fc.weight, fc.bias)`): ghost clipping sees only layer calls, so
    such a parameter would get a zero norm and a zero gradient, silently."""
    owned = [(layer, name) for layer in idle for name in layer.trainable]
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
