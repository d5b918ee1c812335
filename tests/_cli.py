"""What the `privacylab attack ...` CLI tests share: run one command through typer's runner,
read its one-line `--json` object, and check a refusal is one `error: ...` line on stderr with
exit code 2 and nothing on stdout (the contract of `privacylab.cli._common._guarded`).

    invoke, run_json, fails = command("attack", "gradients")
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from click.testing import Result
from typer.testing import CliRunner

from privacylab.cli import app

runner = CliRunner()


def command(
    *words: str,
) -> tuple[Callable[..., Result], Callable[..., dict[str, Any]], Callable[..., str]]:
    """`(invoke, run_json, fails)` for the command `privacylab WORDS...`."""

    def invoke(*args: str) -> Result:
        """The command's result (exit code, stdout, stderr), whatever it is."""
        return runner.invoke(app, [*words, *args])

    def run_json(*args: str) -> dict[str, Any]:
        """The one JSON line a successful `--json` run prints."""
        result = invoke(*args, "--json")
        assert result.exit_code == 0, result.stderr + result.stdout
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 1, result.stdout
        return json.loads(lines[0])

    def fails(*args: str) -> str:
        """The one stderr line of a refused command (exit 2, nothing on stdout)."""
        result = invoke(*args, "--json")
        assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert result.stdout == ""
        return lines[0]

    return invoke, run_json, fails
