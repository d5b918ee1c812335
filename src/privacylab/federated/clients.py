"""The clients of a simulated federation and the one-call attack scenario.

A client's work in one round is one picklable function of (model, parameters sent, its rows,
local procedure, update defence, seed): `run_client`. It runs `local_update` (McMahan et al.
2017, "Communication-Efficient Learning of Deep Networks from Decentralized Data", Alg. 1,
ClientUpdate; DP-SGD inside it when the defence asks for local privacy) and then the defence's
transformation of the update, with all randomness drawn from a generator seeded by
(seed, round, client): the same update in this process, a worker process or a Ray task, and
after a resume. `observe` is the scenario of gradient-inversion attacks (Zhu et al. 2019,
Alg. 1; Geiping et al. 2020, Sec. 5) in one call: clients compute their updates from the
model as it is, and the server's observation comes back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.execution.executor import torch_threads
from privacylab.federated.local import local_update, training_mode
from privacylab.federated.protocol import (
    ClientDefense,
    FederatedError,
    LocalTraining,
    ObservedUpdate,
    check_defense,
    check_secure_aggregation,
    whole_number,
)

__all__ = [
    "ClientResult",
    "ClientTask",
    "check_labels",
    "check_rows",
    "client_generator",
    "global_rng",
    "observe",
    "output_width",
    "run_client",
    "server_view",
    "split_evenly",
    "stream_seed",
    "weighted_mean",
]

SPLIT_STREAM = 0
SELECTION_STREAM = 1
CLIENT_STREAM = 2
DROPOUT_STREAM = 3


def stream_seed(seed: int, stream: int, *parts: int) -> int:
    """A 63-bit seed for one random stream (the row split, a round's client selection, one
    client's round), derived from the federation's `seed` with numpy's `SeedSequence`, so
    streams never share draws and each can be rebuilt alone (resume after a kill)."""
    sequence = np.random.SeedSequence([int(seed), int(stream), *(int(p) for p in parts)])
    return int(sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def client_generator(
    seed: int, round: int, client: int, device: str | torch.device = "cpu"
) -> torch.Generator:
    """The generator of `client`'s randomness in `round` (DP-SGD noise, the update defence)."""
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(stream_seed(seed, CLIENT_STREAM, round, client))
    return generator


@contextmanager
def global_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Run the block with torch's global generator (CPU, and `device`'s if CUDA) seeded by
    `seed`, then restore the caller's state: dropout masks inside `functional_call` and `vmap`
    draw from it, not from a generator passed in."""
    devices = []
    if device.type == "cuda":
        devices = [torch.cuda.current_device() if device.index is None else device.index]
    with torch.random.fork_rng(devices=devices):
        torch.random.default_generator.manual_seed(seed)
        for index in devices:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield


def split_evenly(n: int, parts: int) -> list[np.ndarray]:
    """Row indices 0..n-1 cut in order into `parts` runs whose sizes differ by at most one."""
    return [np.asarray(a, dtype=np.int64) for a in np.array_split(np.arange(n), parts)]


def weighted_mean(
    updates: Sequence[Mapping[str, Tensor]], weights: Sequence[int]
) -> dict[str, Tensor]:
    """sum_c (n_c / N) u_c with N = sum_c n_c (McMahan et al. 2017, Alg. 1: the server's
    example-weighted average), summed in client order so the result is reproducible."""
    total = float(sum(weights))
    mean: dict[str, Tensor] = {}
    for name in updates[0]:
        acc = torch.zeros_like(updates[0][name])
        for update, n in zip(updates, weights, strict=True):
            acc = acc + update[name] * (float(n) / total)
        mean[name] = acc
    return mean


@dataclass
class ClientTask:
    """One client's work in one round; picklable (sent to `LocalExecutor` or Ray workers).

    `state`: the parameters the server sent. `x`, `y`: the client's rows. `rounds`: the
    federation's total rounds, over which a DP defence spreads its budget. `device`: where the
    client computes; `to_cpu`: send the update back on the CPU (for another process)."""

    model: nn.Module
    state: dict[str, Tensor]
    x: Tensor
    y: Tensor
    training: LocalTraining
    defense: ClientDefense | None
    seed: int
    round: int
    client: int
    rounds: int
    device: str = "cpu"
    to_cpu: bool = False


@dataclass
class ClientResult:
    """What one client sends back: its (defended) update and its number of rows."""

    client: int
    update: dict[str, Tensor]
    num_examples: int


def run_client(task: ClientTask) -> ClientResult:
    """Run one client's round: local training from `task.state` on its rows (with the
    defence's local DP-SGD, if any), then the defence's transformation of the update; every
    random draw comes from `client_generator(seed, round, client)` (dropout from torch's
    global generator, seeded for the call from a stream of its own and then restored). On the
    CPU it runs on one thread, as in a `LocalExecutor` worker, so that every executor gives
    the same bits."""
    device = torch.device(task.device)
    model = task.model.to(device)
    state = {k: v.to(device) for k, v in task.state.items()}
    x, y = task.x.to(device), task.y.to(device)
    n = int(x.shape[0])
    generator = client_generator(task.seed, task.round, task.client, device)
    privacy = None
    if task.defense is not None:
        privacy = task.defense.local_privacy(training=task.training, examples=n, rounds=task.rounds)
    threads = torch_threads(1) if device.type == "cpu" else nullcontext()
    dropout_seed = stream_seed(task.seed, DROPOUT_STREAM, task.round, task.client)
    with threads, global_rng(dropout_seed, device):
        update = local_update(
            model, state, x, y, task.training, privacy=privacy, generator=generator
        )
        if task.defense is not None:
            update = task.defense.apply(_detached(update), generator)
        update = _detached(update)
    if task.to_cpu:
        update = {k: v.cpu() for k, v in update.items()}
    return ClientResult(task.client, update, n)


def _detached(update: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach() if v.requires_grad else v for k, v in update.items()}


def check_rows(x: object, y: object, what: str = "the clients'") -> tuple[Tensor, Tensor]:
    """(`x`, `y`) detached if `x` is n >= 1 rows of finite floating-point features and `y`
    holds n labels (int labels or probability rows); else FederatedError (one line)."""
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise FederatedError(f"{what} x and y must be torch tensors")
    if x.ndim < 2 or int(x.shape[0]) < 1:
        raise FederatedError(f"{what} x must hold n >= 1 rows, got shape {tuple(x.shape)}")
    if y.ndim < 1 or int(y.shape[0]) != int(x.shape[0]):
        raise FederatedError(
            f"{what} y must hold one label per row of x ({int(x.shape[0])}), "
            f"got shape {tuple(y.shape)}"
        )
    if not torch.is_floating_point(x) or not bool(torch.isfinite(x).all()):
        raise FederatedError(f"{what} x must be finite floating-point features")
    return x.detach(), y.detach()


def output_width(model: nn.Module, x: Tensor) -> int:
    """The number of classes `model` scores: the width of its (n, k) logits on the first row
    of `x` (eval mode, no gradient; each module's mode restored), else FederatedError."""
    try:
        with training_mode(model, False), torch.no_grad():
            out = model(x[:1])
    except Exception as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise FederatedError(f"the model cannot run on x: {detail}") from None
    if not isinstance(out, Tensor) or out.ndim != 2 or int(out.shape[1]) < 2:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise FederatedError(f"the model must return (n, classes) logits, got {shape}")
    return int(out.shape[1])


def check_labels(y: Tensor, num_classes: int, what: str = "the clients'") -> None:
    """FederatedError (one line) unless `y` is int labels (n,) in 0..num_classes-1 or
    probability rows (n, num_classes) of finite non-negative entries (`cross_entropy`'s two
    forms)."""
    if torch.is_floating_point(y):
        if y.ndim != 2 or int(y.shape[1]) != num_classes:
            raise FederatedError(
                f"{what} y must be int labels (n,) or probability rows (n, {num_classes}), "
                f"got {y.dtype} of shape {tuple(y.shape)}"
            )
        if not bool(torch.isfinite(y).all()) or bool((y < 0).any()):
            raise FederatedError(f"{what} probability rows must be finite and >= 0")
        return
    if y.ndim != 1 or y.dtype == torch.bool or y.is_complex():
        raise FederatedError(
            f"{what} y must be int labels (n,) or probability rows (n, {num_classes}), "
            f"got {y.dtype} of shape {tuple(y.shape)}"
        )
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= num_classes:
        raise FederatedError(
            f"{what} labels must lie in 0..{num_classes - 1} (the model's outputs), "
            f"got {low}..{high}"
        )


def observe(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    training: LocalTraining | None = None,
    defense: ClientDefense | None = None,
    clients: int = 1,
    secure_aggregation: bool = False,
    seed: int = 0,
    rounds: int = 1,
) -> list[ObservedUpdate]:
    """What an honest-but-curious server observes in one round (round 1) in which `clients`
    clients, holding (`x`, `y`) cut in order into runs of near-equal size, each compute their
    update from `model`'s current parameters with `training` (Zhu et al. 2019, Alg. 1: FedSGD,
    one gradient; Geiping et al. 2020, Sec. 5: FedAvg's local steps) and apply `defense`.
    Returns one `ObservedUpdate` per client, or with `secure_aggregation` (Bonawitz et al.
    2017) only their example-weighted mean. `rounds` is the number of rounds of the whole
    federation, over which a DP defence spreads its privacy budget. `model` is not changed."""
    if not isinstance(model, nn.Module):
        raise FederatedError(f"model must be a torch module, got {type(model).__name__}")
    defense = check_defense(defense)
    training = LocalTraining() if training is None else training
    if not isinstance(training, LocalTraining):
        raise FederatedError(f"training must be a LocalTraining, got {type(training).__name__}")
    x, y = check_rows(x, y)
    clients = whole_number("clients", clients)
    rounds = whole_number("rounds", rounds)
    seed = whole_number("seed", seed, 0)
    check_secure_aggregation(secure_aggregation, clients)
    if clients > int(x.shape[0]):
        raise FederatedError(f"{clients} clients need at least {clients} rows, got {len(x)}")
    parameters = list(model.named_parameters())
    if not parameters:
        raise FederatedError("the model has no parameters to train")
    check_labels(y, output_width(model, x))
    device = parameters[0][1].device
    state = {k: v.detach().clone() for k, v in parameters}
    results = [
        run_client(
            ClientTask(
                model, state, x[rows], y[rows], training, defense, seed, 1, c, rounds, str(device)
            )
        )
        for c, rows in enumerate(split_evenly(int(x.shape[0]), clients))
    ]
    return server_view(results, state, 1, training, defense, secure_aggregation)


def server_view(
    results: Sequence[ClientResult],
    state: dict[str, Tensor],
    round: int,
    training: LocalTraining,
    defense: ClientDefense | None,
    secure_aggregation: bool,
) -> list[ObservedUpdate]:
    """The server's observation of one round from the clients' results (in client order): one
    `ObservedUpdate` per client, or with secure aggregation one aggregate whose update is the
    example-weighted mean and whose `num_examples` is the total (Bonawitz et al. 2017: the sum
    is all the server learns). The per-client updates are not kept in the aggregate."""
    spec = None if defense is None else defense.spec
    if secure_aggregation:
        weights = [r.num_examples for r in results]
        return [
            ObservedUpdate(
                round=round,
                clients=tuple(r.client for r in results),
                state=state,
                update=weighted_mean([r.update for r in results], weights),
                num_examples=sum(weights),
                training=training,
                aggregated=True,
                defense=spec,
            )
        ]
    return [
        ObservedUpdate(
            round=round,
            clients=(r.client,),
            state=state,
            update=r.update,
            num_examples=r.num_examples,
            training=training,
            defense=spec,
        )
        for r in results
    ]
