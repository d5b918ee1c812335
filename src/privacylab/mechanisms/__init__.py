"""Noise mechanisms: Gaussian (classical and analytic), Laplace, randomized response, groups."""

from privacylab.mechanisms.gaussian import (
    add_gaussian_noise,
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
    gaussian_epsilon_for,
)
from privacylab.mechanisms.group import group_privacy_dp, group_privacy_rdp
from privacylab.mechanisms.laplace import add_laplace_noise, laplace_scale
from privacylab.mechanisms.randomized_response import (
    randomized_response,
    rr_estimate_frequencies,
    rr_keep_probability,
)

__all__ = [
    "add_gaussian_noise",
    "add_laplace_noise",
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
    "gaussian_epsilon_for",
    "group_privacy_dp",
    "group_privacy_rdp",
    "laplace_scale",
    "randomized_response",
    "rr_estimate_frequencies",
    "rr_keep_probability",
]
