"""train() on the user's own data, loss and model: every data form gives the same run as a
privacylab Dataset, any per-example loss trains with and without DP, bad input is one line, and
the cached front end of an nn.Sequential holds deterministic layers only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from torch.utils.data import Dataset as TorchDataset

from privacylab.data import load_dataset, split_train_test
from privacylab.models import build_model
from privacylab.training import DPSGD, PrivacyConfig, TrainConfig, TrainingError, train
from privacylab.training.inputs import as_training_data
from privacylab.training.trainer import _frozen_prefix


@pytest.fixture(scope="module")
def digits():
    tr, te = split_train_test(load_dataset("digits"))
    return tr.subset(range(300)), te.subset(range(200))


def _mlp(seed: int = 0) -> nn.Module:
    return build_model("mlp", (64,), 10, widths=(16,), seed=seed)


def _weights(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


class Items(TorchDataset):
    """A plain map-style torch Dataset of (x, y) items, y a Python int."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], int(self.y[i])


DP = PrivacyConfig(noise_multiplier=1.0, max_grad_norm=1.0)


@pytest.mark.parametrize("privacy", [None, DP], ids=["plain", "dp"])
def test_every_data_form_gives_the_dataset_run(digits, privacy) -> None:
    tr, te = digits
    config = TrainConfig(epochs=1, batch_size=50, lr=0.2, privacy=privacy)
    reference = train(_mlp(), tr, config, te)
    x, y = tr.features, tr.labels
    forms = {
        "numpy": (x.numpy().astype("float64"), y.numpy().astype("int32")),
        "tensors": (x, y),
        "tuple of inputs": ((x,), y),
        "TensorDataset": TensorDataset(x, y),
        "torch Dataset": Items(x, y),
        "DataLoader": DataLoader(TensorDataset(x, y), batch_size=50, shuffle=True),
    }
    loader_config = TrainConfig(epochs=1, lr=0.2, privacy=privacy)  # default batch size
    for name, data in forms.items():
        cfg = loader_config if name == "DataLoader" else config
        result = train(_mlp(), data, cfg, (te.features.numpy(), te.labels.numpy()))
        assert torch.equal(_weights(result.model), _weights(reference.model)), name
        assert result.history[-1].eval_accuracy == reference.history[-1].eval_accuracy, name
        if privacy is not None:
            assert result.privacy.sample_rate == 50 / 300
            assert result.privacy.epsilon == reference.privacy.epsilon


def test_a_loader_batch_size_is_q_unless_the_config_sets_one(digits) -> None:
    tr, _ = digits
    loader = DataLoader(TensorDataset(tr.features, tr.labels), batch_size=30)
    cfg = TrainConfig(epochs=1, lr=0.1, privacy=DP)
    assert train(_mlp(), loader, cfg).privacy.sample_rate == 30 / 300
    cfg = TrainConfig(epochs=1, lr=0.1, batch_size=60, privacy=DP)
    assert train(_mlp(), loader, cfg).privacy.sample_rate == 60 / 300


def test_a_loader_larger_than_the_data_is_q_above_one(digits) -> None:
    tr, _ = digits
    loader = DataLoader(TensorDataset(tr.features, tr.labels), batch_size=400)
    with pytest.raises(TrainingError, match=r"q = 1.33 > 1") as info:
        train(_mlp(), loader, TrainConfig(epochs=1, privacy=DP))
    assert "\n" not in str(info.value)


