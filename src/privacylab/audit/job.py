"""Audits by name, as `privacylab audit` and `privacylab run` call them."""

from __future__ import annotations

from pathlib import Path

from privacylab.audit.result import AuditResult
from privacylab.execution import Executor, ResultStore

POISONING = ("backdoor", "clipbkd", "mi")
METHODS = (*POISONING, "dirac", "one-run", "one-run-whitebox")
"""Audit methods: Jagielski et al. 2020 (backdoor, ClipBKD, membership inference), the white-box
Dirac gradient canary (Nasr et al. 2023) and one-run audits (Steinke et al. 2023)."""


def run_audit(
    method: str,
    *,
    epsilon: float,
    delta: float = 1e-5,
    trials: int = 200,
    dataset: str = "digits",
    model: str = "logreg",
    confidence: float = 0.95,
    store: ResultStore | str | Path,
    executor: Executor | None = None,
    seed: int = 0,
    k: int | None = None,
) -> AuditResult:
    """Audit DP-SGD trained for (`epsilon`, `delta`) with `method`; trials are durable in
    `store`. One-run audits use a single training run, so `trials` does not apply to them.
    `k` is the number of poisoned rows of a poisoning audit (None: the method's default)."""
    if method not in METHODS:
        raise ValueError(f"unknown audit method {method!r}; choose one of {', '.join(METHODS)}")
    if k is not None and method not in POISONING:
        raise ValueError(f"--k applies to the poisoning audits ({', '.join(POISONING)}) only")
    owned = not isinstance(store, ResultStore)
    db = ResultStore(store) if owned else store
    try:
        if method in POISONING:
            from privacylab.audit.poisoning import PoisoningAudit, run_poisoning_audit

            config = PoisoningAudit(
                method=method, dataset=dataset, model=model, epsilon=epsilon, delta=delta,
                seed=seed, k=k,
            )  # fmt: skip
            return run_poisoning_audit(
                config, trials, store=db, executor=executor, confidence=confidence
            )
        if method == "dirac":
            from privacylab.audit.whitebox import DiracAudit, run_whitebox_audit

            if dataset != "digits" or model != "logreg":
                raise ValueError("the dirac audit trains a logistic regression on digits")
            dirac = DiracAudit(epsilon=epsilon, delta=delta, seed=seed)
            return run_whitebox_audit(
                dirac, trials, store=db, executor=executor, confidence=confidence
            )
        from privacylab.audit.one_run import OneRunAudit, run_one_run_audit

        one_run = OneRunAudit(
            variant=method, dataset=dataset, model=model, epsilon=epsilon, delta=delta, seed=seed
        )
        return run_one_run_audit(one_run, confidence=confidence)
    finally:
        if owned:
            db.close()
