"""The simulated federation (McMahan et al. 2017, Alg. 1): FedSGD is SGD on the pooled data,
FedAvg averages the clients' changes weighted by their rows, secure aggregation shows only
that mean, training works, a killed run resumes to the same bits, every executor gives the
same numbers, and the server's knowledge is a Target at updates access."""

from __future__ import annotations

import dataclasses
import gc
import json
import weakref
from functools import cache

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.data import load_dataset
from privacylab.defenses.update import parse_update_defense
from privacylab.federated import (
    FederatedError,
    Federation,
    FederationConfig,
    LocalPrivacy,
    LocalTraining,
    local_update,
    observe,
)
from privacylab.federated.checkpoint import RECORD_FILE, WEIGHTS_FILE
from privacylab.federated.clients import client_generator
from privacylab.models import build_model
from privacylab.target import AccessError


@cache
def _digits() -> tuple[Tensor, Tensor]:
    return load_dataset("digits").to_tensors()


def _rows(n: int, start: int = 0) -> tuple[Tensor, Tensor]:
    x, y = _digits()
    return x[start : start + n], y[start : start + n]


def _logreg(seed: int = 0) -> nn.Module:
    return build_model("logreg", (1, 8, 8), 10, seed=seed)


def _params(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _sgd_step(model: nn.Module, x: Tensor, y: Tensor, lr: float) -> dict[str, Tensor]:
    manual = _copy(model)
    opt = torch.optim.SGD(manual.parameters(), lr=lr)
    F.cross_entropy(manual(x), y).backward()
    opt.step()
    return _params(manual)


def _copy(model: nn.Module) -> nn.Module:
    clone = build_model("logreg", (1, 8, 8), 10, seed=0)
    clone.load_state_dict(model.state_dict())
    return clone


@pytest.mark.parametrize("sizes", [None, (7, 20, 13)])
def test_fedsgd_is_one_sgd_step_on_the_pooled_batch(sizes: tuple[int, ...] | None) -> None:
    """With one client, or clients of any sizes (the example-weighted mean of per-client mean
    gradients is the pooled mean gradient), a FedSGD round is one SGD step of step
    server_lr * lr on all the rows."""
    x, y = _rows(40)
    model = _logreg()
    before = _params(model)
    config = FederationConfig(
        clients=1 if sizes is None else 3,
        rounds=1,
        training=LocalTraining(lr=0.5),
        rows_per_client=sizes,
        server_lr=2.0,
    )
    fed = Federation(model, x, y, config)
    observed = fed.round(1)
    expected = _sgd_step(model, x, y, lr=1.0)
    for name, value in fed.state.items():
        torch.testing.assert_close(value, expected[name], msg=name)
    for name, value in _params(model).items():  # the caller's model is untouched
        assert torch.equal(value, before[name])
    assert len(observed) == config.clients and not observed[0].aggregated
    assert sorted(c for o in observed for c in o.clients) == list(range(config.clients))
    assert all(torch.equal(o.state[k], before[k]) for o in observed for k in before)


def test_fedavg_weights_unequal_clients_by_their_rows() -> None:
    """w <- w - sum_c (n_c / n) (w - w_c), each w_c from the client's own SGD steps, by hand."""
    x, y = _rows(60)
    model = _logreg(1)
    training = LocalTraining("fedavg", epochs=2, batch_size=4, lr=0.1)
    config = FederationConfig(clients=3, rounds=1, training=training, rows_per_client=(5, 25, 12))
    fed = Federation(model, x, y, config)
    start = _params(model)
    deltas, sizes = [], []
    for c in range(3):
        xc, yc = fed.client_data(c)
        manual = _copy(model)
        opt = torch.optim.SGD(manual.parameters(), lr=0.1)
        for lo, hi in training.batches(len(xc)):
            opt.zero_grad()
            F.cross_entropy(manual(xc[lo:hi]), yc[lo:hi]).backward()
            opt.step()
        deltas.append({k: start[k] - v for k, v in _params(manual).items()})
        sizes.append(len(xc))
    assert sizes == [5, 25, 12]
    observed = fed.round(1)
    for o, delta, n in zip(observed, deltas, sizes, strict=True):
        assert o.num_examples == n and o.training == training
        for k in start:
            torch.testing.assert_close(o.update[k], delta[k])
    for k, value in fed.state.items():
        hand = start[k] - sum(n * d[k] for n, d in zip(sizes, deltas, strict=True)) / sum(sizes)
        torch.testing.assert_close(value, hand, msg=k)
    rows = torch.cat([fed.client_data(c)[0] for c in range(3)])
    assert len({tuple(r.flatten().tolist()) for r in rows}) == len(rows)  # disjoint rows


def test_secure_aggregation_shows_only_the_weighted_mean() -> None:
    x, y = _rows(50)
    defense = parse_update_defense("noise:1e-3")
    kwargs = dict(clients=4, rounds=1, training=LocalTraining("fedavg", batch_size=5), seed=3)
    open_fed = Federation(_logreg(), x, y, FederationConfig(**kwargs), defense)
    secure = Federation(
        _logreg(), x, y, FederationConfig(**kwargs, secure_aggregation=True), defense
    )
    each = open_fed.round(1)
    (only,) = secure.round(1)
    assert only.aggregated and only.clients == (0, 1, 2, 3) and only.num_examples == 50
    assert only.defense == "noise:0.001" and all(o.defense == "noise:0.001" for o in each)
    for k in only.update:
        mean = sum(o.num_examples * o.update[k] for o in each) / 50
        torch.testing.assert_close(only.update[k], mean)
    for k, value in secure.state.items():  # the same server step either way
        torch.testing.assert_close(value, open_fed.state[k])
    # the noise is the clients' own: a different seed draws different noise
    other = Federation(_logreg(), x, y, FederationConfig(**{**kwargs, "seed": 4}), defense)
    assert not torch.equal(other.round(1)[0].update["1.weight"], each[0].update["1.weight"])


class _Tracked:
    """A defence that keeps weak references to the updates the clients send."""

    spec = "tracked"

    def __init__(self) -> None:
        self.sent: list[weakref.ref[Tensor]] = []

    def local_privacy(
        self, *, training: LocalTraining, examples: int, rounds: int
    ) -> LocalPrivacy | None:
        return None

    def apply(self, update: dict[str, Tensor], generator: torch.Generator) -> dict[str, Tensor]:
        out = {k: v.clone() for k, v in update.items()}
        self.sent += [weakref.ref(v) for v in out.values()]
        return out


@pytest.mark.parametrize("secure", [False, True])
def test_secure_aggregation_keeps_no_individual_update(secure: bool) -> None:
    x, y = _rows(30)
    defense = _Tracked()
    config = FederationConfig(clients=3, secure_aggregation=secure)
    fed = Federation(_logreg(), x, y, config, defense)
    observed = fed.round(1)
    gc.collect()
    alive = [ref() for ref in defense.sent if ref() is not None]
    assert len(defense.sent) == 6 and len(observed) == (1 if secure else 3)
    assert len(alive) == (0 if secure else 6)


def test_a_short_fedavg_run_learns_digits() -> None:
    x, y = _digits()
    training = LocalTraining("fedavg", epochs=2, batch_size=16, lr=0.5)
    config = FederationConfig(clients=5, rounds=5, training=training, clients_per_round=4)
    fed = Federation(_logreg(), x[:1400], y[:1400], config)
    seen: list[int] = []
    result = fed.fit(x[1400:], y[1400:], progress=lambda r: seen.append(r.round))
    assert seen == [1, 2, 3, 4, 5] and result.rounds == 5 and result.resumed_from == 0
    assert all(len(r.clients) == 4 for r in result.history)
    assert len({r.clients for r in result.history}) > 1  # selection changes between rounds
    accuracies = [r.test_accuracy for r in result.history]
    assert result.accuracy is not None and result.accuracy > 0.85, accuracies
    assert accuracies[-1] > accuracies[0]
    assert json.loads(json.dumps(result.to_dict()))["accuracy"] == result.accuracy


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, capsys) -> None:
    """Rounds 1..2 with a checkpoint, then a fresh Federation resumes to round 4: same bits
    (client selection and the defence's noise reseeded per round)."""
    x, y = _rows(120)
    test_x, test_y = _rows(100, start=1500)
    defense = parse_update_defense("noise:1e-3")
    config = FederationConfig(
        clients=6,
        rounds=4,
        training=LocalTraining("fedavg", epochs=2, batch_size=8, lr=0.2),
        clients_per_round=3,
        seed=11,
    )
    uninterrupted = Federation(_logreg(), x, y, config, defense)
    whole = uninterrupted.fit(test_x, test_y, progress=False)

    first = Federation(_logreg(), x, y, config, defense)
    part = first.fit(test_x, test_y, tmp_path, until=2)
    assert part.rounds == 2 and "round 2/4" in capsys.readouterr().err
    record = json.loads((tmp_path / RECORD_FILE).read_text())
    assert record["round"] == 2 and len(record["record"]["history"]) == 2

    resumed = Federation(_logreg(), x, y, config, defense)
    rest = resumed.fit(test_x, test_y, tmp_path, progress=False)
    assert rest.resumed_from == 2 and rest.rounds == 4
    for k, value in resumed.state.items():
        assert torch.equal(value, uninterrupted.state[k]), k
    assert [r.test_accuracy for r in rest.history] == [r.test_accuracy for r in whole.history]
    assert [r.clients for r in rest.history] == [r.clients for r in whole.history]
    again = Federation(_logreg(), x, y, config, defense).fit(checkpoint=tmp_path, progress=False)
    assert again.resumed_from == 4 and again.rounds == 4  # nothing left to run

    other = dataclasses.replace(config, seed=12)
    with pytest.raises(FederatedError, match="different federation"):
        Federation(_logreg(), x, y, other, defense).fit(checkpoint=tmp_path)
    (tmp_path / WEIGHTS_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(FederatedError, match="cannot read the federation checkpoint") as info:
        Federation(_logreg(), x, y, config, defense).fit(checkpoint=tmp_path)
    assert "\n" not in str(info.value)


def test_the_local_executor_gives_the_serial_numbers() -> None:
    """Two worker processes (spawned: their cost is the torch import) give the bits of the
    serial run; the update defence is left out here only to keep the workers' imports small
    (its draws are seeded by (seed, round, client) wherever the client runs)."""
    x, y = _rows(40)
    kwargs = dict(clients=2, rounds=1, training=LocalTraining("fedavg", batch_size=8), seed=5)
    serial = Federation(_logreg(), x, y, FederationConfig(**kwargs))
    pooled = Federation(_logreg(), x, y, FederationConfig(**kwargs, executor="local", workers=2))
    a, b = serial.round(1), pooled.round(1)
    for left, right in zip(a, b, strict=True):
        assert left.clients == right.clients and left.num_examples == right.num_examples
        assert all(torch.equal(left.update[k], right.update[k]) for k in left.update)
    assert all(torch.equal(v, pooled.state[k]) for k, v in serial.state.items())


def test_dropout_masks_come_from_the_federation_seed_not_the_global_generator() -> None:
    x, y = _rows(20)
    model = build_model("mlp", (1, 8, 8), 10, seed=0, widths=(16,), dropout=0.5)
    sent = []
    for global_seed, seed in ((0, 0), (1, 0), (0, 1)):
        torch.manual_seed(global_seed)
        before = torch.get_rng_state()
        (only,) = Federation(model, x, y, FederationConfig(clients=1, seed=seed)).round(1)
        assert torch.equal(torch.get_rng_state(), before)  # the caller's generator is restored
        sent.append(only.update)
    assert all(torch.equal(sent[0][k], sent[1][k]) for k in sent[0])
    assert not all(torch.equal(sent[0][k], sent[2][k]) for k in sent[0])


class _Halve:
    """A defence recording what each client asks of it and halving the update."""

    spec = "halve"

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def local_privacy(
        self, *, training: LocalTraining, examples: int, rounds: int
    ) -> LocalPrivacy | None:
        self.asked.append((examples, rounds))
        return None

    def apply(self, update: dict[str, Tensor], generator: torch.Generator) -> dict[str, Tensor]:
        return {k: v / 2 for k, v in update.items()}


def test_the_defence_transforms_what_the_server_sees_and_steps_with() -> None:
    x, y = _rows(30)
    defense = _Halve()
    config = FederationConfig(clients=2, rounds=7, training=LocalTraining(lr=1.0))
    fed = Federation(_logreg(), x, y, config, defense)
    observed = fed.round(1)
    assert sorted(defense.asked) == [(15, 7), (15, 7)]
    for o in observed:
        xc, yc = fed.client_data(o.clients[0])
        plain = local_update(_logreg(), o.state, xc, yc, LocalTraining(lr=1.0))
        assert o.defense == "halve"
        assert all(torch.allclose(o.update[k], plain[k] / 2) for k in plain)
    expected = _sgd_step(_logreg(), x, y, lr=0.5)
    assert all(torch.allclose(v, expected[k], atol=1e-6) for k, v in fed.state.items())


def test_local_dp_sgd_clients_train_privately() -> None:
    """Each client's update is DP-SGD at the defence's calibrated σ for all the federation's
    rounds, with the noise of the generator seeded by (seed, round, client)."""
    x, y = _rows(30)
    dp = parse_update_defense("dp:8:accountant=rdp")  # the accountant is tested elsewhere
    config = FederationConfig(clients=2, rounds=3, seed=1)
    fed = Federation(_logreg(), x, y, config, dp)
    once = fed.round(1)
    twice = Federation(_logreg(), x, y, config, dp).round(1)
    privacy = dp.local_privacy(training=config.training, examples=15, rounds=3)
    assert privacy is not None and dp.to_dict()["steps"] == 3
    for o, again in zip(once, twice, strict=True):
        (c,) = o.clients
        xc, yc = fed.client_data(c)
        generator = client_generator(1, 1, c)
        private = local_update(
            _logreg(), o.state, xc, yc, config.training, privacy=privacy, generator=generator
        )
        plain = local_update(_logreg(), o.state, xc, yc, config.training)
        for k in o.update:
            torch.testing.assert_close(o.update[k], private[k])
            assert torch.equal(o.update[k], again.update[k])
        assert not torch.allclose(o.update["1.weight"], plain["1.weight"])


def test_the_servers_target_holds_the_updates_at_updates_access_only() -> None:
    x, y = _rows(20)
    fed = Federation(_logreg(), x, y, FederationConfig(clients=2))
    observed = fed.round(1)
    target = fed.target(observed)
    assert target.access.value == "updates" and target.num_classes == 10
    assert target.updates == tuple(observed)
    view = target.with_access("white-box")
    view.model(x[:3])
    with pytest.raises(AccessError):
        _ = view.updates
    assert target.queries == 3
    copy = fed.model  # a copy: changing it does not move the federation
    with torch.no_grad():
        next(copy.parameters()).add_(1.0)
    assert not torch.equal(next(copy.parameters()), fed.state["1.weight"])


def test_observe_splits_in_order_and_leaves_the_model_alone() -> None:
    x, y = _rows(9)
    model = _logreg(2)
    before = _params(model)
    training = LocalTraining("fedavg", epochs=2, lr=0.3)
    each = observe(model, x, y, training=training, clients=2)
    assert [o.clients for o in each] == [(0,), (1,)] and [o.num_examples for o in each] == [5, 4]
    for o, (lo, hi) in zip(each, [(0, 5), (5, 9)], strict=True):
        sent = local_update(model, before, x[lo:hi], y[lo:hi], training)
        assert all(torch.equal(o.update[k], sent[k]) for k in sent)
    defense = _Halve()
    (only,) = observe(model, x, y, training=training, clients=2, secure_aggregation=True, rounds=4)
    halved = observe(model, x, y, training=training, defense=defense, clients=2, rounds=4)
    assert sorted(defense.asked) == [(4, 4), (5, 4)] and halved[0].defense == "halve"
    assert all(torch.allclose(halved[0].update[k], each[0].update[k] / 2) for k in before)
    for k in only.update:
        torch.testing.assert_close(
            only.update[k], (5 * each[0].update[k] + 4 * each[1].update[k]) / 9
        )
    assert all(torch.equal(v, before[k]) for k, v in _params(model).items())
    with pytest.raises(FederatedError, match="10 clients need at least 10 rows"):
        observe(model, x, y, clients=10)
    with pytest.raises(FederatedError, match="secure aggregation needs >= 2 clients"):
        observe(model, x, y, secure_aggregation=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"clients": 0}, "clients must be a whole number >= 1"),
        ({"rounds": 1.5}, "rounds must be a whole number"),
        ({"clients_per_round": 5}, "exceeds clients"),
        ({"rows_per_client": (3, 4)}, "lists 2 sizes for 3 clients"),
        ({"server_lr": float("nan")}, "server_lr must be a finite number > 0"),
        ({"executor": "threads"}, "executor must be one of serial, local, ray"),
        ({"seed": -1}, "seed must be a whole number >= 0"),
        ({"training": "fedavg"}, "training must be a LocalTraining"),
        ({"secure_aggregation": 1}, "secure_aggregation must be True or False"),
        (
            {"clients_per_round": 1, "secure_aggregation": True},
            "secure aggregation needs >= 2 clients per round",
        ),
    ],
)
def test_a_bad_config_is_one_line(change: dict, message: str) -> None:
    with pytest.raises(FederatedError, match=message) as info:
        FederationConfig(**{"clients": 3, **change})
    assert "\n" not in str(info.value)


