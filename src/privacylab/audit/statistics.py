"""Statistics that turn audit outcomes into empirical lower bounds on ε — re-exported from
`privacylab.stats`, where they live (bottom of the import graph), so that existing imports keep
working.

- Clopper–Pearson bounds and the poisoning-audit ε lower bound of Jagielski, Ullman & Oprea
  2020 (Algorithm 2 / Theorem 2), extended to δ > 0 and to k poisoned points by group privacy.
- The (ε, δ) curve of μ-GDP (Dong, Roth & Su 2022, Corollary 2.13) and the μ implied by an
  attack's error rates (Nasr et al. 2023, Sec. 4).
- The one-run audit of Steinke, Nasr & Jagielski 2023 (Theorem 3 and its p-value algorithm).
"""

from __future__ import annotations

from privacylab.stats import (
    clopper_pearson_bounds,
    epsilon_from_gdp_mu,
    epsilon_lower_bound_gdp,
    epsilon_lower_bound_poisoning,
    gdp_mu_from_rates,
    one_run_epsilon_lower_bound,
    one_run_p_value,
)

__all__ = [
    "clopper_pearson_bounds",
    "epsilon_from_gdp_mu",
    "epsilon_lower_bound_gdp",
    "epsilon_lower_bound_poisoning",
    "gdp_mu_from_rates",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
]
