"""Empirical ε lower bounds (auditing): statistics (Clopper–Pearson and the poisoning audit of
Jagielski et al. 2020, GDP after Dong, Roth & Su 2022 and Nasr et al. 2023, the one-run audit of
Steinke, Nasr & Jagielski 2023), the `AuditResult` type and durable trials (`run_trials`).
"""

from privacylab.audit.job import METHODS, run_audit
from privacylab.audit.result import AuditResult
from privacylab.audit.runner import run_trials
from privacylab.audit.statistics import (
    clopper_pearson_bounds,
    epsilon_from_gdp_mu,
    epsilon_lower_bound_gdp,
    epsilon_lower_bound_poisoning,
    gdp_mu_from_rates,
    one_run_epsilon_lower_bound,
    one_run_p_value,
)

__all__ = [
    "METHODS",
    "AuditResult",
    "clopper_pearson_bounds",
    "epsilon_from_gdp_mu",
    "epsilon_lower_bound_gdp",
    "epsilon_lower_bound_poisoning",
    "gdp_mu_from_rates",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
    "run_audit",
    "run_trials",
]
