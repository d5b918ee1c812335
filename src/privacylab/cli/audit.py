"""`privacylab audit`: an empirical lower bound on ε of our own DP-SGD."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from privacylab.accounting import _validate as check
from privacylab.cli._common import (
    JsonOpt,
    _emit_json,
    _guarded,
    _model_fits,
    _path_arg,
    _whole_in,
    _writable_file,
    app,
)


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
        Path,
        typer.Option("--store", help="Result store; a re-run resumes from it.", parser=_path_arg),
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

        from privacylab.audit.job import MAX_TRIALS, METHODS, POISONING, run_audit
        from privacylab.execution import make_executor

        if method not in METHODS:
            raise ValueError(f"unknown audit method {method!r}; choose one of {', '.join(METHODS)}")
        check.target_epsilon(epsilon, "epsilon")
        check.delta(delta)
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence}")
        _whole_in(trials, "--trials", 1, MAX_TRIALS)
        _whole_in(workers, "--workers", 1, 1024)
        _whole_in(seed, "--seed", 0, 2**63 - 1)
        if k is not None:
            if method not in POISONING:
                raise ValueError(
                    f"--k applies to the poisoning audits ({', '.join(POISONING)}) only"
                )
            _whole_in(k, "--k", 1, MAX_TRIALS)
        if address is not None and executor != "ray":
            raise ValueError(f"--address is only for --executor ray, not {executor!r}")
        if method == "dirac" and (dataset != "digits" or model != "logreg"):
            raise ValueError("the dirac audit trains a logistic regression on digits")
        _writable_file(store, "--store")
        _model_fits(dataset, model, {}, None)
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
