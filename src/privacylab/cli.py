"""The `privacylab` command line: one typer app whose sub-commands mirror the packages.

Every command prints its result on stdout (one JSON object with
`--json`), progress and notes on stderr, and answers bad input with exit code 2 and exactly one
`error: ...` line on stderr.
"""

from __future__ import annotations

import json
import math
import sys
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
    Accountant,
    Guarantee,
    PrivacyParameterError,
    calibrate_noise_multiplier,
    dp_sgd,
    make_accountant,
    max_steps,
    steps_from_epochs,
)
from privacylab.accounting import _validate as check

try:  # typer >= 0.20 ships its own copy of click
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as _click_errors  # type: ignore[no-redef]

ACCOUNTANTS = ("rdp", "rdp-classic", "pld", "gdp")
"""Accountants the `account` commands accept."""

DEFAULT_ACCOUNTANT = "pld"

CURVE_ACCOUNTANTS = ("rdp", "pld", "gdp", "advanced")
"""Curves drawn by `account curve` (Abadi et al. 2016, Figure 2, plus PLD and GDP)."""

CURVE_LABELS = {
    "rdp": "RDP / moments accountant (upper bound)",
    "pld": "PLD (upper bound)",
    "gdp": "GDP / CLT (approximation, may under-state ε)",
    "advanced": "advanced composition (upper bound)",
}

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
    """Run a command body, turning bad input (PrivacyParameterError, ValueError, unwritable
    files) into one stderr line and exit code 2."""
    try:
        fn()
    except (PrivacyParameterError, ValueError, OverflowError) as e:
        _fail(str(e))
    except RuntimeError as e:
        if type(e).__name__ not in ("TaskError", "QueryBudgetError"):
            raise
        _fail(str(e), 1)
    except OSError as e:
        _fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e))


def _stderr() -> Console:
    return Console(stderr=True)


