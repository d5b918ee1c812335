"""DP drop-ins for nn.LSTM/GRU/RNN and nn.MultiheadAttention (issue 11, must build 2).

Two oracles: the stock modules themselves (outputs equal in float64 once the stock weights are
loaded), and a float64 brute-force loop of per-example autograd gradients (per-example norms
and clipped sums of ghost clipping equal to it, also for sequence-first inputs with T == B)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from privacylab.training.dp import (
    DPSGD,
    ClipThresholds,
    DPSGDError,
    GhostClipping,
    PerSampleClipping,
)
from privacylab.training.dp.modules import DPGRU, DPLSTM, DPRNN, DPMultiheadAttention

F64 = torch.float64
C = 0.3

RECURRENT = [
    (nn.LSTM, DPLSTM, {}),
    (nn.GRU, DPGRU, {}),
    (nn.RNN, DPRNN, {}),
    (nn.RNN, DPRNN, {"nonlinearity": "relu"}),
]
RECURRENT_IDS = ["lstm", "gru", "rnn-tanh", "rnn-relu"]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _flat(result: tuple) -> list[Tensor]:
    out, state = result
    return [out, *(state if isinstance(state, tuple) else (state,))]


def _initial(stock: type[nn.Module], layers: int, batch: int, hidden: int) -> object:
    h = torch.randn(layers, batch, hidden, dtype=F64)
    return (h, torch.randn_like(h)) if stock is nn.LSTM else h


@pytest.mark.parametrize(("stock_type", "dp_type", "extra"), RECURRENT, ids=RECURRENT_IDS)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize(
    ("layers", "bidirectional", "bias"), [(1, False, True), (2, True, True), (2, False, False)]
)
def test_recurrent_outputs_equal_the_stock_module(
    stock_type, dp_type, extra, batch_first, layers, bidirectional, bias
):
    stock = stock_type(
        3, 4, num_layers=layers, bias=bias, batch_first=batch_first,
        bidirectional=bidirectional, **extra,
    ).double()  # fmt: skip
    dp = dp_type.from_module(stock)
    batch, steps = 2, 5
    x = torch.randn(batch, steps, 3, dtype=F64)
    if not batch_first:
        x = x.transpose(0, 1).contiguous()
    hx = _initial(stock_type, layers * (2 if bidirectional else 1), batch, 4)
    for args in [(x,), (x, hx)]:
        got, want = _flat(dp(*args)), _flat(stock(*args))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    unbatched = x[:, 0] if not batch_first else x[0]
    for g, w in zip(_flat(dp(unbatched)), _flat(stock(unbatched)), strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("stock_type", "dp_type", "extra"), RECURRENT, ids=RECURRENT_IDS)
def test_a_stock_state_dict_loads_into_the_drop_in(stock_type, dp_type, extra):
    stock = stock_type(3, 4, num_layers=2, bidirectional=True, **extra)
    dp = dp_type(3, 4, num_layers=2, bidirectional=True, **extra)
    dp.load_state_dict(stock.state_dict())  # strict: every key renamed and used
    x = torch.randn(6, 2, 3)
    for g, w in zip(_flat(dp(x)), _flat(stock(x)), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    owners = [m for m in dp.modules() if list(m.parameters(recurse=False))]
    assert owners and all(type(m) is nn.Linear for m in owners)


def test_from_module_keeps_frozen_weights_mode_and_dtype():
    stock = nn.LSTM(3, 4, num_layers=2).double().eval()
    stock.weight_hh_l1.requires_grad_(False)
    dp = DPLSTM.from_module(stock)
    frozen = [n for n, p in dp.named_parameters() if not p.requires_grad]
    assert frozen == ["l1.hh.weight"]
    assert not dp.training and all(p.dtype == F64 for p in dp.parameters())
    with pytest.raises(DPSGDError, match=r"needs an nn\.LSTM"):
        DPLSTM.from_module(nn.GRU(3, 4))


def test_dropout_acts_between_layers_in_training_only():
    dp = DPGRU(3, 4, num_layers=2, dropout=0.5).double()
    x = torch.randn(5, 2, 3, dtype=F64)
    dp.eval()
    eval_out = dp(x)[0]
    torch.testing.assert_close(dp(x)[0], eval_out)
    dp.train()
    assert not torch.allclose(dp(x)[0], eval_out)
    stock = nn.GRU(3, 4, num_layers=2, dropout=0.5).double().eval()
    torch.testing.assert_close(DPGRU.from_module(stock)(x)[0], stock(x)[0])


@pytest.mark.parametrize(("stock_type", "dp_type", "extra"), RECURRENT, ids=RECURRENT_IDS)
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_packed_sequences_equal_the_stock_module(stock_type, dp_type, extra, enforce_sorted):
    stock = stock_type(3, 5, num_layers=2, bidirectional=True, batch_first=True, **extra).double()
    dp = dp_type.from_module(stock)
    x = torch.randn(4, 6, 3, dtype=F64)
    lengths = [6, 4, 4, 1] if enforce_sorted else [3, 6, 1, 4]
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=enforce_sorted)
    for args in [(packed,), (packed, _initial(stock_type, 4, 4, 5))]:
        got, want = dp(*args), stock(*args)
        assert isinstance(got[0], PackedSequence)
        assert torch.equal(got[0].batch_sizes, want[0].batch_sizes)
        for name in ("sorted_indices", "unsorted_indices"):
            mine, theirs = getattr(got[0], name), getattr(want[0], name)
            assert (mine is None and theirs is None) or torch.equal(mine, theirs)
        torch.testing.assert_close(got[0].data, want[0].data, rtol=1e-10, atol=1e-12)
        for g, w in zip(_flat(got)[1:], _flat(want)[1:], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("batch_first", [False, True])
def test_lstm_with_projection_equals_the_stock_module(batch_first):
    stock = nn.LSTM(3, 5, num_layers=2, bidirectional=True, proj_size=2,
                    batch_first=batch_first).double()  # fmt: skip
    dp = DPLSTM.from_module(stock)
    assert {n for n, _ in dp.named_parameters() if ".hr." in n} == {
        "l0.hr.weight", "l0_reverse.hr.weight", "l1.hr.weight", "l1_reverse.hr.weight",
    }  # fmt: skip
    x = torch.randn(4, 6, 3, dtype=F64)  # (B, T, d) or (T, B, d): B = 6 sequence-first
    batch = 4 if batch_first else 6
    h0, c0 = torch.randn(4, batch, 2, dtype=F64), torch.randn(4, batch, 5, dtype=F64)
    for args in [(x,), (x, (h0, c0))]:
        for g, w in zip(_flat(dp(*args)), _flat(stock(*args)), strict=True):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: DPGRU(3, 4, proj_size=2), "has no proj_size"),
        (lambda: DPLSTM(3, 4, proj_size=4), "must be smaller than hidden_size"),
        (lambda: DPRNN(3, 4, nonlinearity="gelu"), "nonlinearity must be"),
        (lambda: DPGRU(3, 0), "hidden_size must be"),
        (lambda: DPGRU(3, 4)(torch.randn(2, 3, 4, 3)), "2-D or 3-D input"),
        (lambda: DPGRU(3, 4)(torch.randn(4, 2, 5)), "input_size=3"),
        (lambda: DPGRU(3, 4)(torch.randn(4, 2, 3), torch.randn(2, 2, 4)), r"hx of shape"),
        (lambda: DPLSTM(3, 4)(torch.randn(4, 2, 3), torch.randn(1, 2, 4)), "pair"),
        (
            lambda: DPMultiheadAttention(8, 2)(
                torch.randn(3, 8), torch.randn(4, 8), torch.randn(5, 8)
            ),
            "do not match",
        ),
        (
            lambda: DPMultiheadAttention(8, 2)(
                torch.randn(3, 2, 8),
                torch.randn(4, 2, 8),
                torch.randn(4, 2, 8),
                attn_mask=torch.zeros(3, 5),
            ),
            "attn_mask must be",
        ),
        (lambda: DPMultiheadAttention(8, 3), "not divisible"),
    ],
)
def test_unsupported_uses_are_refused_in_one_line(make, message):
    with pytest.raises(DPSGDError, match=message) as info:
        make()
    assert "\n" not in str(info.value)


def _mha_inputs(batch_first: bool, kdim: int, batch: int = 3, target: int = 4, source: int = 5):
    q = torch.randn(batch, target, 8, dtype=F64)
    k = torch.randn(batch, source, kdim, dtype=F64)
    v = torch.randn(batch, source, kdim, dtype=F64)
    if not batch_first:
        q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))
    return q, k, v


def _mask_cases(batch: int = 3, heads: int = 2, target: int = 4, source: int = 5):
    padding = torch.zeros(batch, source, dtype=torch.bool)
    padding[0, -2:] = True
    causal_like = torch.ones(target, source, dtype=torch.bool).triu(2)
    return [
        {},
        {"key_padding_mask": padding},
        {"key_padding_mask": padding.to(F64) * -3.0},
        {"attn_mask": torch.randn(target, source, dtype=F64)},
        {"attn_mask": causal_like, "key_padding_mask": padding},
        {"attn_mask": torch.randn(batch * heads, target, source, dtype=F64)},
        {"average_attn_weights": False, "key_padding_mask": padding},
        {"need_weights": False, "attn_mask": causal_like},
    ]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize(
    ("kdim", "bias", "zero_attn", "bias_kv"),
    [
        (8, True, False, False),
        (5, True, True, False),
        (8, False, False, True),
        (5, True, True, True),
    ],
)
def test_attention_equals_the_stock_module(batch_first, kdim, bias, zero_attn, bias_kv):
    stock = nn.MultiheadAttention(
        8, 2, bias=bias, add_bias_kv=bias_kv, add_zero_attn=zero_attn, kdim=kdim, vdim=kdim,
        batch_first=batch_first,
    ).double()  # fmt: skip
    dp = DPMultiheadAttention.from_module(stock)
    q, k, v = _mha_inputs(batch_first, kdim)
    cases = [((q, k, v), _mask_cases(source=5))]  # cross-attention, L = 4, S = 5
    if kdim == 8:
        cases.append(((q, q, q), _mask_cases(source=4)))  # self-attention
    for args, masks in cases:
        for kwargs in masks:
            got, want = dp(*args, **kwargs), stock(*args, **kwargs)
            torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-12)
            if want[1] is None:
                assert got[1] is None
            else:
                assert got[1].shape == want[1].shape
                torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-12)


def test_attention_self_unbatched_and_causal_hint_equal_the_stock_module():
    stock = nn.MultiheadAttention(8, 2, batch_first=True).double()
    dp = DPMultiheadAttention.from_module(stock)
    x = torch.randn(3, 4, 8, dtype=F64)
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    for args, kwargs in [
        ((x, x, x), {}),
        ((x[0], x[0], x[0]), {"average_attn_weights": False}),
        ((x, x, x), {"attn_mask": causal, "is_causal": True}),
    ]:
        got, want = dp(*args, **kwargs), stock(*args, **kwargs)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    # The drop-in builds the causal mask itself when only the hint is given.
    torch.testing.assert_close(dp(x, x, x, is_causal=True)[0], stock(x, x, x, attn_mask=causal)[0])


def test_attention_from_module_keeps_frozen_projections():
    stock = nn.MultiheadAttention(8, 2, kdim=5, vdim=6)
    stock.k_proj_weight.requires_grad_(False)
    stock.out_proj.bias.requires_grad_(False)
    dp = DPMultiheadAttention.from_module(stock)
    frozen = sorted(n for n, p in dp.named_parameters() if not p.requires_grad)
    assert frozen == ["k_proj.weight", "out_proj.bias"]
    torch.testing.assert_close(dp.v_proj.weight, stock.v_proj_weight)
    torch.testing.assert_close(dp.q_proj.bias, stock.in_proj_bias[:8])


# --- ghost clipping on models made of the drop-ins, against a brute-force loop -------------


class RecurrentClassifier(nn.Module):
    """Takes (B, T, d); feeds the recurrent layer sequence-first unless it is batch_first."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn
        width = getattr(rnn, "proj_size", 0) or rnn.hidden_size
        self.head = nn.Linear(width * (2 if rnn.bidirectional else 1), 3)

    def forward(self, x: Tensor) -> Tensor:
        if not self.rnn.batch_first:
            x = x.transpose(0, 1)
        out = self.rnn(x)[0]
        if not self.rnn.batch_first:
            out = out.transpose(0, 1)
        return self.head(out.mean(1))


