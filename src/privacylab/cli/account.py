"""`privacylab account`: ε of DP-SGD, the noise for a target ε, the step budget, ε curves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from privacylab.accounting import (
    Accountant,
    Guarantee,
    PrivacyParameterError,
    calibrate_noise_multiplier,
    dp_sgd,
    make_accountant,
    step_budget,
    steps_from_epochs,
)
from privacylab.accounting import _validate as check
from privacylab.cli._common import (
    DEFAULT_ACCOUNTANT,
    AccountantOpt,
    DeltaOpt,
    EpochsOpt,
    JsonOpt,
    NoiseOpt,
    SampleRateOpt,
    StepsOpt,
    _accountant_name,
    _emit_json,
    _fmt,
    _guarded,
    _resolve_steps,
    _stderr,
    app,
)

CURVE_ACCOUNTANTS = ("rdp", "pld", "gdp", "advanced")
"""Curves drawn by `account curve` (Abadi et al. 2016, Figure 2, plus PLD and GDP)."""

STEP_SEARCH_CAP = 10**9
"""`account steps` searches up to this many steps; beyond it the answer says "more than"."""

MAX_CURVE_POINTS = 10_000
"""Most epochs `account curve` evaluates."""

CURVE_LABELS = {
    "rdp": "RDP / moments accountant (upper bound)",
    "pld": "PLD (upper bound)",
    "gdp": "GDP / CLT (approximation, may under-state ε)",
    "advanced": "advanced composition (upper bound)",
}

account_app = typer.Typer(
    help="Privacy accounting for DP-SGD: ε for a run, the noise for a target ε, the step budget.",
    no_args_is_help=True,
)
app.add_typer(account_app, name="account")


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
        sigma = check.noise_multiplier(noise_multiplier)
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
        eps = check.target_epsilon(epsilon, "epsilon")
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
        sigma = check.noise_multiplier(noise_multiplier)
        q = check.sample_rate(sample_rate)
        eps = check.target_epsilon(epsilon, "epsilon")
        d = check.delta(delta)
        with _stderr().status(f"searching the step budget with {name}..."):
            t, capped = step_budget(sigma, q, eps, d, accountant=name, limit=STEP_SEARCH_CAP)
        if json_output:
            _emit_json(
                {
                    "steps": t,
                    "epochs": t * q,
                    "capped": capped,
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
        elif capped:
            typer.echo(
                f"more than {t} steps ({t * q:.4g} epochs; the search cap) fit in ε ≤ {eps:g} "
                f"at δ = {d:g}  [{name}]  σ = {sigma:g}, q = {q:g}"
            )
        else:
            typer.echo(
                f"at most {t} steps ({t * q:.4g} epochs) for ε ≤ {eps:g} at δ = {d:g}  "
                f"[{name}]  σ = {sigma:g}, q = {q:g}"
            )

    _guarded(run)


def _check_plot_path(plot: Path) -> None:
    """Refuse a --plot that is not a writable file path, before any work."""
    if not str(plot).strip():
        raise PrivacyParameterError("--plot must be a file path, got ''")
    if plot.is_dir():
        raise PrivacyParameterError(f"--plot {plot} is a folder; give a .png file path")
    if plot.suffix.lower() != ".png":
        raise PrivacyParameterError(f"--plot must end in .png, got {plot}")
    if not plot.resolve().parent.is_dir():
        raise PrivacyParameterError(f"cannot write plot: no directory {plot.parent}")


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
        sigma = check.noise_multiplier(noise_multiplier)
        q = check.sample_rate(sample_rate)
        d = check.delta(delta)
        last = check.positive("epochs", epochs)
        n = check.count(points, "points")
        if n > MAX_CURVE_POINTS:
            raise PrivacyParameterError(f"points must be at most {MAX_CURVE_POINTS}, got {n}")
        if plot is not None:
            _check_plot_path(plot)
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
            _stderr().print(f"wrote {plot}", markup=False, highlight=False)

    _guarded(run)


@account_app.command("model")
def model_command(
    path: Annotated[Path, typer.Argument(help="A model folder written by `privacylab train`.")],
    accountant: AccountantOpt = DEFAULT_ACCOUNTANT,
    delta: Annotated[
        float | None, typer.Option("--delta", help="δ, in (0, 1) (default: the run's δ).")
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Re-account a saved model: ε of the privacy event its training actually executed (recorded
    in its sidecar), with any accountant."""

    def run() -> None:
        from privacylab.training import reaccount

        name = _accountant_name(accountant)
        d = None if delta is None else check.delta(delta)
        g = reaccount(path, accountant=name, delta=d)
        if json_output:
            _emit_json(
                {
                    "model": str(path),
                    "epsilon": float(g.epsilon),
                    "delta": g.delta,
                    "accountant": g.accountant,
                    "order": None if g.order is None else float(g.order),
                    "note": g.note,
                }
            )
            return
        order = f", Rényi order {g.order:g}" if g.order is not None else ""
        typer.echo(f"ε = {_fmt(g.epsilon)} at δ = {g.delta:g}  [{g.accountant}{order}]  {path}")
        if g.note:
            typer.echo(f"note: {g.note}")

    _guarded(run)
