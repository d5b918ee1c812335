"""Model validator: findings for every problem family, a fixed copy that trains under ghost
clipping with the brute-force per-example result, the user's model untouched."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.training.dp import DPSGD, ClipThresholds, DPSGDError, GhostClipping
from privacylab.training.dp.modules import DPLSTM, DPMultiheadAttention
from privacylab.training.dp.validate import Finding, describe, fix, group_count, validate

F64 = torch.float64
C = 0.4


class Everything(nn.Module):
    """Conv + BatchNorm2d, InstanceNorm with running stats, sparse Embedding, LSTM, attention."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 12, 3, padding=1)
        self.bn = nn.BatchNorm2d(12)
        self.inorm = nn.InstanceNorm1d(12, track_running_stats=True)
        self.embed = nn.Embedding(10, 6, sparse=True)
        self.rnn = nn.LSTM(12 + 6, 8, num_layers=2, bidirectional=True)
        self.attn = nn.MultiheadAttention(16, 2)
        self.bn1 = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 3)

    def forward(self, image: Tensor) -> Tensor:
        h = F.relu(self.bn(self.conv(image)))  # (B, 12, 4, 4)
        seq = self.inorm(h.flatten(2))  # (B, 12, 16)
        tokens = (image.flatten(1) > 0).long() * 3 + torch.arange(16) % 3  # (B, 16) per example
        seq = torch.cat([seq.transpose(1, 2), self.embed(tokens)], 2)  # (B, T=16, 18)
        out = self.rnn(seq.transpose(0, 1))[0]  # sequence-first (T, B, 16)
        out = self.attn(out, out, out)[0].mean(0)  # (B, 16)
        return self.head(F.relu(self.bn1(out)))


def _everything() -> nn.Module:
    torch.manual_seed(0)
    model = Everything().double()
    with torch.no_grad():  # non-trivial running statistics and affine parameters to carry over
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.running_mean.uniform_(-1, 1)
    return model


def _loss(out: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(out, y, reduction="none")


def test_every_problem_is_found_with_its_fix():
    findings = {f.path: f for f in validate(_everything()) if f.blocking}
    assert set(findings) == {"bn", "inorm", "embed", "rnn", "attn", "bn1"}
    assert all(f.blocking and f.fix is not None for f in findings.values())
    assert findings["bn"].module_type == "BatchNorm2d"
    assert "GroupNorm(4, 12)" in findings["bn"].fix and "Wu & He 2018" in findings["bn"].fix
    assert "GroupNorm(1, 16)" in findings["bn1"].fix
    assert "track_running_stats=False" in findings["inorm"].fix
    assert "sparse=False" in findings["embed"].fix
    assert "DPLSTM" in findings["rnn"].fix and "DPMultiheadAttention" in findings["attn"].fix
    text = describe(list(findings.values()))
    assert len(text.splitlines()) == 6
    assert "'bn' (BatchNorm2d): normalises with batch statistics" in text


def test_group_count_is_gcd_of_32_and_channels_with_positions_else_one():
    assert [group_count(c) for c in (3, 12, 16, 48, 64, 96)] == [1, 4, 16, 16, 32, 32]
    assert group_count(16, positions=False) == 1
    fixed = fix(nn.Sequential(nn.Linear(3, 16), nn.BatchNorm1d(16), nn.Linear(16, 2)))
    assert fixed[1].num_groups == 1  # 16 groups of one feature would output the bias only
    assert fixed[1](torch.randn(4, 16)).std() > 0.5


def test_fix_returns_a_copy_that_trains_with_ghost_clipping_exactly():
    model = _everything()
    before = copy.deepcopy(model.state_dict())
    fixed = fix(model)
    # The user's model is untouched.
    assert type(model.rnn) is nn.LSTM and type(model.bn) is nn.BatchNorm2d
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [f for f in validate(fixed) if f.blocking] == []
    assert type(fixed.bn) is nn.GroupNorm and fixed.bn.num_groups == 4
    torch.testing.assert_close(fixed.bn.weight, model.bn.weight)
    assert not fixed.inorm.track_running_stats and not fixed.embed.sparse
    assert type(fixed.rnn) is DPLSTM and type(fixed.attn) is DPMultiheadAttention
    assert not {id(p) for p in fixed.parameters()} & {id(p) for p in model.parameters()}

    x, y = torch.randn(5, 1, 4, 4, dtype=F64), torch.randint(0, 3, (5,))
    names = [n for n, p in fixed.named_parameters() if p.requires_grad]
    result = GhostClipping(fixed, _loss, ClipThresholds(C, names)).clip((x,), y)
    params = dict(fixed.named_parameters())
    for i in range(x.shape[0]):  # brute-force per-example oracle on the fixed model
        grads = torch.autograd.grad(
            _loss(fixed(x[i : i + 1]), y[i : i + 1]).sum(), list(params.values())
        )
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        torch.testing.assert_close(result.norms[i], norm, rtol=1e-9, atol=1e-12)
        for name, g in zip(params, grads, strict=True):
            result.grad_sum[name] -= (C / (norm + 1e-6)).clamp(max=1.0) * g
    assert max(float(v.abs().max()) for v in result.grad_sum.values()) < 1e-10

    engine = DPSGD(
        fixed, torch.optim.SGD(fixed.parameters(), lr=0.1), _loss, noise_multiplier=1.0,
        max_grad_norm=C, expected_batch_size=5, clipping="ghost",
    )  # fmt: skip
    step = engine.step((x,), y)
    assert engine.clipping == "ghost" and step.batch_size == 5
    with pytest.raises(DPSGDError, match="batch statistics"):
        DPSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), _loss,
              noise_multiplier=1.0, max_grad_norm=C, expected_batch_size=5)  # fmt: skip


