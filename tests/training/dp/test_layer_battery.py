"""The layer battery of issue 11: every registered layer type, odd configurations, both modes.

Each case builds a tiny float64 model around one layer configuration and runs
``GhostClipping`` and ``PerSampleClipping`` with a flat threshold and with per-layer thresholds
(McMahan et al. 2018); per-example norms and clipped sums are compared with a brute-force loop
of ``torch.autograd.grad`` over single examples (relative tolerance 1e-6).  A case a mode
cannot handle exactly must be refused with a one-line ``DPSGDError`` (``GhostClippingError``
is one), never answered wrongly.  A meta-test makes a new rule without a case fail.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from privacylab.training.dp import (
    ClipThresholds,
    DPSGDError,
    GhostClipping,
    PerSampleClipping,
    registered_layer_types,
    split_threshold,
)

B = 4
EXACT = "exact"
NOT_BATCH = "dimension 0 is not the batch|not batch-first"


def _loss(out: Tensor, y: Tensor) -> Tensor:
    return (out - y).pow(2).flatten(1).sum(1)


class Around(nn.Module):
    """``head(tanh(body(*inputs)).flatten(1))``: the layer under test, then a Linear head."""

    def __init__(self, body: Callable[..., Tensor], width: int, **layers: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.layers = nn.ModuleDict(layers)
        self.head = nn.Linear(width, 2)

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.head(torch.tanh(self.body(self.layers, *inputs)).flatten(1))


def around(body: Callable[..., Tensor], inputs: tuple[Tensor, ...], **layers: nn.Module):
    """A float64 model ``Around(body)`` for these inputs, with its inputs and random targets."""
    layers = {name: layer.double() for name, layer in layers.items()}
    with torch.no_grad():
        width = body(nn.ModuleDict(layers), *inputs)[0].numel()
    model = Around(body, width, **layers).double()
    return model, inputs, torch.randn(inputs[0].shape[0], 2, dtype=torch.float64)


def one(layer: nn.Module, x: Tensor):
    return around(lambda m, x: m["layer"](x), (x,), layer=layer)


def twice(layer: nn.Module, x: Tensor):
    """The layer applied to its own output (a layer used twice in one forward)."""
    return around(lambda m, x: m["layer"](torch.tanh(m["layer"](x))), (x,), layer=layer)


def frozen(name: str, build: Callable[[], tuple]) -> Callable[[], tuple]:
    def make():
        model, inputs, y = build()
        getattr(model.layers["layer"], name).requires_grad_(False)
        return model, inputs, y

    return make


def _x(*shape: int, batch: int = B) -> Tensor:
    return torch.randn(batch, *shape, dtype=torch.float64)


def _tokens(vocab: int, length: int, batch: int = B) -> Tensor:
    tokens = torch.randint(0, vocab, (batch, length))
    tokens[0, :] = tokens[0, 0]  # repeated tokens
    return tokens


def _bag_with_weights():
    bag = nn.EmbeddingBag(6, 3, mode="sum", padding_idx=5)
    tokens, weights = _tokens(6, 5), _x(5)
    return around(lambda m, t, w: m["layer"](t, per_sample_weights=w), (tokens, weights), layer=bag)


def _bag_flat_offsets():
    """EmbeddingBag on 1-D tokens with offsets built inside the model: bags are examples."""

    def body(m, t):
        offsets = torch.arange(0, t.numel(), t.shape[1], device=t.device)
        return m["layer"](t.reshape(-1), offsets)

    return around(body, (_tokens(6, 3),), layer=nn.EmbeddingBag(6, 3, mode="mean"))


def _positions(expand: bool, length: int = B):
    """Token + position embeddings, the positions ``arange(L)`` with L == B (expanded or not)."""

    def body(m, t):
        pos = torch.arange(t.shape[1], device=t.device)
        if expand:
            pos = pos.expand_as(t)
            return m["ln"](m["tok"](t) + m["pos"](pos))
        return m["ln"](m["tok"](t) + m["pos"](pos)[None])

    return around(
        body,
        (_tokens(7, length),),
        tok=nn.Embedding(7, 4),
        pos=nn.Embedding(length, 4),
        ln=nn.LayerNorm(4),
    )


def _sequence_first(t: int):
    """(B, T, d) made sequence-first before a Linear: refused by ghost even when T == B."""
    return around(
        lambda m, x: m["layer"](x.transpose(0, 1)).transpose(0, 1),
        (_x(t, 3),),
        layer=nn.Linear(3, 2),
    )


def _tied():
    emb = nn.Embedding(6, 4)
    head = nn.Linear(4, 6, bias=False)
    head.weight = emb.weight
    return around(lambda m, t: m["head"](m["emb"](t)), (_tokens(6, 3),), emb=emb, head=head)


def _sparse_embedding():
    return one(nn.Embedding(6, 3, padding_idx=0, sparse=True), _tokens(6, 5))


@dataclass(frozen=True)
class Case:
    """A layer configuration, and what each mode must do with it (EXACT or a refusal regex)."""

    id: str
    layer_type: type[nn.Module] | None
    build: Callable[[], tuple]
    ghost: str = EXACT
    per_sample: str = EXACT
    rule: bool = True
    """Ghost must use the layer type's registered rule (not the per-layer fallback)."""


