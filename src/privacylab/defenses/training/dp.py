"""DP-SGD (Abadi et al. 2016, Deep Learning with Differential Privacy, Alg. 1): per-example
gradient clipping and Gaussian noise, with the noise multiplier σ calibrated so that the whole
run is (ε, δ)-DP; the only defence here with a guarantee against every attacker.

It is the trainer's `privacy` option (`TrainConfig.privacy = PrivacyConfig(epsilon, delta)`):
Poisson sampling, σ calibrated for the planned steps, ε computed from the steps actually
executed and recorded in `Fitted.epsilon` (never above the target). With `tune = "defaults"`
(the default) the batch size, epochs, learning rate, optimiser and clipping norm are those of
`privacylab.training.defaults.dp_defaults(ε, δ, n)` (large batches, a fixed step budget, lr·C
tuned together: what `privacylab train --dp` uses), because the recipe's non-private settings
(small batches, many epochs) waste the budget; `tune = "recipe"` keeps the recipe's settings
and changes only the privacy. The recipe's other privacy options (accountant, clipping
engine, sampling) are kept when it has some.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from privacylab.data import Dataset
from privacylab.defenses.base import (
    DefenseData,
    Fitted,
    ModelBuilder,
    Parameter,
    TrainingDefense,
    register_defense,
)
from privacylab.training import PrivacyConfig, TrainConfig
from privacylab.training.defaults import dp_defaults


@register_defense
class DPSGD(TrainingDefense):
    """Train with DP-SGD at (ε, δ); hyperparameters from the DP defaults rule unless
    `tune = recipe`."""

    name = "dp"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter(
            "epsilon", float, 8.0, "privacy budget ε of the whole run", low=0.0, low_open=True
        ),
        Parameter(
            "delta",
            float,
            1e-5,
            "δ of the (ε, δ) guarantee",
            low=0.0,
            high=1.0,
            low_open=True,
            high_open=True,
        ),
        Parameter(
            "tune",
            str,
            "defaults",
            "defaults: DP hyperparameters by privacylab.training.defaults; recipe: keep the "
            "recipe's",
            choices=("defaults", "recipe"),
        ),
    )
    paper = "Abadi et al. 2016, Deep Learning with Differential Privacy, Alg. 1"

    def configure(self, config: TrainConfig) -> TrainConfig:
        """`config` made private at (ε, δ): σ is calibrated by the trainer (any noise
        multiplier of the recipe is dropped; its other privacy options are kept)."""
        base = config.privacy if config.privacy is not None else PrivacyConfig()
        privacy = replace(
            base,
            epsilon=float(self.params["epsilon"]),
            delta=float(self.params["delta"]),
            noise_multiplier=None,
        )
        return replace(config, privacy=privacy)

    def tuned(self, config: TrainConfig, n: int) -> TrainConfig:
        """`config` with the DP defaults for `n` training examples (`tune = defaults`), else
        unchanged."""
        if self.params["tune"] != "defaults":
            return config
        chosen = dp_defaults(float(self.params["epsilon"]), float(self.params["delta"]), n)
        base = config.privacy if config.privacy is not None else PrivacyConfig()
        return replace(
            config,
            batch_size=chosen.batch_size,
            epochs=chosen.epochs,
            lr=chosen.lr,
            optimizer=chosen.optimizer,
            privacy=replace(base, max_grad_norm=chosen.max_grad_norm),
        )

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
        """The base training under `configure(tuned(config, len(data)))`; ε spent is in
        `Fitted.epsilon`, δ in the notes."""
        fitted = super().fit(
            build, data, self.tuned(config, len(data)), extra, seed=seed, folder=folder
        )
        fitted.notes["delta"] = float(self.params["delta"])
        fitted.notes["target_epsilon"] = float(self.params["epsilon"])
        return fitted
