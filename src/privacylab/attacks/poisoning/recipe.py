"""The victim's training recipe for the backdoor experiments: one place that says how the
models attacked, defended and retrained here are trained, so an attack, a defence that
retrains on cleansed data, the job and the benchmarks all train alike.

The victim trains with the one trainer (`privacylab.training.train`), optionally under DP-SGD
(`PrivacyConfig`; Abadi et al. 2016, Alg. 1) — the poisoning defence whose group-privacy bound
`privacylab.defenses.backdoor.dp` states.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from torch import nn

from privacylab.attacks.poisoning.base import PoisonError
from privacylab.data import Dataset
from privacylab.models import ModelSpec
from privacylab.training import PrivacyConfig, TrainConfig, train

__all__ = ["VictimRecipe", "train_victim"]


@dataclass(frozen=True)
class VictimRecipe:
    """How the victim trains: `model` by name with `model_options`, and the trainer's
    options. `epsilon` (None: non-private) trains with DP-SGD at (ε, `delta`), clipping at
    `max_grad_norm`.

    The defaults are chosen so that BadNets (`square:4@corner`, all-to-one) takes at <= 1 %
    poison on mnist5k (the job's split: 3,500 training rows, 1,000 test rows) with the clean
    model's accuracy kept, as Gu et al. 2017 (Sec. 4) report for MNIST: the 784-512-256-10
    ReLU MLP, 20 epochs of Adam at 2e-3, batch 64 — at 1 % (35 poisons) ASR 0.990, 0.956,
    0.996 over seeds 0, 1, 2 with poisoned accuracy 0.938 / 0.935 / 0.947 against 0.935 /
    0.938 / 0.942 for the clean models; at 0.5 % 0.984, 0.945, 0.869. Adam at 1e-3 gave ASR
    0.975, 0.944, 0.994 at 1 % (clean accuracy 0.926-0.936), 30 epochs at 1e-3 0.974, 0.946.
    About 17 CPU-seconds per model. The small CNN of the DP literature (`cnn`, ReLU) learns
    the corner patch far less at 1 % (Adam at 1e-3, batch 64: ASR 0.57 at 20 epochs, 0.72 at
    40; at 3e-3, 0.85), though its clean accuracy is higher (0.965). Under DP-SGD (clip 1,
    Poisson batches of 256 expected rows, Adam at 5e-3, 20 epochs; δ = 1e-5) the MLP reaches
    0.875 test accuracy at ε = 8 and 0.81 at ε = 1; Adam at 2e-3 gave 0.87 at ε = 8, at 1e-2
    0.86 (ε = 8) and 0.75 (ε = 1).
    `benchmarks/badnets_dp.py` gives the full table."""

    model: str = "mlp"
    model_options: dict[str, Any] = field(
        default_factory=lambda: {"widths": [512, 256], "activation": "relu"}
    )
    epochs: int = 20
    batch_size: int = 64
    lr: float = 2e-3
    optimizer: str = "adam"
    epsilon: float | None = None
    delta: float = 1e-5
    max_grad_norm: float = 1.0
    private_lr: float = 5e-3
    private_batch_size: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise PoisonError(f"victim recipe: model must be a model name, got {self.model!r}")
        if not isinstance(self.model_options, dict):
            raise PoisonError(
                f"victim recipe: model_options must be an object of the model's options, "
                f"got {self.model_options!r}"
            )

    def spec(self, data: Dataset) -> ModelSpec:
        """The model's spec for `data`'s input shape and classes."""
        return ModelSpec(self.model, data.input_shape, data.num_classes, dict(self.model_options))

    def config(self, seed: int, device: str = "cpu") -> TrainConfig:
        """The trainer configuration (DP-SGD's own batch size and learning rate when private:
        DP-SGD wants larger batches, Abadi et al. 2016 Sec. 5.2)."""
        privacy = None
        lr, batch = self.lr, self.batch_size
        if self.epsilon is not None:
            privacy = PrivacyConfig(
                epsilon=self.epsilon, delta=self.delta, max_grad_norm=self.max_grad_norm
            )
            lr, batch = self.private_lr, self.private_batch_size
        return TrainConfig(
            epochs=self.epochs,
            batch_size=batch,
            lr=lr,
            optimizer=self.optimizer,
            seed=seed,
            device=device,
            privacy=privacy,
        )

    def private(self, epsilon: float | None) -> VictimRecipe:
        """The same recipe at another ε (None: non-private)."""
        return replace(self, epsilon=epsilon)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VictimRecipe:
        """Inverse of `to_dict`; one PoisonError line on unknown keys or a non-object."""
        if not isinstance(data, dict):
            raise PoisonError(f"a victim recipe is an object of its fields, got {data!r}")
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            raise PoisonError(f"unknown victim recipe keys: {', '.join(sorted(extra))}")
        return cls(**data)


def train_victim(
    recipe: VictimRecipe,
    data: Dataset,
    *,
    seed: int = 0,
    device: str = "cpu",
    checkpoint_dir: str | Path | None = None,
    eval_data: Dataset | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Train the victim's model on `data` by `recipe`; returns the model (eval mode) and the
    trainer's summary (`TrainResult.to_dict()`: ε spent under DP-SGD). With
    `checkpoint_dir`, a killed run resumes."""
    model = recipe.spec(data).build(seed=seed)
    result = train(
        model,
        data,
        recipe.config(seed, device),
        eval_data,
        checkpoint_dir=checkpoint_dir,
    )
    return result.model.eval(), result.to_dict()
