"""`EmbeddingTarget`: a text classifier cut at a position, whose users release embeddings.

Du et al. 2023 ("DP-Forward", CCS'23, Sec. 3.2 and 6.1): the user runs the pre-noise part f(·)
of the pipeline and sends f(X) (clear) or f(X) + Z (DP-Forward) to the service provider, who
runs the rest. The adversary of Sec. 6.1 — the untrusted provider or an eavesdropper — observes
those released embeddings; to collect embeddings of its own auxiliary sequences it queries f(·)
as a black box. Here that is `logits` access (the released matrix is a raw, unnormalised
output of the model, as logits are):

- `embeddings(ids)`: what users release at the cut, (m, r, d): release(f(X)) for a model with
  a release layer (the DP-Forward noise: fresh noise on every call, in eval mode too), the clear
  f(X) at `position` otherwise (a non-private or DP-SGD model sends its embeddings in clear).
  One query per row.
- `labels`, `probabilities`, `logits`: the deployed classifier p(release(f(X))), as for any
  `Target` (what membership inference queries).

The model is a `privacylab.models.encoder.EncoderClassifier`; token ids are (m, L) int64 with
[PAD] = 0, L at most `length`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from privacylab.models.encoder import EncoderClassifier, Position, parse_position
from privacylab.models.errors import ModelError
from privacylab.target.access import Access, TargetError
from privacylab.target.target import OutputDefense, Precision, QueryMonitor, Target

__all__ = ["EmbeddingTarget"]


class EmbeddingTarget(Target):
    """An `EncoderClassifier` as an attacker sees it (module docstring).

    `position`: where the released embeddings are read; for a model with a release layer it
    must be the model's cut (default), otherwise any position (default "output", the sentence
    embedding). `length`: the fixed sequence length users send (DP-Forward pads every sequence
    to it; default the encoder's `max_len`); with `length` given, ids must be exactly that long.
    """

    def __init__(
        self,
        model: EncoderClassifier,
        access: Access | str,
        *,
        position: Position | str | None = None,
        length: int | None = None,
        query_budget: int | None = None,
        output_defense: OutputDefense | None = None,
        query_monitor: QueryMonitor | None = None,
        device: str | torch.device = "cpu",
        batch_size: int = 256,
        precision: Precision = "float32",
    ) -> None:
        if not isinstance(model, EncoderClassifier):
            raise TargetError("an embedding target needs an EncoderClassifier")
        released = model.release is not None
        try:
            if position is None:
                where = model.position if released else parse_position("output", model.depth)
            else:
                where = parse_position(position, model.depth)
        except ModelError as error:
            raise TargetError(str(error)) from None
        if released and where != model.position:
            raise TargetError(
                f"the model releases its embeddings at {model.position}, not at {where}"
            )
        if length is not None and (
            isinstance(length, bool) or not isinstance(length, int) or length < 1
        ):
            raise TargetError(f"length must be a whole number >= 1, got {length!r}")
        if length is not None and length > model.max_len:
            raise TargetError(f"length {length} exceeds the encoder's max_len {model.max_len}")
        super().__init__(
            model,
            access,
            model.num_classes,
            query_budget=query_budget,
            output_defense=output_defense,
            query_monitor=query_monitor,
            device=device,
            batch_size=batch_size,
            precision=precision,
        )
        self.position = where
        self.fixed_length = length is not None
        self.length = int(length) if length is not None else model.max_len
        self.dim = model.dim
        self.vocab_size = int(model.encoder.config.vocab_size)  # type: ignore[union-attr]

    @property
    def rows(self) -> int:
        """r: rows of one released matrix (1 at the pooled output, the length otherwise)."""
        return 1 if self.position.pooled else self.length

    def _ids(self, ids: Tensor | np.ndarray) -> Tensor:
        try:
            ids = torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError):
            raise TargetError("token ids must be integers of shape (m, L)") from None
        if ids.ndim != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TargetError("token ids must be integers of shape (m, L)")
        width = int(ids.shape[1])
        if (self.fixed_length and width != self.length) or width > self.length or width < 1:
            need = f"exactly {self.length}" if self.fixed_length else f"1..{self.length}"
            raise TargetError(f"sequences of {width} tokens; the target takes {need}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise TargetError(f"token ids outside the vocabulary [0, {self.vocab_size})")
        return ids.to(torch.int64)

    @torch.no_grad()
    def embeddings(self, ids: Tensor | np.ndarray) -> Tensor:
        """The embeddings users release for `ids` (m, L): (m, r, d) on the CPU, noisy for a
        model with a release layer. Needs logits access; one query per row."""
        self.require(Access.LOGITS)
        ids = self._ids(ids)
        self._count(ids)
        model: EncoderClassifier = self._model  # type: ignore[assignment]
        outs = []
        for i in range(0, int(ids.shape[0]), self.batch_size):
            batch = ids[i : i + self.batch_size].to(self.device)
            matrix = model.before(batch, self.position)
            if model.release is not None:
                matrix = model.release(matrix)
            outs.append(matrix.to(self.dtype).cpu())
        if not outs:
            return torch.zeros(0, self.rows, self.dim, dtype=self.dtype)
        return torch.cat(outs)

    @torch.no_grad()
    def _raw(self, x: Tensor | np.ndarray) -> Tensor:
        ids = self._ids(x)
        self._count(ids)
        outs = []
        for i in range(0, int(ids.shape[0]), self.batch_size):
            out = self._model(ids[i : i + self.batch_size].to(self.device)).to(self.dtype)
            self._check(out)
            outs.append(out.cpu())
        if not outs:
            return torch.zeros(0, self.num_classes, dtype=self.dtype)
        return torch.cat(outs)