CASES = [
    Case("linear", nn.Linear, lambda: one(nn.Linear(3, 4), _x(3))),
    Case("linear-sequence", nn.Linear, lambda: one(nn.Linear(3, 4), _x(5, 3))),
    Case("linear-sequence-T-equals-B", nn.Linear, lambda: one(nn.Linear(3, 2), _x(B, 3))),
    Case("linear-twice", nn.Linear, lambda: twice(nn.Linear(3, 3), _x(2, 3))),
    Case("linear-frozen-bias", nn.Linear, frozen("bias", lambda: one(nn.Linear(3, 4), _x(5, 3)))),
    Case("linear-frozen-weight", nn.Linear, frozen("weight", lambda: one(nn.Linear(3, 4), _x(3)))),
    Case("linear-sequence-first-T-equals-B", nn.Linear, lambda: _sequence_first(B), NOT_BATCH),
    Case("linear-sequence-first", nn.Linear, lambda: _sequence_first(3), NOT_BATCH),
    Case("conv1d-stride-dilation", nn.Conv1d, lambda: one(nn.Conv1d(2, 3, 3, 2, 1, 2), _x(2, 9))),
    Case(
        "conv1d-reflect-groups",
        nn.Conv1d,
        lambda: one(nn.Conv1d(4, 6, 3, groups=2, padding=1, padding_mode="reflect"), _x(4, 6)),
    ),
    Case(
        "conv1d-depthwise-twice", nn.Conv1d, lambda: twice(nn.Conv1d(3, 3, 3, groups=3), _x(3, 9))
    ),
    Case(
        "conv2d-circular-stride",
        nn.Conv2d,
        lambda: one(nn.Conv2d(2, 3, 3, stride=2, padding=1, padding_mode="circular"), _x(2, 5, 5)),
    ),
    Case("conv2d-twice", nn.Conv2d, lambda: twice(nn.Conv2d(2, 2, 2, dilation=2), _x(2, 6, 6))),
    Case(
        "conv2d-ghost-norm",
        nn.Conv2d,
        lambda: one(nn.Conv2d(16, 16, 3, padding=1), _x(16, 2, 2)),
    ),
    Case(
        "conv1d-groups-ghost-norm-twice",
        nn.Conv1d,
        lambda: twice(nn.Conv1d(16, 16, 3, groups=2, padding=1), _x(16, 2)),
    ),
    Case("conv2d-groups", nn.Conv2d, lambda: one(nn.Conv2d(4, 4, 3, groups=2), _x(4, 4, 5))),
    Case(
        "conv2d-depthwise-replicate",
        nn.Conv2d,
        lambda: one(nn.Conv2d(2, 4, 3, groups=2, padding=1, padding_mode="replicate"), _x(2, 4, 4)),
    ),
    Case(
        "conv2d-frozen-bias",
        nn.Conv2d,
        frozen("bias", lambda: one(nn.Conv2d(2, 3, 3, padding="same"), _x(2, 4, 4))),
    ),
    Case("conv3d", nn.Conv3d, lambda: one(nn.Conv3d(2, 2, 2, stride=(1, 2, 1)), _x(2, 3, 4, 3))),
    Case(
        "conv3d-groups-zeros",
        nn.Conv3d,
        lambda: one(nn.Conv3d(2, 4, 2, groups=2, padding=1, dilation=2), _x(2, 3, 3, 3)),
    ),
    Case(
        "conv-transpose1d-output-padding",
        nn.ConvTranspose1d,
        lambda: one(nn.ConvTranspose1d(2, 3, 3, stride=2, padding=1, output_padding=1), _x(2, 4)),
    ),
    Case(
        "conv-transpose1d-groups-dilation",
        nn.ConvTranspose1d,
        lambda: one(nn.ConvTranspose1d(4, 2, 2, groups=2, dilation=2), _x(4, 3)),
    ),
    Case(
        "conv-transpose2d-depthwise",
        nn.ConvTranspose2d,
        lambda: one(nn.ConvTranspose2d(3, 3, 3, stride=2, groups=3), _x(3, 2, 3)),
    ),
    Case(
        "conv-transpose2d-twice",
        nn.ConvTranspose2d,
        lambda: twice(nn.ConvTranspose2d(2, 2, 2), _x(2, 2, 2)),
    ),
    Case(
        "conv-transpose3d",
        nn.ConvTranspose3d,
        lambda: one(nn.ConvTranspose3d(2, 2, 2, stride=2, output_padding=1), _x(2, 2, 2, 1)),
    ),
    Case("embedding-padding-idx", nn.Embedding, lambda: one(nn.Embedding(6, 3, 0), _tokens(4, 5))),
    Case(
        "embedding-twice",
        nn.Embedding,
        lambda: around(
            lambda m, t: m["layer"](t) * m["layer"](t.flip(1)),
            (_tokens(5, 4),),
            layer=nn.Embedding(5, 3),
        ),
    ),
    Case("embedding-sparse", nn.Embedding, _sparse_embedding, per_sample="sparse"),
    Case(
        "embedding-max-norm",
        nn.Embedding,
        lambda: one(nn.Embedding(6, 3, max_norm=1.0), _tokens(6, 3)),
        ghost="max_norm",
        per_sample="max_norm",
    ),
    Case("bag-sum-weights-padding", nn.EmbeddingBag, _bag_with_weights),
    Case(
        "bag-mean", nn.EmbeddingBag, lambda: one(nn.EmbeddingBag(5, 3, mode="mean"), _tokens(5, 4))
    ),
    Case(
        "bag-max-padding",
        nn.EmbeddingBag,
        lambda: one(nn.EmbeddingBag(6, 3, mode="max", padding_idx=1), _tokens(6, 5)),
    ),
    Case(
        "bag-max-twice",
        nn.EmbeddingBag,
        lambda: around(
            lambda m, t: m["layer"](t) * m["layer"](t[:, :2]),
            (_tokens(5, 4),),
            layer=nn.EmbeddingBag(5, 3, mode="max"),
        ),
    ),
    Case("bag-1d-offsets", nn.EmbeddingBag, _bag_flat_offsets),
    Case("layer-norm", nn.LayerNorm, lambda: one(nn.LayerNorm((3, 4)), _x(2, 3, 4))),
    Case("group-norm", nn.GroupNorm, lambda: one(nn.GroupNorm(2, 4), _x(4, 3))),
    Case("rms-norm", nn.RMSNorm, lambda: one(nn.RMSNorm(3), _x(2, 3))),
    Case(
        "instance-norm1d",
        nn.InstanceNorm1d,
        lambda: one(nn.InstanceNorm1d(3, affine=True), _x(3, 5)),
    ),
    Case(
        "instance-norm2d-frozen-bias",
        nn.InstanceNorm2d,
        frozen("bias", lambda: one(nn.InstanceNorm2d(2, affine=True), _x(2, 3, 3))),
    ),
    Case(
        "instance-norm3d-twice",
        nn.InstanceNorm3d,
        lambda: twice(nn.InstanceNorm3d(2, affine=True), _x(2, 2, 3, 2)),
    ),
    Case("positions-L-equals-B-expanded", nn.Embedding, lambda: _positions(True)),
    Case("positions-L-equals-B", nn.Embedding, lambda: _positions(False), ghost=NOT_BATCH),
    Case("tied-embedding-head", None, _tied, rule=False),
    Case("no-rule-prelu", None, lambda: one(nn.PReLU(3), _x(3, 4)), rule=False),
    Case(
        "no-rule-bilinear",
        None,
        lambda: around(lambda m, x: m["layer"](x, x.flip(1)), (_x(3),), layer=nn.Bilinear(3, 3, 2)),
        rule=False,
    ),
]


