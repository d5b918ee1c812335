"""RayExecutor on a local two-CPU Ray instance: same results as serial (seeds travel with the
tasks), durable_map resumes without rerunning stored keys, failures name their task, a small audit
runs through run_trials, and a missing ray gives one line with the install hint."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from privacylab.audit.runner import run_trials
from privacylab.execution import (
    EXECUTORS,
    Executor,
    ResultStore,
    SerialExecutor,
    TaskError,
    durable_map,
    make_executor,
)
from privacylab.execution.ray_executor import INSTALL_HINT, RayExecutor

try:
    import ray
except ImportError:  # the test extra installs ray; without it only the install-hint test runs
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="ray is not installed")


def square(task: dict[str, int]) -> dict[str, Any]:
    return {"n": task["n"], "square": task["n"] ** 2}


def seeded_draw(seed: int) -> dict[str, Any]:
    import os

    import torch

    generator = torch.Generator().manual_seed(seed)
    draw = torch.randn(64, 64, generator=generator)
    return {
        "seed": seed,
        "value": float((draw @ draw.T).trace()),
        "torch_threads": torch.get_num_threads(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
    }


def fail_on_three(n: int) -> dict[str, int]:
    if n == 3:
        raise ZeroDivisionError("three is bad")
    time.sleep(0.02)
    return {"n": n}


def gaussian_canary_trial(task: dict[str, Any]) -> dict[str, Any]:
    """One trial of a toy audit: a noisy sum with or without a canary, scored by the released
    value (the canary is in on even trials)."""
    import numpy as np

    config, index = task["config"], task["trial"]
    rng = np.random.default_rng(index)
    member = index % 2 == 0
    released = float(member) + config["sigma"] * rng.standard_normal()
    return {"trial": index, "member": member, "score": released}


@pytest.fixture(scope="module")
def executor() -> Iterator[RayExecutor]:
    # Ray workers cannot import this test module by name: ship its functions by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    was_running = ray.is_initialized()
    ray_executor = RayExecutor(workers=2).start()
    try:
        yield ray_executor
    finally:
        ray_executor.close()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        assert ray.is_initialized() == was_running


@needs_ray
def test_map_unordered_matches_serial(executor: RayExecutor) -> None:
    assert isinstance(executor, Executor) and executor.workers == 2
    assert ray.cluster_resources().get("CPU") == 2
    tasks = [{"n": n} for n in range(10)]
    got = dict(executor.map_unordered(square, tasks))
    assert got == dict(SerialExecutor().map_unordered(square, tasks))
    seeds = [11, 12, 13, 14]
    ray_draws = dict(executor.map_unordered(seeded_draw, seeds))
    serial_draws = dict(SerialExecutor().map_unordered(seeded_draw, seeds))
    for index in range(len(seeds)):
        assert ray_draws[index]["value"] == serial_draws[index]["value"]
        assert ray_draws[index]["torch_threads"] == 1 and ray_draws[index]["omp"] == "1"
    assert list(executor.map_unordered(square, [])) == []


@needs_ray
def test_durable_map_resumes_and_skips_stored_keys(executor: RayExecutor, tmp_path: Path) -> None:
    tasks = {f"k{n:02d}": {"n": n} for n in range(8)}
    seen: list[tuple[str, bool]] = []
    with ResultStore(tmp_path / "r.db") as store:
        for n in range(3):  # a marker value proves these keys are not run again
            store.put("sq", f"k{n:02d}", {"n": n, "square": -1})
        out = durable_map(
            square, tasks, store, "sq", executor, on_done=lambda k, v, c: seen.append((k, c))
        )
        again = durable_map(square, tasks, store, "sq", executor)
    assert list(out) == list(tasks)
    assert [out[f"k{n:02d}"]["square"] for n in range(8)] == [-1, -1, -1, 9, 16, 25, 36, 49]
    assert sorted(k for k, cached in seen if cached) == ["k00", "k01", "k02"]
    assert sorted(k for k, cached in seen if not cached) == [f"k{n:02d}" for n in range(3, 8)]
    assert again == out


@needs_ray
def test_failing_task_names_its_index(executor: RayExecutor) -> None:
    yielded: list[int] = []
    with pytest.raises(
        TaskError, match=r"^task 3 failed: ZeroDivisionError: three is bad$"
    ) as info:
        for index, _ in executor.map_unordered(fail_on_three, list(range(10))):
            yielded.append(index)
    assert info.value.index == 3
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert 3 not in yielded and {0, 1, 2} <= set(yielded)
    assert dict(executor.map_unordered(square, [{"n": 2}])) == {0: {"n": 2, "square": 4}}


@needs_ray
def test_function_workers_cannot_import_is_one_line(
    executor: RayExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "_privacylab_driver_only.py").write_text("def one(_):\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import _privacylab_driver_only

    try:
        with pytest.raises(TaskError, match=r"^task 0 failed: .*_privacylab_driver_only") as info:
            list(executor.map_unordered(_privacylab_driver_only.one, [0]))
        assert "\n" not in str(info.value) and "Traceback" not in str(info.value)
    finally:
        sys.modules.pop("_privacylab_driver_only", None)


@needs_ray
def test_small_audit_through_run_trials(executor: RayExecutor, tmp_path: Path) -> None:
    config = {"sigma": 0.5}
    with ResultStore(tmp_path / "audit.db") as store:
        on_ray = run_trials(gaussian_canary_trial, config, 12, store=store, executor=executor)
    with ResultStore(tmp_path / "serial.db") as store:
        serial = run_trials(gaussian_canary_trial, config, 12, store=store)
    assert on_ray == serial
    assert [r["trial"] for r in on_ray] == list(range(12))


@needs_ray
def test_joined_instance_is_left_running(executor: RayExecutor) -> None:
    with RayExecutor(workers=2, threads_per_worker=2) as inner:
        assert dict(inner.map_unordered(square, [{"n": 5}])) == {0: {"n": 5, "square": 25}}
    assert ray.is_initialized()


@needs_ray
def test_make_executor_ray() -> None:
    assert "ray" in EXECUTORS
    built = make_executor("ray", workers=3, address="auto")
    assert isinstance(built, RayExecutor) and built.workers == 3 and built.address == "auto"
    assert make_executor("Ray").workers >= 1
    with pytest.raises(ValueError, match="only for the 'ray' executor"):
        make_executor("local", workers=2, address="auto")
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="workers"):
            RayExecutor(workers=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="address"):
        RayExecutor(address=" ")


def test_make_executor_ray_without_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ValueError) as info:
        make_executor("ray", workers=2)
    assert str(info.value) == INSTALL_HINT
    assert str(info.value) == "the Ray executor needs `pip install privacylab[distributed]`"


@needs_ray
def test_real_audit_on_ray_equals_serial(executor: RayExecutor, tmp_path: Path) -> None:
    """CI's small audit on the local two-CPU Ray cluster: the white-box Dirac audit of our DP-SGD
    (Nasr et al. 2023) gives the same bound and counts on Ray as serially."""
    from privacylab.audit import run_audit

    on_ray = run_audit(
        "dirac", epsilon=4.0, trials=6, store=tmp_path / "ray.sqlite", executor=executor
    )
    serial = run_audit(
        "dirac", epsilon=4.0, trials=6, store=tmp_path / "serial.sqlite", executor=SerialExecutor()
    )
    assert on_ray.epsilon_lower_bound == serial.epsilon_lower_bound > 0.0
    assert on_ray.counts == serial.counts
    assert not on_ray.violated
