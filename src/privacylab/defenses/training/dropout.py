"""Dropout (seed 004, "Mitigating MIA"; Srivastava et al. 2014; evaluated against membership
inference by Salem et al. 2019, ML-Leaks, Sec. VI "Dropout"): every hidden unit is zeroed with
probability p at each training step (and the survivors scaled by 1/(1−p)), so the model cannot
lean on a few co-adapted neurons; at inference time nothing is dropped.

It is the model's own `dropout` option (the MLP puts `nn.Dropout(p)` after every hidden
activation); a model without that option cannot take this defence (`check_model`, and `fit`
turns the model zoo's refusal into a DefenseError).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from privacylab.data import Dataset
from privacylab.defenses.base import (
    DefenseData,
    DefenseError,
    Fitted,
    ModelBuilder,
    Parameter,
    TrainingDefense,
    register_defense,
)
from privacylab.models import ModelError, model_options
from privacylab.training import TrainConfig


@register_defense
class Dropout(TrainingDefense):
    """Train with the model's dropout layers active at rate p (replacing the recipe's rate)."""

    name = "dropout"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter(
            "p",
            float,
            0.5,
            "probability that a hidden unit is dropped at a training step",
            low=0.0,
            high=1.0,
            high_open=True,
        ),
    )
    paper = "Salem et al. 2019, ML-Leaks, Sec. VI (dropout); Srivastava et al. 2014"

    def check_model(self, model: str) -> None:
        """DefenseError unless the zoo model `model` has a `dropout` option."""
        try:
            options = model_options(model)
        except ModelError as error:
            raise DefenseError(f"{self.label}: {error}") from None
        if "dropout" not in options:
            raise DefenseError(
                f"{self.label} needs a model with a dropout option; {model} has none "
                f"(its options: {', '.join(options) or 'none'})"
            )

    def model_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """`options` with `dropout = p`."""
        return {**options, "dropout": float(self.params["p"])}

    def fit(
        self,
        build: ModelBuilder,
        data: Dataset,
        config: TrainConfig,
        extra: DefenseData,
        *,
        seed: int,
        folder: Path,
    ) -> Fitted:
        """The base training, with a model the zoo could not give dropout refused in one
        line."""

        def checked(seed: int) -> nn.Module:
            try:
                model = build(seed)
            except ModelError as error:
                raise DefenseError(
                    f"{self.label} needs a model with a dropout option: {error}"
                ) from None
            rate = float(self.params["p"])
            if rate > 0 and not any(
                isinstance(m, nn.Dropout) and m.p == rate for m in model.modules()
            ):
                raise DefenseError(f"{self.label}: the model has no dropout layer of rate {rate:g}")
            return model

        return super().fit(checked, data, config, extra, seed=seed, folder=folder)
