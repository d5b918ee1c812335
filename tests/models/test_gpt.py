"""The GPT-style `CausalLM` (Radford et al. 2019; Vaswani et al. 2017, Sec. 3.2.3 causal mask):
position t never sees tokens after t, the key/value cache gives the logits of a full forward
pass, rows of a batch are independent, lengths past `max_len` and bad builder options are
one-line ModelErrors, and the "gpt" spec survives safetensors + JSON storage."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.data.tokenizer import VOCAB_SIZE
from privacylab.models import ModelError, ModelSpec, build_model, load_model, save_model
from privacylab.models.gpt import CausalLM
from privacylab.models.registry import unsupported_parameter_modules

CONTEXT = 20
SPEC = ModelSpec("gpt", (CONTEXT,), VOCAB_SIZE, {"dim": 16, "heads": 4, "blocks": 2})


@pytest.fixture(scope="module")
def model() -> CausalLM:
    built = SPEC.build(seed=0)
    assert isinstance(built, CausalLM)
    return built.eval()


def tokens(n: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB_SIZE, (n, length), generator=torch.Generator().manual_seed(seed))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, CONTEXT - 1), st.integers(0, VOCAB_SIZE - 1), st.integers(0, 1000))
def test_causal(model: CausalLM, j: int, new: int, seed: int) -> None:
    x = tokens(2, CONTEXT, seed)
    y = x.clone()
    y[:, j] = new
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.shape == (2, CONTEXT, VOCAB_SIZE)
    assert torch.allclose(a[:, :j], b[:, :j], atol=1e-6)
    if bool((x[:, j] != new).all()):
        assert not torch.allclose(a[:, j], b[:, j], atol=1e-6)


def test_rows_are_independent(model: CausalLM) -> None:
    x = tokens(5, 12, 1)
    with torch.no_grad():
        together = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(5)])
    assert torch.allclose(together, alone, atol=1e-5)


@pytest.mark.parametrize("chunks", [[1] * CONTEXT, [4, 1, 1, 7, 2, 5], [CONTEXT]])
def test_cache_equals_forward(model: CausalLM, chunks: list[int]) -> None:
    x = tokens(3, CONTEXT, 2)
    with torch.no_grad():
        full = model(x)
        cache = None
        parts, start = [], 0
        for size in chunks:
            out, cache = model.step(x[:, start : start + size], cache)
            parts.append(out)
            start += size
            assert len(cache) == 2
            assert cache[0][0].shape == (3, 4, start, 4) == cache[0][1].shape
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)


def test_forward_matches_a_manual_attention(model: CausalLM) -> None:
    """One block recomputed by hand with an explicit lower-triangular softmax."""
    block = model.blocks[0]
    attention = block.attention
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, _ = attention(x)
        q, k, v = attention.qkv(x).split(16, dim=-1)
        heads = [slice(h * 4, (h + 1) * 4) for h in range(4)]
        mask = torch.ones(6, 6).tril().bool()
        outs = []
        for part in heads:
            scores = q[..., part] @ k[..., part].transpose(-2, -1) / 2.0
            weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
            outs.append(weights @ v[..., part])
        expected = attention.proj(torch.cat(outs, -1))
    assert torch.allclose(got, expected, atol=1e-5)


def test_max_len(model: CausalLM) -> None:
    with pytest.raises(ModelError, match="length 21 exceeds max_len 20") as info:
        model(tokens(1, CONTEXT + 1))
    assert "\n" not in str(info.value)
    _, cache = model.step(tokens(1, CONTEXT - 2))
    model.step(tokens(1, 2), cache)
    with pytest.raises(ModelError, match="length 21 exceeds max_len 20"):
        model.step(tokens(1, 3), cache)


@pytest.mark.parametrize(
    ("shape", "options", "match"),
    [
        ((4, 4), {}, "shape \\(L,\\)"),
        ((0,), {}, "input_shape"),
        ((8,), {"dim": 10, "heads": 4}, "divisible"),
        ((8,), {"heads": 0}, "heads"),
        ((8,), {"dim": -1}, "dim"),
        ((8,), {"blocks": 0}, "blocks"),
        ((8,), {"mlp_ratio": 1.5}, "mlp_ratio"),
        ((8,), {"dropout": 1.0}, "dropout"),
        ((8,), {"width": 3}, "no option width"),
    ],
)
def test_builder_errors(shape: tuple[int, ...], options: dict[str, object], match: str) -> None:
    with pytest.raises(ModelError, match=match) as info:
        build_model("gpt", shape, VOCAB_SIZE, **options)
    assert "\n" not in str(info.value)


def test_builder_and_layers() -> None:
    a = build_model("gpt", (8,), 50, dim=8, heads=2, blocks=3, seed=4)
    b = build_model("gpt", (8,), 50, dim=8, heads=2, blocks=3, seed=4)
    assert isinstance(a, CausalLM) and (a.max_len, a.vocab_size, len(a.blocks)) == (8, 50, 3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert unsupported_parameter_modules(a) == []
    assert a.head.weight.data_ptr() != a.tokens.weight.data_ptr()


def test_spec_save_load(tmp_path: Path, model: CausalLM) -> None:
    assert ModelSpec.from_dict(SPEC.to_dict()) == SPEC
    folder = save_model(model, tmp_path / "lm", SPEC, {"language": {"context": CONTEXT}})
    loaded, spec, metadata = load_model(folder)
    assert spec == SPEC and metadata == {"language": {"context": CONTEXT}}
    assert isinstance(loaded, CausalLM) and not loaded.training
    x = tokens(2, CONTEXT, 5)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))


def test_it_learns_a_sequence() -> None:
    torch.manual_seed(0)
    net = CausalLM(VOCAB_SIZE, 12, dim=16, heads=2, blocks=1)
    x = torch.tensor([[256, *b"abcabcabca", 257]])
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(60):
        loss = F.cross_entropy(net(x[:, :-1]).reshape(-1, VOCAB_SIZE), x[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05
    assert net.eval()(x[:, :-1]).argmax(-1).tolist() == x[:, 1:].tolist()
