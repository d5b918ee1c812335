"""Accounting benchmark: time and ε of privacylab's RDP and PLD against named peers.

For each named DP-SGD setting (σ, q, steps, δ) it times, best of `--repeat` wall-clock runs with a
fresh accountant each run:

* ours RDP   — `make_accountant("rdp")` (tight Balle et al. 2020 conversion)
* ours PLD   — `make_accountant("pld")`
* Opacus RDP — `opacus.accountants.RDPAccountant` (its own 151 orders; Opacus 1.6 also uses the
  Balle et al. conversion), reported as is
* Opacus PRV — `opacus.accountants.PRVAccountant` (its upper bound, default error settings)
* dp_accounting PLD — `dp_accounting.pld.PLDAccountant()` (default discretisation 1e-4) on
  `PoissonSampledDpEvent(q, GaussianDpEvent(σ))` composed `steps` times
* ours PLD calibration — `calibrate_noise_multiplier(..., accountant="pld")` for the target
  ε = dp_accounting's ε

and the ratios the issue sets goals for: ours_rdp_time / opacus_rdp_time (goal ≤ 1),
dp_accounting_pld_time / ours_pld_time (goal ≥ 5) and ours_pld_eps / dp_accounting_pld_eps
(goal ≤ 1: same or tighter).

    python benchmarks/accounting.py [--json] [--quick] [--repeat N]

Needs privacylab importable (`pip install -e .`, or run from the repository root) and the test
extras (Opacus, dp-accounting). Progress goes to stderr; stdout holds only the result.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One DP-SGD run to account for."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    delta: float
    about: str


SETTINGS: dict[str, Setting] = {
    "tf-mnist": Setting(
        1.1, 256 / 60000, math.ceil(60 / (256 / 60000)), 1e-5, "TF Privacy MNIST, 60 epochs"
    ),
    "abadi-fig2": Setting(4.0, 0.01, 10000, 1e-5, "Abadi et al. 2016 Fig. 2, 100 epochs"),
    "small-sigma": Setting(0.6, 0.02, 2000, 1e-6, "small noise, large ε"),
    "large-T": Setting(2.0, 0.001, 100000, 1e-10, "many steps, tiny δ"),
    "full-batch": Setting(10.0, 1.0, 1000, 1e-5, "no subsampling (q = 1)"),
}
QUICK = ("tf-mnist", "abadi-fig2")

METHODS = ("ours_rdp", "ours_pld", "opacus_rdp", "opacus_prv", "dp_accounting_pld")


def _privacylab() -> Any:
    """Import privacylab.accounting, from the source tree if it is not installed."""
    try:
        import privacylab.accounting as accounting
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        import privacylab.accounting as accounting
    return accounting


def ours(name: str) -> Callable[[Setting], float]:
    """ε from a fresh privacylab accountant `name`."""
    accounting = _privacylab()

    def run(s: Setting) -> float:
        event = accounting.dp_sgd(s.noise_multiplier, s.sample_rate, s.steps)
        return float(accounting.make_accountant(name).compose(event).epsilon(s.delta))

    return run


def opacus_rdp() -> Callable[[Setting], float]:
    """ε from Opacus's RDP accountant (default orders)."""
    from opacus.accountants import RDPAccountant

    def run(s: Setting) -> float:
        acc = RDPAccountant()
        acc.history = [(s.noise_multiplier, s.sample_rate, s.steps)]
        return float(acc.get_epsilon(s.delta))

    return run


def opacus_prv() -> Callable[[Setting], float]:
    """ε (upper bound) from Opacus's PRV accountant (Gopi et al. 2021), default errors."""
    from opacus.accountants import PRVAccountant

    def run(s: Setting) -> float:
        acc = PRVAccountant()
        acc.history = [(s.noise_multiplier, s.sample_rate, s.steps)]
        return float(acc.get_epsilon(s.delta))

    return run


def dp_accounting_pld() -> Callable[[Setting], float]:
    """ε from dp_accounting's PLD accountant, default value discretisation interval."""
    import dp_accounting

    def run(s: Setting) -> float:
        event: Any = dp_accounting.GaussianDpEvent(s.noise_multiplier)
        if s.sample_rate < 1.0:
            event = dp_accounting.PoissonSampledDpEvent(s.sample_rate, event)
        acc = dp_accounting.pld.PLDAccountant()
        acc.compose(event, s.steps)
        return float(acc.get_epsilon(s.delta))

    return run


LABELS = {
    "ours_rdp": "ours RDP",
    "ours_pld": "ours PLD",
    "opacus_rdp": "Opacus RDP",
    "opacus_prv": "Opacus PRV",
    "dp_accounting_pld": "dp_acc PLD",
}

RUNNERS: dict[str, Callable[[], Callable[[Setting], float]]] = {
    # each factory imports its library, so that import time is not timed
    "ours_rdp": lambda: ours("rdp"),
    "ours_pld": lambda: ours("pld"),
    "opacus_rdp": opacus_rdp,
    "opacus_prv": opacus_prv,
    "dp_accounting_pld": dp_accounting_pld,
}


