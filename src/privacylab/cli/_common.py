"""What every `privacylab` command shares: the app, one-line errors, JSON output, options."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from privacylab import __version__
from privacylab.accounting import (
    PrivacyParameterError,
    steps_from_epochs,
)
from privacylab.accounting import _validate as check
from privacylab.errors import PrivacylabError

try:  # typer >= 0.20 ships its own copy of click
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as _click_errors  # type: ignore[no-redef]

ACCOUNTANTS = ("rdp", "rdp-classic", "pld", "gdp")
"""Accountants the `account` commands accept."""

DEFAULT_ACCOUNTANT = "pld"

BAD_INPUT = 2


class _OneLineErrors(TyperGroup):
    """Top-level group that reports usage errors as one `error: ...` line on stderr (exit 2)
    instead of click's multi-line usage block."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
        except _click_errors.ClickException as e:
            if not standalone_mode:
                raise
            if type(e).__name__ == "NoArgsIsHelpError":
                e.show()
                sys.exit(e.exit_code)
            _fail(e.format_message(), e.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


app = typer.Typer(
    name="privacylab",
    cls=_OneLineErrors,
    help="Train, attack, audit, defend and report on the privacy of ML models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
account_app = typer.Typer(
    help="Privacy accounting for DP-SGD: ε for a run, the noise for a target ε, the step budget.",
    no_args_is_help=True,
)
app.add_typer(account_app, name="account")


def _fail(message: str, code: int = BAD_INPUT) -> NoReturn:
    """Print one `error: ...` line on stderr and exit with `code`."""
    line = " ".join(str(message).split())
    typer.echo(f"error: {line}", err=True)
    sys.exit(code)


def _guarded(fn: Callable[[], None]) -> None:
    """Run a command body, turning bad input (any PrivacylabError, ValueError, unwritable
    files) into one stderr line and exit code 2; a failed worker task exits 1."""
    try:
        fn()
    except PrivacylabError as e:
        _fail(str(e))
    except (ValueError, OverflowError) as e:
        _fail(str(e))
    except RuntimeError as e:
        if type(e).__name__ != "TaskError":
            raise
        _fail(str(e), 1)
    except OSError as e:
        _fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e))


def _stderr() -> Console:
    return Console(stderr=True)


def _emit_json(payload: dict[str, Any]) -> None:
    """Print one JSON object on stdout; non-finite floats become null (JSON has no inf)."""
    from privacylab.report.jsonable import json_ready

    typer.echo(json.dumps(json_ready(payload), allow_nan=False))


def _accountant_name(name: str, allowed: Sequence[str] = ACCOUNTANTS) -> str:
    if name not in allowed:
        raise PrivacyParameterError(
            f"unknown accountant {name!r}; choose one of {', '.join(allowed)}"
        )
    return name


