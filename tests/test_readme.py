"""Every code block of the README works: Python blocks run as scripts (in order, in one folder,
a block starting `# NAME.py` saved under that name so later blocks import it), `bash run`
blocks run there too, and every other `privacylab ...` command line parses against the CLI."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer

from privacylab.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    return [(info.strip(), body) for info, body in FENCE.findall(README.read_text())]


def _commands(body: str) -> list[str]:
    """The shell commands of a block: comments dropped, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            out.extend(part.strip() for part in line.split("&&"))
    return out


def test_readme_has_the_two_fresh_machine_commands() -> None:
    bash = [c for info, body in _blocks() if info.startswith("bash") for c in _commands(body)]
    assert "pip install torch==2.13.0" in bash and "privacylab run" in bash
    assert 'pip install -e ".[test]"' in bash and "python -m pytest" in bash
    ci = (README.parent / ".ci" / "run").read_text()
    assert 'pip install -e ".[test]"' in ci and "python -m pytest" in ci


def _parse(argv: list[str]) -> None:
    """Parse `argv` with the real command tree without running it: unknown commands or options
    and badly typed values raise click's usage errors."""
    command: click.Command = typer.main.get_command(app)
    ctx = command.make_context("privacylab", list(argv), resilient_parsing=False)
    while isinstance(command, click.Group):
        name, sub, rest = command.resolve_command(ctx, ctx.protected_args + ctx.args)
        assert sub is not None, f"unknown command {name!r} in {argv}"
        ctx = sub.make_context(name, rest, parent=ctx, resilient_parsing=False)
        command = sub


def test_every_readme_command_line_parses() -> None:
    lines = [
        c
        for info, body in _blocks()
        if info.startswith("bash")
        for c in _commands(body)
        if c.startswith("privacylab ")
    ]
    assert len(lines) >= 10
    for line in lines:
        argv = shlex.split(line)[1:]
        try:
            _parse(argv)
        except click.exceptions.Exit:
            pass
        except click.ClickException as error:
            pytest.fail(f"README command does not parse: {line}\n{error.format_message()}")


def test_readme_python_blocks_run_as_scripts(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    ran = 0
    for info, body in _blocks():
        if info == "python":
            first = body.splitlines()[0]
            match = re.match(r"#\s*([\w.]+\.py)\b", first)
            script = tmp_path / (match.group(1) if match else f"block_{ran}.py")
            script.write_text(body)
            result = subprocess.run(
                [sys.executable, script.name],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert result.returncode == 0, f"README block {script.name} failed:\n{result.stderr}"
            ran += 1
        elif info == "bash run":
            for command in _commands(body):
                argv = shlex.split(command)
                assert argv[0] == "privacylab"
                result = subprocess.run(
                    [sys.executable, "-m", "privacylab", *argv[1:]],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                assert result.returncode == 0, f"README command failed: {command}\n{result.stderr}"
                ran += 1
    assert ran >= 6
    assert (tmp_path / "my-report" / "index.html").is_file()
    assert (tmp_path / "my-report-cli" / "results.json").is_file()
