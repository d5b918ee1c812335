"""DP-SGD on 2 CPU ranks (gloo) equals DP-SGD in one process; disagreeing ranks are stopped.

One ``torch.multiprocessing.spawn`` of 2 ranks runs every scenario (a process group costs
seconds to start); each rank writes what it saw to a JSON file and the tests compare it with a
single-process run of ``DPSGD.step`` on the same Poisson batches, computed here.
"""

from __future__ import annotations

import json
import math
import os
import socket
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.nn import functional as F

from privacylab.accounting import Gaussian, PoissonSampled, RdpAccountant, SelfComposed
from privacylab.training.dp import DPSGD, DPSGDError, PoissonSampler, split_threshold
from privacylab.training.dp.distributed import DistributedDPSGD, model_fingerprint

WORLD = 2
N, FEATURES, CLASSES = 24, 5, 3
SIGMA, CLIP, LR, NOISE_SEED = 0.8, 0.3, 0.5, 7
DELTA = 1e-5

# name: (clipping, dtype, partition, q, steps, sampling seed)
RUNS: dict[str, tuple[str, torch.dtype, str, float, int, int]] = {
    "ghost": ("ghost", torch.float64, "balanced", 0.25, 4, 3),
    "per_sample": ("per_sample", torch.float64, "balanced", 0.25, 4, 3),
    "sparse_ghost": ("ghost", torch.float64, "strided", 0.05, 8, 3),
    "sparse_per_sample": ("per_sample", torch.float64, "balanced", 0.05, 8, 1),
    "float32_strided": ("ghost", torch.float32, "strided", 0.25, 4, 5),
    "per_layer_ghost": ("ghost", torch.float64, "balanced", 0.25, 3, 2),
    "auto_sequence_first": ("auto", torch.float64, "strided", 0.1, 5, 1),
}
PER_LAYER = {"per_layer_ghost"}
SEQUENCE = {"auto_sequence_first"}


