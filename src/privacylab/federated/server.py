"""The server of a simulated federation: FederatedAveraging and FederatedSGD.

McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from Decentralized
Data", Alg. 1: each round the server selects `clients_per_round` of its k clients (C*K in the
paper), sends them the global parameters w_t, each client runs its local procedure on its own
rows (`LocalTraining`: FedSGD sends the gradient g_c of its mean loss, FedAvg the change
w_t - w_c after E local epochs of SGD in batches of B), and the server steps with the
example-weighted mean (n_c / n) of what came back:

    FedSGD:  w_{t+1} = w_t - server_lr * lr * sum_c (n_c / n) g_c
    FedAvg:  w_{t+1} = w_t - server_lr * sum_c (n_c / n) (w_t - w_c)

(server_lr = 1 is the paper's algorithm). The server is honest but curious: what it observes
each round is returned as `ObservedUpdate`s — one per client, or with secure aggregation
(Bonawitz et al. 2017) only the weighted mean — and `Federation.target` hands them to an
attacker as a `Target` at `updates` access. Clients run on the project's executors (serial, a
local process pool, Ray) with identical results; every random draw of round r is seeded by
(seed, r, client), so a run resumed from its checkpoint gives the same numbers.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.errors import PrivacylabError
from privacylab.execution.executor import EXECUTORS, Executor, TaskError, make_executor
from privacylab.federated.checkpoint import load_round, save_round
from privacylab.federated.clients import (
    SELECTION_STREAM,
    SPLIT_STREAM,
    ClientResult,
    ClientTask,
    check_labels,
    check_rows,
    output_width,
    run_client,
    server_view,
    stream_seed,
    weighted_mean,
)
from privacylab.federated.local import training_mode
from privacylab.federated.protocol import (
    ClientDefense,
    FederatedError,
    LocalTraining,
    ObservedUpdate,
    check_defense,
    check_secure_aggregation,
    positive_number,
    whole_number,
)
from privacylab.target import Target

__all__ = ["Federation", "FederationConfig", "FederationResult", "RoundRecord", "accuracy"]


@dataclass(frozen=True)
class FederationConfig:
    """A federation's protocol (McMahan et al. 2017, Alg. 1).

    `clients`: K clients. `rounds`: communication rounds. `training`: each client's local
    procedure (FedSGD or FedAvg with E epochs, batch B, step lr). `clients_per_round`: clients
    selected uniformly without replacement each round (None: all). `rows_per_client`: None
    splits all rows evenly (iid, seeded shuffle); an int gives each client that many distinct
    rows; a tuple gives client c `rows_per_client[c]` rows. `secure_aggregation`: the server
    sees only the weighted mean of a round's updates (>= 2 clients per round, Bonawitz et al.
    2017). `server_lr`: the server's step on the
    mean update (1: the paper). `seed`: the row split, the client selection and every
    client's randomness. `executor`, `workers`: where clients run (`make_executor`)."""

    clients: int = 10
    rounds: int = 1
    training: LocalTraining = field(default_factory=LocalTraining)
    clients_per_round: int | None = None
    rows_per_client: int | tuple[int, ...] | None = None
    secure_aggregation: bool = False
    server_lr: float = 1.0
    seed: int = 0
    executor: str = "serial"
    workers: int | None = None

    def __post_init__(self) -> None:
        def keep(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        keep("clients", whole_number("clients", self.clients))
        keep("rounds", whole_number("rounds", self.rounds))
        if not isinstance(self.training, LocalTraining):
            raise FederatedError(
                f"training must be a LocalTraining, got {type(self.training).__name__}"
            )
        if self.clients_per_round is not None:
            keep("clients_per_round", whole_number("clients_per_round", self.clients_per_round))
            if self.clients_per_round > self.clients:
                raise FederatedError(
                    f"clients_per_round ({self.clients_per_round}) exceeds clients ({self.clients})"
                )
        rows = self.rows_per_client
        if isinstance(rows, list | tuple):
            if len(rows) != self.clients:
                raise FederatedError(
                    f"rows_per_client lists {len(rows)} sizes for {self.clients} clients"
                )
            keep("rows_per_client", tuple(whole_number("rows_per_client", r) for r in rows))
        elif rows is not None:
            keep("rows_per_client", whole_number("rows_per_client", rows))
        check_secure_aggregation(self.secure_aggregation, self.per_round)
        keep("server_lr", positive_number("server_lr", self.server_lr))
        keep("seed", whole_number("seed", self.seed, 0))
        if self.executor not in EXECUTORS:
            raise FederatedError(
                f"executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}"
            )
        if self.workers is not None:
            keep("workers", whole_number("workers", self.workers))

    @property
    def per_round(self) -> int:
        """Clients selected each round."""
        return self.clients if self.clients_per_round is None else self.clients_per_round

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        rows = self.rows_per_client
        return {
            "clients": self.clients,
            "rounds": self.rounds,
            "training": self.training.to_dict(),
            "clients_per_round": self.clients_per_round,
            "rows_per_client": list(rows) if isinstance(rows, tuple) else rows,
            "secure_aggregation": self.secure_aggregation,
            "server_lr": self.server_lr,
            "seed": self.seed,
            "executor": self.executor,
            "workers": self.workers,
        }


@dataclass(frozen=True)
class RoundRecord:
    """One finished round: the clients that took part, their rows, the global model's test
    accuracy after the round (None without test data) and the round's seconds."""

    round: int
    clients: tuple[int, ...]
    num_examples: int
    test_accuracy: float | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "round": self.round,
            "clients": list(self.clients),
            "num_examples": self.num_examples,
            "test_accuracy": self.test_accuracy,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoundRecord:
        """Inverse of `to_dict`."""
        accuracy = data["test_accuracy"]
        return cls(
            round=int(data["round"]),
            clients=tuple(int(c) for c in data["clients"]),
            num_examples=int(data["num_examples"]),
            test_accuracy=None if accuracy is None else float(accuracy),
            seconds=float(data["seconds"]),
        )


@dataclass(frozen=True)
class FederationResult:
    """What `Federation.fit` did: every finished round (resumed ones included), the last test
    accuracy, the seconds this call took and the round it resumed after (0: a fresh start)."""

    config: FederationConfig
    defense: str | None
    history: tuple[RoundRecord, ...]
    seconds: float
    resumed_from: int

    @property
    def accuracy(self) -> float | None:
        """Test accuracy of the global model after the last finished round."""
        return self.history[-1].test_accuracy if self.history else None

    @property
    def rounds(self) -> int:
        """Rounds finished."""
        return self.history[-1].round if self.history else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "config": self.config.to_dict(),
            "defense": self.defense,
            "rounds": self.rounds,
            "accuracy": self.accuracy,
            "seconds": self.seconds,
            "resumed_from": self.resumed_from,
            "history": [r.to_dict() for r in self.history],
        }


