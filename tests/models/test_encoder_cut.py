"""EncoderClassifier cut at input | layer:K | output (Du et al. 2023, DP-Forward Sec. 3.2).

Oracles: a direct `transformers` BertModel forward with its attention mask, masked mean pooling
(sentence-transformers' pooling) and the linear head; an autograd loop over single examples
for ghost clipping's per-example gradient norms (Li et al. 2022, Sec. 4)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from privacylab.models.encoder import EncoderClassifier, Position, mean_pool, parse_position
from privacylab.models.errors import ModelError
from privacylab.models.minilm import CLS_ID, PAD_ID, SEP_ID, tiny_bert
from privacylab.training.dp import ClipThresholds, GhostClipping

LENGTHS = (9, 3, 6, 9, 5)
L = 10
POSITIONS = ("input", "layer:1", "layer:2", "output")


@pytest.fixture(scope="module")
def encoder() -> nn.Module:
    model = tiny_bert(dim=32, layers=2, heads=2, max_len=16, seed=0).double()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.add_(0.3 * torch.randn_like(module.weight))
                module.bias.add_(0.3 * torch.randn_like(module.bias))
    return model.eval()


@pytest.fixture(scope="module")
def head() -> nn.Linear:
    torch.manual_seed(1)
    return nn.Linear(32, 3).double()


def _ids(lengths: tuple[int, ...] = LENGTHS, width: int = L, seed: int = 2) -> Tensor:
    """[CLS] tokens [SEP] then [PAD], `lengths` real tokens per row (special ones included)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), width), PAD_ID, dtype=torch.int64)
    for row, length in enumerate(lengths):
        body = torch.randint(1000, 30000, (length - 2,), generator=gen)
        ids[row, :length] = torch.cat([torch.tensor([CLS_ID]), body, torch.tensor([SEP_ID])])
    return ids


def _classifier(
    encoder: nn.Module, head: nn.Linear, position: str, release: nn.Module | None = None
) -> EncoderClassifier:
    model = EncoderClassifier(encoder, 3, position=position, release=release)
    model.head = head
    return model.double().eval()


def _oracle(encoder: nn.Module, head: nn.Linear, ids: Tensor) -> Tensor:
    keep = ids != PAD_ID
    hidden = encoder(input_ids=ids, attention_mask=keep.long()).last_hidden_state
    weights = keep.double().unsqueeze(-1)
    return head((hidden * weights).sum(1) / weights.sum(1))


