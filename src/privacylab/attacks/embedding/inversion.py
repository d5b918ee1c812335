"""Embedding inversion: the victims' tokens from the embeddings they release.

Du et al. 2023 ("DP-Forward", CCS'23, Sec. 6.3), two attacks with the public encoder as prior:

- ``inversion-nn`` (token-wise): at the input position the i-th released row is
  φ(x_i) + z_i, so each row is matched to its nearest neighbour among φ(v) for every vocabulary
  token v AT THAT POSITION — LayerNorm(word(v) + position(i) + segment(0)), as BERT builds it.
  DP-Forward's normalisation C·M/‖M‖_F scales all rows by one unknown factor, so matching is by
  cosine similarity (scale-free). At deeper positions the same matching on the hidden rows is
  weak by design (as in the paper); at the pooled output the d-vector is matched against the
  table (position-averaged) and the L best tokens form a bag of words.
- ``inversion-opt`` (gradient-based continuous relaxation, after Song & Raghunathan 2020,
  "Information Leakage in Embedding Models", Sec. 4): each position i holds logits θ_i over a
  candidate vocabulary; softmax(θ_i / τ) mixes the word embeddings into a relaxed input, the
  encoder is run up to the cut (the relaxed [PAD] probability softly masks the row, as the
  victim's attention mask does) and the cosine similarity of the result to the observed matrix
  is maximised with Adam while τ is annealed; the argmax tokens are returned. The cosine is
  the Gaussian maximum-likelihood objective for a matrix released as C·M/‖M‖_F + Z, whatever C.
  The vocabulary is narrowed per position to candidates screened by nearest neighbours and by
  the first-order (HotFlip-style, Ebrahimi et al. 2018) gain of the objective's gradient, which
  bounds the work; [PAD], [CLS] and [SEP] are always candidates. With auxiliary data and a cut
  past the input, Du et al.'s first step is taken: a linear least-squares map M from the
  released embeddings (the attacker queries f(·) for its auxiliary sequences, noise included)
  to the input rows (which it computes with the public encoder) is fitted, the victims'
  releases are mapped to input rows, and the relaxation runs at the input, which costs no
  encoder layers. Without auxiliary data (or with ``linear_map=False``) the encoder is run
  from the relaxed input to the cut itself (the provider knows f(·)).

Every method returns L tokens per victim (the same guessing budget at every position).
"""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.embedding.base import (
    EmbeddingAttack,
    EmbeddingError,
    EmbeddingTask,
    InversionOutput,
    number_option,
    register_embedding,
    whole_option,
)
from privacylab.models.encoder import EncoderClassifier, Position
from privacylab.models.minilm import CLS_ID, PAD_ID, SEP_ID
from privacylab.target import Access, Target

__all__ = ["NearestNeighbourInversion", "OptimisationInversion"]

SPECIALS = (PAD_ID, CLS_ID, SEP_ID)
CHUNK = 512
"""Rows scored against the whole vocabulary at once (bounds the (rows, V) score matrix)."""


def _encoder(task: EmbeddingTask, attack: str) -> nn.Module:
    encoder = task.public_encoder
    if encoder is None or not hasattr(encoder, "embeddings"):
        raise EmbeddingError(f"{attack} needs the public encoder (side information)")
    encoder = copy.deepcopy(encoder).eval()
    encoder.requires_grad_(False)
    return encoder


def _device(encoder: nn.Module) -> torch.device:
    return next(encoder.parameters()).device


def _shape_check(task: EmbeddingTask, position: Position, encoder: nn.Module, attack: str) -> None:
    _, r, d = task.observed.shape
    dim = int(encoder.config.hidden_size)  # type: ignore[union-attr]
    if d != dim:
        raise EmbeddingError(f"{attack}: embeddings of width {d}, the public encoder's is {dim}")
    rows = 1 if position.pooled else task.length
    if r != rows:
        raise EmbeddingError(f"{attack}: {r} rows per embedding at {position}, expected {rows}")
    limit = int(encoder.config.max_position_embeddings)  # type: ignore[union-attr]
    if task.length > limit:
        raise EmbeddingError(f"{attack}: length {task.length} exceeds the encoder's {limit}")


