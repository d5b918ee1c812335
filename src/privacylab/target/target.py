"""`Target`: a trained model behind the threat model's access level, counting every query.

Attacks receive a `Target` and may use nothing else: `labels` is open to every level,
`probabilities` needs scores, `logits` needs logits and `model` needs white-box access.

Queries. One example in one call is one query; through `model` (white-box), one example in
one forward pass of the returned module is one query (a C&W step on a batch of k examples
costs k queries). Calls past `query_budget` raise `QueryBudgetError`.

Views. `with_access` returns a view at the same or a lower level (never higher: AccessError).
A view shares its parent's ledger: one budget, one query monitor, and its queries are added
to the parent's `queries` (and to the grandparent's...), while `view.queries` counts only what
went through the view (and its own views), which is what an attack runner reports.

Hooks. An output defence (a function of the probability vectors, e.g. rounding or top-k)
plugs in as `output_defense` and is applied before anything is returned. A query monitor
(`query_monitor(x)`) sees every query batch before it is answered, white-box forward passes
included, and may raise to refuse it — where stateful detectors such as PRADA (Juuti et al.
2019) plug in. A view may add its own monitor (`with_monitor`) and its own, tighter budget
(`with_budget`): they apply to the queries through that view (and its views) only, on top of
the shared ones — a view only ever restricts.

Precision. With `precision="float64"` the target answers in float64: it runs a float64 copy
of the model (the caller's model is not converted) on float64 inputs and returns float64
outputs, as the cryptanalytic extraction of Carlini et al. 2020 assumes of the API. The default
"float32" returns float32 outputs.

Updates. A target at `updates` access also carries what a federated server observed
(`updates`, a sequence of `privacylab.federated.ObservedUpdate`: the parameters it sent, what
came back, the protocol): `target.updates` needs that access, and any narrower view hides them.
Reading them is not a query; the forward passes an attack then runs through `model` are.

Outputs. With `outputs="logits"` (default) the model returns logits and the target applies
softmax; on the first query the target checks that they are not already probability vectors
(a model ending in `nn.Softmax` would otherwise be softmaxed twice). With
`outputs="probabilities"` the model's outputs are used as probabilities as they are, and
`logits` returns log-probabilities (logits up to a per-row constant, so softmax gives the
probabilities back). Every batch is checked to have shape (n, num_classes) and finite values.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.target.access import Access, AccessError, QueryBudgetError, TargetError

OutputDefense = Callable[[Tensor], Tensor]
QueryMonitor = Callable[[Tensor], None]
LabelledMonitor = Callable[[Tensor, Tensor], None]
Outputs = Literal["logits", "probabilities"]
Precision = Literal["float32", "float64"]

PROBABILITY_TOLERANCE = 1e-4
"""How close to 1 every row must sum for model outputs to be taken for probability vectors."""


@dataclass
class _Ledger:
    """State shared by a target and all of its views: the budget, the monitor, the total."""

    budget: int | None
    monitor: QueryMonitor | None
    total: int = 0
    checked: bool = False


class Target:
    """A model as an attacker sees it.

    `access` is the declared level; `query_budget` (examples) is unlimited when None;
    `output_defense` post-processes probability vectors; `query_monitor` sees every query batch
    and may raise to refuse it; `outputs` says whether the model returns logits or
    probabilities; `batch_size` bounds the size of one forward pass; `device` is where the
    model runs; `precision` ("float32" or "float64") is the dtype of its answers; `updates`
    are the client updates a federated server observed (`updates` access only).
    """

    def __init__(
        self,
        model: nn.Module,
        access: Access | str,
        num_classes: int,
        *,
        query_budget: int | None = None,
        output_defense: OutputDefense | None = None,
        query_monitor: QueryMonitor | None = None,
        outputs: Outputs = "logits",
        device: str | torch.device = "cpu",
        batch_size: int = 4096,
        precision: Precision = "float32",
        updates: Sequence[Any] | None = None,
    ) -> None:
        self.access = Access.parse(access)
        if updates is not None and self.access is not Access.UPDATES:
            raise AccessError(
                f"observed updates need a target at updates access, not {self.access.value}"
            )
        if precision not in ("float32", "float64"):
            raise TargetError(f'precision must be "float32" or "float64", got {precision!r}')
        if query_budget is not None and (isinstance(query_budget, bool) or query_budget < 0):
            raise ValueError(f"query budget must be a whole number >= 0, got {query_budget!r}")
        if int(num_classes) < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes!r}")
        if outputs not in ("logits", "probabilities"):
            raise TargetError(f'outputs must be "logits" or "probabilities", got {outputs!r}')
        self.num_classes = int(num_classes)
        self.output_defense = output_defense
        self.outputs: Outputs = outputs
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.precision: Precision = precision
        self.dtype = torch.float64 if precision == "float64" else torch.float32
        if precision == "float64":
            model = copy.deepcopy(model).double()
        self._model = model.to(self.device).eval()
        self._ledger = _Ledger(query_budget, query_monitor)
        self._parent: Target | None = None
        self._queries = 0
        self._own_budget: int | None = None
        self._own_monitor: QueryMonitor | None = None
        self._updates: tuple[Any, ...] = tuple(updates or ())

    @property
    def updates(self) -> tuple[Any, ...]:
        """The client updates the server observed (`privacylab.federated.ObservedUpdate`), in
        the order it received them; needs updates access (AccessError), not counted as queries."""
        self.require(Access.UPDATES)
        return self._updates

    @property
    def query_budget(self) -> int | None:
        """The budget (examples) shared by this target and all its views; None: unlimited."""
        return self._ledger.budget

    @property
    def query_monitor(self) -> QueryMonitor | None:
        """The monitor shared by this target and all its views."""
        return self._ledger.monitor

    @property
    def queries(self) -> int:
        """Examples queried through this target and its views."""
        return self._queries

    def with_access(self, access: Access | str) -> Target:
        """A view of the same model at `access`, which may not exceed this target's level
        (AccessError); it shares this target's budget, monitor and query count."""
        access = Access.parse(access)
        if not self.access.allows(access):
            raise AccessError(
                f"a view may only narrow access: cannot widen {self.access.value} to {access.value}"
            )
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        view.access = access
        view._parent = self
        view._queries = 0
        view._own_budget = None
        view._own_monitor = None
        return view

    def with_monitor(
        self, monitor: QueryMonitor | LabelledMonitor, *, labelled: bool = False
    ) -> Target:
        """A view at this target's level whose query batches are also shown to `monitor`
        (after the monitors of this target and its parents), which may raise to refuse them;
        the parent's queries are not shown to it. With `labelled`, the monitor is called as
        `monitor(x, labels)` with the model's own labels for the batch, computed on the
        defender's side (not counted, not shown to other monitors, never returned to the
        client): what a detector such as PRADA keys its state by."""
        view = self.with_access(self.access)
        if labelled:
            view._own_monitor = _Labelled(monitor, self)  # type: ignore[arg-type]
        else:
            view._own_monitor = monitor  # type: ignore[assignment]
        return view

    def with_budget(self, budget: int) -> Target:
        """A view at this target's level that may send at most `budget` examples (on top of
        the shared budget): QueryBudgetError past it."""
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"query budget must be a whole number >= 1, got {budget!r}")
        view = self.with_access(self.access)
        view._own_budget = budget
        return view

    def with_output_defense(self, defense: OutputDefense, serves: Access | str) -> Target:
        """A view of the same model whose probability vectors pass through `defense` (after
        any output defence this target already has), served at `serves` or at this target's
        own level if lower. White-box targets cannot be defended this way (AccessError): the
        attacker would read the model itself."""
        if self.access.allows(Access.WHITEBOX):
            raise AccessError(
                "an output defence cannot defend a white-box target: narrow it to scores first"
            )
        serves = Access.parse(serves)
        view = self.with_access(serves if self.access.allows(serves) else self.access)
        inner = self.output_defense
        view.output_defense = defense if inner is None else _Composed(inner, defense)
        return view

    def require(self, needed: Access | str) -> None:
        """Raise AccessError unless the declared access allows `needed`."""
        needed = Access.parse(needed)
        if not self.access.allows(needed):
            raise AccessError(
                f"this attack needs {needed.value} access but the target offers "
                f"only {self.access.value}"
            )

    @property
    def model(self) -> nn.Module:
        """The model itself (white-box access only), wrapped so that each example of each
        forward pass counts as one query (and is shown to the query monitor)."""
        self.require(Access.WHITEBOX)
        return _CountingModule(self._model, self)

    def _chain(self) -> list[Target]:
        """This target, its parent, ..., the root: outermost view first."""
        nodes: list[Target] = []
        node: Target | None = self
        while node is not None:
            nodes.append(node)
            node = node._parent
        return nodes

    def _count(self, x: Tensor) -> None:
        n = int(x.shape[0])
        ledger = self._ledger
        if ledger.budget is not None and ledger.total + n > ledger.budget:
            raise QueryBudgetError(
                f"query budget of {ledger.budget} examples exhausted "
                f"({ledger.total} used, {n} more asked)"
            )
        chain = self._chain()
        for node in chain:
            if node._own_budget is not None and node._queries + n > node._own_budget:
                raise QueryBudgetError(
                    f"query budget of {node._own_budget} examples exhausted "
                    f"({node._queries} used, {n} more asked)"
                )
        if ledger.monitor is not None:
            ledger.monitor(x.detach())
        for node in reversed(chain):
            if node._own_monitor is not None:
                node._own_monitor(x.detach())
        ledger.total += n
        for node in chain:
            node._queries += n

    def _check(self, out: Tensor) -> None:
        """One-line TargetError for outputs of the wrong shape, non-finite outputs, or outputs
        of the other kind than `outputs` declares (checked once, on the first batch)."""
        if out.ndim != 2 or out.shape[1] != self.num_classes:
            raise TargetError(
                f"the model returned shape {tuple(out.shape)}, expected "
                f"(n, {self.num_classes}) (one {self.outputs[:-1]} row per example)"
            )
        if not bool(torch.isfinite(out).all()):
            raise TargetError("the model returned NaN or infinite outputs")
        if self._ledger.checked or out.shape[0] == 0 or self.num_classes < 2:
            return
        self._ledger.checked = True
        sums = out.double().sum(1)
        probabilities = bool((out >= 0).all()) and bool(
            ((sums - 1).abs() <= PROBABILITY_TOLERANCE).all()
        )
        if self.outputs == "logits" and probabilities:
            raise TargetError(
                "the model already returns probability vectors (rows >= 0 summing to 1); "
                'pass outputs="probabilities" to Target'
            )
        if self.outputs == "probabilities" and not probabilities:
            raise TargetError(
                "the model's outputs are not probability vectors (rows >= 0 summing to 1); "
                'pass outputs="logits" to Target'
            )

    @torch.no_grad()
    def _raw(self, x: Tensor | np.ndarray) -> Tensor:
        x = torch.as_tensor(x)
        self._count(x)
        outs = []
        for i in range(0, int(x.shape[0]), self.batch_size):
            batch = x[i : i + self.batch_size].to(self.device, self.dtype)
            out = self._model(batch).to(self.dtype)
            self._check(out)
            outs.append(out)
        if not outs:
            return torch.zeros(0, self.num_classes, dtype=self.dtype)
        return torch.cat(outs).cpu()

    def _probabilities(self, raw: Tensor) -> Tensor:
        return raw if self.outputs == "probabilities" else F.softmax(raw, dim=1)

    def _defended(self, raw: Tensor) -> Tensor:
        probs = self._probabilities(raw)
        return self.output_defense(probs) if self.output_defense is not None else probs

    def labels(self, x: Tensor | np.ndarray) -> Tensor:
        """Predicted labels (int64, shape (n,)); every access level may ask. An output defence
        that declares `keeps_label = True` (it never moves a row's arg-max) is not computed
        for labels: they are the model's own."""
        raw = self._raw(x)
        if getattr(self.output_defense, "keeps_label", False):
            return self._probabilities(raw).argmax(1)
        return self._defended(raw).argmax(1)

    def accuracy(self, x: Tensor | np.ndarray, y: Tensor | np.ndarray) -> float:
        """Fraction of `x` whose predicted label is `y` (one label query per example; NaN for
        no examples)."""
        if len(y) == 0:
            return float("nan")
        return float((self.labels(x) == torch.as_tensor(y)).float().mean())

    def probabilities(self, x: Tensor | np.ndarray) -> Tensor:
        """Probability vectors (n, classes); needs scores access."""
        self.require(Access.SCORES)
        return self._defended(self._raw(x))

    def logits(self, x: Tensor | np.ndarray) -> Tensor:
        """Logits (n, classes); needs logits access (an output defence blocks it). For a model
        declared with outputs="probabilities", the log-probabilities."""
        self.require(Access.LOGITS)
        if self.output_defense is not None:
            raise AccessError("the target's output defence hides its logits")
        raw = self._raw(x)
        return raw if self.outputs == "logits" else raw.clamp_min(1e-45).log()