def _brute_force(model: nn.Module, inputs: tuple[Tensor, ...], y: Tensor):
    """Per-parameter (B, *shape) per-example gradients by autograd on one example at a time."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    rows = []
    for i in range(y.shape[0]):
        loss = _loss(model(*(x[i : i + 1] for x in inputs)), y[i : i + 1]).sum()
        found = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        rows.append(
            [
                torch.zeros_like(p) if g is None else g.to_dense() if g.is_sparse else g
                for p, g in zip(params.values(), found, strict=True)
            ]
        )
    return {n: torch.stack([r[k] for r in rows]) for k, n in enumerate(params)}


def _clipped(grads: dict[str, Tensor], thresholds: ClipThresholds) -> dict[str, Tensor]:
    """Σ_i c_i ∇L_i with the engine's factors min(1, C / (‖·‖ + 1e-6)), flat or per layer."""
    sq = {n: g.flatten(1).square().sum(1) for n, g in grads.items()}
    total = torch.stack(list(sq.values())).sum(0).sqrt()
    out = {}
    for n, g in grads.items():
        c = thresholds.max_grad_norm
        norm = total
        if thresholds.per_parameter is not None:
            c, norm = thresholds.per_parameter[n], sq[n].sqrt()
        coef = (c / (norm + 1e-6)).clamp(max=1.0)
        out[n] = torch.tensordot(coef, g, dims=1)
    return out


