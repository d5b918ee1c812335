"""Executors and durable_map: same results serial or in processes, failures name their task, and a
SIGKILLed run resumes without redoing any stored unit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from privacylab.execution import (
    Executor,
    LocalExecutor,
    ResultStore,
    SerialExecutor,
    TaskError,
    durable_map,
    make_executor,
)

# Task functions live in a module written to disk, so spawned workers (and the killed subprocess)
# can import them by name.
_TASKS_SOURCE = textwrap.dedent(
    """
    import time

    def square(task):
        return {"n": task["n"], "square": task["n"] ** 2, "name": f"item-{task['n']}"}

    def fail_on_three(n):
        if n == 3:
            raise ZeroDivisionError("three is bad")
        time.sleep(0.02)
        return {"n": n}

    def nan_result(n):
        return {"n": float("nan")}

    def thread_counts(_):
        import os

        import torch

        return {"torch": torch.get_num_threads(), "omp": os.environ["OMP_NUM_THREADS"]}

    def nap(n):
        time.sleep(0.3)
        return {"n": n}

    def logged_slow(task):
        with open(task["log"], "a") as log:
            log.write(task["key"] + "\\n")
        time.sleep(task["delay"])
        return {"key": task["key"], "cube": task["n"] ** 3}
    """
)

_RUNNER_SOURCE = textwrap.dedent(
    """
    import json
    import sys

    import _privacylab_exec_tasks as tasks_module
    from privacylab.execution import LocalExecutor, ResultStore, SerialExecutor, durable_map

    def main():
        db, log, executor_name = sys.argv[1:4]
        tasks = {
            f"k{n:02d}": {"key": f"k{n:02d}", "n": n, "log": log, "delay": 0.08}
            for n in range(40)
        }
        executor = SerialExecutor() if executor_name == "serial" else LocalExecutor(2)
        cached = []
        with ResultStore(db) as store:
            out = durable_map(
                tasks_module.logged_slow, tasks, store, "kill", executor,
                on_done=lambda key, value, was_cached: cached.append(key) if was_cached else None,
            )
        print(json.dumps({"cached": sorted(cached), "n": len(out)}))

    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("exec_tasks")
    (folder / "_privacylab_exec_tasks.py").write_text(_TASKS_SOURCE)
    (folder / "runner.py").write_text(_RUNNER_SOURCE)
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("_privacylab_exec_tasks", None)


@pytest.fixture(scope="module")
def tasks_module(task_dir: Path):
    import _privacylab_exec_tasks

    return _privacylab_exec_tasks


def test_protocol_and_make_executor() -> None:
    serial = make_executor("serial")
    local = make_executor("local", workers=3)
    assert isinstance(serial, SerialExecutor) and serial.workers == 1
    assert isinstance(local, LocalExecutor) and local.workers == 3
    assert isinstance(serial, Executor) and isinstance(local, Executor)
    assert make_executor("local").workers >= 1


def test_make_executor_bad_names() -> None:
    with pytest.raises(ValueError, match="serial, local") as info:
        make_executor("threads")
    assert "\n" not in str(info.value)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="workers"):
            LocalExecutor(workers=bad)  # type: ignore[arg-type]


def test_serial_and_local_durable_map_agree(tmp_path: Path, tasks_module) -> None:
    tasks = {f"t{n}": {"n": n} for n in range(12)}
    out = {}
    for name, executor in (("serial", SerialExecutor()), ("local", LocalExecutor(2))):
        events: list[tuple[str, bool]] = []
        with ResultStore(tmp_path / f"{name}.db") as store:
            out[name] = durable_map(
                tasks_module.square,
                tasks,
                store,
                "sq",
                executor,
                on_done=lambda k, v, cached, events=events: events.append((k, cached)),
            )
            assert store.count("sq") == 12
            assert store.items("sq") == out[name]
        assert sorted(events) == sorted((k, False) for k in tasks)
    assert out["serial"] == out["local"]
    assert list(out["local"]) == list(tasks)
    assert out["local"]["t5"] == {"n": 5, "square": 25, "name": "item-5"}


def test_durable_map_skips_stored_keys(tmp_path: Path, tasks_module) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        store.put("sq", "t1", {"n": 1, "square": -1, "name": "planted"})
        events: list[tuple[str, bool]] = []
        out = durable_map(
            tasks_module.square,
            {f"t{n}": {"n": n} for n in range(3)},
            store,
            "sq",
            SerialExecutor(),
            on_done=lambda k, v, cached: events.append((k, cached)),
        )
    assert out["t1"]["name"] == "planted"  # not re-run, stored value returned
    assert out["t2"] == {"n": 2, "square": 4, "name": "item-2"}
    assert sorted(events) == [("t0", False), ("t1", True), ("t2", False)]


