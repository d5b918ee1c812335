"""The data holder's run of the provider's training code: one place that trains the honest
model and the malicious one alike, with the one trainer (`privacylab.training.train`) and the
victim recipe of the poisoning family (`VictimRecipe`: the 784-512-256-10 ReLU MLP, Adam), so
that the accuracy cost of an encoding is measured against an honest model of the same recipe
and seed — and, with `recipe.epsilon`, under DP-SGD (Abadi et al. 2016, Alg. 1), the defence
that bounds what any training algorithm can encode about one example.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from privacylab.attacks.memorization.base import MemorizationAttack, Secret
from privacylab.attacks.poisoning.recipe import VictimRecipe
from privacylab.data import Dataset
from privacylab.training import train

__all__ = ["train_encoded", "train_honest"]


def train_honest(
    recipe: VictimRecipe,
    data: Dataset,
    *,
    seed: int = 0,
    device: str = "cpu",
    checkpoint_dir: str | Path | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """The honestly trained model of `recipe` on `data` (eval mode) and the trainer's summary."""
    model = recipe.spec(data).build(seed=seed)
    result = train(model, data, recipe.config(seed, device), checkpoint_dir=checkpoint_dir)
    return result.model.eval(), result.to_dict()


def train_encoded(
    attack: MemorizationAttack,
    secret: Secret,
    recipe: VictimRecipe,
    data: Dataset,
    *,
    seed: int = 0,
    key: int = 0,
    device: str = "cpu",
    checkpoint_dir: str | Path | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """The model released by `attack`'s malicious training on `data` hiding `secret`: the same
    recipe, initialisation and seed as `train_honest`, with the attack's module, data, hooks
    and post-processing (`MaliciousTraining`); refused with one line when the secret exceeds
    the attack's capacity. Returns the released model (eval mode) and the trainer's summary."""
    model = recipe.spec(data).build(seed=seed)
    attack.check_capacity(secret.layout, model, data.num_classes, len(data))
    private = recipe.epsilon is not None
    plan = attack.encode(secret, model, data, key=key, private=private)
    config = recipe.config(seed, device)
    if private and plan.clipping is not None and config.privacy is not None:
        config = replace(config, privacy=replace(config.privacy, clipping=plan.clipping))
    result = train(
        plan.model,
        plan.data,
        config,
        checkpoint_dir=checkpoint_dir,
        regularizer=plan.regularizer,
        loss_fn=plan.loss_fn,
    )
    released = plan.release(result.model)
    return released.eval(), result.to_dict()