class SequenceFirst(nn.Module):
    """A Linear on a sequence-first (T, B, d) view: ghost clipping refuses it at the first
    non-empty batch and ``auto`` switches to per_sample then — on each rank at its own step."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(FEATURES, 7)
        self.head = nn.Linear(7, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.mix(x.transpose(0, 1))).mean(0))


def _model(dtype: torch.dtype, name: str = "") -> nn.Module:
    torch.manual_seed(11)
    if name in SEQUENCE:
        return SequenceFirst().to(dtype)
    return nn.Sequential(
        nn.Linear(FEATURES, 7), nn.Tanh(), nn.LayerNorm(7), nn.Linear(7, CLASSES)
    ).to(dtype)


def _data(dtype: torch.dtype, name: str = "") -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(5)
    shape = (N, 3, FEATURES) if name in SEQUENCE else (N, FEATURES)
    x = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype) * 3
    return x, torch.randint(0, CLASSES, (N,), generator=generator)


def _loss(outputs: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def _engine(
    model: nn.Module, clipping: str, q: float, *, momentum: float = 0.9, per_layer: bool = False
) -> DPSGD:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    names = [n for n, _ in model.named_parameters()]
    return DPSGD(
        model,
        optimizer,
        _loss,
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        expected_batch_size=q * N,
        clipping=clipping,
        generator=torch.Generator().manual_seed(NOISE_SEED),
        sample_rate=q,
        per_layer_thresholds=split_threshold(names, CLIP) if per_layer else None,
    )


def _epsilon(engine: DPSGD) -> float:
    return RdpAccountant().compose(engine.privacy_event).guarantee(DELTA).epsilon


def _flat(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().double().flatten() for p in model.parameters()]).tolist()


# ---------------------------------------------------------------- what each rank runs


def _train(rank: int, name: str) -> dict:
    clipping, dtype, partition, q, steps, seed = RUNS[name]
    model = _model(dtype, name)
    x, y = _data(dtype, name)
    engine = _engine(model, clipping, q, per_layer=name in PER_LAYER)
    trainer = DistributedDPSGD(engine, N, seed=seed, partition=partition)
    local, total, losses = [], [], []
    for _ in range(steps):
        share = trainer.next_share()
        result = trainer.step(x[share], y[share])
        assert result.local_batch_size == len(share) == len(result.norms)
        local.append(result.local_batch_size)
        total.append(result.batch_size)
        losses.append(result.loss_mean)
    trainer.verify()
    engine = trainer.engine
    return {
        "params": _flat(model),
        "event": repr(engine.privacy_event),
        "epsilon": _epsilon(engine),
        "local": local,
        "total": total,
        "losses": losses,
        "clipping": engine.clipping,
    }


def _refusal(run: Callable[[], None]) -> str:
    try:
        run()
    except DPSGDError as error:
        return str(error)
    return "no error"


def _other_seed(rank: int) -> None:
    DistributedDPSGD(_engine(_model(torch.float64), "ghost", 0.25), N, seed=3 + rank)


def _other_model(rank: int) -> None:
    model = _model(torch.float64)
    if rank == 1:
        with torch.no_grad():
            model[0].weight[0, 0] += 1e-12
    DistributedDPSGD(_engine(model, "ghost", 0.25), N, seed=3)


def _other_optimizer(rank: int) -> None:
    engine = _engine(_model(torch.float64), "ghost", 0.25, momentum=0.9 if rank == 0 else 0.0)
    DistributedDPSGD(engine, N, seed=3)


def _diverged_later(rank: int, check_every: int = 1, changed_before: int = 3) -> None:
    model = _model(torch.float64)
    x, y = _data(torch.float64)
    engine = _engine(model, "per_sample", 0.25)
    trainer = DistributedDPSGD(engine, N, seed=3, check_every=check_every)
    for step in range(1, 6):
        if step == changed_before and rank == 1:
            with torch.no_grad():
                model[3].bias.mul_(1.5)
        share = trainer.next_share()
        trainer.step(x[share], y[share])


def _skipped_sample(rank: int) -> None:
    x, y = _data(torch.float64)
    trainer = DistributedDPSGD(_engine(_model(torch.float64), "ghost", 0.25), N, seed=3)
    if rank == 1:
        trainer.next_share()
    share = trainer.next_share()
    trainer.step(x[share], y[share])


def _reseeded_sampler(rank: int) -> None:
    x, y = _data(torch.float64)
    trainer = DistributedDPSGD(_engine(_model(torch.float64), "ghost", 0.25), N, seed=3)
    if rank == 1:
        trainer.sampler.generator.manual_seed(4)
    share = trainer.next_share()
    trainer.step(x[share], y[share])


def _no_share(rank: int) -> None:
    x, y = _data(torch.float64)
    trainer = DistributedDPSGD(_engine(_model(torch.float64), "ghost", 0.25), N, seed=3)
    share = trainer.next_share() if rank == 0 else torch.arange(0)
    trainer.step(x[share], y[share])


def _wrong_examples(rank: int) -> None:
    x, y = _data(torch.float64)
    trainer = DistributedDPSGD(_engine(_model(torch.float64), "ghost", 0.25), N, seed=3)
    share = trainer.next_share()
    if rank == 1:
        share = torch.arange(len(share) + 1)
    trainer.step(x[share], y[share])


class _FailingLoss:
    """Cross-entropy that raises a (non-DP) error on rank 1 only."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __call__(self, outputs: Tensor, targets: Tensor) -> Tensor:
        if self.rank == 1:
            raise RuntimeError("boom on rank 1")
        return _loss(outputs, targets)


def _clipping_fails(rank: int) -> None:
    x, y = _data(torch.float64)
    engine = _engine(_model(torch.float64), "per_sample", 0.25)
    engine.loss_fn = engine._clipper.loss_fn = _FailingLoss(rank)
    trainer = DistributedDPSGD(engine, N, seed=3)
    share = trainer.next_share()
    try:
        trainer.step(x[share], y[share])
    except DPSGDError:
        raise
    except Exception as error:  # rank 1's own error, whatever its type, as it was raised
        raise DPSGDError(f"{type(error).__name__}: {error}") from error