def test_bad_data_and_rounds_are_one_line() -> None:
    x, y = _rows(10)
    model = _logreg()
    cases = [
        (
            lambda: Federation(model, x, y, FederationConfig(clients=11)),
            "11 clients need at least 11 rows, got 10",
        ),
        (
            lambda: Federation(model, x, y, FederationConfig(clients=2, rows_per_client=6)),
            "asks for 12 rows",
        ),
        (lambda: Federation(model, x, y + 10, FederationConfig()), r"labels must lie in 0\.\.9"),
        (lambda: Federation(model, x, y.float(), FederationConfig()), "integer class labels"),
        (lambda: Federation(model, x[:, :, :4], y, FederationConfig()), "cannot run on x"),
        (lambda: Federation(model, x, y, FederationConfig(clients=2)).round(0), "round must"),
        (lambda: Federation(model, x, y, FederationConfig(rounds=3)).round(2), "the next is 1"),
        (lambda: Federation(model, x, y, FederationConfig()).fit(until=2), "exceeds the rounds"),
        (lambda: Federation(model, x, y, FederationConfig()).fit(x), "both test_x and test_y"),
        (lambda: Federation(model, x, y, FederationConfig()).client_data(10), r"in 0\.\.9"),
        (lambda: observe(model, x, y + 10), r"labels must lie in 0\.\.9"),
        (lambda: observe(model, x, y.float()), r"probability rows \(n, 10\)"),
        (lambda: observe(model, x, torch.full((10, 10), float("nan"))), "finite and >= 0"),
        (lambda: observe(model, x[:, :, :4], y), "cannot run on x"),
        (lambda: observe(None, x, y), "model must be a torch module"),  # type: ignore[arg-type]
        (lambda: observe(model, x, y, defense="noise:1e-2"), "defense must be a client defence"),
        (
            lambda: Federation(model, x, y, FederationConfig(), defense="fp16"),  # type: ignore[arg-type]
            "defense must be a client defence",
        ),
    ]
    for build, message in cases:
        with pytest.raises(FederatedError, match=message) as info:
            build()
        assert "\n" not in str(info.value)


def test_a_client_defence_is_charged_for_the_busiest_clients_participations() -> None:
    """Selection depends only on the seed: with 1 of 6 clients per round over 6 rounds, the
    DP budget covers the most rounds any client is selected in, not all 6."""
    x, y = _rows(30)
    defense = _Halve()
    config = FederationConfig(clients=6, rounds=6, clients_per_round=1, seed=2)
    fed = Federation(_logreg(), x, y, config, defense)
    counts = [sum(c in fed.selected(r) for r in range(1, 7)) for c in range(6)]
    assert fed.participations == max(counts) < 6
    fed.round(1)
    assert defense.asked == [(5, max(counts))]