def timed(fn: Callable[[], float], repeat: int) -> dict[str, Any]:
    """Best-of-`repeat` wall time of `fn()` and its value; an exception becomes `error`."""
    times: list[float] = []
    value = float("nan")
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            value = fn()
        except Exception as e:  # a peer failing on a setting is a result, not a crash
            return {"epsilon": None, "time_s": None, "error": f"{type(e).__name__}: {e}"}
        times.append(time.perf_counter() - start)
    return {"epsilon": value, "time_s": min(times), "first_s": times[0]}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def bench_setting(s: Setting, repeat: int, step: Callable[[str], None]) -> dict[str, Any]:
    """All methods, the PLD calibration and the ratios for one setting."""
    out: dict[str, Any] = {
        "noise_multiplier": s.noise_multiplier,
        "sample_rate": s.sample_rate,
        "steps": s.steps,
        "delta": s.delta,
        "about": s.about,
    }
    for method in METHODS:
        step(method)
        runner = RUNNERS[method]()
        out[method] = timed(lambda runner=runner: runner(s), repeat)

    step("ours_pld_calibration")
    target = out["dp_accounting_pld"]["epsilon"]
    if target is None:
        out["ours_pld_calibration"] = {"error": "no dp_accounting ε to target"}
    else:
        accounting = _privacylab()
        found: dict[str, float] = {}

        def calibrate() -> float:
            found["sigma"] = float(
                accounting.calibrate_noise_multiplier(
                    target, s.delta, s.sample_rate, s.steps, accountant="pld"
                )
            )
            return target

        result = timed(calibrate, repeat)
        result["target_epsilon"] = result.pop("epsilon")
        result["noise_multiplier"] = found.get("sigma")
        out["ours_pld_calibration"] = result

    def t(m: str) -> float | None:
        return out[m].get("time_s")

    def e(m: str) -> float | None:
        return out[m].get("epsilon")

    out["ratios"] = {
        "ours_rdp_time/opacus_rdp_time": _ratio(t("ours_rdp"), t("opacus_rdp")),
        "dp_accounting_pld_time/ours_pld_time": _ratio(t("dp_accounting_pld"), t("ours_pld")),
        "ours_pld_eps/dp_accounting_pld_eps": _ratio(e("ours_pld"), e("dp_accounting_pld")),
        "ours_rdp_eps/opacus_rdp_eps": _ratio(e("ours_rdp"), e("opacus_rdp")),
    }
    return out


def run(names: list[str], repeat: int) -> dict[str, Any]:
    """Benchmark the named settings, with a rich progress line on stderr."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    results: dict[str, Any] = {}
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("", total=None)
        for name in names:

            def step(method: str, name: str = name) -> None:
                progress.update(task, description=f"{name}: {method}")

            results[name] = bench_setting(SETTINGS[name], repeat, step)
    return results


def _num(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_tables(results: dict[str, Any], repeat: int) -> None:
    """Human-readable tables on stdout."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
    detail = Table(title=f"ε and best-of-{repeat} wall time (s)")
    detail.add_column("setting")
    detail.add_column("σ / q / steps / δ")
    for method in METHODS:
        detail.add_column(LABELS[method], justify="right")
    for name, r in results.items():
        cells = []
        for method in METHODS:
            m = r[method]
            if m.get("error"):
                cells.append("error")
            else:
                cells.append(f"{m['epsilon']:.4f}\n{m['time_s']:.3f} s")
        params = (
            f"{r['noise_multiplier']:g} / {r['sample_rate']:.4g} / {r['steps']} / {r['delta']:g}"
        )
        detail.add_row(name, params, *cells)
    console.print(detail)

    summary = Table(
        title="goals: RDP ratio ≤ 1, PLD speed-up ≥ 5, PLD ε ratio ≤ 1, calibration < 2 s"
    )
    summary.add_column("setting")
    summary.add_column("RDP time ours/Opacus", justify="right")
    summary.add_column("PLD speed-up vs dp_acc", justify="right")
    summary.add_column("PLD ε ours/dp_acc", justify="right")
    summary.add_column("PLD calibration s", justify="right")
    summary.add_column("calibrated σ", justify="right")
    for name, r in results.items():
        ratios = r["ratios"]
        cal = r["ours_pld_calibration"]
        summary.add_row(
            name,
            _num(ratios["ours_rdp_time/opacus_rdp_time"], ".2f"),
            _num(ratios["dp_accounting_pld_time/ours_pld_time"], ".1f"),
            _num(ratios["ours_pld_eps/dp_accounting_pld_eps"], ".5f"),
            _num(cal.get("time_s"), ".3f"),
            _num(cal.get("noise_multiplier"), ".5g"),
        )
    console.print(summary)
    for name, r in results.items():
        for method in (*METHODS, "ours_pld_calibration"):
            if r[method].get("error"):
                print(f"{name} {method}: {r[method]['error']}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse flags, run, print one JSON object or tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing (best is kept)")
    parser.add_argument(
        "--settings", nargs="+", choices=sorted(SETTINGS), help="run only these settings"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    names = args.settings or (list(QUICK) if args.quick else list(SETTINGS))
    warnings.filterwarnings("ignore")
    results = run(names, args.repeat)
    if args.json:
        print(json.dumps(results))
    else:
        print_tables(results, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
