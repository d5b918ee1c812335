"""make_private: DP-SGD in the user's own loop, Opacus-style — the step is DPSGD's, the ε is
`privacylab account`'s and Opacus's, the loader is Poisson sampling, misuse is one line."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from typer.testing import CliRunner

from privacylab.accounting.calibration import dp_sgd_epsilon
from privacylab.cli import app
from privacylab.data import load_dataset, split_train_test
from privacylab.errors import PrivacylabError
from privacylab.training import DPSGD, DPSGDError, TrainingError, make_private
from privacylab.training.dp import PoissonSampler


@pytest.fixture(scope="module")
def digits():
    return split_train_test(load_dataset("digits"))


def _mlp(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 32), nn.Tanh(), nn.Dropout(dropout), nn.Linear(32, 10)
    )


def _loop(private, epochs: int = 1) -> list[float]:
    """The Opacus loop, with privacylab's objects."""
    losses = []
    for _ in range(epochs):
        for x, y in private.loader:
            private.optimizer.zero_grad()
            loss = private.criterion(private.model(x), y)
            loss.backward()
            private.optimizer.step()
            losses.append(loss.item())
    return losses


def _weights(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_the_loop_learns_and_spends_the_target_epsilon(digits) -> None:
    tr, te = digits
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    private = make_private(
        model, optimizer, (tr.features, tr.labels), epsilon=2.0, epochs=4, batch_size=128, seed=0
    )
    _loop(private, epochs=4)
    steps = 4 * len(private.loader)
    assert private.accountant.steps == steps
    epsilon = private.accountant.get_epsilon(1e-5)
    assert 1.9 < epsilon <= 2.0
    model.eval()
    with torch.no_grad():
        accuracy = float((model(te.features).argmax(1) == te.labels).float().mean())
    assert accuracy > 0.6  # chance is 0.1


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_epsilon_is_privacylab_accounts_and_opacus(accountant) -> None:
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(200, 5, generator=g), torch.randint(0, 3, (200,), generator=g))
    model = nn.Linear(5, 3)
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        noise_multiplier=1.3,
        batch_size=20,
        accountant=accountant,
        seed=1,
    )
    _loop(private, epochs=2)
    sigma, q, steps = private.noise_multiplier, private.sample_rate, private.accountant.steps
    assert (q, steps) == (0.1, 20)
    ours = private.accountant.get_epsilon(1e-5)
    assert ours == dp_sgd_epsilon(sigma, q, steps, 1e-5, accountant)
    argv = ["account", "epsilon", "--noise-multiplier", repr(sigma), "--sample-rate", repr(q)]
    argv += ["--steps", str(steps), "--delta", "1e-5", "--accountant", accountant, "--json"]
    cli = CliRunner().invoke(app, argv)
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["epsilon"] == pytest.approx(ours, rel=1e-12)
    theirs = PRVAccountant() if accountant == "pld" else RDPAccountant()
    theirs.history = [(sigma, q, steps)]
    # PLD and Opacus's PRV are both numerically tight (different discretisations); the RDP
    # bound is the same closed form (Mironov et al. 2019) on the same orders.
    tolerance = 0.01 if accountant == "pld" else 1e-9
    assert ours == pytest.approx(theirs.get_epsilon(1e-5), rel=tolerance)


def test_the_loader_is_poisson_sampling() -> None:
    n, q = 400, 0.05
    data = (torch.randn(n, 3), torch.zeros(n, dtype=torch.long))
    model = nn.Linear(3, 2)
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        noise_multiplier=1.0,
        batch_size=int(q * n),
        seed=3,
    )
    assert len(private.loader) == 20 and private.loader.expected_batch_size == q * n
    sizes, seen = [], torch.zeros(n)
    for _ in range(15):
        for x, y in private.loader:
            assert len(x) == len(y)
            sizes.append(len(y))
            seen += (x[:, None, :] == data[0][None]).all(2).any(0).float()
    sizes_t = torch.tensor(sizes, dtype=torch.float64)
    mean, var = n * q, n * q * (1 - q)
    assert abs(float(sizes_t.mean()) - mean) < 4 * math.sqrt(var / len(sizes))
    assert 0.6 * var < float(sizes_t.var()) < 1.5 * var  # binomial, not a fixed size
    rate = seen / len(sizes)  # every example sampled at rate q, independently of the others
    assert abs(float(rate.mean()) - q) < 0.005


