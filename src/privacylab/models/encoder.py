"""A BERT-style encoder classifier cut in two at a chosen position, for DP-Forward.

Du et al. 2023 ("DP-Forward: Fine-tuning and Inference on Language Models with Differential
Privacy in Forward Pass", CCS'23, Sec. 3.2) split the pipeline into a pre-noise function f(·),
run by the user, and a post-noise part p(·), run by the service provider: the user releases
f(X) + Z and the provider computes p(f(X) + Z). The cut is at a `Position`:

- ``input``: f(X) is the input embedding matrix (word + position + segment embeddings, LayerNorm),
  n × d;
- ``layer:K``: f(X) is the output of encoder layer K (1-based), n × d;
- ``output``: f(X) is the mean-pooled output of the last layer (the sentence embedding), 1 × d.

`EncoderClassifier.forward(ids)` runs ``after(release(before(ids)))``. Without a release module
it is plain fine-tuning of the encoder with a linear head (mean pooling over the real tokens, as
sentence-transformers does). With one (the DP-Forward noise layer of
`privacylab.training.dpforward`), what follows the cut sees only the released matrix: the
sequence is padded to a fixed length, f(X) holds every row, padding included, and the post-noise
layers attend to and pool over all rows, so the provider learns nothing from the attention mask
(the sequence length stays private).

Token ids are (n, L) int64 with [PAD] = 0 (`privacylab.models.minilm.PAD_ID`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from privacylab.models.errors import ModelError
from privacylab.models.minilm import PAD_ID


@dataclass(frozen=True)
class Position:
    """Where the pipeline is cut: ``kind`` is "input", "layer" (with ``layer`` = K) or
    "output"."""

    kind: str
    layer: int = 0

    def __str__(self) -> str:
        return f"layer:{self.layer}" if self.kind == "layer" else self.kind

    @property
    def pooled(self) -> bool:
        """Whether f(X) is the 1 × d sentence embedding rather than an n × d matrix."""
        return self.kind == "output"


def parse_position(text: str | Position, layers: int) -> Position:
    """`text` ("input", "layer:K" with 1 <= K <= `layers`, or "output") as a Position, or a
    one-line ModelError."""
    if isinstance(text, Position):
        text = str(text)
    value = str(text).strip()
    if value in ("input", "output"):
        return Position(value)
    match = re.fullmatch(r"layer:(-?\d+)", value)
    if match is None:
        raise ModelError(
            f"unknown position {text!r}; choose input, layer:K (K in 1..{layers}) or output"
        )
    k = int(match.group(1))
    if not 1 <= k <= layers:
        raise ModelError(f"layer index {k} is out of range: the encoder has layers 1..{layers}")
    return Position("layer", k)


def _additive_mask(keep: Tensor, dtype: torch.dtype) -> Tensor:
    return (~keep)[:, None, None, :].to(dtype) * torch.finfo(dtype).min


def mean_pool(hidden: Tensor, keep: Tensor) -> Tensor:
    """Mean of the rows of `hidden` (n, L, d) where `keep` (n, L) is True: (n, d)."""
    weights = keep.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)


class EncoderClassifier(nn.Module):
    """`encoder` (a transformers BertModel, e.g. `privacylab.models.minilm.load_minilm()`) with a
    linear head over the mean-pooled last layer, cut at `position` (module docstring).

    `release`, when given, is applied to f(X) at the cut (the DP-Forward noise layer); the
    layers after it then ignore the attention mask. The head is initialised from `seed` (the
    global random state is left as it was), so the same seed gives the same model.
    """

    def __init__(
        self,
        encoder: nn.Module,
        num_classes: int,
        *,
        position: Position | str = "output",
        release: nn.Module | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ModelError(f"num_classes must be a whole number >= 2, got {num_classes!r}")
        self.encoder = encoder
        self.depth = len(encoder.encoder.layer)  # type: ignore[union-attr]
        self.position = parse_position(position, self.depth)
        self.dim = int(encoder.config.hidden_size)  # type: ignore[union-attr]
        self.num_classes = num_classes
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.head = nn.Linear(self.dim, num_classes)
        self.release = release

    @property
    def max_len(self) -> int:
        """Longest sequence the encoder takes (its position embeddings)."""
        return int(self.encoder.config.max_position_embeddings)  # type: ignore[union-attr]

    def _layers(self, hidden: Tensor, keep: Tensor, start: int, stop: int) -> Tensor:
        mask = _additive_mask(keep, hidden.dtype)
        for layer in self.encoder.encoder.layer[start:stop]:  # type: ignore[union-attr]
            out = layer(hidden, attention_mask=mask)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def _check(self, ids: Tensor) -> Tensor:
        if (
            not isinstance(ids, Tensor)
            or ids.ndim != 2
            or ids.dtype not in (torch.int64, torch.int32)
        ):
            raise ModelError("the encoder takes integer token ids of shape (n, L)")
        if ids.shape[1] > self.max_len:
            raise ModelError(f"sequences of {ids.shape[1]} tokens exceed max_len {self.max_len}")
        return ids.long()

    def before(self, ids: Tensor, position: Position | str | None = None) -> Tensor:
        """f(X) at `position` (default: the model's cut), before any release: (n, L, d) for
        input and layer:K, (n, 1, d) for output."""
        ids = self._check(ids)
        where = self.position if position is None else parse_position(position, self.depth)
        keep = ids != PAD_ID
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        hidden = self.encoder.embeddings(  # type: ignore[union-attr]
            input_ids=ids, position_ids=positions, token_type_ids=torch.zeros_like(ids)
        )
        if where.kind == "input":
            return hidden
        stop = where.layer if where.kind == "layer" else self.depth
        hidden = self._layers(hidden, keep, 0, stop)
        return hidden if where.kind == "layer" else mean_pool(hidden, keep).unsqueeze(1)

    def after(self, released: Tensor, keep: Tensor | None = None) -> Tensor:
        """p(·): logits (n, classes) from the matrix at the model's cut; `keep` (n, L) is the
        attention mask (None: every row is attended to and pooled, as after a release)."""
        if self.position.pooled:
            return self.head(released[:, 0])
        if keep is None:
            keep = torch.ones(released.shape[:2], dtype=torch.bool, device=released.device)
        start = 0 if self.position.kind == "input" else self.position.layer
        hidden = self._layers(released, keep, start, self.depth)
        return self.head(mean_pool(hidden, keep))

    def forward(self, ids: Tensor) -> Tensor:
        """Logits (n, classes) of token ids (n, L): p(release(f(X))) (module docstring)."""
        ids = self._check(ids)
        matrix = self.before(ids)
        if self.release is None:
            return self.after(matrix, ids != PAD_ID)
        return self.after(self.release(matrix))
