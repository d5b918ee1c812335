"""Spectral signatures (Tran, Li & Madry 2018, Alg. 1): the scores re-derived from the top
eigenvector of the covariance (numpy's eigh, not the SVD the code uses) and their sum equal to
σ₁²; the Gaussian separation s₀ in closed form against Monte Carlo; on planted
representations the removed rows hold every planted row and the verdict names its label, and
a clean set is not flagged; on a tiny MLP backdoored on 8x8 digits (poisons 10% of the target
label) the removed rows hold most poisons (precision and recall printed); retraining gets the
rows kept; bad options are one line."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import nn

from _backdoor_digits import TARGET, digits, fit, poisoned
from privacylab.data import Dataset
from privacylab.defenses.backdoor import BackdoorDefenseError, BackdoorEvidence
from privacylab.defenses.backdoor.spectral import (
    SpectralSignatures,
    gaussian_separation,
    spectral_scores,
)


@settings(max_examples=40, deadline=None)
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(3, 30), st.integers(1, 6)),
        elements=st.floats(-10, 10, allow_nan=False),
    ),
    st.floats(-100, 100),
)
def test_scores_are_projections_on_the_top_covariance_direction(
    r: np.ndarray, shift: float
) -> None:
    tau = spectral_scores(r)
    centred = r - r.mean(axis=0)
    values, vectors = np.linalg.eigh(centred.T @ centred)
    assert tau.sum() == pytest.approx(values[-1], rel=1e-6, abs=1e-6)
    gap = values[-1] - (values[-2] if values.size > 1 else 0.0)
    if gap > 1e-6 * max(1.0, values[-1]):
        assert np.allclose(tau, (centred @ vectors[:, -1]) ** 2, rtol=1e-6, atol=1e-6)
    assert np.allclose(spectral_scores(r + shift), tau, rtol=1e-6, atol=1e-5)


def test_constant_representations_score_zero() -> None:
    assert np.array_equal(spectral_scores(np.ones((5, 3))), np.zeros(5))


@pytest.mark.parametrize("share", [0.03, 0.15, 0.5])
def test_gaussian_separation_matches_monte_carlo(share: float) -> None:
    draws = np.sort(np.random.default_rng(0).standard_normal(400_000) ** 2)[::-1]
    top = round(share * draws.size)
    simulated = draws[:top].mean() / draws[top:].mean()
    assert gaussian_separation(share) == pytest.approx(simulated, rel=0.02)


def _identity_model(dims: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(dims, 3))


def _planted(seed: int, share: float, target: int) -> tuple[Dataset, np.ndarray]:
    rng = np.random.default_rng(seed)
    per_class, dims = 200, 8
    features = rng.standard_normal((3 * per_class, dims))
    labels = np.repeat(np.arange(3), per_class)
    planted = rng.choice(
        np.flatnonzero(labels == target), size=round(share * per_class), replace=False
    )
    direction = rng.standard_normal(dims)
    features[planted] += 12.0 * direction / np.linalg.norm(direction)
    data = Dataset(
        "planted",
        torch.tensor(features, dtype=torch.float32),
        torch.tensor(labels),
        3,
        (dims,),
        "tabular",
    )
    return data, np.sort(planted)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), share=st.floats(0.03, 0.1), target=st.integers(0, 2))
def test_planted_signature_is_removed_and_named(seed: int, share: float, target: int) -> None:
    data, planted = _planted(seed, share, target)
    model = _identity_model(8)
    detection = SpectralSignatures(epsilon=0.1).inspect(model, BackdoorEvidence(3, training=data))
    assert np.isin(planted, detection.flagged_rows).all()  # type: ignore[arg-type]
    assert detection.details["removed_per_class"] == [30, 30, 30]
    assert detection.detected and detection.flagged_class == target
    quiet = data.subset(np.setdiff1d(np.arange(len(data)), planted))
    verdict = SpectralSignatures(epsilon=0.1).inspect(model, BackdoorEvidence(3, training=quiet))
    assert verdict.detected is False and verdict.flagged_class is None
    assert max(verdict.scores["ratio"]) < 1.5


@dataclass
class Scene:
    model: nn.Module
    data: Dataset
    poisons: np.ndarray


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    x, y = digits()
    rows = np.random.default_rng(0).permutation(len(y))[:1300]
    x, y = x[rows], y[rows]
    count = round(0.10 * int((y == TARGET).sum()) / 0.90)  # 10% of the target label
    features, labels, poisons = poisoned(x, y, count, TARGET)
    model = fit(
        lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)),
        features,
        labels,
        steps=400,
    )
    data = Dataset("digits-poisoned", features, labels, 10, (1, 8, 8), "image")
    yield Scene(model, data, poisons)
    torch.set_num_threads(before)


def test_removes_most_poisons_from_a_backdoored_mlp(scene: Scene) -> None:
    detection = SpectralSignatures(epsilon=0.1).inspect(
        scene.model, BackdoorEvidence(10, training=scene.data)
    )
    flagged = detection.flagged_rows
    assert flagged is not None
    hits = np.isin(flagged, scene.poisons).sum()
    target_rows = int((scene.data.labels == TARGET).sum())
    removed_target = detection.details["removed_per_class"][TARGET]
    print(
        f"spectral: recall {hits / scene.poisons.size:.3f}, precision in the target label "
        f"{hits / removed_target:.3f}, ratio {detection.scores['ratio'][TARGET]:.2f}"
    )
    assert removed_target == round(0.15 * target_rows)
    assert hits / scene.poisons.size >= 0.7
    ratios = detection.scores["ratio"]
    assert int(np.argmax(ratios)) == TARGET


def test_retrain_gets_the_rows_kept(scene: Scene) -> None:
    seen: list[Dataset] = []
    sentinel = nn.Linear(1, 1)

    def retrain(data: Dataset) -> nn.Module:
        seen.append(data)
        return sentinel

    detection = SpectralSignatures().inspect(
        scene.model, BackdoorEvidence(10, training=scene.data, retrain=retrain)
    )
    assert detection.mitigation is not None and detection.mitigation.model is sentinel
    keep = np.setdiff1d(np.arange(len(scene.data)), detection.flagged_rows)  # type: ignore[arg-type]
    assert torch.equal(seen[0].labels, scene.data.labels[keep])
    assert torch.equal(seen[0].features, scene.data.features[keep])
    no_retrain = SpectralSignatures().inspect(
        scene.model, BackdoorEvidence(10, training=scene.data)
    )
    assert no_retrain.mitigation is None


@pytest.mark.parametrize(
    "options",
    [{"epsilon": 0}, {"epsilon": 0.6}, {"epsilon": "x"}, {"factor": -1}, {"layer": 3}],
)
def test_bad_options_are_one_line(options: dict[str, object]) -> None:
    with pytest.raises(BackdoorDefenseError) as error:
        SpectralSignatures(**options)  # type: ignore[arg-type]
    assert "\n" not in str(error.value) and "spectral" in str(error.value)


def test_missing_training_data_is_one_line(scene: Scene) -> None:
    with pytest.raises(BackdoorDefenseError, match="needs training-data"):
        SpectralSignatures().inspect(scene.model, BackdoorEvidence(10))
