"""Executors (where tasks run) and :func:`durable_map` (run tasks, store each result as it lands).

An executor only knows how to run ``fn`` over a sequence of tasks and yield ``(index, result)`` as
each one finishes. :func:`durable_map` adds the "nothing lost" contract on top: it skips keys that
are already in the :class:`~privacylab.execution.store.ResultStore`, and writes each new result the
moment it arrives, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from typing import Any, Protocol, TypeVar, runtime_checkable

from privacylab.execution.store import ResultStore, encode_value
from privacylab.registry import Registry

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("serial", "local", "ray")
_THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


class TaskError(RuntimeError):
    """A task raised; the message names the task index, and ``__cause__`` holds the original."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def _task_error(index: int, err: BaseException) -> TaskError:
    detail = " ".join(str(err).split())
    return TaskError(index, f"task {index} failed: {type(err).__name__}: {detail}")


@runtime_checkable
class Executor(Protocol):
    """Runs a function over tasks and yields ``(task index, result)`` as each finishes."""

    workers: int

    def map_unordered(self, fn: Callable[[T], R], tasks: Sequence[T]) -> Iterator[tuple[int, R]]:
        """Yield ``(index, fn(tasks[index]))`` for every task, in completion order.

        A task that raises stops the map with a :class:`TaskError` naming its index.
        """
        ...


class SerialExecutor:
    """Runs every task in this process, one after another, in task order."""

    workers: int = 1

    def map_unordered(self, fn: Callable[[T], R], tasks: Sequence[T]) -> Iterator[tuple[int, R]]:
        """Yield ``(index, fn(task))`` in task order; a failing task raises TaskError."""
        for index, task in enumerate(tasks):
            try:
                result = fn(task)
            except Exception as err:
                raise _task_error(index, err) from err
            yield index, result

    def __repr__(self) -> str:
        return "SerialExecutor()"


