"""Privacy accounting: events (what happened) and accountants (who bounds it).

numpy/scipy only; imports nothing else of privacylab.
"""

from privacylab.accounting._validate import PrivacyParameterError
from privacylab.accounting.base import Accountant, Guarantee
from privacylab.accounting.calibration import (
    calibrate_noise_multiplier,
    make_accountant,
    max_steps,
    step_budget,
    steps_from_epochs,
)
from privacylab.accounting.composition import (
    AdvancedCompositionAccountant,
    NaiveCompositionAccountant,
)
from privacylab.accounting.events import (
    Composed,
    Event,
    Gaussian,
    Laplace,
    MatrixGaussian,
    PoissonSampled,
    RandomizedResponse,
    SelfComposed,
    dp_sgd,
)
from privacylab.accounting.gdp import GdpAccountant
from privacylab.accounting.pld import PldAccountant, PrivacyLossDistribution
from privacylab.accounting.rdp import RdpAccountant
from privacylab.accounting.shuffling import ShuffleGuarantee, shuffled_epsilon

__all__ = [
    "Accountant",
    "AdvancedCompositionAccountant",
    "Composed",
    "Event",
    "Gaussian",
    "GdpAccountant",
    "Guarantee",
    "Laplace",
    "MatrixGaussian",
    "NaiveCompositionAccountant",
    "PldAccountant",
    "PoissonSampled",
    "PrivacyLossDistribution",
    "PrivacyParameterError",
    "RandomizedResponse",
    "RdpAccountant",
    "SelfComposed",
    "ShuffleGuarantee",
    "calibrate_noise_multiplier",
    "dp_sgd",
    "make_accountant",
    "max_steps",
    "shuffled_epsilon",
    "step_budget",
    "steps_from_epochs",
]
