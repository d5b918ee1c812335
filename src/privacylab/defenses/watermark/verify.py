"""Verifying an ownership watermark on a suspect model (Adi et al. 2018, Sec. 4, "Verify"),
as a one-sided binomial test.

The owner queries the suspect's labels on the n trigger inputs and counts k matches with the
trigger labels. Under the null hypothesis — the suspect was not derived from the watermarked
model — the suspect is a fixed function of data that never held the trigger labels, and the
labels were drawn uniformly at random from K classes independently of it
(`privacylab.defenses.watermark.trigger`). So each prediction matches its label with probability
exactly 1/K, independently, and k ~ Binomial(n, 1/K): the p-value

    p = P[Binomial(n, 1/K) >= k] = sum_{j=k}^{n} C(n, j) K^-j (1 - 1/K)^(n-j)

is exact, not asymptotic (scipy.stats.binom.sf(k - 1, n, 1/K)). The suspect is claimed when
p < threshold. Adi et al. verify with a threshold on the trigger-set accuracy; the p-value is
that threshold made explicit and comparable across n and K.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from scipy.stats import binom
from torch import nn

from privacylab.defenses.watermark.trigger import TriggerSet, WatermarkError
from privacylab.errors import PrivacylabError
from privacylab.target import Access, Target

__all__ = [
    "DEFAULT_THRESHOLD",
    "Verification",
    "binomial_p_value",
    "verify_watermark",
]

DEFAULT_THRESHOLD = 1e-3
"""p-value below which the suspect is claimed: one chance in a thousand that an independent
model matches the trigger set this well."""


@dataclass(frozen=True)
class Verification:
    """The test's outcome: `matches` of `triggers` predictions equal the trigger labels,
    `p_value` of that under the null (K = `num_classes`), `owned` when p < `threshold`;
    `queries` the suspect answered (counted by its `Target`)."""

    matches: int
    triggers: int
    num_classes: int
    p_value: float
    owned: bool
    threshold: float
    queries: int

    @property
    def trigger_accuracy(self) -> float:
        """Fraction of triggers whose label the suspect predicts."""
        return self.matches / self.triggers

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the CLI's keys (`matches`, `triggers`, `p_value`, `owned`,
        `threshold`) and the rest."""
        out = asdict(self)
        out["trigger_accuracy"] = self.trigger_accuracy
        out["chance"] = 1.0 / self.num_classes
        return out


def binomial_p_value(matches: int, triggers: int, num_classes: int) -> float:
    """P[Binomial(triggers, 1/num_classes) >= matches]: the chance that a model independent of
    the trigger labels matches at least `matches` of them (exact; 1.0 for 0 matches)."""
    for value, name in ((matches, "matches"), (triggers, "triggers")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise WatermarkError(f"{name} must be a whole number >= 0, got {value!r}")
    if triggers < 1 or matches > triggers:
        raise WatermarkError(
            f"need 0 <= matches <= triggers, triggers >= 1; got {matches}/{triggers}"
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise WatermarkError(f"num_classes must be a whole number >= 2, got {num_classes!r}")
    return float(min(1.0, max(0.0, binom.sf(matches - 1, triggers, 1.0 / num_classes))))


def _threshold(value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and 0.0 < value < 1.0):
        raise WatermarkError(f"the p-value threshold must lie in (0, 1), got {value!r}")
    return value


def verify_watermark(
    suspect: Target | nn.Module,
    trigger: TriggerSet,
    *,
    threshold: float = DEFAULT_THRESHOLD,
) -> Verification:
    """Query `suspect`'s labels on the trigger inputs and test them (module docstring).

    `suspect` is a `Target` (any access level: only labels are asked, and its queries are
    counted and pass through its monitor, budget and output defence) or a bare module that
    returns logits, wrapped in a label-only `Target` (answering in float64 when its weights are
    float64). A suspect with another number of classes or input shape is refused with one
    line."""
    threshold = _threshold(threshold)
    if not isinstance(trigger, TriggerSet):
        raise WatermarkError(f"trigger must be a TriggerSet, got {type(trigger).__name__}")
    if isinstance(suspect, nn.Module):
        first = next(suspect.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
        wide = first is not None and first.dtype == torch.float64
        suspect = Target(
            suspect,
            Access.LABEL,
            trigger.num_classes,
            device=device,
            precision="float64" if wide else "float32",
        )
    if not isinstance(suspect, Target):
        raise WatermarkError(
            f"the suspect must be a Target or a torch module, got {type(suspect).__name__}"
        )
    if suspect.num_classes != trigger.num_classes:
        raise WatermarkError(
            f"the suspect has {suspect.num_classes} classes but the trigger set "
            f"{trigger.num_classes}: it cannot be a copy of the watermarked model"
        )
    before = suspect.queries
    try:
        predicted = suspect.labels(trigger.inputs).cpu()
    except PrivacylabError:  # a budget, a monitor's refusal: the target's own one line
        raise
    except RuntimeError as error:
        raise WatermarkError(
            f"the suspect cannot read trigger inputs of shape {trigger.input_shape}: "
            f"{str(error).splitlines()[0]}"
        ) from None
    matches = int((predicted == trigger.labels).sum())
    n = len(trigger)
    p_value = binomial_p_value(matches, n, trigger.num_classes)
    return Verification(
        matches=matches,
        triggers=n,
        num_classes=trigger.num_classes,
        p_value=p_value,
        owned=p_value < threshold,
        threshold=threshold,
        queries=suspect.queries - before,
    )
