"""Activation clustering (Chen et al. 2019): on a tiny MLP backdoored on 8x8 digits it names
the target class and its small cluster is the poisons (precision and recall printed); on the
same MLP trained clean it flags nothing. On planted activations (a model whose read layer is
its input) the flagged rows are exactly the planted minority — an oracle independent of any
training. Retraining gets exactly the rows not flagged; bad options are one line."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from _backdoor_digits import TARGET, digits, fit, poisoned
from privacylab.data import Dataset
from privacylab.defenses.backdoor import (
    BackdoorDefenseError,
    BackdoorEvidence,
    make_backdoor_defense,
)
from privacylab.defenses.backdoor.activation_clustering import (
    ActivationClustering,
    reduce_activations,
)


@dataclass
class Scene:
    backdoored: nn.Module
    clean_model: nn.Module
    poisoned: Dataset
    clean: Dataset
    poisons: np.ndarray


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    x, y = digits()
    rows = np.random.default_rng(0).permutation(len(y))[:1300]
    x, y = x[rows], y[rows]
    in_target = int((y == TARGET).sum())
    count = round(0.15 * in_target / 0.85)  # poisons are 15% of the target label
    features, labels, poisons = poisoned(x, y, count, TARGET)
    poisoned_set = Dataset("digits-poisoned", features, labels, 10, (1, 8, 8), "image")
    clean = Dataset("digits", x, y, 10, (1, 8, 8), "image")
    backdoored = fit(_mlp, features, labels, steps=400)
    yield Scene(backdoored, fit(_mlp, x, y, steps=400), poisoned_set, clean, poisons)
    torch.set_num_threads(before)


def _precision_recall(flagged: np.ndarray, poisons: np.ndarray) -> tuple[float, float]:
    hits = np.isin(flagged, poisons).sum()
    return hits / max(1, flagged.size), hits / poisons.size


def test_flags_the_target_and_the_poisons(scene: Scene) -> None:
    detection = make_backdoor_defense("activation-clustering").inspect(
        scene.backdoored, BackdoorEvidence(10, training=scene.poisoned)
    )
    precision, recall = _precision_recall(detection.flagged_rows, scene.poisons)  # type: ignore[arg-type]
    print(f"AC: precision {precision:.3f} recall {recall:.3f}")
    assert detection.detected and detection.flagged_class == TARGET
    assert detection.details["poisoned_classes"] == [TARGET]
    assert precision >= 0.9 and recall >= 0.9
    size = detection.scores["relative_size"][TARGET]
    in_target = int((scene.poisoned.labels == TARGET).sum())
    assert size == pytest.approx(len(detection.flagged_rows) / in_target)


def test_ica_gives_the_clusters_of_whitened_pca(scene: Scene) -> None:
    """FastICA's sources are an orthogonal rotation of the whitened principal components;
    k-means and the silhouette see distances only, so the verdicts agree."""
    evidence = BackdoorEvidence(10, training=scene.poisoned)
    ica = ActivationClustering(reduce="ica").inspect(scene.backdoored, evidence)
    pca = ActivationClustering(reduce="pca").inspect(scene.backdoored, evidence)
    assert np.array_equal(ica.flagged_rows, pca.flagged_rows)  # type: ignore[arg-type]
    assert ica.scores["relative_size"] == pca.scores["relative_size"]
    assert np.allclose(ica.scores["silhouette"], pca.scores["silhouette"], atol=1e-4)


def test_a_clean_model_is_not_flagged(scene: Scene) -> None:
    detection = make_backdoor_defense("activation-clustering").inspect(
        scene.clean_model, BackdoorEvidence(10, training=scene.clean)
    )
    assert detection.detected is False and detection.flagged_class is None
    assert detection.flagged_rows is not None and detection.flagged_rows.size == 0
    assert detection.mitigation is None


def _identity_model(dims: int) -> nn.Module:
    """A model whose read layer (`feature_layer`: the module feeding the last Linear) returns
    its input, so the activations are the planted features."""
    return nn.Sequential(nn.Flatten(), nn.Linear(dims, 3))


def _planted(seed: int, share: float, target: int) -> tuple[Dataset, np.ndarray]:
    """Three Gaussian labels in 4 dimensions; `share` of label `target` moved 10 away."""
    rng = np.random.default_rng(seed)
    per_class, dims = 150, 4
    features = rng.standard_normal((3 * per_class, dims))
    labels = np.repeat(np.arange(3), per_class)
    members = np.flatnonzero(labels == target)
    planted = rng.choice(members, size=round(share * per_class), replace=False)
    direction = rng.standard_normal(dims)
    features[planted] += 10.0 * direction / np.linalg.norm(direction)
    data = Dataset(
        "planted",
        torch.tensor(features, dtype=torch.float32),
        torch.tensor(labels),
        3,
        (dims,),
        "tabular",
    )
    return data, np.sort(planted)


def _check_planted(seed: int, share: float, target: int, reduce: str) -> None:
    data, planted = _planted(seed, share, target)
    model = _identity_model(data.input_shape[0])
    detection = ActivationClustering(reduce=reduce).inspect(
        model, BackdoorEvidence(3, training=data, seed=seed)
    )
    assert detection.detected and detection.flagged_class == target
    assert np.array_equal(detection.flagged_rows, planted)  # type: ignore[arg-type]
    unplanted = data.subset(np.setdiff1d(np.arange(len(data)), planted))
    quiet = ActivationClustering(reduce=reduce).inspect(
        model, BackdoorEvidence(3, training=unplanted, seed=seed)
    )
    assert quiet.detected is False


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), share=st.floats(0.12, 0.3), target=st.integers(0, 2))
def test_planted_minority_is_found_exactly(seed: int, share: float, target: int) -> None:
    _check_planted(seed, share, target, "pca")


def test_planted_minority_is_found_by_ica() -> None:
    _check_planted(7, 0.15, 1, "ica")


def test_retrain_gets_exactly_the_rows_not_flagged(scene: Scene) -> None:
    seen: list[Dataset] = []
    sentinel = nn.Linear(1, 1)

    def retrain(data: Dataset) -> nn.Module:
        seen.append(data)
        return sentinel

    evidence = BackdoorEvidence(10, training=scene.poisoned, retrain=retrain)
    detection = make_backdoor_defense("activation-clustering", reduce="pca").inspect(
        scene.backdoored, evidence
    )
    assert detection.mitigation is not None and detection.mitigation.model is sentinel
    (data,) = seen
    keep = np.setdiff1d(np.arange(len(scene.poisoned)), detection.flagged_rows)  # type: ignore[arg-type]
    assert torch.equal(data.features, scene.poisoned.features[keep])
    assert torch.equal(data.labels, scene.poisoned.labels[keep])


def test_reduction_is_seeded_and_drops_constant_units() -> None:
    rng = np.random.default_rng(3)
    x = np.c_[rng.standard_normal((40, 15)), np.zeros((40, 4))]
    for method in ("ica", "pca"):
        one = reduce_activations(x, 10, method, seed=5)
        assert one.shape == (40, 10)
        assert np.array_equal(one, reduce_activations(x, 10, method, seed=5))
    assert reduce_activations(x[:6], 10, "pca").shape == (6, 5)


def test_small_labels_are_not_judged(scene: Scene) -> None:
    few = scene.poisoned.subset(np.flatnonzero(scene.poisoned.labels.numpy() != 9)[:800])
    rows = np.flatnonzero(scene.poisoned.labels.numpy() == 9)[:5]
    data = Dataset(
        "few",
        torch.cat([few.features, scene.poisoned.features[rows]]),
        torch.cat([few.labels, scene.poisoned.labels[rows]]),
        10,
        (1, 8, 8),
        "image",
    )
    detection = ActivationClustering(reduce="pca").inspect(
        scene.backdoored, BackdoorEvidence(10, training=data)
    )
    assert detection.scores["relative_size"][9] is None
    assert detection.scores["silhouette"][9] is None


@pytest.mark.parametrize(
    "options",
    [
        {"size_threshold": 0.7},
        {"size_threshold": 0},
        {"silhouette_threshold": 1.5},
        {"dims": 0},
        {"dims": True},
        {"reduce": "tsne"},
        {"min_rows": 2},
        {"layer": ""},
    ],
)
def test_bad_options_are_one_line(options: dict[str, object]) -> None:
    with pytest.raises(BackdoorDefenseError) as error:
        ActivationClustering(**options)  # type: ignore[arg-type]
    assert "\n" not in str(error.value) and "activation-clustering" in str(error.value)


def test_missing_training_data_is_one_line(scene: Scene) -> None:
    with pytest.raises(BackdoorDefenseError, match="needs training-data"):
        ActivationClustering().inspect(scene.backdoored, BackdoorEvidence(10, clean=scene.clean))
