"""`Target`: a trained model behind the threat model's access level, counting every query.

Attacks receive a `Target` and may use nothing else: `labels` is open to every level,
`probabilities` needs scores, `logits` needs logits and `model` needs white-box access. One
example in one call is one query; calls past `query_budget` raise `QueryBudgetError`. An
output defence (a function of the probability vectors, e.g. rounding or top-k) plugs in as
`output_defense` and is applied before anything is returned.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.target.access import Access, AccessError, QueryBudgetError

OutputDefense = Callable[[Tensor], Tensor]


class Target:
    """A model as an attacker sees it.

    `access` is the declared level; `query_budget` (examples) is unlimited when None;
    `batch_size` bounds the size of one forward pass; `device` is where the model runs.
    """

    def __init__(
        self,
        model: nn.Module,
        access: Access | str,
        num_classes: int,
        *,
        query_budget: int | None = None,
        output_defense: OutputDefense | None = None,
        device: str | torch.device = "cpu",
        batch_size: int = 4096,
    ) -> None:
        self.access = Access.parse(access)
        if query_budget is not None and (isinstance(query_budget, bool) or query_budget < 0):
            raise ValueError(f"query budget must be a whole number >= 0, got {query_budget!r}")
        if int(num_classes) < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes!r}")
        self.num_classes = int(num_classes)
        self.query_budget = query_budget
        self.output_defense = output_defense
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self._model = model.to(self.device).eval()
        self.queries = 0

    def with_access(self, access: Access | str) -> Target:
        """The same model (and query counter start) at another access level."""
        return Target(
            self._model,
            access,
            self.num_classes,
            query_budget=self.query_budget,
            output_defense=self.output_defense,
            device=self.device,
            batch_size=self.batch_size,
        )

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
        """The model itself (white-box access only)."""
        self.require(Access.WHITEBOX)
        return self._model

    def _count(self, n: int) -> None:
        if self.query_budget is not None and self.queries + n > self.query_budget:
            raise QueryBudgetError(
                f"query budget of {self.query_budget} examples exhausted "
                f"({self.queries} used, {n} more asked)"
            )
        self.queries += n

    @torch.no_grad()
    def _logits(self, x: Tensor | np.ndarray) -> Tensor:
        x = torch.as_tensor(x)
        self._count(int(x.shape[0]))
        outs = [
            self._model(x[i : i + self.batch_size].to(self.device)).float()
            for i in range(0, int(x.shape[0]), self.batch_size)
        ]
        if not outs:
            return torch.zeros(0, self.num_classes)
        return torch.cat(outs).cpu()

    def _defended(self, logits: Tensor) -> Tensor:
        probs = F.softmax(logits, dim=1)
        return self.output_defense(probs) if self.output_defense is not None else probs

    def labels(self, x: Tensor | np.ndarray) -> Tensor:
        """Predicted labels (int64, shape (n,)); every access level may ask."""
        return self._defended(self._logits(x)).argmax(1)

    def probabilities(self, x: Tensor | np.ndarray) -> Tensor:
        """Probability vectors (n, classes); needs scores access."""
        self.require(Access.SCORES)
        return self._defended(self._logits(x))

    def logits(self, x: Tensor | np.ndarray) -> Tensor:
        """Logits (n, classes); needs logits access (an output defence blocks it)."""
        self.require(Access.LOGITS)
        if self.output_defense is not None:
            raise AccessError("the target's output defence hides its logits")
        return self._logits(x)