MODES = {"ghost": GhostClipping, "per_sample": PerSampleClipping}


def _assert_refused(case: Case, mode: str, expected: str) -> None:
    torch.manual_seed(0)
    model, inputs, y = case.build()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    with pytest.raises(DPSGDError) as caught:
        MODES[mode](model, _loss, ClipThresholds(1.0, names)).clip(inputs, y)
    message = str(caught.value)
    assert "\n" not in message, message
    assert re.search(expected, message), message


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_layer_battery(case: Case, mode: str) -> None:
    expected = case.ghost if mode == "ghost" else case.per_sample
    if expected != EXACT:
        _assert_refused(case, mode, expected)
        return
    torch.manual_seed(0)
    model, inputs, y = case.build()
    grads = _brute_force(model, inputs, y)
    names = list(grads)
    norms = torch.stack([g.flatten(1).square().sum(1) for g in grads.values()]).sum(0).sqrt()
    assert bool((norms > 0).all())
    flat_c = float(norms.median())  # some examples clipped, some not
    for thresholds in (
        ClipThresholds(flat_c, names),
        ClipThresholds(flat_c, names, split_threshold(names, flat_c)),
    ):
        clipper = MODES[mode](model, _loss, thresholds)
        if mode == "ghost" and case.rule:
            kinds = {type(layer.module): layer.fallback for layer in clipper.layers}
            assert kinds[case.layer_type] is False, "the layer's rule was not used"
        result = clipper.clip(inputs, y)
        torch.testing.assert_close(result.norms, norms, rtol=1e-6, atol=1e-9)
        want = _clipped(grads, thresholds)
        assert set(result.grad_sum) == set(want)
        for n in names:
            torch.testing.assert_close(result.grad_sum[n], want[n], rtol=1e-6, atol=1e-9)


def test_every_registered_layer_type_has_an_exact_battery_case() -> None:
    covered = {c.layer_type for c in CASES if c.ghost == EXACT and c.rule}
    missing = [t.__name__ for t in registered_layer_types() if t not in covered]
    assert not missing, f"registered layer types without a battery case: {missing}"


def test_the_battery_fails_on_a_wrong_clipped_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is not vacuous: a rule whose clipped sum is off by 1% fails it."""
    from privacylab.training.dp.ghost import rules_embedding

    original = rules_embedding.KeyedRowGradients.clipped_sum

    def off(self, coef, out):  # type: ignore[no-untyped-def]
        original(self, {n: c * 1.01 for n, c in coef.items()}, out)

    monkeypatch.setattr(rules_embedding.KeyedRowGradients, "clipped_sum", off)
    case = next(c for c in CASES if c.id == "bag-mean")
    with pytest.raises(AssertionError):
        test_layer_battery(case, "ghost")


def test_the_battery_fails_on_a_wrong_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    """... and so does a norm that is off (the conv rule read along a flipped axis)."""
    from privacylab.training.dp.ghost import rules_conv

    original = rules_conv.ConvGradients._unfolded

    def flipped(self, call):  # type: ignore[no-untyped-def]
        u = original(self, call)
        return rules_conv._Unfolded(u.source.flip(-1), u.other, u.padding)

    monkeypatch.setattr(rules_conv.ConvGradients, "_unfolded", flipped)
    case = next(c for c in CASES if c.id == "conv1d-stride-dilation")
    with pytest.raises(AssertionError):
        test_layer_battery(case, "ghost")


def test_nothing_here_silently_mixes_dtypes() -> None:
    """The battery runs in float64 (a float32 model would hide errors below 1e-6)."""
    torch.manual_seed(0)
    for case in CASES:
        model, inputs, _ = case.build()
        assert all(p.dtype == torch.float64 for p in model.parameters()), case.id
        assert all(x.dtype in (torch.float64, torch.int64) for x in inputs), case.id
