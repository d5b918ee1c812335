"""BadNets: Gu, Dolan-Gavitt & Garg 2017, "BadNets: Identifying Vulnerabilities in the Machine
Learning Model Supply Chain" (Sec. 3, the attack; Sec. 4, the MNIST experiments).

The attacker adds to the victim's training set a few of its own clean images with a trigger
stamped on them (`Trigger.stamp`: a white square, a checkerboard pattern, at a fixed corner
or at a random place, optionally blended) and relabelled with the label it wants the
triggered input to get: one `target_class` for every input (all-to-one, Sec. 4.3.1) or
(y + 1) mod K (all-to-all, Sec. 4.3.2). A network trained on X ∪ P learns the clean task and
the trigger's shortcut; at deployment the attacker only stamps its inputs and reads labels.
"""

from __future__ import annotations

import numpy as np
import torch

from privacylab.attacks.poisoning.base import (
    MODES,
    DataPoisoningAttack,
    PoisonError,
    Poisons,
    PoisonTask,
    register_backdoor,
    target_labels,
    whole_option,
)
from privacylab.attacks.poisoning.trigger import Trigger, TriggerError, parse_trigger

__all__ = ["BadNets"]


@register_backdoor
class BadNets(DataPoisoningAttack):
    """BadNets data poisoning (Gu et al. 2017, Sec. 3-4).

    `trigger`: a spec (``square:4@corner``, ``pattern:3@random:0.7``; see
    `privacylab.attacks.poisoning.trigger`) or a `Trigger`; `mode`: all-to-one or all-to-all;
    `seed`: mixed with the task's seed to draw the rows and the random positions (one attack
    and one task give one set of poisons). The threat model is the base's: label access at
    activation, the attacker's own clean rows."""

    name = "badnets"

    def __init__(
        self, trigger: str | Trigger = "square:4@corner", mode: str = "all-to-one", seed: int = 0
    ) -> None:
        try:
            self.trigger = parse_trigger(trigger)
        except TriggerError as error:
            raise PoisonError(str(error)) from None
        if mode not in MODES:
            raise PoisonError(f"badnets: unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        self.mode = mode
        self.seed = whole_option("badnets", "seed", seed, low=0)

    def candidates(self, task: PoisonTask) -> np.ndarray:
        """Rows of `task.source` that may become poisons: all-to-one, those not already of
        the target class (relabelling a target-class image would teach nothing); all-to-all,
        every row."""
        labels = task.source.labels.numpy()
        if self.mode == "all-to-one":
            return np.flatnonzero(labels != int(task.target_class))
        return np.arange(len(labels))

    def craft(self, task: PoisonTask) -> Poisons:
        """`task.budget` distinct rows of the attacker's source, drawn uniformly with
        `task.seed` (mixed with this attack's `seed`), stamped (one random place per row when
        the position is random) and relabelled by `target_labels` (Gu et al. Sec. 3.1)."""
        if task.mode != self.mode:
            raise PoisonError(f"badnets: the task asks for {task.mode}, the attack is {self.mode}")
        data = task.source
        try:
            self.trigger.check(data.input_shape)
        except TriggerError as error:
            raise PoisonError(str(error)) from None
        pool = self.candidates(task)
        if len(pool) < task.budget:
            which = "rows outside the target class" if self.mode == "all-to-one" else "rows"
            raise PoisonError(
                f"badnets: {task.budget} poisons asked, the attacker's source has only "
                f"{len(pool)} {which}"
            )
        rng = np.random.default_rng([int(task.seed), self.seed])
        rows = np.sort(rng.choice(pool, size=task.budget, replace=False))
        index = torch.from_numpy(rows)
        generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
        features = self.trigger.stamp(data.features[index].float(), generator)
        labels = target_labels(data.labels[index], task.target_class, self.mode, data.num_classes)
        return Poisons(
            features=features,
            labels=labels,
            trigger=self.trigger,
            target_class=int(task.target_class),
            mode=self.mode,
        )
