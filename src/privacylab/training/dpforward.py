"""DP-Forward: sequence-level local DP by noise in the forward pass, and its accounting.

Du et al. 2023 ("DP-Forward: Fine-tuning and Inference on Language Models with Differential
Privacy in Forward Pass", CCS'23). The user runs the pre-noise part f(·) of the pipeline on a
sequence X and releases f(X) + Z; the provider runs p(·) on it (Sec. 3.2). `ForwardNoise` is
the release layer plugged into `privacylab.models.encoder.EncoderClassifier(release=...)`:

1. normalisation (Sec. 3.2, Eq. (3), the paper's choice over clipping): every sequence's matrix
   f(X) (n × d) is scaled to Frobenius norm exactly C, f(X) · C / ‖f(X)‖_F;
2. the analytic matrix Gaussian mechanism (aMGM, Sec. 4, Theorem 2) adds Z with
   σ_min(B)·σ_min(C) calibrated for L2 sensitivity S₂ = 2C. Under SeqLDP (Definition 3:
   replace-one neighbouring sequences X, X') two normalised matrices differ by at most
   ‖f(X)‖_F + ‖f(X')‖_F = 2C. The authors' released code passes a sensitivity of 1 whatever C
   is, which understates the noise (hence overstates the privacy) by 2C; here S₂ = 2C always.

The noise is added in training and in evaluation mode alike: inference queries are protected
too (Sec. 3.5), and the deployed pipeline's accuracy is that of noisy inference.

Accounting (Sec. 3.3, "Privacy Accounting"): every training sequence is released once per epoch
(batches are drawn without replacement), so k epochs are k adaptive releases of the same X; σ is
calibrated so that the k-fold composition is (ε, δ)-SeqLDP (`forward_mechanism`), and the PLD
accountant (Koskela et al. 2020; the paper's numerical accountant) certifies the ε reported.
With f(·) frozen (`privacylab.dpforward.DPForwardConfig.frozen`) each sequence is released once
and every epoch re-uses that release (post-processing): k = 1. One inference release is a
single aMGM release with its own ε (smaller unless k = 1). Labels, when private, are perturbed
once before training by k-ary randomized response (Sec. 3.4, Warner 1965), composed with the
sequence releases for an LDP guarantee on the pair (X, y). Shuffling (Sec. 3.4) can
amplify one round of local reports to central DP (Feldman, McMillan & Talwar 2021); it is
reported where its condition holds, with its assumption. The trainer's per-epoch evaluation of
the training set (loss and accuracy for the experimenter) is measurement, not a release to the
provider, and is not accounted.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from privacylab.accounting import (
    Composed,
    PldAccountant,
    PrivacyParameterError,
    RandomizedResponse,
    SelfComposed,
)
from privacylab.accounting.events import Event
from privacylab.mechanisms.matrix_gaussian import MatrixGaussianMechanism
from privacylab.mechanisms.randomized_response import randomized_response
from privacylab.training.config import TrainingError

__all__ = [
    "ACCOUNTANT",
    "ForwardNoise",
    "ForwardPrivacy",
    "forward_mechanism",
    "forward_privacy",
    "private_labels",
    "release_accuracy_bound",
]

ACCOUNTANT = "pld"
"""The accountant that certifies every DP-Forward ε (Du et al. 2023, Sec. 3.3)."""

SHUFFLE_ASSUMPTION = (
    "a trusted shuffler permutes the n users' reports; each user sends one report per round "
    "(one epoch, or the one release of a frozen f); rounds are composed by basic composition"
)


def _positive(name: str, value: object) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TrainingError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number) or number <= 0.0:
        raise TrainingError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def forward_mechanism(
    epsilon: float,
    delta: float,
    clip: float,
    rows: int,
    columns: int,
    *,
    releases: int = 1,
    generator: torch.Generator | None = None,
) -> MatrixGaussianMechanism:
    """The aMGM (i.i.d., the optimal choice of Du et al. 2023, Sec. 4.2) whose `releases`-fold
    composition on one sequence is (ε, δ)-SeqLDP for `rows` × `columns` matrices normalised to
    Frobenius norm `clip` = C: sensitivity S₂ = 2C (replace-one, Sec. 3.2)."""
    clip = _positive("clip C", clip)
    epsilon = _positive("epsilon", epsilon)
    return MatrixGaussianMechanism.calibrated(
        epsilon, delta, 2.0 * clip, rows, columns, releases=releases, generator=generator
    )


def _call_seed(seed: int, call: int) -> int:
    return int(np.random.SeedSequence([seed, call]).generate_state(1, dtype=np.uint64)[0] >> 1)


class ForwardNoise(nn.Module):
    """The DP-Forward release layer: normalise each sequence's matrix to Frobenius norm C, then
    add aMGM noise (Du et al. 2023, Sec. 3.2), in training and evaluation mode.

    `mechanism` None: normalisation only (no privacy; the noiseless reference). The noise of
    the i-th call is drawn from a generator seeded by (`seed`, i), and i is the buffer
    `calls`, saved with the model's weights (and the trainer's checkpoints): a resumed or
    reloaded model continues the same noise stream.

    `reduce` = d′ (with `dim` = d): the optional dimension reduction of Sec. 3.2 against the
    curse of dimensionality: a trainable linear map M1 (d → d′, user side, before the
    normalisation) and M2 (d′ → d, provider side, after the noise), both seeded. The released
    matrix is r × d′ (the mechanism's columns); its sensitivity stays 2C, and M2 is
    post-processing.
    """

    def __init__(
        self,
        clip: float,
        mechanism: MatrixGaussianMechanism | None,
        *,
        seed: int = 0,
        reduce: int | None = None,
        dim: int | None = None,
    ) -> None:
        super().__init__()
        self.clip = _positive("clip C", clip)
        self.down: nn.Linear | None = None
        self.up: nn.Linear | None = None
        if reduce is not None:
            for name, value in (("reduce", reduce), ("dim", dim)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise TrainingError(f"{name} must be a whole number >= 1, got {value!r}")
            assert dim is not None
            if mechanism is not None and mechanism.columns != reduce:
                raise TrainingError(
                    f"the mechanism releases {mechanism.columns} columns, not reduce = {reduce}"
                )
            self.down = _seeded_linear(dim, reduce, seed, 1, bias=False)
            self.up = _seeded_linear(reduce, dim, seed, 2, bias=True)
        if mechanism is not None and not isinstance(mechanism, MatrixGaussianMechanism):
            raise TrainingError(
                f"mechanism must be a MatrixGaussianMechanism, got {type(mechanism).__name__}"
            )
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise TrainingError(f"seed must be a whole number >= 0, got {seed!r}")
        if mechanism is not None and not math.isclose(
            mechanism.sensitivity, 2.0 * self.clip, rel_tol=1e-12
        ):
            raise TrainingError(
                f"the mechanism's sensitivity {mechanism.sensitivity:g} is not 2C = "
                f"{2.0 * self.clip:g} (replace-one SeqLDP of matrices normalised to C)"
            )
        self.mechanism = mechanism
        self.seed = seed
        self.generator = torch.Generator()
        if mechanism is not None:
            mechanism.generator = self.generator
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def extra_repr(self) -> str:
        sigma = "none" if self.mechanism is None else f"{self.mechanism.scale:.4g}"
        return f"clip={self.clip:g}, sigma={sigma}, seed={self.seed}"

    def normalise(self, matrix: Tensor) -> Tensor:
        """C · M / ‖M‖_F for each matrix M of `matrix` (batch, r, d) (Du et al. 2023, Eq. (3))."""
        if not isinstance(matrix, Tensor) or matrix.ndim != 3:
            raise TrainingError("ForwardNoise takes matrices of shape (batch, rows, columns)")
        norms = torch.linalg.vector_norm(matrix.flatten(1), dim=1)
        scale = self.clip / norms.clamp_min(torch.finfo(matrix.dtype).tiny)
        return matrix * scale[:, None, None]

    def user_side(self, matrix: Tensor) -> Tensor:
        """What the user sends (Du et al. 2023, Sec. 3.2): M1 when reducing, the normalisation
        and fresh aMGM noise, one release per sequence."""
        if self.down is not None:
            matrix = self.down(matrix)
        released = self.normalise(matrix)
        if self.mechanism is not None:
            call = int(self.calls)
            self.generator.manual_seed(_call_seed(self.seed, call))
            self.calls.fill_(call + 1)
            released = self.mechanism.release(released)
        return released

    def start_session(self, session: int) -> None:
        """Draw this layer's noise from a stream of its own for `session` from now on (the
        call counter restarts in it). Reloading a model restores its saved counter, so two
        sessions over the same folder would otherwise draw the same noise at the same call
        index, and the difference of two of their releases would be f(X) − f(X') without
        noise; a job that queries a loaded model starts a session derived from its own seed
        (reproducible, distinct per job)."""
        if isinstance(session, bool) or not isinstance(session, int) or session < 0:
            raise TrainingError(f"session must be a whole number >= 0, got {session!r}")
        self.seed = _call_seed(self.seed, 2**40 + session) % 2**31
        self.calls.fill_(0)

    def provider_side(self, released: Tensor) -> Tensor:
        """M2 on a release when reducing (post-processing by the provider), else the release."""
        return released if self.up is None else self.up(released)

    def forward(self, matrix: Tensor) -> Tensor:
        """`provider_side(user_side(matrix))`: one release per sequence."""
        return self.provider_side(self.user_side(matrix))


def _seeded_linear(inputs: int, outputs: int, seed: int, stream: int, *, bias: bool) -> nn.Linear:
    """nn.Linear with PyTorch's default uniform(±1/√inputs) initialisation, from (seed, stream)."""
    layer = nn.Linear(inputs, outputs, bias=bias)
    generator = torch.Generator().manual_seed(_call_seed(seed, -stream % 2**31))
    bound = 1.0 / math.sqrt(inputs)
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        if layer.bias is not None:
            layer.bias.uniform_(-bound, bound, generator=generator)
    return layer


def release_accuracy_bound(mechanism: MatrixGaussianMechanism, clip: float) -> float:
    """The best accuracy any classifier can reach telling two sequences apart from ONE release
    of `mechanism` on matrices normalised to `clip` = C: Φ(C / σ_min).

    Two released means differ by ‖f(X) − f(X')‖_F ≤ 2C; against Gaussian noise whose least
    variance is σ_min², the Neyman-Pearson (likelihood-ratio) test between the two shifts errs
    with probability Φ(−‖Δ‖ / (2σ_min)) (Du et al. 2023's aMGM, Theorem 2; the same Gaussian
    hypothesis test as Dong, Roth & Su 2022, Sec. 2.3). It caps DP-Forward's binary accuracy
    under noisy inference, whatever the training: with i.i.d. noise σ_min = scale."""
    from scipy.stats import norm

    clip = _positive("clip C", clip)
    return float(norm.cdf(clip / mechanism.scale))


def private_labels(
    labels: np.ndarray, epsilon: float, classes: int, seed: int
) -> tuple[np.ndarray, RandomizedResponse]:
    """`labels` perturbed once by k-ary randomized response at `epsilon` (Du et al. 2023,
    Sec. 3.4; Warner 1965, Kairouz et al. 2016), and the event of that one release."""
    epsilon = _positive("label epsilon", epsilon)
    event = RandomizedResponse(epsilon=epsilon, k=classes)
    noisy = randomized_response(labels, epsilon, classes, np.random.default_rng([seed, 7]))
    return noisy, event


def _pld_epsilon(event: Event, delta: float) -> float:
    return float(PldAccountant().compose(event).epsilon(delta))


@dataclass
class ForwardPrivacy:
    """The SeqLDP guarantee of one DP-Forward run (Du et al. 2023, Definition 3 and Sec. 3.3).

    `epsilon`: the sequence X over all `releases` of training (one per epoch, or one when f(·)
    is frozen and p(·) re-uses it), PLD-certified at `delta`;
    `inference_epsilon`: one release (one inference query); `label_epsilon`/`label_event`: the
    randomized response of the label (None: labels are sent in the clear); `total_epsilon`: the
    pair (X, y), PLD of the composition (None when the labels are not private); `shuffled`:
    the amplification by shuffling of one round (`shuffle_guarantee`), None where it does not
    apply.
    """

    sensitivity: float
    clip: float
    epsilon: float
    delta: float
    event: dict[str, Any]
    releases: int
    inference_epsilon: float
    label_epsilon: float | None = None
    label_event: dict[str, Any] | None = None
    total_epsilon: float | None = None
    shuffled: dict[str, Any] | None = None
    notion: str = "SeqLDP"
    adjacency: str = "replace-one sequence"
    accountant: str = ACCOUNTANT

    def to_dict(self) -> dict[str, Any]:
        """JSON form with the keys of the shared schema."""
        return {
            "notion": self.notion,
            "adjacency": self.adjacency,
            "sensitivity": self.sensitivity,
            "clip": self.clip,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": self.accountant,
            "event": self.event,
            "releases": self.releases,
            "inference_epsilon": self.inference_epsilon,
            "label_epsilon": self.label_epsilon,
            "label_event": self.label_event,
            "total_epsilon": self.total_epsilon,
            "shuffled": self.shuffled,
        }


def shuffle_guarantee(
    mechanism: MatrixGaussianMechanism, users: int, delta: float, rounds: int
) -> dict[str, Any] | None:
    """Amplification by shuffling (Feldman, McMillan & Talwar 2021) of DP-Forward's reports:
    each of the `users` sends one aMGM release per round, an (ε₀, δ₀)-LDP report with
    δ₀ = δ / (4 n) and ε₀ its PLD ε at δ₀; the shuffled round's (ε, δ) comes from
    `privacylab.accounting.shuffling.shuffled_epsilon`, and the `rounds` (releases) are composed
    by basic composition (kε, kδ). None where the theorem does not apply (ε₀ too large for n)."""
    from privacylab.accounting.shuffling import shuffled_epsilon

    delta0 = delta / (4.0 * users)
    epsilon0 = _pld_epsilon(mechanism.event, delta0)
    try:
        guarantee = shuffled_epsilon(epsilon0, users, delta, delta0=delta0)
    except PrivacyParameterError:
        return None
    if guarantee is None:
        return None
    data = asdict(guarantee) if is_dataclass(guarantee) else dict(guarantee.to_dict())
    return {
        **data,
        "rounds": rounds,
        "composed_epsilon": rounds * float(data["epsilon"]),
        "composed_delta": rounds * float(data["delta"]),
        "composition": "basic (k·ε, k·δ) over rounds",
        "round_assumption": SHUFFLE_ASSUMPTION,
    }


def forward_privacy(
    mechanism: MatrixGaussianMechanism,
    *,
    clip: float,
    delta: float,
    releases: int,
    label_event: RandomizedResponse | None = None,
    users: int | None = None,
) -> ForwardPrivacy:
    """The `ForwardPrivacy` of `releases` releases of `mechanism` per sequence, PLD-accounted
    at `delta`, with the label's randomized response `label_event` composed in, and the
    shuffled guarantee for `users` reports per round when `users` is given."""
    sequence = SelfComposed(mechanism.event, releases)
    epsilon = _pld_epsilon(sequence, delta)
    total = None
    if label_event is not None:
        total = _pld_epsilon(Composed([sequence, label_event]), delta)
    shuffled = None
    if users is not None:
        shuffled = shuffle_guarantee(mechanism, users, delta, releases)
    return ForwardPrivacy(
        sensitivity=mechanism.sensitivity,
        clip=float(clip),
        epsilon=epsilon,
        delta=float(delta),
        event=sequence.to_dict(),
        releases=releases,
        inference_epsilon=_pld_epsilon(mechanism.event, delta),
        label_epsilon=None if label_event is None else label_event.eps,
        label_event=None if label_event is None else label_event.to_dict(),
        total_epsilon=total,
        shuffled=shuffled,
    )