def _resolve_steps(steps: int | None, epochs: float | None, sample_rate: float) -> int:
    """Steps from exactly one of `--steps` / `--epochs` (steps = ⌈epochs / q⌉)."""
    if (steps is None) == (epochs is None):
        raise PrivacyParameterError("give exactly one of --steps or --epochs")
    if steps is not None:
        return check.steps(steps)
    return steps_from_epochs(check.positive("epochs", epochs), sample_rate)


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}g}" if math.isfinite(x) else str(x)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"privacylab {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Train, attack, audit, defend and report on the privacy of ML models."""


NoiseOpt = Annotated[
    float, typer.Option("--noise-multiplier", help="σ: noise std / clipping norm (> 0).")
]
SampleRateOpt = Annotated[
    float, typer.Option("--sample-rate", help="q: Poisson sampling rate per step, in (0, 1].")
]
DeltaOpt = Annotated[float, typer.Option("--delta", help="δ, in (0, 1).")]
StepsOpt = Annotated[
    int | None, typer.Option("--steps", help="Number of steps T (or give --epochs).")
]
EpochsOpt = Annotated[
    float | None, typer.Option("--epochs", help="Epochs E; steps = ⌈E / q⌉ (or give --steps).")
]
AccountantOpt = Annotated[
    str,
    typer.Option(
        "--accountant",
        help="rdp (tight Balle et al. 2020 conversion), rdp-classic "
        "(ε = RDP + log(1/δ)/(α−1)), pld (default: tightest certified upper bound) "
        "or gdp (CLT approximation, may under-state ε).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def _widths(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise ValueError(f"--widths must be comma-separated whole numbers, got {text!r}") from None


TERMINAL_HIDDEN = ("access", "balanced_accuracy", "seconds")
"""Summary columns left to the HTML report when printing the summary."""

PLAIN_PROGRESS_SECONDS = 2.0
"""Without a terminal, progress within one unchanged stage is printed at most this often; a new
stage (e.g. the next attack) and a finished one are always printed."""


class _Stages:
    """Progress of a long job on stderr, one bar per stage (a stage like "dp-eps1: attack
    loss" belongs to the bar "dp-eps1"). Without a terminal, plain one-line messages instead:
    one when a stage starts or changes, when it completes, and at most every
    `PLAIN_PROGRESS_SECONDS` in between."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.plain = not console.is_terminal
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            disable=self.plain,
        )
        self.tasks: dict[str, Any] = {}
        self.start = time.monotonic()
        self.printed: dict[str, tuple[float, str, float]] = {}

    @staticmethod
    def _key(stage: str) -> str:
        return stage.split(": attack")[0] if ": attack" in stage else stage

    def __call__(self, stage: str, done: float, total: float) -> None:
        key = self._key(stage)
        if self.plain:
            self._line(key, stage, done, total)
            return
        if key not in self.tasks:
            self.tasks[key] = self.bar.add_task(key, total=max(total, 1))
        description = key if done >= total else stage
        self.bar.update(
            self.tasks[key], completed=done, total=max(total, 1), description=description
        )

    def _line(self, key: str, stage: str, done: float, total: float) -> None:
        now = time.monotonic()
        last = self.printed.get(key)
        finished = done >= total
        if last is not None:
            last_time, last_stage, last_done = last
            if done == last_done and stage == last_stage:
                return
            if stage == last_stage and not finished and now - last_time < PLAIN_PROGRESS_SECONDS:
                return
        self.printed[key] = (now, stage, done)
        label = f"{key}: done" if finished and stage != key else stage
        line = f"[{now - self.start:6.0f}s] {label} ({done:.0f}/{total:.0f})"
        print(line, file=self.console.file, flush=True)

    def __enter__(self) -> _Stages:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)


def _plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, separated by two spaces: lines never wrap mid-cell."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        cells = (
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _print_summary(payload: dict[str, Any]) -> None:
    """Print per target its verdict and its attacks, strongest first: a rich table at the
    terminal's own width, or a plain text table when stdout is not a terminal."""
    from privacylab.report.html import SUMMARY_COLUMNS, TARGET_KEYS, target_tables
    from privacylab.report.verdict import (
        DEFAULT_VERDICT_THRESHOLD,
        VERDICT_FPR,
        target_verdict,
    )

    threshold = payload.get("verdict_threshold", DEFAULT_VERDICT_THRESHOLD)
    shown = [(k, h) for k, h in SUMMARY_COLUMNS if k not in TERMINAL_HIDDEN + TARGET_KEYS]
    console = Console()
    plain = not console.is_terminal
    title = payload.get("title")
    if plain and title:
        print(title)
    targets = [t for t in payload.get("targets") or [] if isinstance(t, dict)]
    for target, (facts, rows) in zip(targets, target_tables(payload), strict=True):
        heading = (
            f"{facts['target']}: ε {facts['epsilon']}, accuracy (test / train) {facts['accuracy']}"
        )
        verdict = target_verdict(target, threshold)
        if verdict["leaks"] is None:
            said = "no attack result"
        else:
            said = (
                f"{'FAIL, leaks' if verdict['leaks'] else 'pass'}: {verdict['attack']} finds "
                f"{100 * (verdict['tpr_at_01pct_fpr'] or 0):.2g}% of members at "
                f"{100 * VERDICT_FPR:g}% FPR, at least {100 * verdict['tpr_lower_bound']:.2g}% "
                f"with {100 * verdict['confidence']:g}% confidence (threshold "
                f"{100 * threshold:.2g}%)"
            )
        cells = [[str(row.get(k, "")) for k, _ in shown] for row in rows]
        if plain:
            print(f"\n{heading}\nverdict: {said}")
            print(_plain_table([h for _, h in shown], cells))
            continue
        table = Table(title=f"{heading}\nverdict: {said}", title_justify="left")
        for _, header in shown:
            table.add_column(header, overflow="fold")
        for row, line in zip(rows, cells, strict=True):
            table.add_row(*line, style="red" if row.get("violation") else None)
        console.print(table)


