"""Empirical ε lower bounds (auditing). For now its statistics layer: Clopper–Pearson and the
poisoning audit (Jagielski et al. 2020), GDP (Dong, Roth & Su 2022; Nasr et al. 2023) and the
one-run audit (Steinke, Nasr & Jagielski 2023). numpy/scipy only.
"""

from privacylab.audit.statistics import (
    clopper_pearson_bounds,
    epsilon_from_gdp_mu,
    epsilon_lower_bound_poisoning,
    gdp_mu_from_rates,
    one_run_epsilon_lower_bound,
    one_run_p_value,
)

__all__ = [
    "clopper_pearson_bounds",
    "epsilon_from_gdp_mu",
    "epsilon_lower_bound_poisoning",
    "gdp_mu_from_rates",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
]