class _Labelled:
    """A monitor called with the batch and the model's own labels for it (defender side)."""

    def __init__(self, monitor: LabelledMonitor, target: Target) -> None:
        self.monitor, self.target = monitor, target

    @torch.no_grad()
    def __call__(self, x: Tensor) -> None:
        target = self.target
        outs = [
            target._model(x[i : i + target.batch_size].to(target.device, target.dtype))
            .argmax(1)
            .cpu()
            for i in range(0, int(x.shape[0]), target.batch_size)
        ]
        labels = torch.cat(outs) if outs else torch.zeros(0, dtype=torch.int64)
        self.monitor(x, labels)


class _Composed:
    """Two output defences applied in turn (first `inner`, then `outer`)."""

    def __init__(self, inner: OutputDefense, outer: OutputDefense) -> None:
        self.inner, self.outer = inner, outer
        self.keeps_label = bool(
            getattr(inner, "keeps_label", False) and getattr(outer, "keeps_label", False)
        )

    def __call__(self, probs: Tensor) -> Tensor:
        return self.outer(self.inner(probs))


class _CountingModule(nn.Module):
    """The target's model as white-box access hands it out: forward passes are the model's,
    and each example in each forward pass counts as one query of `target` (against its budget,
    shown to its monitor). Parameters, gradients and modes are the model's own."""

    def __init__(self, model: nn.Module, target: Target) -> None:
        super().__init__()
        self.inner = model
        object.__setattr__(self, "_target", target)

    def forward(self, x: Tensor) -> Tensor:
        self._target._count(x)
        return self.inner(x)