def test_local_map_unordered_yields_every_index_once(tasks_module) -> None:
    tasks = list(range(9))
    got = list(LocalExecutor(2).map_unordered(tasks_module.fail_on_three, [n + 10 for n in tasks]))
    assert sorted(i for i, _ in got) == tasks
    assert all(result == {"n": i + 10} for i, result in got)
    assert list(LocalExecutor(2).map_unordered(tasks_module.square, [])) == []


def test_workers_cap_torch_threads(tasks_module) -> None:
    pytest.importorskip("torch")
    results = dict(
        LocalExecutor(2, threads_per_worker=1).map_unordered(tasks_module.thread_counts, [0])
    )
    assert results == {0: {"torch": 1, "omp": "1"}}


@pytest.mark.parametrize("executor", [SerialExecutor(), LocalExecutor(2)], ids=["serial", "local"])
def test_task_exception_names_its_index(tmp_path: Path, tasks_module, executor) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        with pytest.raises(TaskError, match=r"task 3 failed: ZeroDivisionError: three is bad") as e:
            durable_map(
                tasks_module.fail_on_three,
                {f"k{n}": n for n in range(8)},
                store,
                "ns",
                executor,
            )
        assert e.value.index == 3
        assert isinstance(e.value.__cause__, ZeroDivisionError)
        stored = store.keys("ns")
    assert "k3" not in stored
    assert {"k0", "k1", "k2"} <= stored  # finished before the failure: kept


def test_bad_result_is_refused_naming_the_key(tmp_path: Path, tasks_module) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        with pytest.raises(ValueError, match="'only'") as info:
            durable_map(tasks_module.nan_result, {"only": 1}, store, "ns", SerialExecutor())
        assert "\n" not in str(info.value)
        assert store.count("ns") == 0
        with pytest.raises(ValueError, match="strings"):
            durable_map(tasks_module.square, {1: {"n": 1}}, store, "ns", SerialExecutor())


def test_interrupt_cancels_pending_tasks(tmp_path: Path, tasks_module) -> None:
    def interrupt(key: str, value: dict, cached: bool) -> None:
        raise KeyboardInterrupt

    with ResultStore(tmp_path / "r.db") as store:
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            durable_map(
                tasks_module.nap,
                {f"k{n}": n for n in range(40)},
                store,
                "ns",
                LocalExecutor(2),
                on_done=interrupt,
            )
        elapsed = time.monotonic() - start
        assert 1 <= store.count("ns") < 40  # what finished is kept
    assert elapsed < 40 * 0.3 / 2  # did not wait for the pending tasks


def _run_to_completion(task_dir: Path, db: Path, log: Path, executor: str) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(task_dir), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(task_dir / "runner.py"), str(db), str(log), executor],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("executor", ["serial", "local"])
def test_sigkilled_run_resumes_without_redoing_stored_units(
    tmp_path: Path, task_dir: Path, executor: str
) -> None:
    db, log1, log2 = tmp_path / "kill.db", tmp_path / "run1.log", tmp_path / "run2.log"
    all_keys = {f"k{n:02d}" for n in range(40)}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(task_dir), os.environ.get("PYTHONPATH", "")]),
    }
    with ResultStore(db) as watcher:
        proc = subprocess.Popen(
            [sys.executable, str(task_dir / "runner.py"), str(db), str(log1), executor],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group, so killpg takes the pool workers too
        )
        try:
            deadline = time.monotonic() + 60
            while watcher.count("kill") < 10:
                assert proc.poll() is None, proc.communicate()[1].decode()
                assert time.monotonic() < deadline, "the run never stored 10 units"
                time.sleep(0.01)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        stored_at_kill = watcher.keys("kill")
    assert 10 <= len(stored_at_kill) < 40, "kill came too late to test resuming"
    ran_first = log1.read_text().split()
    assert stored_at_kill <= set(ran_first)

    summary = _run_to_completion(task_dir, db, log2, executor)
    ran_second = log2.read_text().split()

    assert summary == {"cached": sorted(stored_at_kill), "n": 40}
    assert not stored_at_kill & set(ran_second), "a stored unit was executed again"
    assert sorted(ran_second) == sorted(all_keys - stored_at_kill)  # each remaining key ran once
    with ResultStore(db) as store:
        assert store.count("kill") == 40
        items = store.items("kill")
    assert set(items) == all_keys
    for key, value in items.items():
        n = int(key[1:])
        assert value == {"key": key, "cube": n**3}