def accuracy(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 1024) -> float:
    """Share of rows of `x` whose arg-max logit is the label in `y` (every module in eval mode
    for the count, each one's own mode restored after)."""
    correct = 0
    with training_mode(model, False), torch.no_grad():
        for start in range(0, int(x.shape[0]), batch_size):
            logits = model(x[start : start + batch_size])
            correct += int((logits.argmax(1) == y[start : start + batch_size]).sum())
    return correct / max(int(x.shape[0]), 1)


def _labelled_rows(x: object, y: object, what: str) -> tuple[Tensor, Tensor]:
    x, y = check_rows(x, y, what)
    if y.ndim != 1 or torch.is_floating_point(y) or y.dtype == torch.bool:
        raise FederatedError(
            f"{what} y must be integer class labels, got {y.dtype} of shape {tuple(y.shape)}"
        )
    return x, y.long()


def _digest(tensors: Iterable[tuple[str, Tensor]]) -> str:
    hasher = hashlib.sha256()
    for name, tensor in tensors:
        hasher.update(name.encode())
        hasher.update(str(tuple(tensor.shape)).encode())
        hasher.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return hasher.hexdigest()


def _print_round(total: int) -> Callable[[RoundRecord], None]:
    def show(record: RoundRecord) -> None:
        accuracy = (
            "" if record.test_accuracy is None else f", test accuracy {record.test_accuracy:.4f}"
        )
        print(
            f"round {record.round}/{total}: {len(record.clients)} clients, "
            f"{record.num_examples} examples{accuracy}, {record.seconds:.2f} s",
            file=sys.stderr,
            flush=True,
        )

    return show


