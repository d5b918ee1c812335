"""A small CLIP: an image encoder f and a text encoder g trained contrastively into one
embedding space (Radford et al. 2021, "Learning Transferable Visual Models From Natural
Language Supervision", Sec. 2.3 and Fig. 3), and its zero-shot classifier (Sec. 3.1.2): the
victim of Carlini & Terzis 2022 ("Poisoning and Backdooring Contrastive Learning", ICLR'22).

- `DualEncoder`: f = a small CNN (two strided convolutions and an MLP), g = word embeddings,
  masked mean pooling and an MLP; both outputs L2-normalised; a learnable temperature, logit
  scale t initialised at 1/0.07 and clamped at 100 (Radford et al. Sec. 2.5);
  `forward(images, ids)` = t · f(x) g(c)ᵀ, (B, B).
- `clip_loss`: the symmetric InfoNCE loss of Fig. 3, per example: (CE of row i with label i +
  CE of column i with label i) / 2; its batch mean is CLIP's loss.
- `ZeroShotClassifier`: images -> logits over classes, the class weights being the
  normalised mean of each class's normalised prompt embeddings (Sec. 3.1.4, prompt ensembling).

Training is the one trainer's (`privacylab.training.train` with `loss_fn=clip_loss`: a batch of
the trainer is the set of in-batch negatives); `models` sits below `training` in the layering,
so the call lives in `privacylab.attacks.poisoning.contrastive.train_dual_encoder`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.models.errors import ModelError

__all__ = [
    "INIT_TEMPERATURE",
    "MAX_LOGIT_SCALE",
    "DualEncoder",
    "ZeroShotClassifier",
    "clip_loss",
]

INIT_TEMPERATURE = 0.07
MAX_LOGIT_SCALE = 100.0


class _ImageEncoder(nn.Module):
    """Two strided 4x4 convolutions (each halves the side) with ReLU, then a two-layer MLP to
    `dim`: cheap enough to train a few thousand pairs in seconds on a CPU."""

    def __init__(self, image_shape: tuple[int, int, int], dim: int, width: int) -> None:
        super().__init__()
        channels, height, width_px = image_shape
        for _ in range(2):
            height, width_px = height // 2, width_px // 2
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 4, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 4, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Linear(2 * width * height * width_px, 128), nn.ReLU(), nn.Linear(128, dim)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


class _TextEncoder(nn.Module):
    """Word embeddings, mean over the non-[PAD] positions, a two-layer MLP to `dim`."""

    def __init__(self, vocab_size: int, dim: int, width: int, pad_id: int) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.embedding = nn.Embedding(vocab_size, width, padding_idx=pad_id)
        self.head = nn.Sequential(nn.Linear(width, 128), nn.ReLU(), nn.Linear(128, dim))

    def forward(self, ids: Tensor) -> Tensor:
        keep = (ids != self.pad_id).unsqueeze(-1).to(self.embedding.weight.dtype)
        summed = (self.embedding(ids) * keep).sum(dim=1)
        return self.head(summed / keep.sum(dim=1).clamp_min(1.0))


class DualEncoder(nn.Module):
    """CLIP's two towers at toy scale (see the module docstring). `image_shape` (C, H, W),
    `vocab_size` of the caption tokenizer, embedding `dim`, conv `width`, word-embedding
    `text_width`, the tokenizer's `pad_id`."""

    def __init__(
        self,
        image_shape: Sequence[int],
        vocab_size: int,
        dim: int = 64,
        *,
        width: int = 16,
        text_width: int = 64,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        shape = tuple(image_shape) if isinstance(image_shape, Sequence) else ()
        whole = all(isinstance(s, int | np.integer) and not isinstance(s, bool) for s in shape)
        if not whole or len(shape) != 3 or min(shape) < 1 or min(shape[1:]) < 4:
            raise ModelError(
                f"the dual encoder needs (C, H, W) images of at least 4x4, got {image_shape!r}"
            )
        for name, value in (
            ("vocab_size", vocab_size),
            ("dim", dim),
            ("width", width),
            ("text_width", text_width),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelError(f"dual encoder: {name} must be a whole number >= 1, got {value!r}")
        if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < vocab_size:
            raise ModelError(f"dual encoder: pad_id must lie in [0, {vocab_size}), got {pad_id!r}")
        shape = tuple(int(s) for s in shape)
        self.image_shape = shape
        self.config = {
            "image_shape": list(shape),
            "vocab_size": vocab_size,
            "dim": dim,
            "width": width,
            "text_width": text_width,
            "pad_id": pad_id,
        }
        self.image = _ImageEncoder(shape, dim, width)  # type: ignore[arg-type]
        self.text = _TextEncoder(vocab_size, dim, text_width, pad_id)
        self.log_scale = nn.Parameter(torch.tensor(math.log(1.0 / INIT_TEMPERATURE)))

    @property
    def logit_scale(self) -> Tensor:
        """t = exp(log t) clamped at 100 (Radford et al. 2021, Sec. 2.5)."""
        return self.log_scale.exp().clamp(max=MAX_LOGIT_SCALE)

    def encode_image(self, images: Tensor) -> Tensor:
        """f(x): (n, dim), unit norm."""
        return F.normalize(self.image(images), dim=-1)

    def encode_text(self, ids: Tensor) -> Tensor:
        """g(c): (n, dim), unit norm."""
        return F.normalize(self.text(ids), dim=-1)

    def forward(self, images: Tensor, ids: Tensor) -> Tensor:
        """The (B, B) logits t · ⟨f(x_i), g(c_j)⟩ (Radford et al. Fig. 3)."""
        return self.logit_scale * self.encode_image(images) @ self.encode_text(ids).T


def clip_loss(logits: Tensor, _targets: Tensor | None = None) -> Tensor:
    """Per-example symmetric InfoNCE (Radford et al. 2021, Fig. 3): for pair i,
    (CE(logits[i, :], i) + CE(logits[:, i], i)) / 2. `logits` is (B, B) with the matching pairs
    on the diagonal; the trainer's targets are ignored."""
    if logits.dim() != 2 or logits.shape[0] != logits.shape[1]:
        raise ModelError(f"clip_loss needs (B, B) logits, got {tuple(logits.shape)}")
    labels = torch.arange(len(logits), device=logits.device)
    rows = F.cross_entropy(logits, labels, reduction="none")
    cols = F.cross_entropy(logits.T, labels, reduction="none")
    return (rows + cols) / 2


class ZeroShotClassifier(nn.Module):
    """CLIP's zero-shot head (Radford et al. 2021, Sec. 3.1.2 and 3.1.4): class k's weight is
    w_k = normalise(mean_p g(prompt_{k,p})), and an image's logits are t · ⟨f(x), w_k⟩.
    `prompt_ids_per_class`: one (P_k, L) id tensor per class. The weights are computed once,
    here, from the model's text tower (a buffer, frozen); the image tower stays the model's."""

    def __init__(self, model: DualEncoder, prompt_ids_per_class: Sequence[Tensor]) -> None:
        super().__init__()
        if len(prompt_ids_per_class) < 2:
            raise ModelError("a zero-shot classifier needs prompts for at least 2 classes")
        self.model = model
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        weights = []
        with torch.no_grad():
            for k, ids in enumerate(prompt_ids_per_class):
                if ids.dim() != 2 or len(ids) == 0:
                    raise ModelError(f"class {k}'s prompts must be a non-empty (P, L) id tensor")
                weights.append(model.encode_text(ids.to(device)).mean(dim=0))
        model.train(was_training)
        self.register_buffer("class_weights", F.normalize(torch.stack(weights), dim=-1))

    @property
    def num_classes(self) -> int:
        """K."""
        return int(self.class_weights.shape[0])

    def forward(self, images: Tensor) -> Tensor:
        """(n, K) logits."""
        return self.model.logit_scale * self.model.encode_image(images) @ self.class_weights.T