class LengthsClassifier(nn.Module):
    """Takes padded (B, T, d) and lengths (B,); reads h_n of a batch-first recurrent layer,
    run on a PackedSequence (``packed=True``) or on the padded batch with ``lengths=``."""

    def __init__(self, rnn: nn.Module, packed: bool) -> None:
        super().__init__()
        self.rnn = rnn
        self.packed = packed
        self.head = nn.Linear(rnn.num_layers * 2 * (rnn.proj_size or rnn.hidden_size), 3)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        if self.packed:
            packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            state = self.rnn(packed)[1]
        else:
            state = self.rnn(x, lengths=lengths)[1]
        h_n = state[0] if isinstance(state, tuple) else state
        return self.head(h_n.transpose(0, 1).flatten(1))


class AttentionClassifier(nn.Module):
    """Embedding, (self- or cross-) attention with a padding mask, mean pooling, head."""

    def __init__(self, batch_first: bool, cross: bool, bias_kv: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 8)
        self.attn = DPMultiheadAttention(8, 2, kdim=3 if cross else None, vdim=3 if cross else None,
                                         batch_first=batch_first, add_bias_kv=bias_kv,
                                         add_zero_attn=bias_kv)  # fmt: skip
        self.head = nn.Linear(8, 3)
        self.cross = cross

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        keys = x if self.cross else h
        mask = x[..., 0] > 1.0  # a padding mask derived from each example itself
        mask[:, 0] = False
        if not self.attn.batch_first:
            h, keys = h.transpose(0, 1), keys.transpose(0, 1)
        out = self.attn(h, keys, keys, key_padding_mask=mask)[0]
        if not self.attn.batch_first:
            out = out.transpose(0, 1)
        return self.head(out.mean(1))