def test_same_seed_same_run(digits) -> None:
    tr, _ = digits
    runs = []
    for _ in range(2):
        model = _mlp(dropout=0.2)
        private = make_private(
            model,
            torch.optim.Adam(model.parameters(), lr=0.01),
            tr,
            noise_multiplier=1.0,
            batch_size=64,
            seed=7,
        )
        runs.append((_loop(private), _weights(model)))
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("clipping", ["ghost", "per_sample"])
def test_a_step_is_dpsgds_step(digits, clipping) -> None:
    """The same batch (the loader's generator) and the same noise seed: the weights after the
    step equal those after DPSGD.step — the user's loop changes nothing in the mechanism."""
    tr, _ = digits
    seed = 11
    model = _mlp(dropout=0.3)
    twin = copy.deepcopy(model)
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.3),
        tr,
        noise_multiplier=0.8,
        max_grad_norm=0.5,
        batch_size=100,
        clipping=clipping,
        seed=seed,
    )
    engine = DPSGD(
        twin,
        torch.optim.SGD(twin.parameters(), lr=0.3),
        lambda out, y: F.cross_entropy(out, y, reduction="none"),
        noise_multiplier=0.8,
        max_grad_norm=0.5,
        expected_batch_size=100,
        clipping=clipping,
        generator=torch.Generator().manual_seed(seed + 1),
        sample_rate=100 / len(tr),
    )
    sampler = PoissonSampler(len(tr), 100 / len(tr), torch.Generator().manual_seed(seed))
    batches = iter(private.loader)
    for _ in range(2):
        x, y = next(batches)
        index = sampler.sample()
        assert torch.equal(y, tr.labels[index])
        torch.manual_seed(5)  # dropout masks: the same random state for both
        loss = private.criterion(private.model(x), y)
        loss.backward()
        ours = private.optimizer.step()
        torch.manual_seed(5)
        theirs = engine.step(tr.features[index], tr.labels[index]).loss_mean
        assert torch.equal(_weights(model), _weights(twin))
        assert ours == theirs
    if clipping == "ghost":  # vmap draws its own dropout masks per example
        assert loss.item() == pytest.approx(ours, rel=1e-6)  # the outputs seen are trained


def test_the_loss_seen_is_the_loss_trained_with_dropout(digits) -> None:
    tr, _ = digits
    model = _mlp(dropout=0.5)
    private = make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), tr, noise_multiplier=1.0,
        batch_size=64, seed=0,
    )  # fmt: skip
    for x, y in private.loader:
        loss = private.criterion(private.model(x), y)
        loss.backward()
        assert private.optimizer.step() == pytest.approx(loss.item(), rel=1e-6)


def test_several_inputs_a_loader_and_a_torch_loss_module() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 2), nn.Linear(3, 2)

        def forward(self, u: Tensor, v: Tensor) -> Tensor:
            return self.a(u) + self.b(v)

    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(120, 4, generator=g), torch.randn(120, 3, generator=g)
    y = (u[:, 0] + v[:, 0] > 0).long()
    model = Two()
    loader = DataLoader(TensorDataset(u, v, y), batch_size=30, shuffle=True)
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        loader,
        noise_multiplier=0.5,
        loss_fn=nn.CrossEntropyLoss(),  # a mean-reduced module: applied per example
        seed=0,
    )
    assert private.sample_rate == 0.25
    for _ in range(10):
        for x, t in private.loader:
            assert isinstance(x, tuple) and len(x) == 2
            loss = private.criterion(private.model(*x), t)
            loss.backward()
            private.optimizer.step()
    with torch.no_grad():
        assert float((model(u, v).argmax(1) == y).float().mean()) > 0.8


def _private(**kwargs):
    g = torch.Generator().manual_seed(0)
    data = kwargs.pop("data", (torch.randn(50, 4, generator=g), torch.arange(50) % 2))
    model = kwargs.pop("model", None) or nn.Linear(4, 2)
    settings = {"noise_multiplier": 1.0, "batch_size": 10, "seed": 0, **kwargs}
    return make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), data, **settings)