def test_fixed_recurrent_and_attention_layers_compute_the_same_outputs():
    model = _everything().eval()
    fixed = fix(model)
    seq = torch.randn(7, 3, 18, dtype=F64)
    for got, want in zip(fixed.rnn(seq)[1], model.rnn(seq)[1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fixed.rnn(seq)[0], model.rnn(seq)[0], rtol=1e-10, atol=1e-12)
    q = torch.randn(5, 3, 16, dtype=F64)
    for got, want in zip(fixed.attn(q, q, q), model.attn(q, q, q), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # Everything but the normalisation layers: the whole model is unchanged once BatchNorm is
    # taken out of the comparison (identity BN in eval mode vs GroupNorm differ by design).
    plain = copy.deepcopy(model)
    plain.bn, plain.bn1, plain.inorm = nn.Identity(), nn.Identity(), nn.Identity()
    plain_fixed = copy.deepcopy(fixed)
    plain_fixed.bn, plain_fixed.bn1, plain_fixed.inorm = nn.Identity(), nn.Identity(), nn.Identity()
    x = torch.randn(3, 1, 4, 4, dtype=F64)
    torch.testing.assert_close(plain_fixed(x), plain(x), rtol=1e-10, atol=1e-12)


def test_the_model_itself_and_shared_modules_are_replaced():
    lstm = nn.LSTM(3, 4)
    fixed = fix(lstm)
    assert type(fixed) is DPLSTM and type(lstm) is nn.LSTM
    shared = nn.BatchNorm1d(4)
    model = nn.Sequential(nn.Linear(4, 4), shared, nn.Linear(4, 4), shared)
    fixed = fix(model)
    assert type(fixed[1]) is nn.GroupNorm and fixed[1] is fixed[3]


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        (nn.Embedding(10, 4, max_norm=1.0), "max_norm=1.0 rewrites rows"),
        (nn.EmbeddingBag(10, 4, max_norm=2.0), "max_norm=2.0"),
        (nn.LazyBatchNorm1d(), "not known yet"),
        (nn.LazyInstanceNorm1d(track_running_stats=True), "not known yet"),
    ],
)
def test_what_cannot_be_fixed_is_refused_in_one_line(layer, message):
    model = nn.Sequential(nn.Linear(4, 4), layer)
    findings = validate(model)
    assert [f.path for f in findings if f.blocking] == ["1"]
    assert findings[0].fix is None and message in findings[0].problem
    assert "cannot be fixed automatically" in describe(findings)
    with pytest.raises(DPSGDError, match="cannot fix 1 layer") as info:
        fix(model)
    assert "\n" not in str(info.value) and message in str(info.value)


def test_every_unfixable_layer_is_listed_not_only_the_first():
    model = nn.Sequential(nn.Embedding(10, 4, max_norm=1.0), nn.BatchNorm1d(4),
                          nn.LazyBatchNorm2d())  # fmt: skip
    with pytest.raises(DPSGDError, match="cannot fix 2 layer") as info:
        fix(model)
    assert "'0' (Embedding)" in str(info.value) and "'2' (LazyBatchNorm2d)" in str(info.value)


