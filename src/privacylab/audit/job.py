"""Audits by name, as `privacylab audit` and `privacylab run` call them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from privacylab.audit.result import AuditResult
from privacylab.errors import PrivacylabError
from privacylab.execution import Executor, ResultStore
from privacylab.registry import Registry

POISONING = ("backdoor", "clipbkd", "mi")
MAX_TRIALS = 10**6
"""Most trials (and poisoned rows k) an audit accepts."""


class AuditInputError(PrivacylabError, ValueError):
    """An audit option is out of range; the message is one line."""


class _AuditRun(Protocol):
    def __call__(
        self, method: str, settings: dict[str, Any], trials: int, store: ResultStore,
        executor: Executor | None, confidence: float,
    ) -> AuditResult: ...  # fmt: skip


AUDITS: Registry[_AuditRun] = Registry("audit method", sort_choices=False)
"""Audit runners by method name, in the order of METHODS."""


def _poisoning(
    method: str, settings: dict[str, Any], trials: int, store: ResultStore,
    executor: Executor | None, confidence: float,
) -> AuditResult:  # fmt: skip
    from privacylab.audit.poisoning import PoisoningAudit, run_poisoning_audit

    config = PoisoningAudit(method=method, **settings)
    return run_poisoning_audit(
        config, trials, store=store, executor=executor, confidence=confidence
    )


def _dirac(
    method: str, settings: dict[str, Any], trials: int, store: ResultStore,
    executor: Executor | None, confidence: float,
) -> AuditResult:  # fmt: skip
    from privacylab.audit.whitebox import DiracAudit, run_whitebox_audit

    if settings["dataset"] != "digits" or settings["model"] != "logreg":
        raise ValueError("the dirac audit trains a logistic regression on digits")
    dirac = DiracAudit(epsilon=settings["epsilon"], delta=settings["delta"], seed=settings["seed"])
    return run_whitebox_audit(dirac, trials, store=store, executor=executor, confidence=confidence)


def _one_run(
    method: str, settings: dict[str, Any], trials: int, store: ResultStore,
    executor: Executor | None, confidence: float,
) -> AuditResult:  # fmt: skip
    from privacylab.audit.one_run import OneRunAudit, run_one_run_audit

    settings = {k: v for k, v in settings.items() if k != "k"}
    return run_one_run_audit(OneRunAudit(variant=method, **settings), confidence=confidence)


for _name in POISONING:
    AUDITS.register(_name, _poisoning)
AUDITS.register("dirac", _dirac)
AUDITS.register("one-run", _one_run)
AUDITS.register("one-run-whitebox", _one_run)

METHODS = tuple(AUDITS.names())
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
    run = AUDITS.get(method)
    method = AUDITS.canonical(method)
    if k is not None and method not in POISONING:
        raise ValueError(f"--k applies to the poisoning audits ({', '.join(POISONING)}) only")
    for name, value in (("trials", trials), ("k", k)):
        if value is None and name == "k":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TRIALS:
            raise AuditInputError(
                f"{name} must be a whole number in [1, {MAX_TRIALS:,}], got {value!r}"
            )
    if not (isinstance(confidence, float) and 0 < confidence < 1):
        raise AuditInputError(f"confidence must be in (0, 1), got {confidence!r}")
    settings: dict[str, Any] = {
        "dataset": dataset, "model": model, "epsilon": epsilon, "delta": delta, "seed": seed,
    }  # fmt: skip
    if method in POISONING:
        settings["k"] = k
    owned = not isinstance(store, ResultStore)
    db = ResultStore(store) if owned else store
    try:
        return run(method, settings, trials, db, executor, confidence)
    finally:
        if owned:
            db.close()
