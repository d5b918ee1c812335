"""DP-SGD inside each federated client (Abadi et al. 2016, Deep Learning with Differential
Privacy, Alg. 1; the "local" or example-level DP of federated clients): every local step clips
each example's gradient to L2 norm C, sums, adds N(0, (σ C)^2) per coordinate and divides by the
local batch size (`privacylab.federated.local_update(..., privacy=LocalPrivacy(C, σ))`). The
update then leaves the client as it is (`apply` is the identity): whatever the server (or an
attacker holding the update) computes from it is post-processing.

Accounting. σ is calibrated so that each client's data is (ε, δ)-DP over *all* its
participations (add/remove-one-example adjacency). A client passes over its rows in fixed,
disjoint local batches (no Poisson sampling), so in each local epoch every example enters
exactly one noisy sum, once, with sensitivity C: one Gaussian mechanism of noise multiplier σ
per epoch, composed adaptively over `training.epochs * rounds` epochs. This is exact when the
client's rows form one local batch (FedSGD; FedAvg with `batch_size=None`); with several local
batches cut by row position it takes the other rows' batches as fixed, the usual convention
for DP-SGD over fixed batches (adding a row shifts the later rows' batches). The event is
`dp_sgd(σ, sample_rate=1.0, steps=epochs * rounds)`. There is NO amplification by sampling
(neither by local batches nor by the server picking a subset of clients per round: a client is
charged for every round, whether it took part or not), so this is an upper bound. The
client's row count (the divisor of each noisy sum; the server is told it anyway, FedAvg weights
by it) is taken as public, as the lot size is in Abadi et al. σ comes from
`calibrate_noise_multiplier(ε, δ, 1.0, steps, accountant)` (PLD by default, Koskela et al.
2020 / Google's dp_accounting: tight for composed Gaussians), the smallest σ whose ε does not
exceed the target. Where PLD's grid would be too large (ε of 10^3 and beyond), σ comes from the
exact analytic Gaussian mechanism instead (Balle & Wang 2018, Theorem 8): without sampling, k
Gaussian mechanisms of multiplier σ compose to exactly one of L2 sensitivity √k, so
σ = analytic_gaussian_sigma(ε, δ, √k) is exact; the accountant used is reported.
"""

from __future__ import annotations

from typing import Any, ClassVar

from privacylab.accounting import calibrate_noise_multiplier
from privacylab.accounting.calibration import dp_sgd_epsilon
from privacylab.defenses.base import DefenseError, Parameter
from privacylab.defenses.update.base import UpdateDefense, register_update_defense
from privacylab.errors import PrivacylabError
from privacylab.federated.protocol import LocalPrivacy, LocalTraining
from privacylab.mechanisms.gaussian import analytic_gaussian_sigma, gaussian_epsilon_for

__all__ = ["LocalDPSGD"]


@register_update_defense
class LocalDPSGD(UpdateDefense):
    """Each client trains with DP-SGD at (ε, δ) over all rounds (Abadi et al. 2016, Alg. 1):
    per-example clipping to `clip`, σ calibrated for `training.epochs * rounds` full passes
    without sampling amplification."""

    name = "dp"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter(
            "epsilon",
            float,
            None,
            "ε of each client's data over all its participations",
            low=0.0,
            low_open=True,
        ),
        Parameter("clip", float, 1.0, "per-example L2 clipping norm C", low=0.0, low_open=True),
        Parameter(
            "delta",
            float,
            1e-5,
            "δ of the (ε, δ) guarantee",
            low=0.0,
            high=1.0,
            low_open=True,
            high_open=True,
        ),
        Parameter("accountant", str, "pld", "accountant that calibrates σ", choices=("pld", "rdp")),
    )
    paper = "Abadi et al. 2016, Deep Learning with Differential Privacy, Alg. 1"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.calibrated: dict[str, Any] | None = None

    @staticmethod
    def steps(training: LocalTraining, rounds: int) -> int:
        """Gaussian mechanisms each example goes through: one per local epoch per round."""
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise DefenseError(f"dp: rounds must be a whole number >= 1, got {rounds!r}")
        return int(training.epochs) * rounds

    def noise_multiplier(self, training: LocalTraining, rounds: int) -> float:
        """The smallest σ (by the accountant) at which `rounds` participations of local
        training `training` are (ε, δ)-DP."""
        steps = self.steps(training, rounds)
        epsilon, delta = self.params["epsilon"], self.params["delta"]
        try:
            return calibrate_noise_multiplier(epsilon, delta, 1.0, steps, self.params["accountant"])
        except PrivacylabError as error:
            if self.params["accountant"] != "pld":
                raise DefenseError(f"{self.spec}: {error}") from None
        return analytic_gaussian_sigma(epsilon, delta, sensitivity=steps**0.5)

    def epsilon_spent(self, noise_multiplier: float, steps: int) -> float:
        """ε of `steps` unsampled Gaussian mechanisms of multiplier σ at this δ (the
        accountant's `compose(dp_sgd(σ, 1.0, steps)).epsilon(δ)`, memoised: every client
        asks in every round)."""
        delta = self.params["delta"]
        try:
            return float(
                dp_sgd_epsilon(noise_multiplier, 1.0, steps, delta, self.params["accountant"])
            )
        except PrivacylabError:
            return gaussian_epsilon_for(noise_multiplier, delta, sensitivity=steps**0.5)

    def local_privacy(self, *, training: LocalTraining, examples: int, rounds: int) -> LocalPrivacy:
        """`LocalPrivacy(clip, σ)` for a client with `examples` rows taking part in up to
        `rounds` rounds of `training`; the calibration is kept in `calibrated`."""
        if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
            raise DefenseError(f"dp: a client needs >= 1 example, got {examples!r}")
        steps = self.steps(training, rounds)
        sigma = self.noise_multiplier(training, rounds)
        self.calibrated = {
            "noise_multiplier": sigma,
            "steps": steps,
            "rounds": rounds,
            "epsilon_spent": self.epsilon_spent(sigma, steps),
        }
        return LocalPrivacy(clip=float(self.params["clip"]), noise_multiplier=sigma)

    def to_dict(self) -> dict[str, Any]:
        """The base form plus ε, δ, the clipping norm, the accountant and, once
        `local_privacy` has calibrated it, σ, the number of composed steps and the ε the
        accountant reports for them (never above ε)."""
        out = super().to_dict()
        calibrated = self.calibrated or {}
        out.update(
            epsilon=float(self.params["epsilon"]),
            delta=float(self.params["delta"]),
            clip=float(self.params["clip"]),
            accountant=self.params["accountant"],
            sigma=calibrated.get("noise_multiplier"),
            steps=calibrated.get("steps"),
            epsilon_spent=calibrated.get("epsilon_spent"),
            sampling="none (fixed local batches; no amplification)",
        )
        return out
