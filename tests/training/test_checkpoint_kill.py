"""A checkpoint is one atomic unit: a run killed at ANY write of its checkpoints (or of the saved
model) resumes to the weights, steps and ε of an uninterrupted run — never epoch-k weights with
epoch-(k−1) bookkeeping, which would report fewer DP steps and a smaller ε than were taken."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load

from privacylab.models import load_model
from privacylab.training import PrivacyConfig, TrainConfig, TrainingError, train_job
from privacylab.training.checkpoint import CHECKPOINT_FILE

CONFIG = TrainConfig(
    epochs=3,
    batch_size=512,
    lr=0.3,
    seed=1,
    privacy=PrivacyConfig(noise_multiplier=1.0, accountant="pld"),
)


class Killed(BaseException):
    """A simulated kill: not an Exception, so nothing in the code under test catches it."""


class KillInjector:
    """Counts the write primitives (os.open, os.write, os.fsync, os.replace) that touch `root`
    and raises Killed at the `kill_at`-th one (a write is cut after half its bytes)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path, kill_at: int = 0) -> None:
        self.root, self.kill_at, self.calls = str(root), kill_at, 0
        self.fds: set[int] = set()
        real_open, real_write = os.open, os.write
        real_fsync, real_replace = os.fsync, os.replace

        def tick() -> None:
            self.calls += 1
            if self.calls == self.kill_at:
                raise Killed(self.calls)

        def fake_open(path, flags, *args, **kwargs):
            mine = str(path).startswith(self.root)
            if mine:
                tick()
            fd = real_open(path, flags, *args, **kwargs)
            if mine:
                self.fds.add(fd)
            return fd

        def fake_write(fd, data):
            if fd in self.fds:
                self.calls += 1
                if self.calls == self.kill_at:
                    real_write(fd, bytes(data)[: len(data) // 2])
                    raise Killed(self.calls)
            return real_write(fd, data)

        def fake_fsync(fd):
            if fd in self.fds:
                tick()
            return real_fsync(fd)

        def fake_replace(src, dst, *args, **kwargs):
            if str(dst).startswith(self.root):
                tick()
            return real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "open", fake_open)
        monkeypatch.setattr(os, "write", fake_write)
        monkeypatch.setattr(os, "fsync", fake_fsync)
        monkeypatch.setattr(os, "replace", fake_replace)


def _outcome(out: Path) -> tuple[dict[str, torch.Tensor], dict]:
    model, _, metadata = load_model(out)
    return model.state_dict(), metadata


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict[str, torch.Tensor], dict]:
    out = tmp_path_factory.mktemp("whole") / "run"
    train_job("digits", "logreg", CONFIG, out)
    return _outcome(out)


def _assert_same_run(out: Path, reference) -> None:
    weights, metadata = _outcome(out)
    ref_weights, ref_metadata = reference
    assert weights.keys() == ref_weights.keys()
    for name, value in weights.items():
        assert torch.equal(value, ref_weights[name]), name
    summary, ref_summary = metadata["summary"], ref_metadata["summary"]
    assert summary["steps"] == ref_summary["steps"]
    assert summary["epsilon"] == ref_summary["epsilon"]
    assert metadata["privacy_event"] == ref_metadata["privacy_event"]
    assert metadata["result"]["history"] == ref_metadata["result"]["history"]


def test_a_kill_at_every_write_resumes_to_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference
) -> None:
    with monkeypatch.context() as patch:
        counter = KillInjector(patch, tmp_path)
        train_job("digits", "logreg", CONFIG, tmp_path / "count")
    writes = counter.calls
    # 3 checkpoints and 2 model files, each: open, write, fsync, replace, open + fsync folder.
    assert writes == 5 * 6
    for kill_at in range(1, writes + 1):
        out = tmp_path / f"kill{kill_at}"
        with monkeypatch.context() as patch, pytest.raises(Killed):
            KillInjector(patch, tmp_path, kill_at)
            train_job("digits", "logreg", CONFIG, out)
        train_job("digits", "logreg", CONFIG, out)
        _assert_same_run(out, reference)


SCRIPT = """
import os, signal, sys
from privacylab.training import PrivacyConfig, TrainConfig, train_job
kill_at, calls, real_replace = int(sys.argv[2]), [0], os.replace
def replace(src, dst):
    calls[0] += 1
    if calls[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)
os.replace = replace
config = TrainConfig(epochs=3, batch_size=512, lr=0.3, seed=1,
                     privacy=PrivacyConfig(noise_multiplier=1.0, accountant="pld"))
train_job("digits", "logreg", config, sys.argv[1])
"""


def test_a_sigkilled_run_resumes_to_the_uninterrupted_run(tmp_path: Path, reference) -> None:
    """A real SIGKILL just before the second checkpoint's commit: the epoch-2 weights exist only
    in the partial file, and the re-run resumes from epoch 1 with epoch-1 bookkeeping."""
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), "2"], capture_output=True, timeout=300
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    blob = (out / "checkpoint" / CHECKPOINT_FILE).read_bytes()
    assert len(load(blob)) > 0
    assert (out / "checkpoint" / (CHECKPOINT_FILE + ".partial")).exists()
    train_job("digits", "logreg", CONFIG, out)
    _assert_same_run(out, reference)


def test_a_damaged_checkpoint_is_one_clear_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train_job("digits", "logreg", TrainConfig(epochs=1, batch_size=512, seed=1), out)
    path = out / "checkpoint" / CHECKPOINT_FILE
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(TrainingError, match="cannot read the checkpoint") as error:
        train_job("digits", "logreg", TrainConfig(epochs=1, batch_size=512, seed=1), out)
    assert "\n" not in str(error.value)


def test_bookkeeping_that_disagrees_with_the_ledger_is_refused(tmp_path: Path) -> None:
    """A checkpoint whose step count differs from its privacy-event ledger is not resumed."""
    out = tmp_path / "run"
    config = TrainConfig(epochs=1, batch_size=512, seed=1, privacy=CONFIG.privacy)
    train_job("digits", "logreg", config, out)
    path = out / "checkpoint" / CHECKPOINT_FILE
    blob = path.read_bytes()
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size])
    meta = json.loads(header["__metadata__"]["privacylab"])
    meta["state"]["steps"] -= 1
    header["__metadata__"]["privacylab"] = json.dumps(meta)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + blob[8 + size :])
    with pytest.raises(TrainingError, match="ledger holds"):
        train_job("digits", "logreg", config, out)
