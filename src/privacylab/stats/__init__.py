"""Statistics at the bottom of the import graph (numpy/scipy only; imports nothing of
privacylab's but `privacylab.errors`): ROC curves, AUC and TPR at a fixed FPR, Clopper–Pearson
bounds, ε lower bounds from a test's counts (plain, held-out, poisoning with group privacy),
Gaussian DP (μ ↔ ε), the one-run audit bound, and reconstruction quality in [0, 1] pixel
space (MSE, PSNR, SSIM, batch matching, label accuracy).
Attacks, audits and reports all use these."""

from privacylab.stats._checks import StatisticsError
from privacylab.stats.binomial import (
    clopper_pearson,
    clopper_pearson_bounds,
    clopper_pearson_upper,
)
from privacylab.stats.embedding import majority_share, token_recall
from privacylab.stats.epsilon import (
    epsilon_from_counts,
    epsilon_lower_bound,
    epsilon_lower_bound_poisoning,
    group_delta_factor,
    group_privacy,
    held_out_epsilon,
)
from privacylab.stats.gdp import (
    epsilon_from_gdp_mu,
    epsilon_lower_bound_gdp,
    gdp_delta,
    gdp_mu_from_rates,
)
from privacylab.stats.images import (
    image_scores,
    label_accuracy,
    match,
    mse,
    psnr,
    ssim,
    to_unit,
)
from privacylab.stats.one_run import one_run_epsilon_lower_bound, one_run_p_value
from privacylab.stats.roc import auc, check_scores, roc_auc, roc_counts, roc_curve, tpr_at_fpr

__all__ = [
    "StatisticsError",
    "auc",
    "check_scores",
    "clopper_pearson",
    "clopper_pearson_bounds",
    "clopper_pearson_upper",
    "epsilon_from_counts",
    "epsilon_from_gdp_mu",
    "epsilon_lower_bound",
    "epsilon_lower_bound_gdp",
    "epsilon_lower_bound_poisoning",
    "gdp_delta",
    "gdp_mu_from_rates",
    "group_delta_factor",
    "group_privacy",
    "held_out_epsilon",
    "image_scores",
    "label_accuracy",
    "majority_share",
    "match",
    "mse",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
    "psnr",
    "roc_auc",
    "roc_counts",
    "roc_curve",
    "ssim",
    "to_unit",
    "token_recall",
    "tpr_at_fpr",
]