def _regression(n: int = 256, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    w = torch.tensor([1.0, -2.0, 0.5, 0.0, 1.5])
    return x, (x @ w + 0.1 * torch.randn(n, generator=g)).unsqueeze(1)


def _mse(out: Tensor, target: Tensor) -> Tensor:
    return F.mse_loss(out, target, reduction="none").mean(1)


@pytest.mark.parametrize("clipping", [None, "ghost", "per_sample"])
def test_regression_with_mse(clipping) -> None:
    x, y = _regression()
    privacy = None if clipping is None else PrivacyConfig(noise_multiplier=0.5, clipping=clipping)
    cfg = TrainConfig(epochs=8, batch_size=64, lr=0.05, privacy=privacy)
    model = nn.Linear(5, 1)
    before = float(_mse(model(x), y).mean().detach())
    result = train(model, (x, y), cfg, _regression(128, seed=1), loss_fn=_mse)
    last = result.history[-1]
    assert last.train_accuracy is None and last.eval_accuracy is None
    assert last.train_loss < 0.2 * before and last.eval_loss < 0.2 * before


def _bce(out: Tensor, target: Tensor) -> Tensor:
    return F.binary_cross_entropy_with_logits(out, target, reduction="none").mean(1)


def _next_token(out: Tensor, target: Tensor) -> Tensor:
    return F.cross_entropy(out.transpose(1, 2), target, reduction="none").mean(1)


class Bigram(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.head = nn.Linear(16, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


def _brute_clipped_sum(model: nn.Module, loss_fn, x: Tensor, y: Tensor, c: float) -> Tensor:
    """Σ_i min(1, C/‖g_i‖) g_i by one float64 autograd pass per example."""
    model = model.double()
    total = None
    for i in range(len(y)):
        xi = x[i : i + 1].double() if x.is_floating_point() else x[i : i + 1]
        yi = y[i : i + 1].double() if y.is_floating_point() else y[i : i + 1]
        grads = torch.autograd.grad(loss_fn(model(xi), yi).sum(), list(model.parameters()))
        g = torch.cat([t.flatten() for t in grads])
        g = g * min(1.0, c / float(g.norm()))
        total = g if total is None else total + g
    return total


@pytest.mark.parametrize("clipping", ["ghost", "per_sample"])
@pytest.mark.parametrize("task", ["mse", "bce", "next-token"])
def test_custom_losses_are_clipped_per_example(task, clipping) -> None:
    """The engine's clipped sum for each loss equals a float64 per-example autograd loop."""
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    if task == "next-token":
        model: nn.Module = Bigram(5)
        x = torch.randint(0, 5, (6, 4), generator=g)
        y, loss_fn = torch.randint(0, 5, (6, 4), generator=g), _next_token
    else:
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        x = torch.randn(6, 4, generator=g)
        y = torch.randn(6, 3, generator=g) if task == "mse" else (torch.rand(6, 3) > 0.5).float()
        loss_fn = _mse if task == "mse" else _bce
    engine = DPSGD(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loss_fn,
        noise_multiplier=1.0,
        max_grad_norm=0.05,
        expected_batch_size=6,
        clipping=clipping,
    )
    got = engine.clipped_batch(x, y).grad_sum
    got = torch.cat([got[n].flatten() for n, _ in model.named_parameters()]).double()
    torch.testing.assert_close(
        got, _brute_clipped_sum(model, loss_fn, x, y, 0.05), rtol=1e-4, atol=1e-6
    )


def test_multi_label_with_bce_and_dp() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 6, generator=g)
    y = torch.stack([x[:, 0] > 0, x[:, 1] + x[:, 2] > 0, x[:, 3] < 0.5], 1).float()

    for privacy in (None, PrivacyConfig(noise_multiplier=0.5)):
        torch.manual_seed(0)
        model = nn.Linear(6, 3)
        cfg = TrainConfig(epochs=10, batch_size=60, lr=0.3, privacy=privacy)
        result = train(model, (x, y), cfg, loss_fn=_bce)
        assert result.history[-1].train_accuracy is None
        hits = ((result.model(x) > 0).float() == y).float().mean()
        assert hits > 0.85, (privacy, float(hits))


@pytest.mark.parametrize("clipping", [None, "ghost", "per_sample"])
def test_next_token_loss(clipping) -> None:
    """A deterministic successor sequence: next = (token + 1) mod V, learnt to high accuracy."""
    vocab, length = 7, 6
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, vocab, (240, 1), generator=g)
    seq = (start + torch.arange(length + 1)) % vocab
    data = (seq[:, :-1], seq[:, 1:])
    privacy = None if clipping is None else PrivacyConfig(noise_multiplier=1.0, clipping=clipping)
    torch.manual_seed(0)
    cfg = TrainConfig(epochs=6, batch_size=48, lr=0.5, privacy=privacy)
    result = train(Bigram(vocab), data, cfg, loss_fn=_next_token)
    assert result.history[-1].train_accuracy is not None
    assert result.history[-1].train_accuracy > 0.9


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64 + 3, 10)

    def forward(self, image: Tensor, extra: Tensor) -> Tensor:
        return self.fc(torch.cat([image.flatten(1), extra], 1))