def _one_line(error: pytest.ExceptionInfo) -> None:
    assert isinstance(error.value, PrivacylabError) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 1.0}, "either epsilon"),
        ({"noise_multiplier": None, "epsilon": 1.0}, "give epochs"),
        ({"noise_multiplier": 0.0}, "noise multiplier must be"),
        ({"delta": 1.0}, "delta must be in"),
        ({"batch_size": 80}, r"q = 1.6 > 1"),
        ({"batch_size": None}, "give batch_size"),
        ({"accountant": "bogus"}, "unknown accountant"),
        ({"data": (torch.randn(5, 4), torch.rand(5))}, "labels are float32"),
        ({"data": (torch.randn(0, 4), torch.zeros(0, dtype=torch.long))}, "is empty"),
        ({"model": nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2))}, "GroupNorm"),
        ({"seed": -1}, "seed must be"),
    ],
)
def test_bad_settings_are_one_line(kwargs, message) -> None:
    with pytest.raises((DPSGDError, TrainingError), match=message) as error:
        _private(**kwargs)
    _one_line(error)


def test_misuse_of_the_loop_is_one_line() -> None:
    private = _private()
    batches = iter(private.loader)
    x, y = next(batches)
    with pytest.raises(DPSGDError, match=r"compute the loss with private\.criterion") as error:
        F.cross_entropy(private.model(x), y).backward()
    _one_line(error)
    with pytest.raises(DPSGDError, match=r"needs loss.backward\(\) first") as error:
        private.optimizer.step()
    _one_line(error)
    with pytest.raises(DPSGDError, match="outputs exactly as it returned") as error:
        private.criterion(private.model(x) * 2, y)
    _one_line(error)
    loss = private.criterion(private.model(x), y)
    loss.backward()
    with pytest.raises(DPSGDError, match="twice for one step") as error:
        loss.backward()
    _one_line(error)
    with pytest.raises(DPSGDError, match="closure") as error:
        private.optimizer.step(lambda: 0.0)
    _one_line(error)
    private.optimizer.step()
    # a batch from elsewhere, or the same batch again: not a Poisson sample
    private.criterion(private.model(x), y).backward()
    with pytest.raises(DPSGDError, match=r"needs a new batch from private\.loader") as error:
        private.optimizer.step()
    _one_line(error)
    next(batches)
    x, y = next(batches)
    private.criterion(private.model(x), y).backward()
    with pytest.raises(DPSGDError, match="skipped without a step") as error:
        private.optimizer.step()
    _one_line(error)
    assert private.accountant.steps == 1


def test_a_scalar_loss_is_refused() -> None:
    private = _private(loss_fn=lambda out, y: F.cross_entropy(out, y))
    x, y = next(iter(private.loader))
    with pytest.raises(DPSGDError, match=r"shape \(\d+,\), got \(\)") as error:
        private.criterion(private.model(x), y)
    _one_line(error)


def test_evaluation_calls_are_the_plain_model() -> None:
    private = _private()
    x, _ = next(iter(private.loader))
    private.model.eval()
    out = private.model(x)
    assert out.requires_grad and private.model.pending is None
    private.model.train()
    with torch.no_grad():
        private.model(x)
    assert private.model.pending is None


def test_physical_batch_size_is_the_same_step(digits) -> None:
    """Opacus's BatchMemoryManager: micro-batches, one noisy step — the same mechanism."""
    tr, _ = digits
    runs = []
    for physical in (None, 7):
        model = _mlp()
        private = make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.3), tr, noise_multiplier=1.0,
            batch_size=64, seed=2, physical_batch_size=physical,
        )  # fmt: skip
        losses = _loop(private)[:5]
        runs.append((losses, _weights(model), private.accountant.get_epsilon()))
    assert runs[0][0] == pytest.approx(runs[1][0], rel=1e-5)
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-4, atol=1e-5)
    assert runs[0][2] == runs[1][2]


def test_secure_noise_is_not_seeded() -> None:
    results = []
    for _ in range(2):
        model = nn.Linear(4, 2)
        nn.init.zeros_(model.weight)
        nn.init.zeros_(model.bias)
        private = _private(model=model, secure_noise=True)
        x, y = next(iter(private.loader))
        private.criterion(private.model(x), y).backward()
        private.optimizer.step()
        results.append((y, _weights(model)))
    assert torch.equal(results[0][0], results[1][0])  # the seed still fixes the batches
    assert not torch.equal(results[0][1], results[1][1])  # the OS draws the noise