class Recorder(nn.Module):
    """An identity release that records what it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[tuple[int, ...], int, int]] = []

    def forward(self, *args: Tensor, **kwargs: Tensor) -> Tensor:
        self.calls.append((tuple(args[0].shape), len(args), len(kwargs)))
        return args[0]


def test_parse_position_accepts_the_three_kinds() -> None:
    assert parse_position("input", 6) == Position("input")
    assert parse_position(" output ", 6) == Position("output")
    assert parse_position("layer:1", 6) == Position("layer", 1)
    assert parse_position("layer:6", 6) == Position("layer", 6)
    assert parse_position(Position("layer", 3), 6) == Position("layer", 3)
    assert str(Position("layer", 3)) == "layer:3" and str(Position("input")) == "input"
    assert Position("output").pooled and not Position("layer", 2).pooled


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("middle", "unknown position"),
        ("layer:x", "unknown position"),
        ("layer:", "unknown position"),
        ("layer 3", "unknown position"),
        ("", "unknown position"),
        ("layer:0", "out of range"),
        ("layer:-1", "out of range"),
        ("layer:7", "out of range"),
    ],
)
def test_parse_position_refuses_with_one_line(text: str, message: str) -> None:
    with pytest.raises(ModelError, match=message) as caught:
        parse_position(text, 6)
    assert "\n" not in str(caught.value)


def test_model_refuses_bad_positions_and_inputs(encoder: nn.Module) -> None:
    with pytest.raises(ModelError, match="out of range"):
        EncoderClassifier(encoder, 2, position="layer:3")
    with pytest.raises(ModelError, match="num_classes"):
        EncoderClassifier(encoder, 1)
    model = EncoderClassifier(encoder, 2)
    with pytest.raises(ModelError, match="integer token ids"):
        model(torch.zeros(2, 4))
    with pytest.raises(ModelError, match="exceed max_len"):
        model(torch.ones(1, 17, dtype=torch.int64))


@pytest.mark.parametrize("position", POSITIONS)
def test_cut_composes_to_the_transformers_forward(
    encoder: nn.Module, head: nn.Linear, position: str
) -> None:
    ids = _ids()
    keep = ids != PAD_ID
    want = _oracle(encoder, head, ids)
    model = _classifier(encoder, head, position)
    with torch.no_grad():
        matrix = model.before(ids)
        torch.testing.assert_close(model.after(matrix, keep), want, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(model(ids), want, rtol=1e-10, atol=1e-10)
        other = _classifier(encoder, head, "output")
        torch.testing.assert_close(other.before(ids, position), matrix, rtol=0, atol=0)
    rows = 1 if position == "output" else L
    assert matrix.shape == (len(LENGTHS), rows, 32)


def test_before_matches_hidden_states_and_pooling(encoder: nn.Module, head: nn.Linear) -> None:
    ids = _ids()
    keep = ids != PAD_ID
    model = _classifier(encoder, head, "output")
    with torch.no_grad():
        states = encoder(
            input_ids=ids, attention_mask=keep.long(), output_hidden_states=True
        ).hidden_states
        for k, position in enumerate(("input", "layer:1", "layer:2")):
            got = model.before(ids, position)
            torch.testing.assert_close(got[keep], states[k][keep], rtol=1e-10, atol=1e-10)
        pooled = model.before(ids)[:, 0]
        torch.testing.assert_close(pooled, mean_pool(states[2], keep), rtol=1e-10, atol=1e-10)
        manual = torch.stack([states[2][i, keep[i]].mean(0) for i in range(len(ids))])
        torch.testing.assert_close(pooled, manual, rtol=1e-10, atol=1e-10)


@settings(max_examples=10, deadline=None)
@given(
    lengths=st.lists(st.integers(2, 8), min_size=1, max_size=4),
    extra=st.integers(1, 6),
    position=st.sampled_from(POSITIONS),
)
def test_padding_changes_nothing_without_a_release(
    encoder: nn.Module, head: nn.Linear, lengths: list[int], extra: int, position: str
) -> None:
    ids = _ids(tuple(lengths), width=8)
    wider = torch.cat([ids, torch.full((len(ids), extra), PAD_ID)], dim=1)
    model = _classifier(encoder, head, position)
    with torch.no_grad():
        torch.testing.assert_close(model(wider), model(ids), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("position", POSITIONS)
def test_release_receives_the_matrix_alone_and_what_follows_ignores_the_mask(
    encoder: nn.Module, head: nn.Linear, position: str
) -> None:
    """Module docstring: with a release, p(·) attends to and pools over every row, padding
    included; the mask never reaches the release or what follows it."""
    ids = _ids()
    keep = ids != PAD_ID
    recorder = Recorder()
    model = _classifier(encoder, head, position, release=recorder)
    with torch.no_grad():
        released = model(ids)
        matrix = model.before(ids)
        torch.testing.assert_close(released, model.after(matrix), rtol=1e-12, atol=1e-12)
        everything = torch.ones_like(keep)
        torch.testing.assert_close(
            released, model.after(matrix, everything), rtol=1e-12, atol=1e-12
        )
        masked = model.after(matrix, keep)
        if position == "output":
            torch.testing.assert_close(released, masked, rtol=1e-10, atol=1e-10)
        else:
            changed = matrix.clone()
            changed[~keep] += torch.randn(changed[~keep].shape, dtype=changed.dtype)
            assert not torch.allclose(released, masked, atol=1e-6)
            torch.testing.assert_close(model.after(changed, keep), masked, rtol=1e-10, atol=1e-10)
            moved = (model.after(changed) - model.after(matrix)).abs().amax(dim=1)
            assert (moved[torch.tensor([n < L for n in LENGTHS])] > 1e-6).all()
            torch.testing.assert_close(
                moved[torch.tensor([n == L for n in LENGTHS])],
                torch.zeros(sum(n == L for n in LENGTHS), dtype=moved.dtype),
            )
    shape = (len(LENGTHS), 1, 32) if position == "output" else (len(LENGTHS), L, 32)
    assert recorder.calls == [(shape, 1, 0)]


def _per_example_norms(model: nn.Module, ids: Tensor, labels: Tensor) -> Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    norms = []
    for i in range(len(ids)):
        loss = nn.functional.cross_entropy(model(ids[i : i + 1]), labels[i : i + 1])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        norms.append(torch.sqrt(sum((g**2).sum() for g in grads if g is not None)))
    return torch.stack(norms)


def _loss(logits: Tensor, labels: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits, labels, reduction="none")


@pytest.mark.parametrize(("position", "release"), [("output", False), ("layer:1", True)])
def test_ghost_clipping_norms_equal_an_autograd_loop(position: str, release: bool) -> None:
    """Per-example gradient norms of the whole classifier (embeddings, attention, LayerNorm,
    head) by ghost clipping equal single-example autograd norms; the clipped sum is
    Σ_i g_i · min(1, C / ‖g_i‖)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        encoder = tiny_bert(dim=16, layers=2, heads=2, max_len=16, seed=3)
        model = EncoderClassifier(
            encoder, 2, position=position, release=Recorder() if release else None
        )
        ids = _ids((9, 3, 6, 4), width=L, seed=5)
        labels = torch.tensor([0, 1, 1, 0])
        norms = _per_example_norms(model, ids, labels)
        clip = float(norms.median())
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        ghost = GhostClipping(model, _loss, ClipThresholds(clip, names)).clip((ids,), labels)
        torch.testing.assert_close(ghost.norms, norms, rtol=1e-5, atol=0)
        assert (norms > clip).any() and (norms < clip).any()
        params = dict(model.named_parameters())
        factors = torch.clamp(clip / norms, max=1.0)
        weighted = (_loss(model(ids), labels) * factors).sum()
        want = dict(
            zip(names, torch.autograd.grad(weighted, [params[n] for n in names]), strict=True)
        )
        for name in ("head.weight", "encoder.embeddings.word_embeddings.weight"):
            got = ghost.grad_sum[name]
            assert float((got - want[name]).norm() / want[name].norm()) < 1e-5, name
    finally:
        torch.set_default_dtype(previous)
