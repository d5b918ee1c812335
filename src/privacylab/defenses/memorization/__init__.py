"""Checks and defences against memorization attacks (Song, Ristenpart & Shmatikov, CCS 2017;
seed 004, Exercise 4 and the capacity-abuse mitigation): tests on released weights
(`WEIGHT_CHECKS`: lsb-entropy, correlation, sign-pattern), sanitisers of the weights
(`requantize`, `add_weight_noise`, `sanitize_cost`) and an anomaly detector over queries and
training inputs (`QueryAnomalyDetector`)."""

from privacylab.defenses.memorization.base import (
    WEIGHT_CHECKS,
    CheckResult,
    MemorizationDefenseError,
    WeightCheck,
    make_weight_check,
    register_weight_check,
    run_weight_checks,
    weight_check_names,
)
from privacylab.defenses.memorization.correlation import CorrelationCheck
from privacylab.defenses.memorization.lsb_entropy import LSBEntropyCheck
from privacylab.defenses.memorization.queries import QueryAnomalyDetector, QueryWatch
from privacylab.defenses.memorization.sanitize import add_weight_noise, requantize, sanitize_cost
from privacylab.defenses.memorization.sign_pattern import SignPatternCheck

__all__ = [
    "WEIGHT_CHECKS",
    "CheckResult",
    "CorrelationCheck",
    "LSBEntropyCheck",
    "MemorizationDefenseError",
    "QueryAnomalyDetector",
    "QueryWatch",
    "SignPatternCheck",
    "WeightCheck",
    "add_weight_noise",
    "make_weight_check",
    "register_weight_check",
    "requantize",
    "run_weight_checks",
    "sanitize_cost",
    "weight_check_names",
]
