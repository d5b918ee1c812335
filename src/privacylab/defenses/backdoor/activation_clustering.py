"""Activation clustering (Chen et al. 2019, "Detecting Backdoor Attacks on Deep Neural
Networks by Activation Clustering", SafeAI@AAAI, Sec. 3-4).

A model trained on poisoned data classifies a poisoned row of (received) label t for a
reason of its own — the trigger — so in the last hidden layer the rows labelled t fall in
two groups: the genuine members of t and the poisons. Per label, the whole activation of the
chosen layer (`layer_activations`: every unit, every channel) is reduced to 10 dimensions
(independent component analysis in the paper; FastICA or PCA here, seeded) and split by
k-means into two clusters. Sec. 4 judges a split by the clusters' relative size (a poisoned
class has a small cluster: the poisons are a minority of the label) and by the silhouette
score (how well the two clusters separate); a clean class splits into two halves of similar
size that overlap. A label is flagged when its smaller cluster's share is below
`size_threshold` and its silhouette score above `silhouette_threshold`; the flagged rows are
the small clusters of the flagged labels, and the flagged class the flagged label whose split
is the most separated (the backdoor's target in an all-to-one attack). With `retrain`, the
mitigation is the paper's: train again without the flagged rows.

Reduction: FastICA's components are an orthogonal rotation of the whitened principal
components, and k-means and the silhouette score see only Euclidean distances, so "ica" (the
paper's) and whitened "pca" give the same clusters (checked in the tests); "pca" is the
default because it is an order of magnitude cheaper.

Thresholds: 0.35 for the relative size follows the paper (poisons at most a third of a
label); the paper gives no single silhouette cut, so 0.2 is privacylab's, for components of
unit variance (FastICA whitens; PCA is whitened here too so one cut serves both). Measured on
a small digits MLP: clean labels 0.07-0.14, the poisoned label (15% poisons) 0.33.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA, FastICA
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import silhouette_score
from torch import nn

from privacylab.data import Dataset
from privacylab.defenses.backdoor.base import (
    BackdoorDefense,
    BackdoorDefenseError,
    BackdoorEvidence,
    Detection,
    Mitigation,
    check_layer,
    check_number,
    check_whole,
    layer_activations,
    register_backdoor_defense,
)

__all__ = [
    "ActivationClustering",
    "cleansed_mitigation",
    "reduce_activations",
    "training_activations",
]

REDUCTIONS = ("ica", "pca")


def reduce_activations(
    activations: np.ndarray, dims: int, method: str = "ica", seed: int = 0
) -> np.ndarray:
    """`activations` (n, d) projected to at most `dims` dimensions (fewer when n or the
    number of non-constant units is smaller): FastICA (Chen et al. 2019, Sec. 3) or PCA,
    seeded. Constant units carry nothing and are dropped first."""
    x = np.asarray(activations, dtype=np.float64)
    varying = x.std(axis=0) > 1e-12
    x = x[:, varying]
    k = min(dims, x.shape[1], x.shape[0] - 1)
    if k < 1:
        return np.zeros((x.shape[0], 1))
    if method == "pca":
        return PCA(n_components=k, whiten=True, random_state=seed).fit_transform(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ica = FastICA(n_components=k, random_state=seed, whiten="unit-variance", max_iter=400)
        return ica.fit_transform(x)


def training_activations(
    defense: BackdoorDefense, model: nn.Module, evidence: BackdoorEvidence, layer: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """The data-inspecting defences' input (Chen et al. 2019 Sec. 3; Tran et al. 2018 Alg. 1):
    the chosen layer's activations of every received training row and the rows' labels, after
    checking the evidence holds what `defense` needs."""
    evidence.require(defense.name, defense.needs)
    training = evidence.training
    assert training is not None
    activations = layer_activations(model, training.features, layer).numpy()
    return activations, training.labels.numpy()


def cleansed_mitigation(
    evidence: BackdoorEvidence, flagged: np.ndarray, method: str
) -> Mitigation | None:
    """The data-cleansing defences' repair (Chen et al. 2019 Sec. 4; Tran et al. 2018,
    Alg. 1 last step): the victim's recipe (`evidence.retrain`) run on the training set
    without the `flagged` rows; None when no retraining is possible or nothing is left."""
    if evidence.retrain is None or evidence.training is None:
        return None
    keep = np.setdiff1d(np.arange(len(evidence.training)), flagged)
    if keep.size == 0:
        return None
    cleansed: Dataset = evidence.training.subset(keep)
    model = evidence.retrain(cleansed)
    return Mitigation(
        model=model,
        description=f"{method}: retrained without {flagged.size} flagged training rows",
    )


@register_backdoor_defense
class ActivationClustering(BackdoorDefense):
    """Activation clustering (Chen et al. 2019, Sec. 3-4): per received label, the chosen
    layer's activations reduced to `dims` dimensions (`reduce`: whitened "pca", or "ica" as in
    the paper: the same clusters), split by seeded k-means (k = 2); a label is poisoned when
    its smaller cluster holds less than `size_threshold` of the label's rows and the split's
    silhouette score exceeds `silhouette_threshold` (None: size alone). Labels with fewer
    than `min_rows` rows are not judged. Needs the training data; mitigates (retraining
    without the flagged rows) when the evidence can retrain."""

    name = "activation-clustering"
    paper = (
        "Chen et al. 2019, Detecting Backdoor Attacks on Deep Neural Networks by "
        "Activation Clustering (SafeAI@AAAI), Sec. 3-4"
    )
    needs = ("training-data",)

    def __init__(
        self,
        layer: str | None = None,
        dims: int = 10,
        reduce: str = "pca",
        size_threshold: float = 0.35,
        silhouette_threshold: float | None = 0.2,
        min_rows: int = 10,
    ) -> None:
        self.layer = check_layer(self.name, layer)
        self.dims = check_whole(self.name, "dims", dims)
        if reduce not in REDUCTIONS:
            raise BackdoorDefenseError(
                f"{self.name}: reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}"
            )
        self.reduce = reduce
        self.size_threshold = check_number(
            self.name, "size_threshold", size_threshold, low=0.0, high=0.5
        )
        self.silhouette_threshold = (
            None
            if silhouette_threshold is None
            else check_number(
                self.name,
                "silhouette_threshold",
                silhouette_threshold,
                low=-1.0,
                high=1.0,
                low_open=False,
                high_open=True,
            )
        )
        self.min_rows = check_whole(self.name, "min_rows", min_rows, low=4)

    def split(self, activations: np.ndarray, seed: int) -> tuple[np.ndarray, float, float]:
        """One label's split: (mask of the smaller cluster, its relative size, silhouette)."""
        reduced = reduce_activations(activations, self.dims, self.reduce, seed)
        kmeans = KMeans(n_clusters=2, n_init=10, random_state=seed).fit(reduced)
        assign = kmeans.labels_
        counts = np.bincount(assign, minlength=2)
        if counts.min() == 0:
            return np.zeros(len(assign), dtype=bool), 0.0, 0.0
        small = int(np.argmin(counts))
        silhouette = float(
            silhouette_score(reduced, assign, sample_size=min(len(assign), 2000), random_state=seed)
        )
        return assign == small, float(counts[small] / counts.sum()), silhouette

    def inspect(self, model: nn.Module, evidence: BackdoorEvidence) -> Detection:
        """Cluster each label's activations; flag the labels with a small, separated cluster."""
        start = time.perf_counter()
        activations, labels = training_activations(self, model, evidence, self.layer)
        sizes: list[float | None] = []
        silhouettes: list[float | None] = []
        poisoned: list[int] = []
        flagged: list[np.ndarray] = []
        for label in range(evidence.num_classes):
            rows = np.flatnonzero(labels == label)
            if rows.size < self.min_rows:
                sizes.append(None)
                silhouettes.append(None)
                continue
            small, size, silhouette = self.split(activations[rows], evidence.seed + label)
            sizes.append(size)
            silhouettes.append(silhouette)
            separated = self.silhouette_threshold is None or silhouette > self.silhouette_threshold
            if size < self.size_threshold and separated:
                poisoned.append(label)
                flagged.append(rows[small])
        flagged_rows = np.sort(np.concatenate(flagged)) if flagged else np.zeros(0, dtype=np.int64)
        flagged_class = (
            max(poisoned, key=lambda c: (silhouettes[c], -c)) if poisoned else None  # type: ignore[arg-type, return-value]
        )
        mitigation = cleansed_mitigation(evidence, flagged_rows, self.name) if poisoned else None
        details: dict[str, Any] = {
            "layer": self.layer,
            "dims": self.dims,
            "reduce": self.reduce,
            "size_threshold": self.size_threshold,
            "silhouette_threshold": self.silhouette_threshold,
            "poisoned_classes": poisoned,
            "seed": evidence.seed,
        }
        return Detection(
            method=self.name,
            detected=bool(poisoned),
            flagged_class=flagged_class,
            scores={"relative_size": sizes, "silhouette": silhouettes},
            flagged_rows=flagged_rows.astype(np.int64),
            mitigation=mitigation,
            seconds=time.perf_counter() - start,
            details=details,
        )