def _init_worker(threads: int) -> None:
    """Pool initializer: cap BLAS/OpenMP and torch threads so workers do not oversubscribe cores.

    The env vars are set before any task runs, so a task that imports torch gets
    ``torch.get_num_threads() == threads`` (torch sizes its intra-op pool from ``OMP_NUM_THREADS``
    at import). If torch is already imported in the worker, ``torch.set_num_threads`` is called
    directly. Torch is not imported here just to set the count: that costs seconds per worker,
    and tasks that never use torch would pay it.
    """
    for name in _THREAD_ENV_VARS:
        os.environ[name] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with torch's intra-op pool at `threads`, then restore the caller's count.

    Work units (audit trials, attack loops of small forward passes) run fastest on one thread,
    but when they run in the caller's process (serial executor, one worker) the caller's thread
    count must survive them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LocalExecutor:
    """Runs tasks in a pool of local processes started with the ``spawn`` method.

    ``spawn`` (not ``fork``) is safe with torch and threads. Each worker caps its thread count at
    `threads_per_worker` (OMP/MKL/OpenBLAS env vars, which torch follows when a task imports it,
    and ``torch.set_num_threads`` if torch is already loaded), so
    ``workers * threads_per_worker`` should not exceed the cores. With ``workers == 1`` tasks run
    in this process (no pool, no thread changes). At most ``2 * workers`` tasks are in flight, so
    an interrupt wastes little work and tasks are pickled lazily. `fn` and the tasks must be
    picklable: `fn` a top-level function of an importable module.

    Args:
        workers: number of worker processes (>= 1).
        threads_per_worker: intra-op threads per worker (>= 1).
    """

    def __init__(self, workers: int = 2, threads_per_worker: int = 1) -> None:
        for name, value in (("workers", workers), ("threads_per_worker", threads_per_worker)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.workers = workers
        self.threads_per_worker = threads_per_worker

    def __repr__(self) -> str:
        return (
            f"LocalExecutor(workers={self.workers}, threads_per_worker={self.threads_per_worker})"
        )

    def map_unordered(self, fn: Callable[[T], R], tasks: Sequence[T]) -> Iterator[tuple[int, R]]:
        """Yield ``(index, fn(task))`` as each task finishes, in completion order.

        If a task raises, no new task starts, the tasks already running are still collected and
        yielded (so their results are not lost), and then :class:`TaskError` naming the first
        failing index is raised. Closing the iterator early or a KeyboardInterrupt cancels every
        pending task.
        """
        if self.workers == 1:
            yield from SerialExecutor().map_unordered(fn, tasks)
            return
        if not tasks:
            return
        pool = cf.ProcessPoolExecutor(
            max_workers=min(self.workers, len(tasks)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self.threads_per_worker,),
        )
        # Spawned workers import the parent's main module before the initializer runs; if that
        # imports torch, only the inherited environment caps its threads. The parent's own
        # libraries are already loaded, so setting the variables here changes nothing for it.
        saved = {name: os.environ.get(name) for name in _THREAD_ENV_VARS}
        os.environ.update({name: str(self.threads_per_worker) for name in _THREAD_ENV_VARS})
        in_flight: dict[cf.Future[R], int] = {}
        next_index = 0
        failure: TaskError | None = None
        clean = False
        try:
            while True:
                while (
                    failure is None
                    and next_index < len(tasks)
                    and (len(in_flight) < 2 * self.workers)
                ):
                    in_flight[pool.submit(fn, tasks[next_index])] = next_index
                    next_index += 1
                if not in_flight:
                    break
                done, _ = cf.wait(in_flight, return_when=cf.FIRST_COMPLETED)
                for future in sorted(done, key=in_flight.__getitem__):
                    index = in_flight.pop(future)
                    if future.cancelled():
                        continue
                    err = future.exception()
                    if err is not None:
                        if failure is None:
                            failure = _task_error(index, err)
                            failure.__cause__ = err
                            for pending in in_flight:
                                pending.cancel()
                        continue
                    yield index, future.result()
            if failure is not None:
                raise failure
            clean = True
        finally:
            for pending in in_flight:
                pending.cancel()
            # A clean finish or a task failure waits for the workers to exit; an interrupt or an
            # early close does not wait for tasks that are still running.
            pool.shutdown(wait=clean or failure is not None, cancel_futures=True)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _ray_executor(workers: int, address: str | None) -> Executor:
    from privacylab.execution.ray_executor import RayExecutor

    return RayExecutor(workers=workers, address=address)


EXECUTOR_FACTORIES: Registry[Callable[[int, str | None], Executor]] = Registry(
    "executor", choices="choose one of:", sort_choices=False
)
"""Executor factories `(workers, address) -> Executor` by name, in the order of EXECUTORS."""
EXECUTOR_FACTORIES.register("serial", lambda workers, address: SerialExecutor())
EXECUTOR_FACTORIES.register("local", lambda workers, address: LocalExecutor(workers=workers))
EXECUTOR_FACTORIES.register("ray", _ray_executor)


def make_executor(
    name: str = "local", workers: int | None = None, address: str | None = None
) -> Executor:
    """Build an executor by name: ``"serial"``, ``"local"`` or ``"ray"``.

    Args:
        name: ``"serial"`` (in-process), ``"local"`` (a spawn process pool) or ``"ray"`` (Ray
            remote tasks, see :class:`~privacylab.execution.ray_executor.RayExecutor`).
        workers: worker processes (tasks at once) for ``"local"`` and ``"ray"``; default
            ``min(os.cpu_count(), 4)``, and 1 if the CPU count is unknown. Ignored by ``"serial"``.
        address: for ``"ray"`` only: ``None`` starts a local Ray instance, ``"auto"`` or
            ``"HOST:PORT"`` joins a running cluster.

    Raises:
        ValueError: unknown name (one line listing the choices), an `address` for an executor
            other than ``"ray"``, or ``"ray"`` without ray installed (one line with the install
            hint).
    """
    key = EXECUTOR_FACTORIES.canonical(name)
    if address is not None and key != "ray":
        raise ValueError(f"an address is only for the 'ray' executor, not {name!r}")
    if workers is None:
        workers = max(1, min(os.cpu_count() or 1, 4))
    return EXECUTOR_FACTORIES.make(key, workers, address)


def progress_counter(
    progress: Callable[[str, float, float], None] | None, stage: str, total: int
) -> Callable[[str, dict[str, Any], bool], None]:
    """An `on_done` callback for `durable_map` that reports each finished (or reused) unit of
    `stage` as `progress(stage, done, total)`; does nothing without `progress`."""
    done = [0]

    def tick(key: str, value: dict[str, Any], cached: bool) -> None:
        done[0] += 1
        if progress:
            progress(stage, done[0], total)

    return tick


def durable_map(
    fn: Callable[[T], Mapping[str, Any]],
    tasks: Mapping[str, T],
    store: ResultStore,
    namespace: str,
    executor: Executor,
    on_done: Callable[[str, dict[str, Any], bool], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run ``fn`` over every task not yet in the store, storing each result as soon as it finishes.

    Keys already stored in `namespace` are not run again: their stored value is returned and
    ``on_done(key, value, True)`` is called for each. The other tasks go to `executor`; each result
    is written with :meth:`ResultStore.put` the moment it arrives (first write wins, so a key
    another process stored meanwhile keeps that process's value), then ``on_done(key, value,
    False)`` is called. A run that is killed keeps everything stored so far, and re-running the
    same call finishes the rest.

    Args:
        fn: a top-level (picklable) function mapping a task to a JSON-able dict.
        tasks: unit key (e.g. from :func:`~privacylab.execution.store.config_key`) -> task.
        store: where results are kept.
        namespace: the group of keys in the store (one experiment).
        executor: where tasks run.
        on_done: called once per key with (key, stored value, cached).

    Returns:
        Every result keyed as in `tasks` (in the order of `tasks`), as stored (JSON round-tripped).

    Raises:
        TaskError: a task raised (results that finished before are stored).
        ValueError: a key is not a string, or ``fn`` returned something that is not a JSON dict.
    """
    for key in tasks:
        if not isinstance(key, str):
            raise ValueError(f"task keys must be strings, got {type(key).__name__} {key!r}")
    stored = store.items(namespace)
    results: dict[str, dict[str, Any]] = {}
    todo: list[str] = []
    for key in tasks:
        if key in stored:
            results[key] = stored[key]
            if on_done is not None:
                on_done(key, stored[key], True)
        else:
            todo.append(key)
    if todo:
        runs = executor.map_unordered(fn, [tasks[key] for key in todo])
        with closing(runs):  # type: ignore[type-var]
            for index, value in runs:
                key = todo[index]
                try:
                    encode_value(value)
                except ValueError as err:
                    raise ValueError(f"task {key!r} returned a bad result: {err}") from None
                store.put(namespace, key, value)
                kept = store.get(namespace, key)
                assert kept is not None
                results[key] = kept
                if on_done is not None:
                    on_done(key, kept, False)
    return {key: results[key] for key in tasks}