class Federation:
    """K simulated clients holding (`x`, `y`) and the server that trains `model` with them
    (McMahan et al. 2017, Alg. 1). The caller's model is copied, never changed; `device` is
    where the global model and the clients compute. `defense` is what every client applies
    to its update (`privacylab.defenses.update`; None: nothing). Buffers (BatchNorm running
    statistics) are not federated: clients compute with the global model's own."""

    def __init__(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        config: FederationConfig,
        defense: ClientDefense | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        if not isinstance(config, FederationConfig):
            raise FederatedError(f"config must be a FederationConfig, got {type(config).__name__}")
        if not isinstance(model, nn.Module):
            raise FederatedError(f"model must be a torch module, got {type(model).__name__}")
        x, y = _labelled_rows(x, y, "training")
        self.config = config
        self.defense = check_defense(defense)
        self.device = torch.device(device)
        self._model = copy.deepcopy(model).to(self.device)
        if not any(True for _ in self._model.parameters()):
            raise FederatedError("the model has no parameters to train")
        self._x, self._y = x.to(self.device), y.to(self.device)
        self.num_classes = output_width(self._model, self._x)
        check_labels(self._y, self.num_classes, "training")
        self._rows = self._split(int(x.shape[0]))
        self._completed = 0
        self._history: list[RoundRecord] = []
        self._executor: Executor | None = None
        self._participations: int | None = None
        self._fingerprint = self._make_fingerprint(x, y)

    def _split(self, n: int) -> list[Tensor]:
        k, rows = self.config.clients, self.config.rows_per_client
        if rows is None:
            sizes = [n // k + (1 if c < n % k else 0) for c in range(k)]
        elif isinstance(rows, int):
            sizes = [rows] * k
        else:
            sizes = list(rows)
        if rows is None and n < k:
            raise FederatedError(f"{k} clients need at least {k} rows, got {n}")
        if sum(sizes) > n:
            raise FederatedError(f"rows_per_client asks for {sum(sizes)} rows, only {n} given")
        order = np.random.default_rng(stream_seed(self.config.seed, SPLIT_STREAM)).permutation(n)
        bounds = np.cumsum([0, *sizes])
        return [
            torch.as_tensor(np.sort(order[bounds[c] : bounds[c + 1]]), device=self.device)
            for c in range(k)
        ]

    def _make_fingerprint(self, x: Tensor, y: Tensor) -> str:
        config = self.config.to_dict()
        del config["executor"], config["workers"]  # results do not depend on them
        identity = {
            "config": config,
            "defense": None if self.defense is None else self.defense.spec,
            "data": _digest([("x", x), ("y", y)]),
            "model": _digest(self._model.state_dict().items()),
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    @property
    def model(self) -> nn.Module:
        """A copy of the current global model."""
        return copy.deepcopy(self._model)

    @property
    def state(self) -> dict[str, Tensor]:
        """A detached copy of the current global parameters (name -> tensor)."""
        return {k: v.detach().clone() for k, v in self._model.named_parameters()}

    @property
    def rounds_done(self) -> int:
        """The last round finished (0: none)."""
        return self._completed

    def client_data(self, c: int) -> tuple[Tensor, Tensor]:
        """Client `c`'s rows (x, y)."""
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < self.config.clients:
            raise FederatedError(f"client must be in 0..{self.config.clients - 1}, got {c!r}")
        rows = self._rows[c]
        return self._x[rows], self._y[rows]

    @property
    def participations(self) -> int:
        """The most rounds any one client takes part in over the whole run: what a DP-SGD
        client defence is calibrated for. Selection depends only on the seed, never on the
        data, so a client's rows are charged only for the rounds it is selected in (no
        amplification by the selection is claimed); every client shares the σ of the busiest,
        so σ tells nothing about a client's own schedule."""
        if self._participations is None:
            counts = np.zeros(self.config.clients, dtype=np.int64)
            for r in range(1, self.config.rounds + 1):
                counts[self.selected(r)] += 1
            self._participations = max(int(counts.max()), 1)
        return self._participations

    def selected(self, r: int) -> list[int]:
        """The clients taking part in round `r`: all, or `clients_per_round` of them drawn
        uniformly without replacement from a stream seeded by (seed, r), in id order."""
        k, m = self.config.clients, self.config.per_round
        if m == k:
            return list(range(k))
        rng = np.random.default_rng(stream_seed(self.config.seed, SELECTION_STREAM, r))
        return sorted(int(c) for c in rng.choice(k, size=m, replace=False))

    def _executor_for_clients(self) -> Executor:
        if self._executor is None:
            try:
                self._executor = make_executor(self.config.executor, self.config.workers)
            except PrivacylabError:
                raise
            except ValueError as error:
                raise FederatedError(str(error)) from None
        return self._executor

    def close(self) -> None:
        """Release the executor (a Ray instance it started is shut down); a later round
        builds a new one."""
        executor, self._executor = self._executor, None
        close = getattr(executor, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Federation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run_clients(self, tasks: Sequence[ClientTask]) -> list[ClientResult]:
        executor = self._executor_for_clients()
        results: list[ClientResult | None] = [None] * len(tasks)
        try:
            for index, result in executor.map_unordered(run_client, tasks):
                results[index] = result
        except TaskError as error:
            if isinstance(error.__cause__, PrivacylabError):
                raise error.__cause__ from None
            raise
        return [r for r in results if r is not None]

    def round(self, r: int) -> list[ObservedUpdate]:
        """Run round `r` (the next one: rounds run once each, in order, as a DP defence's
        budget counts them) from the current global parameters: the selected clients train
        locally and apply the defence (randomness seeded by (seed, r, client)), the server
        steps with the example-weighted mean. Returns what the server observed: one
        `ObservedUpdate` per client, or with secure aggregation one aggregate (the
        individual updates are then dropped, kept nowhere)."""
        r = whole_number("round", r)
        if r != self._completed + 1 or r > self.config.rounds:
            raise FederatedError(
                f"round {r} cannot run now: rounds run once each, in order, up to "
                f"{self.config.rounds} (the next is {self._completed + 1})"
            )
        config = self.config
        state = self.state
        in_process = config.executor == "serial"
        model = self._model if in_process else copy.deepcopy(self._model).cpu()
        sent = state if in_process else {k: v.cpu() for k, v in state.items()}
        tasks = []
        for c in self.selected(r):
            x, y = self.client_data(c)
            tasks.append(
                ClientTask(
                    model=model,
                    state=sent,
                    x=x if in_process else x.cpu(),
                    y=y if in_process else y.cpu(),
                    training=config.training,
                    defense=self.defense,
                    seed=config.seed,
                    round=r,
                    client=c,
                    rounds=self.participations,
                    device=str(self.device),
                    to_cpu=not in_process,
                )
            )
        results = self._run_clients(tasks)
        for result in results:
            result.update = {k: v.to(self.device) for k, v in result.update.items()}
        observed = server_view(
            results, state, r, config.training, self.defense, config.secure_aggregation
        )
        if config.secure_aggregation:
            mean = observed[0].update
        else:
            mean = weighted_mean([o.update for o in observed], [o.num_examples for o in observed])
        del results, tasks
        step = config.server_lr * (config.training.lr if config.training.sends == "gradient" else 1)
        with torch.no_grad():
            for name, param in self._model.named_parameters():
                param.sub_(step * mean[name].to(param.dtype))
        self._completed = r
        return observed

    def target(self, observed: Sequence[ObservedUpdate]) -> Target:
        """What the server knows as a `Target` at `updates` access: a copy of the global model
        and the `observed` updates (a white-box view of it hides them: AccessError)."""
        return Target(
            self.model, "updates", self.num_classes, updates=list(observed), device=self.device
        )

    def fit(
        self,
        test_x: Tensor | None = None,
        test_y: Tensor | None = None,
        checkpoint: str | Path | None = None,
        *,
        until: int | None = None,
        progress: bool | Callable[[RoundRecord], None] = True,
    ) -> FederationResult:
        """Run the rounds after the last finished one up to `until` (default: all), recording
        the global model's accuracy on (`test_x`, `test_y`) after each. With `checkpoint` (a
        folder), the global model and the record are committed after every round, and a
        later call (in a fresh process) resumes after the last committed round with the same
        numbers as an uninterrupted run. `progress`: one line per round on stderr (True),
        nothing (False), or a callable given each `RoundRecord`."""
        started = time.perf_counter()
        until = self.config.rounds if until is None else whole_number("until", until)
        if until > self.config.rounds:
            raise FederatedError(f"until ({until}) exceeds the rounds ({self.config.rounds})")
        if (test_x is None) != (test_y is None):
            raise FederatedError("give both test_x and test_y, or neither")
        if test_x is not None and test_y is not None:
            test_x, test_y = _labelled_rows(test_x, test_y, "test")
            test_x, test_y = test_x.to(self.device), test_y.to(self.device)
        folder = None if checkpoint is None else Path(checkpoint)
        if folder is not None:
            loaded = load_round(folder, self._model, self._fingerprint)
            if loaded is not None:
                self._completed, record = loaded
                self._history = [RoundRecord.from_dict(h) for h in record.get("history", [])]
        show = _print_round(self.config.rounds) if progress is True else progress or None
        resumed_from = self._completed
        try:
            self._run_rounds(until, test_x, test_y, folder, show)
        finally:
            self.close()
        return FederationResult(
            config=self.config,
            defense=None if self.defense is None else self.defense.spec,
            history=tuple(self._history),
            seconds=time.perf_counter() - started,
            resumed_from=resumed_from,
        )

    def _run_rounds(
        self,
        until: int,
        test_x: Tensor | None,
        test_y: Tensor | None,
        folder: Path | None,
        show: Callable[[RoundRecord], None] | None,
    ) -> None:
        for r in range(self._completed + 1, until + 1):
            begin = time.perf_counter()
            observed = self.round(r)
            clients = tuple(sorted(c for o in observed for c in o.clients))
            examples = sum(o.num_examples for o in observed)
            del observed
            score = None
            if test_x is not None and test_y is not None:
                score = accuracy(self._model, test_x, test_y)
            record = RoundRecord(r, clients, examples, score, time.perf_counter() - begin)
            self._history.append(record)
            if folder is not None:
                save_round(
                    folder,
                    self._model,
                    self._fingerprint,
                    r,
                    {
                        "config": self.config.to_dict(),
                        "defense": None if self.defense is None else self.defense.spec,
                        "history": [h.to_dict() for h in self._history],
                    },
                )
            if show is not None:
                show(record)
