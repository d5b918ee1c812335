"""The report on the terminal: progress on stderr with and without a terminal, the summary."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from test_sections import ATTACKS, full_run

from privacylab.cli import _common
from privacylab.cli._common import _plain_table, _print_summary, _Stages


def _attack_progress(stages: _Stages, target: str = "dp-eps1") -> None:
    """The calls `experiment.attack_target` makes for one target."""
    for i, name in enumerate(ATTACKS):
        stages(f"{target}: attack {name}", i, len(ATTACKS))
    stages(f"{target}: attacks done", len(ATTACKS), len(ATTACKS))


def test_progress_bars_finish() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with _Stages(console) as stages:
        for done in range(5):
            stages("train targets", done, 4)
        _attack_progress(stages)
    tasks = {t.description: t for t in stages.bar.tasks}
    assert set(tasks) == {"train targets", "dp-eps1"}
    assert all(t.completed == t.total for t in tasks.values())


def test_plain_progress_without_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    clock = iter(float(t) for t in range(1000))
    monkeypatch.setattr(_common.time, "monotonic", lambda: next(clock) * 0.1)
    with _Stages(console) as stages:
        for done in range(1, 17):
            stages("references for dp-eps1", done, 16)
        _attack_progress(stages)
    lines = out.getvalue().splitlines()
    assert all(line.startswith("[") and "\x1b" not in line for line in lines)
    refs = [line for line in lines if "references" in line]
    assert refs[0].endswith("(1/16)") and refs[-1].endswith("(16/16)")
    assert 2 <= len(refs) < 16  # throttled within one stage
    attacks = [line for line in lines if "dp-eps1: attack " in line]
    assert len(attacks) == len(ATTACKS)  # every new attack is announced
    assert lines[-1].endswith(f"dp-eps1: done ({len(ATTACKS)}/{len(ATTACKS)})")


def test_summary_is_plain_and_grouped_when_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _print_summary(full_run())
    out = capsys.readouterr().out
    assert "│" not in out and "━" not in out
    blocks = out.split("\n\n")
    assert "non-private" in blocks[1] and "verdict: FAIL, leaks" in blocks[1]
    assert "dp-eps1" in blocks[2] and "verdict: pass" in blocks[2]
    for block in blocks[1:]:
        rows = block.strip().splitlines()[4:]
        assert len(rows) == len(ATTACKS)
        tpr = [float(row.split()[3]) for row in rows]
        assert tpr == sorted(tpr, reverse=True)
        widths = {len(line) for line in block.strip().splitlines()[2:4]}
        assert len(widths) == 1  # header and rule line up


def test_summary_uses_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()

    def narrow() -> Console:
        return Console(file=buffer, force_terminal=True, width=70)

    monkeypatch.setattr(_common, "Console", narrow)
    _print_summary(full_run())
    text = buffer.getvalue()
    assert "verdict" in text
    assert max(len(line) for line in _strip(text).splitlines()) <= 70


def _strip(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_plain_table_pads_columns() -> None:
    text = _plain_table(["a", "bb"], [["long name", "1"], ["x", "22"]])
    assert text.splitlines() == ["a          bb", "---------  --", "long name   1", "x          22"]