def _emit_json(payload: dict[str, Any]) -> None:
    """Print one JSON object on stdout; non-finite floats become null (JSON has no inf)."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    typer.echo(json.dumps(clean(payload), allow_nan=False))


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
        return check.count(steps, "steps")
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


@account_app.command("epsilon")
def epsilon_command(
    noise_multiplier: NoiseOpt,
    sample_rate: SampleRateOpt,
    delta: DeltaOpt,
    steps: StepsOpt = None,
    epochs: EpochsOpt = None,
    accountant: AccountantOpt = DEFAULT_ACCOUNTANT,
    json_output: JsonOpt = False,
) -> None:
    """ε of DP-SGD with Poisson sampling (Abadi et al. 2016, Algorithm 1) at δ."""

    def run() -> None:
        name = _accountant_name(accountant)
        sigma = check.positive("noise multiplier", noise_multiplier)
        q = check.sample_rate(sample_rate)
        d = check.delta(delta)
        t = _resolve_steps(steps, epochs, q)
        g = make_accountant(name).compose(dp_sgd(sigma, q, t)).guarantee(d)
        if json_output:
            _emit_json(
                {
                    "epsilon": float(g.epsilon),
                    "delta": d,
                    "accountant": g.accountant,
                    "order": None if g.order is None else float(g.order),
                    "noise_multiplier": sigma,
                    "sample_rate": q,
                    "steps": t,
                    "note": g.note,
                }
            )
            return
        _print_guarantee(g, sigma, q, t)

    _guarded(run)


def _print_guarantee(g: Guarantee, sigma: float, q: float, steps: int) -> None:
    order = f", Rényi order {g.order:g}" if g.order is not None else ""
    typer.echo(
        f"ε = {_fmt(g.epsilon)} at δ = {g.delta:g}  [{g.accountant}{order}]  "
        f"σ = {sigma:g}, q = {q:g}, {steps} steps ({steps * q:.4g} epochs)"
    )
    if g.note:
        typer.echo(f"note: {g.note}")


@account_app.command("noise")
def noise_command(
    epsilon: Annotated[float, typer.Option("--epsilon", help="Target ε (> 0).")],
    delta: DeltaOpt,
    sample_rate: SampleRateOpt,
    steps: StepsOpt = None,
    epochs: EpochsOpt = None,
    accountant: AccountantOpt = DEFAULT_ACCOUNTANT,
    json_output: JsonOpt = False,
) -> None:
    """Smallest noise multiplier σ whose DP-SGD run meets the target (ε, δ)."""

    def run() -> None:
        name = _accountant_name(accountant)
        eps = check.positive("epsilon", epsilon)
        q = check.sample_rate(sample_rate)
        d = check.delta(delta)
        t = _resolve_steps(steps, epochs, q)
        with _stderr().status(f"calibrating σ with {name}..."):
            sigma = calibrate_noise_multiplier(eps, d, q, t, accountant=name)
        if json_output:
            _emit_json(
                {
                    "noise_multiplier": float(sigma),
                    "epsilon": eps,
                    "delta": d,
                    "accountant": name,
                    "sample_rate": q,
                    "steps": t,
                }
            )
            return
        typer.echo(
            f"σ = {float(sigma):.6g} gives ε ≤ {eps:g} at δ = {d:g}  [{name}]  "
            f"q = {q:g}, {t} steps ({t * q:.4g} epochs)"
        )

    _guarded(run)


@account_app.command("steps")
def steps_command(
    noise_multiplier: NoiseOpt,
    sample_rate: SampleRateOpt,
    epsilon: Annotated[float, typer.Option("--epsilon", help="Privacy budget ε (> 0).")],
    delta: DeltaOpt,
    accountant: AccountantOpt = DEFAULT_ACCOUNTANT,
    json_output: JsonOpt = False,
) -> None:
    """Largest number of DP-SGD steps that stays within (ε, δ) at noise multiplier σ."""

    def run() -> None:
        name = _accountant_name(accountant)
        sigma = check.positive("noise multiplier", noise_multiplier)
        q = check.sample_rate(sample_rate)
        eps = check.positive("epsilon", epsilon)
        d = check.delta(delta)
        with _stderr().status(f"searching the step budget with {name}..."):
            t = int(max_steps(sigma, q, eps, d, accountant=name))
        if json_output:
            _emit_json(
                {
                    "steps": t,
                    "epochs": t * q,
                    "noise_multiplier": sigma,
                    "sample_rate": q,
                    "epsilon": eps,
                    "delta": d,
                    "accountant": name,
                }
            )
            return
        if t < 1:
            typer.echo(f"not even one step fits in ε = {eps:g} at δ = {d:g}  [{name}]")
        else:
            typer.echo(
                f"at most {t} steps ({t * q:.4g} epochs) for ε ≤ {eps:g} at δ = {d:g}  "
                f"[{name}]  σ = {sigma:g}, q = {q:g}"
            )

    _guarded(run)


def _curve(
    name: str, sigma: float, q: float, steps: list[int], d: float, tick: Callable[[], None]
) -> list[float]:
    """ε at each step count for one accountant. RDP adds up, so one RDP accountant is extended
    step block by step block (its per-step RDP is computed once); the others start afresh."""
    values: list[float] = []
    if name == "rdp":
        acc: Accountant = make_accountant(name)
        done = 0
        for t in steps:
            if t > done:
                acc.compose(dp_sgd(sigma, q, t - done))
                done = t
            values.append(float(acc.epsilon(d)))
            tick()
        return values
    for t in steps:
        values.append(float(make_accountant(name).compose(dp_sgd(sigma, q, t)).epsilon(d)))
        tick()
    return values


def _plot(
    path: Path,
    epochs: list[float],
    curves: dict[str, list[float]],
    sigma: float,
    q: float,
    d: float,
) -> None:
    """ε against epochs on linear axes, one labelled line per accountant (Abadi et al. Fig. 2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    styles = {"advanced": "--", "gdp": ":", "rdp": "-", "pld": "-"}
    for name, values in curves.items():
        ax.plot(epochs, values, styles.get(name, "-"), label=CURVE_LABELS.get(name, name))
    ax.set_xlabel("epoch E")
    ax.set_ylabel("ε")
    ax.set_xlim(0, max(epochs))
    ax.set_ylim(bottom=0)
    ax.set_title(f"ε vs epochs: q = {q:g}, σ = {sigma:g}, δ = {d:g}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


@account_app.command("curve")
def curve_command(
    noise_multiplier: NoiseOpt,
    sample_rate: SampleRateOpt,
    delta: DeltaOpt,
    epochs: Annotated[float, typer.Option("--epochs", help="Last epoch on the x axis (> 0).")],
    points: Annotated[
        int, typer.Option("--points", help="Number of epochs evaluated (evenly spaced).")
    ] = 20,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write the figure to this PNG file.")
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """ε against epochs for RDP, PLD, GDP and advanced composition (Abadi et al. 2016, Fig. 2)."""

    def run() -> None:
        sigma = check.positive("noise multiplier", noise_multiplier)
        q = check.sample_rate(sample_rate)
        d = check.delta(delta)
        last = check.positive("epochs", epochs)
        n = check.count(points, "points")
        if plot is not None and not plot.resolve().parent.is_dir():
            raise PrivacyParameterError(f"cannot write plot: no directory {plot.parent}")
        grid = [last * (i + 1) / n for i in range(n)]
        steps = [steps_from_epochs(e, q) for e in grid]
        curves: dict[str, list[float]] = {}
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=_stderr(),
            transient=True,
        ) as progress:
            for name in CURVE_ACCOUNTANTS:
                task = progress.add_task(f"ε with {name}", total=n)
                curves[name] = _curve(
                    name, sigma, q, steps, d, lambda task=task: progress.advance(task)
                )
        if plot is not None:
            _plot(plot, grid, curves, sigma, q, d)
        if json_output:
            _emit_json(
                {
                    "epochs": grid,
                    "steps": steps,
                    "curves": curves,
                    "delta": d,
                    "noise_multiplier": sigma,
                    "sample_rate": q,
                    "plot": None if plot is None else str(plot),
                }
            )
            return
        table = Table(title=f"ε at δ = {d:g}, σ = {sigma:g}, q = {q:g}")
        table.add_column("epochs", justify="right")
        table.add_column("steps", justify="right")
        for name in CURVE_ACCOUNTANTS:
            table.add_column(name, justify="right")
        for i, e in enumerate(grid):
            table.add_row(
                f"{e:.4g}", str(steps[i]), *(_fmt(curves[k][i]) for k in CURVE_ACCOUNTANTS)
            )
        Console(highlight=False, markup=False).print(table)
        typer.echo(f"note: gdp is {CURVE_LABELS['gdp']}")
        if plot is not None:
            _stderr().print(f"wrote {plot}")

    _guarded(run)


def _widths(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise ValueError(f"--widths must be comma-separated whole numbers, got {text!r}") from None


@app.command("train")
def train_command(
    out: Annotated[Path, typer.Option("--out", help="Folder for the model and checkpoints.")],
    dataset: Annotated[str, typer.Option("--dataset", help="Dataset name.")] = "mnist5k",
    model: Annotated[str, typer.Option("--model", help="Model name.")] = "mlp",
    epochs: Annotated[int, typer.Option("--epochs", help="Epochs.")] = 30,
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Batch size (expected size under Poisson sampling).")
    ] = 256,
    lr: Annotated[float, typer.Option("--lr", help="Learning rate.")] = 0.1,
    optimizer: Annotated[
        str, typer.Option("--optimizer", help="sgd, momentum or adam.")
    ] = "momentum",
    schedule: Annotated[
        str, typer.Option("--schedule", help="constant, cosine or step.")
    ] = "constant",
    weight_decay: Annotated[float, typer.Option("--weight-decay")] = 0.0,
    label_smoothing: Annotated[float, typer.Option("--label-smoothing")] = 0.0,
    augment: Annotated[
        bool, typer.Option("--augment", help="Random rotations and shifts.")
    ] = False,
    widths: Annotated[
        str | None, typer.Option("--widths", help="Hidden widths, e.g. 512,256.")
    ] = None,
    activation: Annotated[
        str | None, typer.Option("--activation", help="relu, tanh or sigmoid.")
    ] = None,
    norm: Annotated[
        str | None, typer.Option("--norm", help="cnn normalisation: group (BatchNorm is refused).")
    ] = None,
    dp: Annotated[bool, typer.Option("--dp", help="Train with DP-SGD.")] = False,
    epsilon: Annotated[
        float | None, typer.Option("--epsilon", help="Target ε (σ is calibrated).")
    ] = None,
    noise_multiplier: Annotated[
        float | None, typer.Option("--noise-multiplier", help="σ (instead of --epsilon).")
    ] = None,
    delta: Annotated[float, typer.Option("--delta", help="δ, in (0, 1).")] = 1e-5,
    max_grad_norm: Annotated[float, typer.Option("--max-grad-norm", help="Clipping norm C.")] = 1.0,
    clipping: Annotated[
        str, typer.Option("--clipping", help="ghost, per_sample or auto.")
    ] = "ghost",
    sampling: Annotated[str, typer.Option("--sampling", help="poisson or shuffle.")] = "poisson",
    per_layer: Annotated[
        bool, typer.Option("--per-layer", help="Per-layer clipping (C/sqrt(K) per tensor).")
    ] = False,
    physical_batch_size: Annotated[
        int | None,
        typer.Option("--physical-batch-size", help="Micro-batch size (virtual batches)."),
    ] = None,
    secure_noise: Annotated[
        bool, typer.Option("--secure-noise", help="Noise from the OS CSPRNG (not seedable).")
    ] = False,
    accountant: Annotated[str, typer.Option("--accountant", help="pld or rdp.")] = "pld",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Train a model, privately with DP-SGD (Abadi et al. 2016, Alg. 1) when --dp is given;
    writes OUT/model.safetensors and OUT/model.json, and resumes from OUT/checkpoint."""

    def run() -> None:
        from privacylab.training.config import PrivacyConfig, TrainConfig
        from privacylab.training.job import train_job

        privacy = None
        if dp:
            _accountant_name(accountant, ("pld", "rdp", "rdp-classic"))
            privacy = PrivacyConfig(
                epsilon=epsilon,
                noise_multiplier=noise_multiplier,
                delta=delta,
                max_grad_norm=max_grad_norm,
                clipping=clipping,
                sampling=sampling,
                accountant=accountant,
                per_layer=per_layer,
                physical_batch_size=physical_batch_size,
                secure_noise=secure_noise,
            )
        elif epsilon is not None or noise_multiplier is not None:
            raise ValueError("--epsilon and --noise-multiplier need --dp")
        config = TrainConfig(
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            optimizer=optimizer,
            schedule=schedule,
            weight_decay=weight_decay,
            label_smoothing=label_smoothing,
            augmentation=augment,
            seed=seed,
            device=device,
            privacy=privacy,
        ).validate()
        options: dict[str, Any] = {}
        if (w := _widths(widths)) is not None:
            options["widths"] = w
        if activation is not None:
            options["activation"] = activation
        if norm is not None:
            options["norm"] = norm
        console = _stderr()
        with Progress(
            TextColumn("training"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} epochs"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        ) as bar:
            task = bar.add_task("train", total=epochs)

            def report(record: Any) -> None:
                eps = f"  ε {record.epsilon:.3f}" if record.epsilon is not None else ""
                acc = (
                    f"  test acc {record.eval_accuracy:.4f}"
                    if record.eval_accuracy is not None
                    else ""
                )
                bar.console.print(
                    f"epoch {record.epoch}/{epochs}  train acc {record.train_accuracy:.4f}"
                    f"{acc}{eps}"
                )
                bar.update(task, completed=record.epoch)

            summary = train_job(
                dataset, model, config, out, root=root, model_options=options, progress=report
            )
        if json_output:
            _emit_json(summary)
            return
        line = f"test accuracy {summary['test_accuracy']:.4f} ({summary['dataset']}, {model})"
        if summary["private"]:
            line += (
                f"  ε = {summary['epsilon']:.4g} at δ = {summary['delta']:g}"
                f" [{summary['accountant']}]"
                f"  σ = {summary['noise_multiplier']:.4g}, q = {summary['sample_rate']:.4g}, "
                f"{summary['steps']} steps, C = {summary['max_grad_norm']:g}"
            )
        typer.echo(line)
        if summary["note"]:
            typer.echo(f"note: {summary['note']}")
        console.print(f"wrote {out}")

    _guarded(run)


TERMINAL_HIDDEN = ("access", "balanced_accuracy", "seconds")
"""Summary columns left to the HTML report when printing to a terminal."""


class _Stages:
    """A rich progress bar per stage of a long job, on stderr (hidden when not a terminal)."""

    def __init__(self, console: Console) -> None:
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            disable=not console.is_terminal,
        )
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: float, total: float) -> None:
        key = stage.split(": attack ")[0] if ": attack " in stage else stage
        if key not in self.tasks:
            self.tasks[key] = self.bar.add_task(key, total=max(total, 1))
        self.bar.update(self.tasks[key], completed=done, description=stage)

    def __enter__(self) -> _Stages:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)


def _print_summary(payload: dict[str, Any]) -> None:
    from privacylab.report.html import SUMMARY_COLUMNS, summary_table_rows

    shown = [(k, h) for k, h in SUMMARY_COLUMNS if k not in TERMINAL_HIDDEN]
    table = Table(title=payload.get("title"))
    for _, header in shown:
        table.add_column(header, overflow="fold")
    for row in summary_table_rows(payload):
        style = "red" if row.get("violation") else None
        table.add_row(*[str(row.get(key, "")) for key, _ in shown], style=style)
    Console(width=max(Console().width, 120)).print(table)


def _floats(text: str, name: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers, got {text!r}") from None


@app.command("run")
def run_command(
    out: Annotated[
        Path, typer.Option("--out", help="Report folder (results.json, index.html).")
    ] = Path("privacylab-report"),
    dataset: Annotated[str, typer.Option("--dataset", help="Dataset name.")] = "mnist5k",
    model: Annotated[str, typer.Option("--model", help="Model name.")] = "mlp",
    widths: Annotated[str, typer.Option("--widths", help="Hidden widths, e.g. 256.")] = "256",
    epsilons: Annotated[
        str, typer.Option("--epsilons", help="ε of the DP-SGD targets, comma-separated.")
    ] = "1,8",
    no_nonprivate: Annotated[
        bool, typer.Option("--no-nonprivate", help="Skip the non-private target.")
    ] = False,
    attacks: Annotated[
        str | None, typer.Option("--attacks", help="Comma-separated attacks (default: all).")
    ] = None,
    references: Annotated[
        int | None, typer.Option("--references", help="Reference models per target.")
    ] = None,
    audits: Annotated[
        str,
        typer.Option("--audits", help="Audits of DP-SGD at each ε, comma-separated, or none."),
    ] = "dirac,one-run-whitebox",
    members: Annotated[
        int | None, typer.Option("--members", help="Training-set size of each target.")
    ] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", help="Training epochs.")] = None,
    workers: Annotated[int, typer.Option("--workers", help="Training processes.")] = 2,
    cache: Annotated[
        Path | None, typer.Option("--cache", help="Trained models and store (default OUT/cache).")
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="4 references, 15 epochs, 1,000 members.")
    ] = False,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Train a non-private and DP-SGD targets, attack each with the membership suite (metric,
    shadow, LiRA, RMIA, label-only) and write the report to OUT; resumes after a kill."""

    def run() -> None:
        from privacylab.experiment import DEFAULT_ATTACKS, RunConfig, run_experiment

        options: dict[str, Any] = {
            "dataset": dataset,
            "model": model,
            "model_options": {"widths": list(_widths(widths) or ())} if widths else {},
            "epsilons": _floats(epsilons, "--epsilons"),
            "nonprivate": not no_nonprivate,
            "attacks": tuple(a for a in (attacks or ",".join(DEFAULT_ATTACKS)).split(",") if a),
            "workers": workers,
            "seed": seed,
            "root": str(root) if root is not None else None,
            "device": device,
            "audits": tuple(a for a in audits.split(",") if a and audits != "none"),
        }
        for name, value in (("references", references), ("members", members), ("epochs", epochs)):
            if value is not None:
                options[name] = value
        config = RunConfig.quick(**options) if quick else RunConfig(**options)
        config.validate()
        with _Stages(_stderr()) as stages:
            payload = run_experiment(config, out, cache=cache, progress=stages)
        if json_output:
            _emit_json(payload)
            return
        _print_summary(payload)
        _stderr().print(f"wrote {out / 'index.html'} and {out / 'results.json'}")

    _guarded(run)


attack_app = typer.Typer(help="Attacks on a saved model.", no_args_is_help=True)
app.add_typer(attack_app, name="attack")


@attack_app.command("membership")
def attack_membership_command(
    target: Annotated[
        Path, typer.Option("--target", help="A model folder written by `privacylab train`.")
    ],
    attack: Annotated[
        str, typer.Option("--attack", help="Attack name(s), comma-separated, e.g. lira,rmia.")
    ] = "lira",
    references: Annotated[int, typer.Option("--references", help="Reference models.")] = 16,
    workers: Annotated[int, typer.Option("--workers", help="Training processes.")] = 2,
    cache: Annotated[
        Path | None, typer.Option("--cache", help="Reference models (default TARGET/attack-cache).")
    ] = None,
    subsample: Annotated[
        int, typer.Option("--subsample", help="Examples a side for boundary attacks.")
    ] = 200,
    root: Annotated[Path | None, typer.Option("--root", help="Folder of on-disk datasets.")] = None,
    json_output: JsonOpt = False,
) -> None:
    """Membership inference against a saved model: its training rows are the members, half of
    its test rows the non-members; references are trained with its own recipe."""

    def run() -> None:
        from privacylab.experiment import attack_target, resolve_attacks, saved_target_game
        from privacylab.report import membership_metrics

        names = resolve_attacks([a for a in attack.split(",") if a.strip()])
        with _Stages(_stderr()) as stages:
            game = saved_target_game(
                target,
                references=references,
                cache=cache if cache is not None else target / "attack-cache",
                workers=workers,
                root=str(root) if root is not None else None,
                progress=stages,
            )
            results = attack_target(
                game.target,
                game.task,
                game.membership,
                names,
                subsample=subsample,
                seed=0,
                progress=stages,
            )
        delta = (game.recipe.train.get("privacy") or {}).get("delta", 1e-5)
        payload = {
            "target": str(target),
            "epsilon": game.record.get("epsilon"),
            "delta": delta,
            "train_accuracy": game.record["train_accuracy"],
            "test_accuracy": game.test_accuracy,
            "references": references,
            "attacks": [membership_metrics(r, delta=delta).to_dict() for r in results],
        }
        if json_output:
            _emit_json(payload)
            return
        _print_summary(
            {
                "title": f"membership inference on {target}",
                "targets": [
                    {
                        "name": game.name,
                        **{
                            k: payload[k]
                            for k in (
                                "epsilon",
                                "delta",
                                "train_accuracy",
                                "test_accuracy",
                                "attacks",
                            )
                        },
                    }
                ],
            }
        )

    _guarded(run)


@app.command("audit")
def audit_command(
    method: Annotated[
        str,
        typer.Option("--method", help="backdoor, clipbkd, mi, dirac, one-run or one-run-whitebox."),
    ] = "dirac",
    dataset: Annotated[str, typer.Option("--dataset", help="Dataset name.")] = "digits",
    model: Annotated[str, typer.Option("--model", help="Model name.")] = "logreg",
    epsilon: Annotated[float, typer.Option("--epsilon", help="Target ε of DP-SGD.")] = 4.0,
    delta: Annotated[float, typer.Option("--delta", help="δ, in (0, 1).")] = 1e-5,
    trials: Annotated[int, typer.Option("--trials", help="Training runs (T).")] = 200,
    confidence: Annotated[
        float, typer.Option("--confidence", help="Confidence of the lower bound.")
    ] = 0.95,
    executor: Annotated[
        str, typer.Option("--executor", help="local (process pool), serial or ray.")
    ] = "local",
    workers: Annotated[int, typer.Option("--workers", help="Parallel trials.")] = 2,
    address: Annotated[
        str | None, typer.Option("--address", help="Ray cluster: auto or HOST:PORT.")
    ] = None,
    store: Annotated[
        Path, typer.Option("--store", help="Result store; a re-run resumes from it.")
    ] = Path("privacylab-audit/store.sqlite"),
    seed: Annotated[int, typer.Option("--seed")] = 0,
    k: Annotated[
        int | None,
        typer.Option("--k", help="Poisoning audits: poisoned rows (distance of D0 and D1)."),
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Measure a lower bound on ε by attacking our own DP-SGD (Jagielski et al. 2020; Nasr et
    al. 2023; Steinke et al. 2023) next to the accountant's ε; trials are saved as they finish."""

    def run() -> None:
        import time

        from privacylab.audit.job import run_audit
        from privacylab.execution import make_executor

        check.positive("epsilon", epsilon)
        check.delta(delta)
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence}")
        if executor == "ray":
            runner = make_executor("ray", workers, address=address)  # type: ignore[call-arg]
        else:
            runner = make_executor(executor, workers)
        start = time.perf_counter()
        result = run_audit(
            method, epsilon=epsilon, delta=delta, trials=trials, dataset=dataset, model=model,
            confidence=confidence, store=store, executor=runner, seed=seed, k=k,
        )  # fmt: skip
        payload = {**result.to_dict(), "wall_seconds": time.perf_counter() - start}
        if json_output:
            _emit_json(payload)
            return
        verdict = (
            "REFUTED: the implementation leaks more than it claims"
            if result.violated
            else "consistent"
        )
        typer.echo(
            f"{result.method}: ε (accountant {result.accountant}) = {result.epsilon_theory:.4g} "
            f"at δ = {result.delta:g};  ε lower bound = {result.epsilon_lower_bound:.4g} at "
            f"{result.confidence:.0%} confidence from {result.trials} trial(s)  [{verdict}]"
        )
        typer.echo(f"counts: {json.dumps(result.counts)}  ({payload['wall_seconds']:.1f} s)")

    _guarded(run)