def _parts(encoder: nn.Module) -> tuple[Tensor, Tensor, Tensor, nn.Module]:
    emb = encoder.embeddings  # type: ignore[union-attr]
    return (
        emb.word_embeddings.weight,
        emb.position_embeddings.weight,
        emb.token_type_embeddings.weight[0],
        emb.LayerNorm,
    )


def _rows(encoder: nn.Module, words: Tensor, positions: Tensor | None = None) -> Tensor:
    """LayerNorm(word + position + segment 0): BERT's input rows of word vectors (…, L, d)
    (with `positions` (…, d) added instead of position(i) when given)."""
    _, position, segment, norm = _parts(encoder)
    if positions is None:
        positions = position[: words.shape[-2]]
    return norm(words + positions + segment)


@torch.no_grad()
def _cosines(encoder: nn.Module, rows: Tensor, where: Tensor, shifts: Tensor) -> Tensor:
    """cos(rows[j], φ_j(v)) for every token v: (n, V), where φ_j(v) = LayerNorm(word(v) +
    shifts[where[j]]) (shift = position(i) + segment(0)).

    LayerNorm is expanded so that no (V, d) table is built per position: with x̃ = w̃_v + c̃
    (centred word and shift) and s² = ‖x̃‖²/d + eps, ⟨o, LN(x)⟩ = ⟨o∘γ, x̃⟩/s + ⟨o, β⟩ and
    ‖LN(x)‖² = Σγ²x̃²/s² + 2⟨γ∘β, x̃⟩/s + ‖β‖², all from dot products with w̃_v."""
    word, _, _, norm = _parts(encoder)
    gamma, beta, eps = norm.weight, norm.bias, float(norm.eps)
    d = word.shape[1]
    w = word - word.mean(1, keepdim=True)
    c = shifts - shifts.mean(1, keepdim=True)
    wc = c @ w.T
    variance = ((w * w).sum(1)[None] + 2 * wc + (c * c).sum(1)[:, None]) / d + eps
    inverse = variance.rsqrt()
    squares = ((w * w) @ (gamma * gamma))[None] + 2 * ((c * gamma * gamma) @ w.T)
    squares = squares + ((c * c) @ (gamma * gamma))[:, None]
    cross = ((w @ (gamma * beta))[None] + (c @ (gamma * beta))[:, None]) * inverse
    length = (squares * inverse * inverse + 2 * cross + (beta * beta).sum()).clamp_min(1e-12)
    unit = F.normalize(rows, dim=-1)
    scaled = unit * gamma
    dots = (scaled @ w.T + (scaled * c[where]).sum(1, keepdim=True)) * inverse[where]
    return (dots + (unit @ beta)[:, None]) / length[where].sqrt()


@torch.no_grad()
def _nearest(
    encoder: nn.Module, observed: Tensor, position: Position, k: int, length: int
) -> Tensor:
    """The `k` tokens of highest cosine similarity to each observed row, against the token
    table at the row's position: (m, L, k); at the pooled output, against the table at the
    position embedding averaged over the `length` positions, (m, 1, k)."""
    _, position_table, segment, _ = _parts(encoder)
    m, r, d = observed.shape
    if position.pooled:
        shifts = (position_table[:length].mean(0) + segment)[None]
    else:
        shifts = position_table[:r] + segment
    rows = observed.reshape(m * r, d)
    where = torch.arange(shifts.shape[0], device=rows.device).repeat(m)
    picks = [
        _cosines(encoder, rows[i : i + CHUNK], where[i : i + CHUNK], shifts).topk(k, -1).indices
        for i in range(0, m * r, CHUNK)
    ]
    if not picks:
        return torch.zeros(0, r, k, dtype=torch.int64, device=rows.device)
    return torch.cat(picks).reshape(m, r, k)


