"""Run tasks on Ray actors: on a local Ray instance, or on a cluster by its address.

Ray is an optional dependency (``pip install privacylab[distributed]``) and is imported only when a
:class:`RayExecutor` is built, never when :mod:`privacylab.execution` is imported.

On a cluster every node must have privacylab (and whatever module `fn` lives in) installed: tasks
refer to ``fn`` by module and name, as with :class:`~privacylab.execution.LocalExecutor`.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from privacylab.errors import PrivacylabError
from privacylab.execution.executor import TaskError, _init_worker, _task_error

T = TypeVar("T")
R = TypeVar("R")

INSTALL_HINT = "the Ray executor needs `pip install privacylab[distributed]`"


def _import_ray() -> Any:
    """Import ray, or raise ValueError with the one-line install hint."""
    try:
        import ray
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return ray


CONNECT_TIMEOUT = 15.0
"""Seconds `RayExecutor` waits for a cluster address to accept a connection."""


class RayConnectionError(PrivacylabError, ValueError):
    """A Ray cluster could not be reached; the message is one line."""


def _connect_timeout(value: float | None) -> float:
    if value is None:
        text = os.environ.get("PRIVACYLAB_RAY_CONNECT_TIMEOUT")
        try:
            value = CONNECT_TIMEOUT if text is None else float(text)
        except ValueError:
            raise ValueError(
                f"PRIVACYLAB_RAY_CONNECT_TIMEOUT must be a number of seconds, got {text!r}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise ValueError(f"connect_timeout must be in (0, 3600] seconds, got {value!r}")
    return float(value)


def _check_reachable(address: str, timeout: float) -> None:
    """Open (and close) a TCP connection to `HOST:PORT` within `timeout` seconds, or raise
    RayConnectionError: `ray.init` itself keeps retrying an unreachable address for minutes."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RayConnectionError(f"Ray address must be 'auto' or HOST:PORT, got {address!r}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as error:
        reason = "timed out" if isinstance(error, TimeoutError) else (error.strerror or error)
        raise RayConnectionError(
            f"cannot reach the Ray cluster at {address} within {timeout:g} s ({reason}); "
            "check the address, or set PRIVACYLAB_RAY_CONNECT_TIMEOUT"
        ) from None


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 while joining a cluster: Ray's C++ client logs each failed
    attempt there, and a failure is reported as one line of ours instead."""
    import sys

    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class _Worker:
    """A Ray actor that runs tasks one after another in one process (the counterpart of a
    LocalExecutor pool worker). A call on an actor goes straight to its process, without the
    per-task scheduling round trip of a Ray task (10–20% more 0.1 s audit trials per minute with
    one worker on two cores, `benchmarks/audit_throughput.py`), and whatever a task caches in its
    process (datasets, set-ups) is kept for the next."""

    def __init__(self, threads: int) -> None:
        _init_worker(threads)

    def run(self, fn: Callable[[Any], Any], task: Any) -> Any:
        """Return ``fn(task)``."""
        return fn(task)


def _ray_task_error(index: int, err: BaseException, ray_error: type[BaseException]) -> TaskError:
    """The TaskError LocalExecutor would raise: an exception raised by `fn` is unwrapped from
    Ray's wrapper; a failure of Ray itself (a worker crash, `fn` not importable by the workers)
    keeps its type, without the remote traceback Ray appends to its message."""
    cause = getattr(err, "cause", None)
    original = cause if isinstance(cause, BaseException) else err
    if isinstance(original, ray_error):
        detail = " ".join(str(original).split()).split(" traceback: ")[0]
        failure = TaskError(index, f"task {index} failed: {type(original).__name__}: {detail}")
    else:
        failure = _task_error(index, original)
    failure.__cause__ = original
    return failure


class RayExecutor:
    """Runs tasks on `workers` Ray actors (``num_cpus=1`` each), yielding results as they finish.

    With ``address=None`` a local Ray instance is started with ``num_cpus=workers`` (unless the
    ``RAY_ADDRESS`` environment variable names a cluster, which Ray then joins); with ``"auto"`` or
    ``"HOST:PORT"`` the executor joins that running cluster. Ray starts on the first
    :meth:`map_unordered` (or :meth:`start`, or ``with``) and :meth:`close` shuts it down only if
    this executor started it. Each actor has at most two tasks in flight (one running, one
    queued), so an interrupt wastes little work. Each actor caps its thread count at
    `threads_per_worker` (OMP/MKL/OpenBLAS env vars and ``torch.set_num_threads``). Tasks carry
    their own seeds, so results equal :class:`~privacylab.execution.LocalExecutor`'s. `fn` and
    the tasks must be picklable (`fn` a top-level function of a module the Ray workers can
    import: an installed package, or a script's ``__main__``, which Ray ships by value; a module
    found only through the driver's ``sys.path`` fails with a one-line TaskError naming the
    missing module).

    Args:
        workers: tasks run at once (>= 1); also the CPUs of a local Ray instance.
        address: ``None`` for a local instance, ``"auto"`` or ``"HOST:PORT"`` for a cluster.
        threads_per_worker: intra-op threads per task (>= 1).
        connect_timeout: seconds to wait for a cluster's address to answer before giving up
            with :class:`RayConnectionError` (default `CONNECT_TIMEOUT`, or the environment
            variable ``PRIVACYLAB_RAY_CONNECT_TIMEOUT``).

    Raises:
        ValueError: a bad argument, or ray is not installed (one line with the install hint).
    """

    def __init__(
        self,
        workers: int = 2,
        address: str | None = None,
        threads_per_worker: int = 1,
        connect_timeout: float | None = None,
    ) -> None:
        for name, value in (("workers", workers), ("threads_per_worker", threads_per_worker)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ValueError(f"address must be 'auto' or 'HOST:PORT', got {address!r}")
        self.connect_timeout = _connect_timeout(connect_timeout)
        self._ray = _import_ray()
        self.workers = workers
        self.address = address.strip() if address is not None else None
        self.threads_per_worker = threads_per_worker
        self._started = False

    def __repr__(self) -> str:
        return (
            f"RayExecutor(workers={self.workers}, address={self.address!r}, "
            f"threads_per_worker={self.threads_per_worker})"
        )

    def start(self) -> RayExecutor:
        """Start (or join) Ray if it is not running yet; returns self."""
        ray = self._ray
        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS") or None
            joins = address is not None
            if address is not None and address != "auto":
                _check_reachable(address, self.connect_timeout)
            if joins:
                os.environ.setdefault(
                    "RAY_gcs_rpc_server_connect_timeout_s", str(max(1, round(self.connect_timeout)))
                )
            try:
                with _quiet_stderr() if joins else contextlib.nullcontext():
                    ray.init(
                        address=self.address or None,
                        num_cpus=None if joins else self.workers,
                        include_dashboard=False,
                        ignore_reinit_error=True,
                        log_to_driver=False,
                    )
            except (ConnectionError, RuntimeError, TimeoutError) as error:
                detail = " ".join(str(error).split())[:300]
                raise RayConnectionError(
                    f"cannot join the Ray cluster at {address or 'a new local instance'}: {detail}"
                ) from None
            self._started = True
        return self

    def close(self) -> None:
        """Shut Ray down if this executor started it (a joined or pre-existing Ray is left)."""
        if self._started:
            self._ray.shutdown()
            self._started = False

    def __enter__(self) -> RayExecutor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def map_unordered(self, fn: Callable[[T], R], tasks: Sequence[T]) -> Iterator[tuple[int, R]]:
        """Yield ``(index, fn(task))`` as each task finishes, in completion order.

        If a task raises, no new task starts, the tasks already running are still collected and
        yielded, and then :class:`~privacylab.execution.TaskError` naming the first failing index
        is raised (its ``__cause__`` is the task's own exception). Closing the iterator early or a
        KeyboardInterrupt stops the running tasks: the call's actors are killed when it ends.
        """
        if not tasks:
            return
        self.start()
        ray = self._ray
        # The actors hold their CPUs while they live, so they live for one call: a later call
        # (or another executor on the same cluster) finds the CPUs free again.
        actor = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(_Worker)
        count = min(self.workers, len(tasks))
        actors = [actor.remote(self.threads_per_worker) for _ in range(count)]
        in_flight: dict[Any, tuple[int, int]] = {}
        load = [0] * count
        next_index = 0
        failure: TaskError | None = None
        try:
            while True:
                while failure is None and next_index < len(tasks) and min(load) < 2:
                    slot = load.index(min(load))
                    ref = actors[slot].run.remote(fn, tasks[next_index])
                    in_flight[ref] = (next_index, slot)
                    load[slot] += 1
                    next_index += 1
                if not in_flight:
                    break
                done, _ = ray.wait(list(in_flight), num_returns=1)
                for ref in sorted(done, key=in_flight.__getitem__):
                    index, slot = in_flight.pop(ref)
                    load[slot] -= 1
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayError as err:
                        if failure is None:
                            failure = _ray_task_error(index, err, ray.exceptions.RayError)
                        continue
                    yield index, result
            if failure is not None:
                raise failure
        finally:
            # Killing the actors also stops tasks still running after an early close or an
            # interrupt.
            for worker in actors:
                with contextlib.suppress(Exception):
                    ray.kill(worker)
