"""Success and detection measures of backdoor attacks and defences (numpy only), defined once
for every attack and defence of the family.

- `attack_success_rate`: the share of triggered inputs *whose true class is not the target*
  that the model classifies as the target (Gu et al. 2017, "BadNets"; the all-to-all variant
  asks for the target of each input's own class instead). Inputs already of the target class
  are left out: counting them would credit the model's clean accuracy to the attack.
- `backdoor_z_score`: Carlini & Terzis 2022 ("Poisoning and Backdooring Contrastive Learning",
  ICLR'22, Sec. 5.1), how much closer two patched images' embeddings are than two clean ones',
  in units of the clean similarities' variance — exactly the paper's formula (its Var⁻¹, not a
  standard deviation).
- `anomaly_index`: Neural Cleanse's outlier score (Wang et al. 2019, S&P, Sec. IV-C): the
  median absolute deviation with the consistency constant 1.4826, so that an index > 2 means
  more than two standard deviations below the median under normality.
- `detection_rates`: false-acceptance and false-rejection rates of a threshold detector
  (STRIP, Gao et al. 2019, Sec. V-B: FRR on clean inputs, FAR on trojaned ones).
"""

from __future__ import annotations

import numpy as np

from privacylab.stats._checks import StatisticsError

__all__ = [
    "MAD_CONSISTENCY",
    "anomaly_index",
    "attack_success_rate",
    "backdoor_z_score",
    "detection_rates",
]

MAD_CONSISTENCY = 1.4826
"""1/Φ⁻¹(3/4): the median absolute deviation times this estimates σ for normal data."""


def _labels(values: object, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise StatisticsError(f"{name} must be a 1-D array of integer class labels")
    return array.astype(np.int64)


def attack_success_rate(predicted: object, true_labels: object, target: int | object) -> float:
    """ASR: among triggered inputs whose true label differs from their target, the share
    predicted as that target (Gu et al. 2017, Sec. 3 and 4, "attack success"). `target` is
    one class (all-to-one) or one target per input (all-to-all: y → (y + 1) mod K, Gu et al.
    Sec. 4.3.2). NaN when no input is of a non-target class."""
    pred = _labels(predicted, "predicted labels")
    true = _labels(true_labels, "true labels")
    if pred.shape != true.shape:
        raise StatisticsError(
            f"predicted and true labels differ in length: {pred.size} != {true.size}"
        )
    wanted = np.asarray(target)
    if wanted.ndim == 0:
        if not np.issubdtype(wanted.dtype, np.integer):
            raise StatisticsError(f"the target must be an integer class label, got {target!r}")
        wanted = np.full_like(true, int(wanted))
    else:
        wanted = _labels(wanted, "target labels")
        if wanted.shape != true.shape:
            raise StatisticsError("one target label per input is needed for all-to-all")
    counted = true != wanted
    if not counted.any():
        return float("nan")
    return float(np.mean(pred[counted] == wanted[counted]))


def _pairwise(embeddings: np.ndarray) -> np.ndarray:
    gram = embeddings @ embeddings.T
    return gram[~np.eye(len(embeddings), dtype=bool)]


def backdoor_z_score(clean: object, patched: object) -> float:
    """Carlini & Terzis 2022, Sec. 5.1, the backdoor z-score of an image encoder f:

        (Mean_{u,v}[⟨f(u ⊕ bd), f(v ⊕ bd)⟩] − Mean_{u,v}[⟨f(u), f(v)⟩]) · Var_{u,v}[⟨f(u), f(v)⟩]⁻¹

    `clean` holds f(u) and `patched` f(u ⊕ bd) for the same images, shape (n, d), as the
    model computes them (CLIP's embeddings are L2-normalised, so ⟨·,·⟩ is a cosine). Pairs
    run over u ≠ v (a vector with itself would only add the norms). Large values mean the
    patch alone makes images look alike: the backdoor took. Note the paper divides by the
    variance, not the standard deviation, so the score is not invariant to rescaling f; it is
    comparable across models whose embeddings are normalised."""
    a = np.asarray(clean, dtype=np.float64)
    b = np.asarray(patched, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise StatisticsError(
            f"clean and patched embeddings must both be (n, d), got {a.shape} and {b.shape}"
        )
    if len(a) < 3:
        raise StatisticsError(f"the z-score needs at least 3 images, got {len(a)}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise StatisticsError("embeddings must be finite")
    base = _pairwise(a)
    variance = float(base.var())
    if variance <= 0.0:
        raise StatisticsError("the clean similarities have no variance: the z-score is undefined")
    return float((_pairwise(b).mean() - base.mean()) / variance)


def anomaly_index(values: object) -> np.ndarray:
    """Neural Cleanse's anomaly index of each value (Wang et al. 2019, Sec. IV-C):
    |x − median| / (1.4826 · MAD), MAD the median of |x − median|. The detector flags the
    classes whose reverse-engineered trigger norm lies *below* the median with an index > 2.
    All zeros when every value equals the median (MAD = 0 and nothing deviates); +inf for a
    value off a median that nothing else deviates from."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2:
        raise StatisticsError("the anomaly index needs a 1-D array of at least 2 values")
    if not np.isfinite(x).all():
        raise StatisticsError("anomaly index: values must be finite")
    median = np.median(x)
    deviation = np.abs(x - median)
    mad = MAD_CONSISTENCY * np.median(deviation)
    if mad == 0.0:
        return np.where(deviation == 0.0, 0.0, np.inf)
    return deviation / mad


def detection_rates(
    clean_scores: object, trojaned_scores: object, threshold: float
) -> tuple[float, float]:
    """(FRR, FAR) of a detector that flags an input as trojaned when its score is *below*
    `threshold` (STRIP's entropy, Gao et al. 2019, Sec. V-B): FRR = share of clean inputs
    flagged, FAR = share of trojaned inputs let through."""
    clean = np.asarray(clean_scores, dtype=np.float64).ravel()
    trojaned = np.asarray(trojaned_scores, dtype=np.float64).ravel()
    if clean.size == 0 or trojaned.size == 0:
        raise StatisticsError("detection rates need clean and trojaned scores")
    if np.isnan(clean).any() or np.isnan(trojaned).any() or np.isnan(threshold):
        raise StatisticsError("detection rates: scores and threshold must not be NaN")
    return float(np.mean(clean < threshold)), float(np.mean(trojaned >= threshold))