def _layers(encoder: nn.Module, hidden: Tensor, keep: Tensor, position: Position) -> Tensor:
    """The encoder from its input rows `hidden` (m, L, d) to the cut, with `keep` (m, L) in
    [0, 1] the (soft) attention mask: (m, L, d), or the (soft) mean-pooled (m, 1, d)."""
    if position.kind == "input":
        return hidden
    layers = encoder.encoder.layer  # type: ignore[union-attr]
    stop = position.layer if position.kind == "layer" else len(layers)
    mask = keep.clamp_min(1e-9).log()[:, None, None, :].to(hidden.dtype)
    for layer in layers[:stop]:
        out = layer(hidden, attention_mask=mask)
        hidden = out[0] if isinstance(out, tuple) else out
    if position.kind == "layer":
        return hidden
    weights = keep.unsqueeze(-1)
    return ((hidden * weights).sum(1) / weights.sum(1).clamp_min(1e-6)).unsqueeze(1)


def _similarity(matrix: Tensor, observed: Tensor) -> Tensor:
    """Frobenius cosine similarity of each sequence's matrix to its observed release: (m,)."""
    return F.cosine_similarity(matrix.flatten(1), observed.flatten(1), dim=1)


@register_embedding("inversion-nn")
class NearestNeighbourInversion(EmbeddingAttack):
    """Token-wise nearest-neighbour inversion (Du et al. 2023, Sec. 6.3; module docstring).
    `chunk`: victims matched per batch."""

    kind: ClassVar[str] = "inversion"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.LOGITS, ("public-encoder",))
    paper: ClassVar[str] = "Du et al. 2023 (DP-Forward), Sec. 6.3, token-wise inversion"

    def __init__(self, chunk: int = 256) -> None:
        self.chunk = whole_option(self.name, "chunk", chunk)

    def run(self, target: Target, task: EmbeddingTask) -> InversionOutput:
        """Recovered tokens (m, L) of the task's observed embeddings."""
        encoder = _encoder(task, self.name)
        position: Position = target.position  # type: ignore[attr-defined]
        _shape_check(task, position, encoder, self.name)
        device = _device(encoder)
        outs = []
        for i in range(0, task.observed.shape[0], self.chunk):
            observed = task.observed[i : i + self.chunk].to(device)
            if position.pooled:
                k = min(task.length, int(encoder.config.vocab_size))  # type: ignore[union-attr]
                outs.append(_nearest(encoder, observed, position, k, task.length)[:, 0].cpu())
            else:
                outs.append(_nearest(encoder, observed, position, 1, task.length)[..., 0].cpu())
        tokens = torch.cat(outs) if outs else torch.zeros(0, task.length, dtype=torch.int64)
        return InversionOutput(tokens=tokens, params={"position": str(position)})