def _loss(out: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(out, y, reduction="none")


def _brute_force(model: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-example gradient norms and Σ_i min(1, C/(‖g_i‖+1e-6)) g_i, one example at a time."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    norms, total = [], {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(x.shape[0]):
        grads = torch.autograd.grad(
            _loss(model(x[i : i + 1]), y[i : i + 1]).sum(), list(params.values())
        )
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        norms.append(norm)
        for name, g in zip(params, grads, strict=True):
            total[name] += (C / (norm + 1e-6)).clamp(max=1.0) * g
    return torch.stack(norms), total


def _ghost(model: nn.Module, x: Tensor, y: Tensor):
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return GhostClipping(model, _loss, ClipThresholds(C, names)).clip((x,), y)


def _per_sample(model: nn.Module, x: Tensor, y: Tensor):
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return PerSampleClipping(model, _loss, ClipThresholds(C, names)).clip((x,), y)


MODELS = {
    "lstm-seq-first-T=B-2layer-bi": lambda: RecurrentClassifier(
        DPLSTM(3, 4, num_layers=2, bidirectional=True)
    ),
    "lstm-batch-first": lambda: RecurrentClassifier(DPLSTM(3, 4, batch_first=True)),
    "gru-seq-first-T=B-bi": lambda: RecurrentClassifier(DPGRU(3, 4, bidirectional=True)),
    "gru-batch-first-2layer": lambda: RecurrentClassifier(
        DPGRU(3, 4, num_layers=2, batch_first=True)
    ),
    "rnn-tanh-seq-first-T=B": lambda: RecurrentClassifier(DPRNN(3, 4, num_layers=2)),
    "rnn-relu-batch-first-bi": lambda: RecurrentClassifier(
        DPRNN(3, 4, nonlinearity="relu", batch_first=True, bidirectional=True)
    ),
    "mha-self-seq-first-L=B": lambda: AttentionClassifier(batch_first=False, cross=False),
    "mha-cross-batch-first": lambda: AttentionClassifier(batch_first=True, cross=True),
    "mha-bias-kv-zero-attn-seq-first": lambda: AttentionClassifier(False, True, bias_kv=True),
    "lstm-proj-seq-first-T=B": lambda: RecurrentClassifier(
        DPLSTM(3, 5, num_layers=2, bidirectional=True, proj_size=2)
    ),
}


@pytest.mark.parametrize("clip", [_ghost, _per_sample], ids=["ghost", "per_sample"])
@pytest.mark.parametrize("name", list(MODELS))
def test_clipping_equals_a_brute_force_loop(name, clip):
    model = MODELS[name]().double()
    batch = 4
    x = torch.randn(batch, 4, 3, dtype=F64)  # T (or L) == B: dimension 0 only by provenance
    y = torch.randint(0, 3, (batch,))
    result = clip(model, x, y)
    norms, total = _brute_force(model, x, y)
    assert (norms > C).any() and (norms < 10 * C).all()  # some examples are really clipped
    torch.testing.assert_close(result.norms, norms, rtol=1e-9, atol=1e-12)
    assert set(result.grad_sum) == set(total)
    for key, want in total.items():
        torch.testing.assert_close(result.grad_sum[key], want, rtol=1e-9, atol=1e-12)


def _brute_force_alone(model: nn.Module, x: Tensor, lengths: Tensor, y: Tensor):
    """The brute-force loop with each example alone, cut to its own length (no padding)."""
    params = dict(model.named_parameters())
    norms, total = [], {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(x.shape[0]):
        alone = x[i : i + 1, : lengths[i]]
        loss = _loss(model(alone, lengths[i : i + 1]), y[i : i + 1]).sum()
        grads = torch.autograd.grad(loss, list(params.values()))
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        norms.append(norm)
        for name, g in zip(params, grads, strict=True):
            total[name] += (C / (norm + 1e-6)).clamp(max=1.0) * g
    return torch.stack(norms), total


RNNS_WITH_LENGTHS = {
    "gru-2layer-bi": lambda: DPGRU(3, 4, num_layers=2, bidirectional=True, batch_first=True),
    "lstm-proj-bi": lambda: DPLSTM(3, 5, bidirectional=True, batch_first=True, proj_size=2),
}


@pytest.mark.parametrize("clip", [GhostClipping, PerSampleClipping], ids=["ghost", "per_sample"])
@pytest.mark.parametrize("name", list(RNNS_WITH_LENGTHS))
def test_clipping_with_lengths_equals_each_example_alone_without_padding(name, clip):
    model = LengthsClassifier(RNNS_WITH_LENGTHS[name](), packed=False).double()
    x, y = torch.randn(4, 5, 3, dtype=F64), torch.randint(0, 3, (4,))
    lengths = torch.tensor([2, 5, 1, 3])
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    result = clip(model, _loss, ClipThresholds(C, names)).clip((x, lengths), y)
    norms, total = _brute_force_alone(model, x, lengths, y)
    torch.testing.assert_close(result.norms, norms, rtol=1e-9, atol=1e-12)
    for key, want in total.items():
        torch.testing.assert_close(result.grad_sum[key], want, rtol=1e-9, atol=1e-12)


def test_lengths_give_the_packed_sequence_results():
    stock = nn.LSTM(3, 5, num_layers=2, bidirectional=True, batch_first=True).double()
    dp = DPLSTM.from_module(stock)
    x, lengths = torch.randn(4, 6, 3, dtype=F64), torch.tensor([3, 6, 1, 4])
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    want_out, want_state = stock(packed)
    want_padded, _ = pad_packed_sequence(want_out, batch_first=True)
    got_out, got_state = dp(x, lengths=lengths)
    torch.testing.assert_close(got_out, want_padded, rtol=1e-10, atol=1e-12)
    for g, w in zip(got_state, want_state, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    for bad in (torch.tensor([3, 7, 1, 4]), torch.tensor([0, 6, 1, 4]), torch.ones(4), [1, 2]):
        with pytest.raises(DPSGDError, match="lengths must") as info:
            dp(x, lengths=bad)
        assert "\n" not in str(info.value)


def test_packed_input_under_ghost_clipping_is_exact_or_refused_in_one_line():
    """A PackedSequence has as many steps as the batch's longest sequence, so ghost clipping's
    probe on 1 and 2 examples may see different layer calls: never silently wrong."""
    model = LengthsClassifier(DPGRU(3, 4, bidirectional=True, batch_first=True), True).double()
    x, y = torch.randn(4, 5, 3, dtype=F64), torch.randint(0, 3, (4,))
    compared = 0
    for lengths in (torch.tensor([2, 5, 1, 3]), torch.tensor([5, 5, 2, 3])):
        names = [n for n, p in model.named_parameters()]
        try:
            result = GhostClipping(model, _loss, ClipThresholds(C, names)).clip((x, lengths), y)
        except DPSGDError as error:
            assert "\n" not in str(error)
            continue
        norms, total = _brute_force_alone(model, x, lengths, y)
        torch.testing.assert_close(result.norms, norms, rtol=1e-9, atol=1e-12)
        for key, want in total.items():
            torch.testing.assert_close(result.grad_sum[key], want, rtol=1e-9, atol=1e-12)
        compared += 1
    assert compared >= 1  # the longest sequence first: the probe sees the batch's steps


def test_ghost_with_frozen_and_per_layer_thresholds_on_a_drop_in():
    model = RecurrentClassifier(DPLSTM(3, 4, bidirectional=True)).double()
    model.rnn.l0.ih.bias.requires_grad_(False)
    x, y = torch.randn(5, 3, 3, dtype=F64), torch.randint(0, 3, (5,))
    result = _ghost(model, x, y)
    norms, total = _brute_force(model, x, y)
    assert "rnn.l0.ih.bias" not in result.grad_sum
    torch.testing.assert_close(result.norms, norms, rtol=1e-9, atol=1e-12)
    for key, want in total.items():
        torch.testing.assert_close(result.grad_sum[key], want, rtol=1e-9, atol=1e-12)


def test_one_dpsgd_step_with_ghost_clipping_matches_the_brute_force_update():
    model = RecurrentClassifier(DPGRU(3, 4, bidirectional=True)).double()
    reference = copy.deepcopy(model)
    x, y = torch.randn(6, 6, 3, dtype=F64), torch.randint(0, 3, (6,))
    engine = DPSGD(
        model, torch.optim.SGD(model.parameters(), lr=1.0), _loss, noise_multiplier=0.0,
        max_grad_norm=C, expected_batch_size=6, clipping="ghost",
    )  # fmt: skip
    engine.step((x,), y)
    assert engine.clipping == "ghost"
    _, total = _brute_force(reference, x, y)
    for (name, before), after in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(after - before, -total[name] / 6, rtol=1e-9, atol=1e-12)


def test_the_stock_gru_is_not_clipped_by_ghost_but_its_drop_in_is():
    stock = RecurrentClassifier(nn.GRU(3, 4)).double()
    x, y = torch.randn(3, 4, 3, dtype=F64), torch.randint(0, 3, (3,))
    with pytest.raises(DPSGDError):
        _ghost(stock, x, y)
    dropin = copy.deepcopy(stock)
    dropin.rnn = DPGRU.from_module(stock.rnn)
    torch.testing.assert_close(dropin(x), stock(x))
    norms, _ = _brute_force(stock, x, y)  # same function, same parameters: same gradients
    torch.testing.assert_close(_ghost(dropin, x, y).norms, norms, rtol=1e-9, atol=1e-12)
