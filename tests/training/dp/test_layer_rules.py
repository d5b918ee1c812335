"""Ghost rules of convolutions, EmbeddingBag, InstanceNorm and Embedding against a brute force.

Each case calls one layer once or twice on a batch; the per-example loss is
L_i = Σ_k ⟨layer(args_k)_i, G_k,i⟩ for random G_k, so the output gradient of call k is G_k and
the per-example gradients are those of a loop of ``torch.autograd.grad`` over single examples
(float64).  The rule's squared norms and its clipped sum Σ_i c_i ∇L_i (random c) are compared
with that loop.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from privacylab.training.dp import GhostClippingError
from privacylab.training.dp.ghost import LayerCall, rule_for
from privacylab.training.dp.ghost.rules import instantiate

B = 3
Args = tuple[tuple, dict]
CallFn = Callable[[slice], Args]


def _sliced(x: Tensor) -> CallFn:
    return lambda s: ((x[s],), {})


def _oracle(layer: nn.Module, calls: list[CallFn], grads: list[Tensor], names: list[str]):
    params = [getattr(layer, n) for n in names]
    rows = []
    for i in range(B):
        s = slice(i, i + 1)
        loss = sum(
            (layer(*args, **kwargs) * g[s]).sum()
            for (args, kwargs), g in zip((c(s) for c in calls), grads, strict=True)
        )
        found = torch.autograd.grad(loss, params)
        rows.append([g.to_dense() if g.is_sparse else g for g in found])
    return {n: torch.stack([r[k] for r in rows]) for k, n in enumerate(names)}


def _strided_full(like: Tensor, value: float) -> Tensor:
    """A buffer shaped like ``like`` but not contiguous (dimensions stored in reverse order)."""
    dims = tuple(reversed(range(like.dim())))
    return torch.full(like.shape[::-1], value, dtype=like.dtype).permute(dims)


def check_rule(
    layer: nn.Module, calls: list[CallFn], trainable: tuple[str, ...] | None = None
) -> None:
    """Norms and clipped sums of the registered rule equal the brute-force loop."""
    layer = layer.double()
    registered = rule_for(layer)
    assert registered is not None
    assert registered.check is None or registered.check(layer) is None
    names = list(trainable or [n for n, _ in layer.named_parameters()])
    torch.manual_seed(1)
    recorded, grads = [], []
    for call in calls:
        args, kwargs = call(slice(None))
        with torch.no_grad():
            out = layer(*args, **kwargs)
        g = torch.randn_like(out)
        grads.append(g)
        recorded.append(LayerCall(args[0], g, args, kwargs))
    want = _oracle(layer, calls, grads, names)
    state = registered.rule(layer, recorded, frozenset(names))
    norms = state.sq_norms()
    assert set(norms) == set(names)
    for n in names:
        expect = want[n].flatten(1).square().sum(1)
        torch.testing.assert_close(norms[n], expect, rtol=1e-9, atol=1e-12)
    coef = {n: torch.rand(B, dtype=torch.float64) for n in names}
    out = {n: _strided_full(getattr(layer, n), 0.5) for n in names}
    state.clipped_sum(coef, out)
    for n in names:
        expect = 0.5 + torch.tensordot(coef[n], want[n], dims=1)
        torch.testing.assert_close(out[n], expect, rtol=1e-9, atol=1e-12)


def _x(*shape: int) -> Tensor:
    return torch.randn(B, *shape, dtype=torch.float64)


CONVS = {
    "conv1d": lambda: (nn.Conv1d(3, 4, 3), _x(3, 9)),
    "conv1d-stride-dilation": lambda: (
        nn.Conv1d(2, 5, 3, stride=2, dilation=2, padding=1),
        _x(2, 11),
    ),
    "conv1d-valid": lambda: (nn.Conv1d(2, 3, 3, padding="valid", bias=False), _x(2, 5)),
    "conv3d-reflect-same": lambda: (
        nn.Conv3d(2, 2, 3, padding="same", padding_mode="reflect"),
        _x(2, 3, 3, 4),
    ),
    "conv1d-same": lambda: (nn.Conv1d(2, 3, 4, padding="same"), _x(2, 7)),
    "conv1d-reflect": lambda: (nn.Conv1d(2, 3, 3, padding=2, padding_mode="reflect"), _x(2, 6)),
    "conv1d-circular": lambda: (nn.Conv1d(2, 3, 3, padding=1, padding_mode="circular"), _x(2, 6)),
    "conv1d-groups": lambda: (nn.Conv1d(4, 6, 3, groups=2, stride=2), _x(4, 9)),
    "conv1d-depthwise": lambda: (nn.Conv1d(3, 6, 3, groups=3, padding=1), _x(3, 8)),
    "conv1d-wide-ghost": lambda: (nn.Conv1d(16, 16, 3, groups=2, padding=1), _x(16, 3)),
    "conv2d": lambda: (nn.Conv2d(2, 3, 3, stride=(2, 1), dilation=(1, 2)), _x(2, 7, 8)),
    "conv2d-groups": lambda: (nn.Conv2d(4, 6, (2, 3), groups=2, padding=1), _x(4, 5, 6)),
    "conv2d-depthwise": lambda: (nn.Conv2d(3, 3, 3, groups=3, stride=2), _x(3, 7, 7)),
    "conv2d-groups-replicate": lambda: (
        nn.Conv2d(4, 4, 3, groups=4, padding=1, padding_mode="replicate"),
        _x(4, 5, 5),
    ),
    "conv2d-groups-ghost": lambda: (nn.Conv2d(16, 16, 3, groups=2, padding=1), _x(16, 2, 2)),
    "conv3d": lambda: (nn.Conv3d(2, 3, 2, stride=(1, 2, 1), padding=1), _x(2, 3, 4, 4)),
    "conv3d-groups-dilation": lambda: (
        nn.Conv3d(4, 4, 2, groups=2, dilation=2, padding_mode="circular", padding=1),
        _x(4, 4, 4, 3),
    ),
    "conv-transpose1d": lambda: (nn.ConvTranspose1d(3, 2, 3, stride=2), _x(3, 5)),
    "conv-transpose1d-output-padding": lambda: (
        nn.ConvTranspose1d(2, 4, 3, stride=3, padding=1, output_padding=2, dilation=2, groups=2),
        _x(2, 5),
    ),
    "conv-transpose1d-ghost": lambda: (nn.ConvTranspose1d(16, 16, 3, groups=2), _x(16, 2)),
    "conv-transpose2d": lambda: (
        nn.ConvTranspose2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), groups=2),
        _x(4, 3, 4),
    ),
    "conv-transpose2d-depthwise": lambda: (
        nn.ConvTranspose2d(3, 3, 3, stride=2, groups=3, output_padding=1),
        _x(3, 3, 3),
    ),
    "conv-transpose3d": lambda: (
        nn.ConvTranspose3d(2, 2, 2, stride=2, padding=1, output_padding=(1, 0, 1)),
        _x(2, 2, 3, 2),
    ),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolution_rules_match_brute_force(name: str) -> None:
    torch.manual_seed(0)
    layer, x = CONVS[name]()
    check_rule(layer, [_sliced(x)])


@st.composite
def conv_configs(draw: st.DrawFn) -> tuple[nn.Module, Tensor]:
    """A random valid convolution (N = 1..3, transposed or not, groups, stride, dilation,
    padding and padding mode, output_padding) and an input for it."""
    n = draw(st.integers(1, 3))
    transposed = draw(st.booleans())
    groups = draw(st.integers(1, 3))
    c_in, c_out = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(n))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(n))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(n))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(n))
    size = tuple(
        d * (k - 1) + 3 + draw(st.integers(0, 3)) for k, d in zip(kernel, dilation, strict=True)
    )
    if n == 3:
        size = tuple(min(s, 4) for s in size)
    if transposed:
        output_padding = tuple(
            draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation, strict=True)
        )
        layer = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[n - 1](
            c_in, c_out, kernel, stride, padding, output_padding, groups, dilation=dilation
        )
        x = _x(c_in, *(max(1, s // 2) for s in size))
    else:
        mode = draw(st.sampled_from(["zeros", "reflect", "replicate", "circular"]))
        layer = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[n - 1](
            c_in, c_out, kernel, stride, padding, dilation, groups, padding_mode=mode
        )
        x = _x(c_in, *size)
    return layer, x


@settings(max_examples=40, deadline=None, derandomize=True)
@given(conv_configs())
def test_random_convolutions_match_brute_force(config: tuple[nn.Module, Tensor]) -> None:
    layer, x = config
    torch.manual_seed(0)
    try:
        with torch.no_grad():
            layer.double()(x)
    except RuntimeError:  # a configuration torch itself rejects (empty output)
        assume(False)
    check_rule(layer, [_sliced(x)])


@pytest.mark.parametrize("trainable", [("weight",), ("bias",)])
@pytest.mark.parametrize("name", ["conv1d-groups", "conv-transpose2d", "conv3d"])
def test_convolutions_with_a_frozen_parameter(name: str, trainable: tuple[str, ...]) -> None:
    torch.manual_seed(0)
    layer, x = CONVS[name]()
    check_rule(layer, [_sliced(x)], trainable)


@pytest.mark.parametrize("name", ["conv1d-groups", "conv-transpose1d-ghost", "conv2d-groups-ghost"])
def test_a_convolution_called_twice_sums_both_calls_per_example(name: str) -> None:
    torch.manual_seed(0)
    layer, x = CONVS[name]()
    other = torch.randn_like(x)[..., 1:]
    check_rule(layer, [_sliced(x), _sliced(other)])


@pytest.mark.parametrize("layer", [nn.Conv1d(3, 2, 2), nn.ConvTranspose1d(3, 2, 2)])
def test_a_convolution_on_unbatched_input_is_refused_in_one_line(layer: nn.Module) -> None:
    x = torch.randn(3, 5)
    rule = rule_for(layer)
    assert rule is not None
    with pytest.raises(GhostClippingError) as caught:
        rule.rule(layer, [LayerCall(x, layer(x).detach(), (x,), {})], frozenset({"weight"}))
    assert "\n" not in str(caught.value) and "unbatched" in str(caught.value)


def test_conv_transpose_with_output_size_argument() -> None:
    torch.manual_seed(0)
    layer = nn.ConvTranspose2d(2, 3, 3, stride=2)
    x = _x(2, 3, 3)
    check_rule(layer, [lambda s: ((x[s],), {"output_size": [8, 8]})])


def test_every_branch_of_the_convolution_rule_is_exercised() -> None:
    """The cases above cover ghost norm, GEMM instantiation and the depthwise offset products,
    for convolutions and transposed ones (else they would test less than they seem to)."""
    from privacylab.training.dp.ghost.rules_conv import SMALL_GROUP, ConvGradients

    def branch(name: str) -> str:
        layer, x = CONVS[name]()
        layer = layer.double()
        with torch.no_grad():
            out = layer(x)
        state = ConvGradients(layer, [LayerCall(x, out)], {"weight"})
        if not state.instantiated:
            return "ghost"
        return "offsets" if state.cg * state.p <= SMALL_GROUP else "gemm"

    transposed = {n for n in CONVS if n.startswith("conv-transpose")}
    assert {branch(n) for n in transposed} == {"ghost", "offsets", "gemm"}
    assert {branch(n) for n in set(CONVS) - transposed} == {"ghost", "offsets", "gemm"}
    assert instantiate(1, 9, 16)  # depthwise 3x3: always instantiated


def _tokens(vocab: int, *shape: int) -> Tensor:
    return torch.randint(0, vocab, (B, *shape))


BAGS = {
    "sum": lambda: (nn.EmbeddingBag(7, 4, mode="sum"), _tokens(3, 5)),
    "mean": lambda: (nn.EmbeddingBag(7, 4, mode="mean"), _tokens(3, 6)),
    "max": lambda: (nn.EmbeddingBag(7, 4, mode="max"), _tokens(4, 5)),
    "sum-padding": lambda: (nn.EmbeddingBag(6, 3, mode="sum", padding_idx=0), _tokens(3, 5)),
    "mean-padding": lambda: (nn.EmbeddingBag(6, 3, mode="mean", padding_idx=1), _tokens(3, 5)),
    "max-padding": lambda: (nn.EmbeddingBag(6, 3, mode="max", padding_idx=2), _tokens(4, 6)),
}


@pytest.mark.parametrize("name", sorted(BAGS))
def test_embedding_bag_rules_match_brute_force(name: str) -> None:
    torch.manual_seed(0)
    layer, tokens = BAGS[name]()
    tokens[0, :] = tokens[0, 0]  # one bag of a single repeated token
    check_rule(layer, [_sliced(tokens)])


def test_embedding_bag_with_per_sample_weights_and_padding() -> None:
    torch.manual_seed(0)
    layer = nn.EmbeddingBag(5, 3, mode="sum", padding_idx=4)
    tokens = _tokens(5, 6)
    tokens[1, :3] = 2
    weights = torch.randn(B, 6, dtype=torch.float64)
    check_rule(layer, [lambda s: ((tokens[s],), {"per_sample_weights": weights[s]})])
    check_rule(layer, [lambda s: ((tokens[s], None, weights[s]), {})])


def test_embedding_bag_used_twice_shares_rows_between_calls() -> None:
    torch.manual_seed(0)
    for mode in ("sum", "mean", "max"):
        layer = nn.EmbeddingBag(4, 3, mode=mode)
        first, second = _tokens(3, 4), _tokens(3, 2)
        check_rule(layer, [_sliced(first), _sliced(second)])


@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_1d_input_with_one_bag_per_example(include_last_offset: bool) -> None:
    torch.manual_seed(0)
    layer = nn.EmbeddingBag(6, 3, mode="mean", include_last_offset=include_last_offset)
    bags = [torch.randint(0, 6, (n,)) for n in (3, 1, 4)]

    def call(s: slice) -> Args:
        chosen = bags[s]
        offsets = torch.tensor([0] + [len(b) for b in chosen]).cumsum(0)
        if not include_last_offset:
            offsets = offsets[:-1]
        return (torch.cat(chosen), offsets), {}

    check_rule(layer, [call])


def test_embedding_bag_with_more_bags_than_examples_is_refused_in_one_line() -> None:
    layer = nn.EmbeddingBag(6, 3).double()
    tokens, offsets = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 3])
    out = layer(tokens, offsets)
    call = LayerCall(tokens, torch.ones_like(out)[:2], (tokens, offsets), {})
    rule = rule_for(layer)
    assert rule is not None
    with pytest.raises(GhostClippingError) as caught:
        rule.rule(layer, [call], frozenset({"weight"}))
    assert "\n" not in str(caught.value) and "not the batch" in str(caught.value)


@pytest.mark.parametrize(
    "layer, reason",
    [
        (nn.EmbeddingBag(5, 3, max_norm=1.0), "max_norm"),
        (nn.EmbeddingBag(5, 3, scale_grad_by_freq=True), "scale_grad_by_freq"),
        (nn.Embedding(5, 3, max_norm=1.0), "max_norm"),
    ],
)
def test_weight_rewriting_or_batch_counting_embeddings_are_refused(layer, reason) -> None:
    rule = rule_for(layer)
    assert rule is not None and rule.check is not None
    message = rule.check(layer)
    assert message is not None and reason in message and "\n" not in message


@pytest.mark.parametrize("sparse", [False, True])
def test_embedding_padding_idx_repeated_tokens_and_sparse(sparse: bool) -> None:
    torch.manual_seed(0)
    layer = nn.Embedding(6, 4, padding_idx=3, sparse=sparse)
    tokens = _tokens(6, 7)
    tokens[0, :4] = 3
    tokens[1, :5] = 2
    check_rule(layer, [_sliced(tokens), _sliced(tokens[:, :2])])


NORMS = {
    "instance1d": lambda: (nn.InstanceNorm1d(3, affine=True), _x(3, 6)),
    "instance2d": lambda: (nn.InstanceNorm2d(2, affine=True), _x(2, 4, 3)),
    "instance3d": lambda: (nn.InstanceNorm3d(2, affine=True, eps=1e-3), _x(2, 3, 2, 3)),
}


@pytest.mark.parametrize("name", sorted(NORMS))
def test_instance_norm_rules_match_brute_force(name: str) -> None:
    torch.manual_seed(0)
    layer, x = NORMS[name]()
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    check_rule(layer, [_sliced(x), _sliced(x.flip(0) * 2)])
    check_rule(layer, [_sliced(x)], ("weight",))


def test_instance_norm_in_eval_with_running_stats_uses_them() -> None:
    torch.manual_seed(0)
    layer = nn.InstanceNorm1d(3, affine=True, track_running_stats=True).double()
    with torch.no_grad():
        layer.running_mean.normal_()
        layer.running_var.uniform_(0.5, 2.0)
    layer.eval()
    check_rule(layer, [_sliced(_x(3, 5))])


def test_instance_norm_on_unbatched_input_is_refused_in_one_line() -> None:
    layer = nn.InstanceNorm1d(3, affine=True).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    rule = rule_for(layer)
    assert rule is not None
    with pytest.raises(GhostClippingError) as caught:
        rule.rule(layer, [LayerCall(x, layer(x).detach(), (x,), {})], frozenset({"weight"}))
    assert "\n" not in str(caught.value) and "unbatched" in str(caught.value)


def test_a_wrong_rule_is_caught_by_the_oracle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness fails on a rule that is off: patches taken from the input flipped in time."""
    from privacylab.training.dp.ghost import rules_conv

    original = rules_conv.ConvGradients._unfolded

    def flipped(self, call: LayerCall):  # type: ignore[no-untyped-def]
        u = original(self, call)
        return rules_conv._Unfolded(u.source.flip(-1), u.other, u.padding)

    monkeypatch.setattr(rules_conv.ConvGradients, "_unfolded", flipped)
    torch.manual_seed(0)
    layer, x = CONVS["conv1d"]()
    with pytest.raises(AssertionError):
        check_rule(layer, [_sliced(x)], ("weight",))