@register_embedding("inversion-opt")
class OptimisationInversion(EmbeddingAttack):
    """Gradient-based continuous relaxation (module docstring). `steps` Adam steps at rate `lr`
    per restart, temperature annealed geometrically from `temperature` to `final_temperature`;
    `restarts` random initialisations (the one whose argmax tokens match best is kept per
    victim); `candidates` tokens screened per position (half by nearest neighbours, half by
    the first-order gain); `chunk` victims optimised together. `linear_map`: map deep
    releases to input rows with a least-squares map fitted on the auxiliary data (None: when
    the task has auxiliary data and the cut is past the input; True: required); `ridge`: its
    Tikhonov weight, relative to the mean eigenvalue of the features' Gram matrix."""

    kind: ClassVar[str] = "inversion"
    threat_model: ClassVar[ThreatModel] = ThreatModel(
        Access.LOGITS, ("public-encoder", "auxiliary-data")
    )
    paper: ClassVar[str] = (
        "Du et al. 2023 (DP-Forward), Sec. 6.3, gradient-based inversion; "
        "Song & Raghunathan 2020, Sec. 4 (continuous relaxation)"
    )

    def __init__(
        self,
        steps: int = 60,
        lr: float = 0.3,
        restarts: int = 2,
        candidates: int = 32,
        temperature: float = 1.0,
        final_temperature: float = 0.05,
        chunk: int = 64,
        linear_map: bool | None = None,
        ridge: float = 1e-3,
    ) -> None:
        self.steps = whole_option(self.name, "steps", steps)
        self.lr = number_option(self.name, "lr", lr)
        self.restarts = whole_option(self.name, "restarts", restarts)
        self.candidates = whole_option(self.name, "candidates", candidates, 2)
        self.temperature = number_option(self.name, "temperature", temperature)
        self.final_temperature = number_option(self.name, "final_temperature", final_temperature)
        self.chunk = whole_option(self.name, "chunk", chunk)
        if linear_map not in (None, True, False):
            raise EmbeddingError(f"{self.name}: linear_map must be true, false or none")
        self.linear_map = linear_map
        self.ridge = number_option(self.name, "ridge", ridge, zero=True)

    def options(self) -> dict[str, Any]:
        """The attack's settings (JSON-ready)."""
        return {
            "steps": self.steps,
            "lr": self.lr,
            "restarts": self.restarts,
            "candidates": self.candidates,
            "temperature": self.temperature,
            "final_temperature": self.final_temperature,
            "linear_map": self.linear_map,
            "ridge": self.ridge,
        }

    def run(self, target: Target, task: EmbeddingTask) -> InversionOutput:
        """Recovered tokens (m, L) of the task's observed embeddings."""
        encoder = _encoder(task, self.name)
        position: Position = target.position  # type: ignore[attr-defined]
        _shape_check(task, position, encoder, self.name)
        device = _device(encoder)
        observed_all = task.observed
        mapped = self.linear_map
        if mapped is None:
            mapped = task.auxiliary_ids is not None and position.kind != "input"
        if mapped:
            if task.auxiliary_ids is None:
                raise EmbeddingError(f"{self.name}: the linear map needs auxiliary data")
            observed_all = self._map(target, task, encoder, position)
            position = Position("input")
        exact = EncoderClassifier(encoder, 2, position=position).to(device).eval()
        generator = torch.Generator(device="cpu").manual_seed(task.seed)
        outs, scores = [], []
        for i in range(0, observed_all.shape[0], self.chunk):
            observed = observed_all[i : i + self.chunk].to(device)
            tokens, score = self._invert(encoder, exact, observed, position, task, generator)
            outs.append(tokens.cpu())
            scores.append(score.cpu())
        tokens = torch.cat(outs) if outs else torch.zeros(0, task.length, dtype=torch.int64)
        similarity = float(torch.cat(scores).mean()) if scores else float("nan")
        params = {**self.options(), "position": str(target.position)}  # type: ignore[attr-defined]
        params.update(similarity=similarity, mapped=bool(mapped))
        return InversionOutput(tokens=tokens, params=params)

    @torch.no_grad()
    def _map(
        self, target: Target, task: EmbeddingTask, encoder: nn.Module, position: Position
    ) -> Tensor:
        """The victims' releases mapped to input rows (m, L, d) by the least-squares map fitted
        on the auxiliary sequences' releases (queried) and input rows (public encoder): one
        d → d map shared by the rows at a row-wise cut, a d → L·d map at the pooled output
        (Du et al. 2023, Sec. 6.3)."""
        aux = task.auxiliary_ids
        assert aux is not None
        if aux.shape[1] != task.length:
            raise EmbeddingError(
                f"{self.name}: auxiliary sequences of {aux.shape[1]} tokens, victims' of "
                f"{task.length}"
            )
        device = _device(encoder)
        released = target.embeddings(aux).to(device).float()  # type: ignore[attr-defined]
        rows = EncoderClassifier(encoder, 2, position="input").to(device).eval()
        clear = torch.cat(
            [rows.before(aux[i : i + 256].to(device)) for i in range(0, len(aux), 256)]
        )
        a, r, d = released.shape
        x = released.reshape(a * r, d) if not position.pooled else released[:, 0]
        y = clear.reshape(a * r, d) if not position.pooled else clear.reshape(a, -1)
        x = torch.cat([x, torch.ones(x.shape[0], 1, device=device)], 1).double()
        gram = x.T @ x
        weight = self.ridge * float(gram.diagonal().mean())
        gram = gram + weight * torch.eye(gram.shape[0], device=device, dtype=gram.dtype)
        solution = torch.linalg.solve(gram, x.T @ y.double()).float()
        observed = task.observed.to(device)
        m = observed.shape[0]
        features = observed.reshape(m * r, d) if not position.pooled else observed[:, 0]
        features = torch.cat([features, torch.ones(features.shape[0], 1, device=device)], 1)
        return (features @ solution).reshape(m, task.length, d)

    def _screen(
        self, encoder: nn.Module, observed: Tensor, position: Position, length: int
    ) -> Tensor:
        """Candidate token ids (m, L, k): nearest neighbours of the observed rows and the tokens
        of largest first-order gain from the uniform mixture, then the special tokens."""
        m = observed.shape[0]
        word = _parts(encoder)[0]
        near = max(1, self.candidates // 2)
        by_distance = _nearest(encoder, observed, position, near, length).expand(m, length, near)
        mean = word.mean(0).expand(m, length, -1).clone().requires_grad_(True)
        keep = torch.ones(m, length, device=observed.device)
        with torch.enable_grad():
            loss = -_similarity(_layers(encoder, _rows(encoder, mean), keep, position), observed)
            (grad,) = torch.autograd.grad(loss.sum(), mean)
        gain = -(grad.reshape(-1, grad.shape[-1]) @ word.T)
        by_gain = gain.topk(max(1, self.candidates - near), -1).indices.reshape(m, length, -1)
        specials = torch.tensor(SPECIALS, device=observed.device).expand(m, length, -1)
        return torch.cat([by_distance, by_gain, specials], -1)

    def _invert(
        self,
        encoder: nn.Module,
        exact: EncoderClassifier,
        observed: Tensor,
        position: Position,
        task: EmbeddingTask,
        generator: torch.Generator,
    ) -> tuple[Tensor, Tensor]:
        length = task.length
        candidates = self._screen(encoder, observed, position, length)
        word = _parts(encoder)[0]
        vectors = word[candidates]
        pad = candidates == PAD_ID
        best = torch.zeros(observed.shape[0], length, dtype=torch.int64, device=observed.device)
        best_score = torch.full((observed.shape[0],), -math.inf, device=observed.device)
        decay = (self.final_temperature / self.temperature) ** (1.0 / max(1, self.steps - 1))
        for restart in range(self.restarts):
            start = torch.randn(candidates.shape, generator=generator) * (
                0.0 if restart == 0 else 1.0
            )
            logits = start.to(observed.device).requires_grad_(True)
            optimiser = torch.optim.Adam([logits], lr=self.lr)
            tau = self.temperature
            with torch.enable_grad():
                for _ in range(self.steps):
                    probs = torch.softmax(logits / tau, -1)
                    mixed = torch.einsum("mlk,mlkd->mld", probs, vectors)
                    keep = 1.0 - (probs * pad).sum(-1)
                    matrix = _layers(encoder, _rows(encoder, mixed), keep, position)
                    loss = -_similarity(matrix, observed).sum()
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
                    tau *= decay
            tokens = candidates.gather(-1, logits.detach().argmax(-1, keepdim=True))[..., 0]
            with torch.no_grad():
                score = _similarity(exact.before(tokens), observed)
            better = score > best_score
            best[better] = tokens[better]
            best_score = torch.where(better, score, best_score)
        return best, best_score
