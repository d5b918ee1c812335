"""Noise mechanisms: Gaussian (classical and analytic; on tensors with its accounting event),
Laplace, randomized response, groups; the analytic matrix Gaussian (aMGM) and the matrix-variate
Gaussian (MVG) baseline; secure sampling."""

from privacylab.mechanisms.gaussian import (
    add_gaussian_noise,
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
    gaussian_epsilon_for,
)
from privacylab.mechanisms.gaussian_tensor import GaussianMechanism
from privacylab.mechanisms.group import group_privacy_dp, group_privacy_rdp
from privacylab.mechanisms.laplace import add_laplace_noise, laplace_scale
from privacylab.mechanisms.matrix_gaussian import (
    MatrixGaussianMechanism,
    amgm_condition,
    amgm_sigma,
)
from privacylab.mechanisms.mvg import MVGMechanism, mvg_sufficient_scale
from privacylab.mechanisms.randomized_response import (
    randomized_response,
    rr_estimate_frequencies,
    rr_keep_probability,
)
from privacylab.mechanisms.secure import secure_standard_normal

__all__ = [
    "GaussianMechanism",
    "MVGMechanism",
    "MatrixGaussianMechanism",
    "add_gaussian_noise",
    "add_laplace_noise",
    "amgm_condition",
    "amgm_sigma",
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
    "gaussian_epsilon_for",
    "group_privacy_dp",
    "group_privacy_rdp",
    "laplace_scale",
    "mvg_sufficient_scale",
    "randomized_response",
    "rr_estimate_frequencies",
    "rr_keep_probability",
    "secure_standard_normal",
]