@pytest.mark.parametrize("privacy", [None, DP], ids=["plain", "dp"])
def test_a_model_with_two_inputs_is_the_one_input_model(digits, privacy) -> None:
    tr, _ = digits
    extra = torch.randn(len(tr), 3, generator=torch.Generator().manual_seed(0))
    two = TwoInputs()
    one = nn.Linear(67, 10)
    one.load_state_dict(two.fc.state_dict())
    cfg = TrainConfig(epochs=1, batch_size=50, lr=0.2, privacy=privacy)
    a = train(two, ((tr.features, extra), tr.labels), cfg)
    b = train(one, (torch.cat([tr.features.flatten(1), extra], 1), tr.labels), cfg)
    assert torch.equal(_weights(a.model), _weights(b.model))
    loader = DataLoader(TensorDataset(tr.features, extra, tr.labels), batch_size=50)
    c = train(TwoInputs(), loader, TrainConfig(epochs=1, lr=0.2, privacy=privacy))
    assert c.history[-1].train_accuracy is not None


class Stream(IterableDataset):
    def __iter__(self):
        yield torch.zeros(3), 0


class Records(TorchDataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return {"x": torch.zeros(3), "y": 0}


X, Y = torch.rand(20, 64), torch.arange(20) % 10


@pytest.mark.parametrize(
    ("data", "loss_fn", "message"),
    [
        ((X[:0], Y[:0]), None, "is empty"),
        (TensorDataset(X[:0], Y[:0]), None, "is empty"),
        ((X, Y[:19]), None, "inputs has 20 rows but its targets have 19"),
        (((X, X[:5]), Y), None, "input 1 has 5 rows"),
        ((X, Y.float()), None, "labels are float32, but the default loss"),
        ((X, Y.bool()), None, "labels are bool"),
        ((X, Y - 1), None, "labels must be >= 0"),
        ((X, Y + 5), None, "label 14 but the model gives 10 outputs"),
        ((X.masked_fill(X > 0.99, float("nan")), Y), None, "NaN or infinite"),
        ((X, Y.float().masked_fill(Y == 3, float("inf"))), "mse", "NaN or infinite"),
        ((X, Y, Y), None, "got 3 items"),
        (Stream(), None, "IterableDataset"),
        (Records(), None, "is a dict"),
        ({"x": X, "y": Y}, None, "must be a privacylab Dataset"),
        ((X, Y), "scalar", r"one loss per example, shape \(2,\), got \(\)"),
        ((X, Y), "broken", "loss_fn fails on the model's outputs"),
    ],
)
def test_bad_input_is_one_line(data, loss_fn, message) -> None:
    losses = {
        "mse": lambda out, t: (out.sum(1) - t).pow(2),
        "scalar": lambda out, t: F.cross_entropy(out, t),
        "broken": lambda out, t: out @ t,
    }
    cfg = TrainConfig(epochs=1, batch_size=10, privacy=DP)
    with pytest.raises(TrainingError, match=message) as info:
        train(_mlp(), data, cfg, loss_fn=losses.get(loss_fn))
    assert "\n" not in str(info.value)


def test_a_scalar_loss_is_fine_without_dp() -> None:
    result = train(_mlp(), (X, Y), TrainConfig(epochs=2, batch_size=10), loss_fn=F.cross_entropy)
    assert result.history[-1].train_accuracy is not None


def test_a_too_large_torch_dataset_is_refused() -> None:
    with pytest.raises(TrainingError, match="GiB once read into memory") as info:
        as_training_data(Items(X, Y), max_bytes=1000)
    assert "\n" not in str(info.value)


def test_a_leading_dropout1d_stays_active_in_training() -> None:
    """The old cache ran every leading parameter-free layer once in eval mode, so this dropout
    never dropped anything; now it ends the cached prefix and drops channels at every step."""
    model = nn.Sequential(nn.Dropout1d(0.5), nn.Flatten(), nn.Linear(4 * 8, 2))
    prefix, body = _frozen_prefix(model)
    assert isinstance(prefix, nn.Identity) and body is model
    seen: list[Tensor] = []
    model[2].register_forward_hook(lambda m, args, out: seen.append(args[0].detach().clone()))
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 4, 8, generator=g) + 1.0  # never 0, so a 0 is a dropped channel
    y = torch.randint(0, 2, (64,), generator=g)
    train(model, (x, y), TrainConfig(epochs=1, batch_size=64, lr=0.1, seed=0))
    probe, training, evaluation = seen  # a 2-example check, one step, one evaluation
    dropped = (training.view(-1, 4, 8) == 0).all(2).float().mean()
    assert 0.3 < dropped < 0.7
    assert len(probe) == 2 and bool((evaluation != 0).all())  # evaluation mode: no dropout