def _floats(text: str, name: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers, got {text!r}") from None


MAX_LR = 1e3
"""Largest learning rate accepted (larger ones overflow float32 updates)."""

MAX_EPOCHS = 100_000
MAX_COUNT = 10**6
"""Largest trial, reference, row and worker counts accepted on the command line."""


def _path_arg(text: str | Path) -> Path:
    """Typer parser for path options: '' (which `Path` would read as '.') is refused."""
    if not str(text).strip():
        raise typer.BadParameter("must be a path, got ''")
    return Path(text)


def _whole_in(value: object, name: str, low: int = 1, high: int = MAX_COUNT) -> int:
    """`value` as a whole number in [low, high], or one-line PrivacylabError."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PrivacylabError(f"{name} must be a whole number in [{low}, {high:,}], got {value!r}")
    return value


def _learning_rate(value: float, name: str = "--lr") -> float:
    """A finite learning rate in (0, MAX_LR]."""
    if not (math.isfinite(value) and 0 < value <= MAX_LR):
        raise PrivacylabError(f"{name} must be a finite number in (0, {MAX_LR:g}], got {value!r}")
    return value


def _device(name: str) -> str:
    """`name` if torch can use it here (cpu, cuda, cuda:N), else one-line PrivacylabError."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise PrivacylabError(f"unknown device {name!r}; use cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise PrivacylabError(f"unsupported device {name!r}; use cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise PrivacylabError(f"--device {name} was asked for but no CUDA device is available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise PrivacylabError(f"no CUDA device {device.index} on this machine")
    return name


def _writable_folder(path: Path, name: str = "--out") -> Path:
    """Check, before any work, that folder `path` exists or can be created: it is not a file and
    its nearest existing ancestor is a writable folder."""
    if not str(path).strip():
        raise PrivacylabError(f"{name} must be a folder path, got ''")
    target = path.expanduser()
    if target.exists() and not target.is_dir():
        raise PrivacylabError(f"{name} {path} exists and is not a folder")
    ancestor = target.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise PrivacylabError(f"{name} {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PrivacylabError(f"{name} {path}: cannot write in {ancestor}")
    return path


def _writable_file(path: Path, name: str) -> Path:
    """Check, before any work, that file `path` can be written: not a folder, and its folder
    exists or can be created."""
    if not str(path).strip():
        raise PrivacylabError(f"{name} must be a file path, got ''")
    if path.expanduser().is_dir():
        raise PrivacylabError(f"{name} {path} is a folder; give a file path")
    _writable_folder(path.expanduser().parent, name)
    return path


def _model_fits(dataset: str, model: str, options: dict[str, Any], root: str | Path | None) -> None:
    """Load `dataset` and check that `model` with `options` builds for it within the parameter
    limit (on the meta device: nothing is allocated), before any training."""
    from privacylab.data.info import dataset_info
    from privacylab.models import model_options
    from privacylab.models._checks import parameter_shapes
    from privacylab.models.factory import is_factory, resolve_factory

    if is_factory(model):  # your own model: importable now, built once the data is loaded
        resolve_factory(model)
        dataset_info(dataset, root)
        return
    model_options(model)  # an unknown model name is refused before the data load
    data = dataset_info(dataset, root)
    parameter_shapes(model, data.input_shape, data.num_classes, dict(options))


def _say(console: Console, text: str) -> None:
    """Print `text` on `console` literally: paths like `x[/]y` are not Rich markup."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)