def _wrong_expected_batch(rank: int) -> None:
    model = _model(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine = DPSGD(
        model,
        optimizer,
        _loss,
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        expected_batch_size=0.25 * N / WORLD,
        sample_rate=0.25,
    )
    DistributedDPSGD(engine, N, seed=3)


def _no_sample_rate(rank: int) -> None:
    model = _model(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine = DPSGD(
        model, optimizer, _loss, noise_multiplier=SIGMA, max_grad_norm=CLIP, expected_batch_size=6
    )
    DistributedDPSGD(engine, N, seed=3)


def _noise_only(rank: int) -> list[float]:
    """One step of a linear model whose loss has zero gradient: the update is the noise alone."""
    torch.manual_seed(0)
    model = nn.Linear(30, 40, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine = DPSGD(
        model,
        optimizer,
        lambda out, y: (out * 0).sum(1),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        expected_batch_size=0.5 * N,
        generator=torch.Generator().manual_seed(NOISE_SEED + rank),
        sample_rate=0.5,
    )
    trainer = DistributedDPSGD(engine, N, seed=3)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    share = trainer.next_share()
    trainer.step(torch.ones(len(share), 30, dtype=torch.float64), torch.zeros(len(share)))
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    return ((after - before) * (0.5 * N) / LR).tolist()


def _secure(rank: int) -> list[float]:
    """Two steps with noise from the OS CSPRNG: drawn on rank 0 only, so the ranks agree."""
    model = _model(torch.float64)
    x, y = _data(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine = DPSGD(
        model,
        optimizer,
        _loss,
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        expected_batch_size=0.25 * N,
        secure_noise=True,
        sample_rate=0.25,
        physical_batch_size=1,
    )
    trainer = DistributedDPSGD(engine, N, seed=3, partition="strided")
    for _ in range(2):
        share = trainer.next_share()
        trainer.step(x[share], y[share])
    trainer.verify()
    return _flat(model)


REFUSALS: dict[str, Callable[[int], None]] = {
    "other_seed": _other_seed,
    "other_model": _other_model,
    "other_optimizer": _other_optimizer,
    "diverged_later": _diverged_later,
    "diverged_between_checks": lambda rank: _diverged_later(rank, 2, 4),
    "skipped_sample": _skipped_sample,
    "reseeded_sampler": _reseeded_sampler,
    "no_share": _no_share,
    "wrong_examples": _wrong_examples,
    "clipping_fails": _clipping_fails,
    "wrong_expected_batch": _wrong_expected_batch,
    "no_sample_rate": _no_sample_rate,
}


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="clipping='auto'")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        report: dict = {name: _train(rank, name) for name in RUNS}
        for name, run in REFUSALS.items():
            report[name] = _refusal(lambda run=run: run(rank))
        report["noise_only"] = _noise_only(rank)
        report["secure"] = _secure(rank)
        # after every refusal the group is still usable: all ranks stopped at the same point
        report["alive"] = _train(rank, "ghost")["params"] == report["ghost"]["params"]
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


# ---------------------------------------------------------------- the single-process oracle


def _single_process(name: str) -> dict:
    clipping, dtype, _, q, steps, seed = RUNS[name]
    model = _model(dtype, name)
    x, y = _data(dtype, name)
    engine = _engine(model, clipping, q, per_layer=name in PER_LAYER)
    sampler = PoissonSampler(N, q, generator=torch.Generator().manual_seed(seed))
    sizes, losses = [], []
    for _ in range(steps):
        batch = sampler.sample()
        result = engine.step(x[batch], y[batch])
        sizes.append(len(batch))
        losses.append(result.loss_mean)
    return {
        "params": _flat(model),
        "event": repr(engine.privacy_event),
        "epsilon": _epsilon(engine),
        "total": sizes,
        "losses": losses,
        "clipping": engine.clipping,
        "privacy_event": engine.privacy_event,
    }


@pytest.mark.filterwarnings("ignore:clipping='auto'")
@pytest.mark.parametrize("name", list(RUNS))
def test_two_ranks_give_the_single_process_model_and_epsilon(ranks, name) -> None:
    single = _single_process(name)
    dtype, q, steps = RUNS[name][1], RUNS[name][3], RUNS[name][4]
    assert single["privacy_event"] == SelfComposed(PoissonSampled(q, Gaussian(SIGMA)), steps)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    before = torch.tensor(_flat(_model(dtype, name)), dtype=torch.float64)
    expected = torch.tensor(single["params"], dtype=torch.float64)
    assert (expected - before).abs().max() > 1e-3  # the run moved the model
    for rank in ranks:
        got = rank[name]
        assert got["event"] == single["event"]
        assert got["epsilon"] == single["epsilon"]
        assert got["total"] == single["total"]
        assert got["clipping"] == single["clipping"]
        torch.testing.assert_close(
            torch.tensor(got["params"], dtype=torch.float64), expected, rtol=0, atol=tol
        )
        for a, b in zip(got["losses"], single["losses"], strict=True):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=tol)
    assert ranks[0][name]["params"] == ranks[1][name]["params"]  # bitwise identical ranks
    local = [r[name]["local"] for r in ranks]
    assert [a + b for a, b in zip(*local, strict=True)] == single["total"]


def test_shares_cover_empty_and_unequal_cases(ranks) -> None:
    """The sparse runs include a step where one rank's share is empty while the other clips,
    a globally empty step, and steps with unequal non-empty shares; under ghost clipping, a
    step where rank 0 (which draws the noise) is empty and must take the order in which the
    layers' noise is drawn from rank 1 (ghost forms the sums by increasing layer size, not in
    parameter order)."""
    sparse = [r["sparse_ghost"]["local"] for r in ranks]
    assert any(a == 0 and b > 0 for a, b in zip(*sparse, strict=True))
    shares = [
        (a, b)
        for name in RUNS
        for a, b in zip(ranks[0][name]["local"], ranks[1][name]["local"], strict=True)
    ]
    assert any((a == 0) != (b == 0) for a, b in shares)
    assert (0, 0) in shares
    assert any(a != b and a > 0 and b > 0 for a, b in shares)


def test_noise_is_added_once(ranks) -> None:
    """With zero gradients the update is the noise: std σC, not √2·σC (noise on each rank),
    drawn by rank 0's generator only (the ranks were given different noise seeds), and the
    same on both ranks."""
    noise = -torch.tensor(ranks[0]["noise_only"], dtype=torch.float64)  # SGD: θ -= lr·g
    assert ranks[1]["noise_only"] == ranks[0]["noise_only"]
    assert noise.numel() == 30 * 40 + 40
    assert noise.std().item() == pytest.approx(SIGMA * CLIP, rel=0.08)
    assert noise.mean().item() == pytest.approx(0.0, abs=0.05)
    expected = torch.empty(40, 30, dtype=torch.float64).normal_(
        0.0, SIGMA * CLIP, generator=torch.Generator().manual_seed(NOISE_SEED)
    )
    torch.testing.assert_close(noise[: 30 * 40], expected.flatten(), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("other_seed", "rank 1 disagrees with rank 0 on the sampling seed"),
        ("other_model", "rank 1 disagrees with rank 0 on the model parameters"),
        ("other_optimizer", "rank 1 disagrees with rank 0 on the optimizer"),
        ("diverged_later", "rank 1's model differs from rank 0's before step 3"),
        ("diverged_between_checks", "rank 1's model differs from rank 0's before step 5"),
        ("reseeded_sampler", "rank 1 drew another Poisson batch than rank 0 in step 1"),
        ("wrong_expected_batch", "global expected batch size q·N is 6"),
    ],
)
def test_disagreeing_rank_is_refused_on_every_rank(ranks, name, says) -> None:
    for rank in ranks:
        assert says in rank[name]
        assert "\n" not in rank[name]


def test_a_local_failure_stops_every_rank(ranks) -> None:
    own = {
        "wrong_examples": "rank 1 was given",
        "skipped_sample": "rank 1 drew 2 batches with next_share() since its last step",
        "no_share": "rank 1 called step() without next_share() first",
    }
    for name, says in own.items():
        assert says in ranks[1][name]
        assert ranks[0][name] == "rank 1 failed in step 1 (see its error); every rank stops"
    assert "boom on rank 1" in ranks[1]["clipping_fails"]  # rank 1 raises its own error
    for rank in ranks:
        assert rank["no_sample_rate"].startswith("the engine has no sample_rate")
    assert "rank 1 failed in step 1" in ranks[0]["clipping_fails"]
    assert all(rank["alive"] for rank in ranks)


def test_refused_without_a_process_group() -> None:
    engine = _engine(_model(torch.float64), "ghost", 0.25)
    with pytest.raises(DPSGDError, match=r"torch\.distributed initialised"):
        DistributedDPSGD(engine, N, seed=0)


def test_secure_noise_is_drawn_once_and_the_ranks_agree(ranks) -> None:
    before = _flat(_model(torch.float64))
    assert ranks[0]["secure"] == ranks[1]["secure"] != before


def test_auto_switches_on_each_rank_at_its_own_step(ranks) -> None:
    """Under ``auto`` a rank switches to per_sample when its first non-empty share meets the
    sequence-first layer; here rank 0 and rank 1 do so at different steps (the other one
    clipping an empty share meanwhile) and the result is still the single-process model."""
    local = [r["auto_sequence_first"]["local"] for r in ranks]
    first = [next(i for i, n in enumerate(sizes) if n > 0) for sizes in local]
    assert first[0] != first[1]
    assert all(r["auto_sequence_first"]["clipping"] == "per_sample" for r in ranks)


def test_fingerprint_is_exact_and_independent_of_the_reduction_order() -> None:
    torch.manual_seed(0)
    params = [torch.randn(300, 70, dtype=torch.float64), torch.randn(7), torch.tensor(1.5)]
    params.append(torch.randn(9, dtype=torch.float16))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = model_fingerprint(params)
        torch.set_num_threads(2)
        assert model_fingerprint(params) == one
    finally:
        torch.set_num_threads(threads)
    assert model_fingerprint([p.clone() for p in params]) == one
    for k in range(len(params)):
        changed = [p.clone() for p in params]
        flat = changed[k].view(-1)
        flat[0] = torch.nextafter(flat[0], flat[0] + 1)  # one ulp in one element
        assert model_fingerprint(changed) != one
    swapped = [params[1], params[0], *params[2:]]
    assert model_fingerprint(swapped) != one
    nan = [torch.tensor([math.nan, 1.0])]
    assert model_fingerprint(nan) == model_fingerprint([t.clone() for t in nan])