def test_projected_lstm_and_attention_with_bias_kv_are_fixed_with_equal_outputs():
    torch.manual_seed(0)
    model = nn.ModuleDict(
        {"rnn": nn.GRU(3, 4, batch_first=True),
         "lstm": nn.LSTM(3, 5, proj_size=2, bidirectional=True),
         "attn": nn.MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True, kdim=3, vdim=3)}
    ).double()  # fmt: skip
    fixed = fix(model)
    assert [type(m).__name__ for m in fixed.values()] == ["DPGRU", "DPLSTM", "DPMultiheadAttention"]
    x, q = torch.randn(6, 2, 3, dtype=F64), torch.randn(4, 2, 8, dtype=F64)
    for name, args in (("rnn", (x,)), ("lstm", (x,)), ("attn", (q, x, x))):
        got, want = fixed[name](*args), model[name](*args)
        for g, w in zip(_leaves(got), _leaves(want), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def _leaves(value: object) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    return [leaf for item in value for leaf in _leaves(item)]


def test_a_replacement_that_would_untie_weights_is_refused():
    model = nn.Sequential(nn.BatchNorm1d(4), nn.LayerNorm(4))
    model[1].weight = model[0].weight
    findings = validate(model)
    assert findings[0].fix is None and "would untie" in findings[0].problem
    with pytest.raises(DPSGDError, match="would untie"):
        fix(model)


def test_subclasses_of_stock_modules_are_not_replaced_silently():
    class MyGRU(nn.GRU):
        pass

    findings = validate(nn.Sequential(MyGRU(3, 4)))
    assert findings[0].fix is None and "subclasses nn.GRU" in findings[0].problem


def test_a_layer_without_a_ghost_rule_is_a_note_not_an_error():
    model = nn.Sequential(nn.Linear(4, 4), nn.PReLU(), nn.Bilinear(4, 4, 2), nn.Linear(2, 2))
    model[3].requires_grad_(False)
    findings = validate(model)
    assert [(f.path, f.blocking, f.fix) for f in findings] == [
        ("1", False, None),
        ("2", False, None),
    ]
    assert "per-sample fallback" in findings[0].problem and "weight" in findings[0].problem
    assert describe(findings).startswith("note: '1' (PReLU)")
    fixed = fix(model)  # notes do not stop fix
    assert fixed is not model and type(fixed[1]) is nn.PReLU


def test_a_clean_model_has_no_findings_and_a_clear_description():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(4, 2))
    assert validate(model) == [] and describe([]) == "model check: no problems found for DP-SGD"
    assert isinstance(Finding("a", "B", "c", None).line(), str)
    with pytest.raises(DPSGDError, match=r"needs a torch\.nn\.Module"):
        validate("not a model")  # type: ignore[arg-type]


class EncoderClassifier(nn.Module):
    """nn.TransformerEncoder (batch-first, padding mask derived from each example) and a head."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        padding = x[..., 0] > 1.0
        padding[:, 0] = False
        return self.head(self.encoder(x, src_key_padding_mask=padding).mean(1))


def test_a_fixed_transformer_encoder_keeps_its_outputs_and_is_clipped_exactly_by_ghost():
    torch.manual_seed(0)
    model = EncoderClassifier().double()
    fixed = fix(model)
    assert [f.path for f in validate(model)] == [
        "encoder.layers.0.self_attn",
        "encoder.layers.1.self_attn",
    ]
    x, y = torch.randn(4, 4, 8, dtype=F64), torch.randint(0, 3, (4,))  # L == B
    for mode in ("train", "eval"):  # eval: nn.Transformer* must stay off their fused fast path
        model.train(mode == "train")
        fixed.train(mode == "train")
        torch.testing.assert_close(fixed(x), model(x), rtol=1e-10, atol=1e-12)
    names = [n for n, p in fixed.named_parameters() if p.requires_grad]
    result = GhostClipping(fixed, _loss, ClipThresholds(C, names)).clip((x,), y)
    params = dict(fixed.named_parameters())
    for i in range(x.shape[0]):
        loss = _loss(fixed(x[i : i + 1]), y[i : i + 1]).sum()
        grads = torch.autograd.grad(loss, list(params.values()))
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        torch.testing.assert_close(result.norms[i], norm, rtol=1e-9, atol=1e-12)
        for name, g in zip(params, grads, strict=True):
            result.grad_sum[name] -= (C / (norm + 1e-6)).clamp(max=1.0) * g
    assert max(float(v.abs().max()) for v in result.grad_sum.values()) < 1e-10


def test_fix_keeps_frozen_affine_parameters_and_the_mode():
    model = nn.Sequential(nn.Conv1d(2, 6, 3), nn.BatchNorm1d(6), nn.InstanceNorm1d(6, affine=True,
                          track_running_stats=True)).eval()  # fmt: skip
    model[1].weight.requires_grad_(False)
    model[2].bias.requires_grad_(False)
    fixed = fix(model)
    assert not fixed.training and not fixed[1].training and not fixed[2].training
    assert [n for n, p in fixed.named_parameters() if not p.requires_grad] == ["1.weight", "2.bias"]
    assert model[1].weight is not fixed[1].weight
    torch.testing.assert_close(fixed[2].weight, model[2].weight)