@pytest.mark.parametrize(
    "layer",
    [nn.Dropout(0.1), nn.Dropout2d(0.1), nn.AlphaDropout(0.1), nn.RReLU(), nn.BatchNorm1d(3)],
)
def test_random_or_mode_dependent_layers_end_the_prefix(layer) -> None:
    if isinstance(layer, nn.BatchNorm1d):
        layer = nn.BatchNorm1d(3, affine=False)
    model = nn.Sequential(nn.Flatten(), layer, nn.Linear(3, 2))
    prefix, body = _frozen_prefix(model)
    assert list(prefix) == [model[0]] and list(body) == [layer, model[2]]


def test_scatnet_keeps_its_cached_front_end(digits) -> None:
    tr, te = digits
    model = build_model("scatnet", tr.input_shape, 10, seed=0, scales=1)
    prefix, _ = _frozen_prefix(model)
    assert [type(m).__name__ for m in prefix] == ["Scattering2D", "Flatten", "LayerNorm"]
    calls = []
    model[0].register_forward_hook(lambda *a: calls.append(1))
    cfg = TrainConfig(epochs=2, batch_size=30, lr=0.5, privacy=PrivacyConfig(noise_multiplier=0.5))
    train(model, tr, cfg, te)
    assert len(calls) == 2  # once on the training set, once on the evaluation set: not per step


def test_a_checkpoint_remembers_the_loader_batch_size(digits, tmp_path) -> None:
    """Resuming with a DataLoader of another batch size would change q mid-run: refused."""
    tr, _ = digits
    cfg = TrainConfig(epochs=1, lr=0.1, privacy=DP)
    data = TensorDataset(tr.features, tr.labels)
    first = train(_mlp(), DataLoader(data, batch_size=30), cfg, checkpoint_dir=tmp_path)
    again = train(_mlp(), DataLoader(data, batch_size=30), cfg, checkpoint_dir=tmp_path)
    assert torch.equal(_weights(again.model), _weights(first.model))  # resumed, nothing to do
    with pytest.raises(TrainingError, match="different training configuration"):
        train(_mlp(), DataLoader(data, batch_size=60), cfg, checkpoint_dir=tmp_path)
