"""The SQLite result store: first write wins, JSON only, WAL, one-line errors, multi-process."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from privacylab.execution import SCHEMA_VERSION, ResultStore, StoreError, config_key


@pytest.fixture
def store(tmp_path: Path):
    with ResultStore(tmp_path / "results.db") as s:
        yield s


def test_put_get_items_keys_count(store: ResultStore) -> None:
    assert store.get("a", "k1") is None
    assert store.count("a") == 0
    assert store.put("a", "k1", {"x": 1})
    assert store.put("a", "k2", {"x": 2})
    assert store.put("b", "k1", {"x": 3})
    assert store.get("a", "k1") == {"x": 1}
    assert store.get("b", "k1") == {"x": 3}
    assert store.items("a") == {"k1": {"x": 1}, "k2": {"x": 2}}
    assert list(store.items("a")) == ["k1", "k2"]
    assert store.keys("a") == {"k1", "k2"}
    assert store.count("a") == 2 and store.count("b") == 1
    assert store.namespaces() == {"a", "b"}
    assert store.delete_namespace("a") == 2
    assert store.count("a") == 0 and store.count("b") == 1


def test_first_write_wins(store: ResultStore) -> None:
    assert store.put("ns", "k", {"v": "first"}) is True
    assert store.put("ns", "k", {"v": "second"}) is False
    assert store.get("ns", "k") == {"v": "first"}
    assert store.count("ns") == 1


def test_json_round_trip(store: ResultStore) -> None:
    value = {
        "float": 0.1,
        "tiny": 5e-324,
        "big_int": 2**70,
        "neg": -3,
        "flag": True,
        "none": None,
        "text": "ε = 1.5 — café",
        "nested": {"list": [1, 2.5, "x", [None, False]], "tuple": (1, 2)},
    }
    store.put("ns", "k", value)
    expected = json.loads(json.dumps(value))
    assert store.get("ns", "k") == expected
    assert store.get("ns", "k")["float"] == 0.1
    assert store.get("ns", "k")["nested"]["tuple"] == [1, 2]


@pytest.mark.parametrize(
    "bad",
    [
        {"x": float("nan")},
        {"x": [1.0, float("inf")]},
        {"x": {"y": -float("inf")}},
        {"x": object()},
        {1: "non-string key"},
        [1, 2],
    ],
)
def test_non_json_values_refused_in_one_line(store: ResultStore, bad: object) -> None:
    with pytest.raises(ValueError) as info:
        store.put("ns", "k", bad)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    assert store.count("ns") == 0


def test_wal_full_and_user_version(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with ResultStore(path) as s:
        assert s._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert s._db.execute("PRAGMA busy_timeout").fetchone()[0] > 0
        s.put("ns", "k", {"v": 1})
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        columns = [row[1] for row in raw.execute("PRAGMA table_info(results)")]
        assert columns == ["namespace", "key", "value", "created"]
    finally:
        raw.close()


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "r.db"
    with ResultStore(path) as s:
        for i in range(20):
            s.put("ns", f"k{i}", {"i": i})
    with ResultStore(path) as s:
        assert s.items("ns") == {f"k{i}": {"i": i} for i in range(20)}


def _assert_one_line_naming(err: StoreError, path: Path) -> None:
    assert isinstance(err, ValueError)
    assert "\n" not in str(err)
    assert str(path) in str(err)


def test_not_a_database_raises_store_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not sqlite\n" * 500)
    with pytest.raises(StoreError) as info:
        ResultStore(path)
    _assert_one_line_naming(info.value, path)


def test_corrupt_pages_raise_store_error(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    with ResultStore(path) as s:
        for i in range(300):
            s.put("ns", str(i), {"v": "x" * 200})
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # keep the header, wipe the schema page
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError) as info:
        ResultStore(path)
    _assert_one_line_naming(info.value, path)


def test_directory_and_newer_schema_raise_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as info:
        ResultStore(tmp_path)
    _assert_one_line_naming(info.value, tmp_path)
    path = tmp_path / "future.db"
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="schema version") as info:
        ResultStore(path)
    _assert_one_line_naming(info.value, path)


def test_closed_store_raises(tmp_path: Path) -> None:
    s = ResultStore(tmp_path / "r.db")
    s.close()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.count("ns")


def test_config_key_golden_value() -> None:
    config = {"b": [1, 2.5, "x"], "a": {"z": None, "y": True}}
    canonical = '{"a":{"y":true,"z":null},"b":[1,2.5,"x"]}'
    assert config_key(config) == hashlib.sha256(canonical.encode()).hexdigest()
    assert config_key({"t": (1, 2)}) == config_key({"t": [1, 2]})
    assert config_key({"lr": 1}) != config_key({"lr": 1.0})


def test_config_key_same_in_another_process() -> None:
    config = {"model": "mlp", "seed": 3, "lr": 0.1, "layers": [64, 32], "dp": {"sigma": 1.1}}
    code = f"from privacylab.execution import config_key;print(config_key({config!r}))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == config_key(config)


@pytest.mark.parametrize(
    "bad", [{"x": float("nan")}, {"x": float("inf")}, {"x": {1, 2}}, {2: "a"}, ["not", "a", "map"]]
)
def test_config_key_refuses_non_json(bad: object) -> None:
    with pytest.raises(ValueError) as info:
        config_key(bad)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_json = st.recursive(
    _json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


def _shuffled(value: object, rnd) -> object:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


@given(config=st.dictionaries(st.text(max_size=6), _json, max_size=6), rnd=st.randoms())
def test_config_key_is_independent_of_key_order(config: dict, rnd) -> None:
    shuffled = _shuffled(config, rnd)
    assert config_key(shuffled) == config_key(config)
    assert len(config_key(config)) == 64


_WRITER = textwrap.dedent(
    """
    import sys
    from privacylab.execution import ResultStore

    path, who, start, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    new = 0
    with ResultStore(path) as store:
        for i in range(start, stop):
            new += store.put("ns", f"k{i:04d}", {"writer": who, "i": i})
    print(new)
    """
)


def test_two_processes_writing_concurrently_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    # Writers overlap on keys 150..249: each of those must be stored exactly once.
    ranges = {"A": (0, 250), "B": (150, 400)}
    procs = {
        who: subprocess.Popen(
            [sys.executable, str(script), str(path), who, str(lo), str(hi)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ},
        )
        for who, (lo, hi) in ranges.items()
    }
    new_counts = {}
    for who, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        new_counts[who] = int(out)
    with ResultStore(path) as s:
        items = s.items("ns")
    assert set(items) == {f"k{i:04d}" for i in range(400)}
    assert sum(new_counts.values()) == 400
    for key, value in items.items():
        assert value["i"] == int(key[1:])
        lo, hi = ranges[value["writer"]]
        assert lo <= value["i"] < hi
    assert sum(v["writer"] == "A" for v in items.values()) == new_counts["A"]
