"""Purchase-like: an embedded stand-in for Purchase-100, made the way Shokri et al. made it.

Shokri, Stronati, Song & Shmatikov, "Membership Inference Attacks Against Machine Learning
Models" (IEEE S&P 2017), Sec. IV: Purchase-100 starts from Kaggle's "Acquire Valued Shoppers"
transactions; each record is a customer, each of 600 binary features says whether the customer
bought product j; the 100 class labels come from clustering the records (k-means), each class a
"purchase style". The Kaggle data cannot be downloaded here, so the customers are simulated and
the labelling is Shokri's:

1. **Products.** 600 products with a long-tailed base popularity (log-normal weights, σ = 1).
2. **Shopper types.** `SHOPPER_TYPES` = 50 latent types. Each type multiplies the popularity of
   `FAVOURITES` = 60 products of its own (drawn uniformly) by `BOOST` = 15 times a log-normal
   (σ = 0.5) factor; its purchase rates are the normalised result.
3. **Customers.** Each customer mixes the types with Dirichlet(`MIXING` = 0.03) weights (total
   concentration 1.5: most customers lean on one or two types, some on several) and has an activity
   level, log-normal around `MEAN_BASKET` = 30 expected purchases (σ = `ACTIVITY_SIGMA` = 0.3).
   Product j is bought with probability 1 − exp(−activity · Σ_t w_t rate_tj) (a Poisson count seen
   as "bought at least once"); the Bernoulli draws give the 0/1 row. A customer who drew no product
   gets their most likely one, as every Kaggle customer bought something.
4. **Labels.** k-means into 100 clusters (scikit-learn, Lloyd, k-means++ seeding, one
   initialisation, fitted on the first `FIT_ROWS` = 10,000 rows, then every row assigned to its
   nearest centre). One deviation from Shokri, stated: k-means runs on the rows scaled to unit
   length (cosine k-means), so a cluster is *what* a customer buys rather than *how much*; on
   raw 0/1 rows the heaviest buyers become clusters of one or two customers and the light
   buyers one cluster of thousands.

Sparsity: about 26 of 600 features are 1 per row (density ≈ 0.044; row counts from about 4 to
80). The density of the released Purchase-100 file was not available here to check; this is
our choice of a market-basket density, stated, not a measurement of the real file.

The whole table is a function of (`n_rows`, `seed`): numpy's PCG64 generator for the
customers, `random_state=seed` for k-means, and one BLAS/OpenMP thread for both the customers'
mixed purchase rates and k-means (so neither the features nor the labels depend on the
machine's thread count). `load_dataset("purchase-like")` gives the default 30,000 rows, seed 0,
built once per process and kept by `functools.lru_cache` (about 5 s of CPU: 1.5 s to draw the
customers, 3.7 s of single-threaded k-means; nothing is written to disk).

What it is for: with 5,000 members, an undefended MLP (`build_model("mlp", (600,), 100,
widths=[256])`, 30 epochs of momentum SGD, lr 0.05, batch 128) reaches train accuracy 1.0 and test
accuracy 0.69; the loss attack (Yeom et al. 2018) on 5,000 members and 5,000 non-members has AUC
0.77 and balanced accuracy 0.78, the gap attack 0.65 (`widths=[512, 256]`, same training: test
accuracy 0.59, loss attack AUC 0.78, balanced accuracy 0.81); members and non-members are the first
10,000 rows of `np.random.default_rng(1).permutation(30_000)`. This is the regime of Shokri's
Purchase-100 target (test accuracy 0.66, shadow attack 0.92 on Purchase) and Nasr et al.'s (test
accuracy 0.80). The mixing weight is the knob: purer customers (smaller `MIXING`) give cleaner
clusters, a higher test accuracy and a weaker attack.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from privacylab.data.dataset import Dataset
from privacylab.data.errors import DataError
from privacylab.data.registry import register_dataset

VERSION = 1
NAME = "purchase-like"
FEATURES = 600
NUM_CLASSES = 100
DEFAULT_ROWS = 30_000
DEFAULT_SEED = 0
MIN_ROWS = 1_000

SHOPPER_TYPES = 50
FAVOURITES = 60
BOOST = 15.0
MIXING = 0.03
MEAN_BASKET = 30.0
ACTIVITY_SIGMA = 0.3
FIT_ROWS = 10_000
KMEANS_MAX_ITER = 100


def _check(n_rows: object, seed: object) -> tuple[int, int]:
    if isinstance(n_rows, bool) or not isinstance(n_rows, (int, np.integer)):
        raise DataError(f"{NAME}: n_rows must be a whole number, got {n_rows!r}")
    if int(n_rows) < MIN_ROWS:
        raise DataError(f"{NAME}: n_rows must be at least {MIN_ROWS}, got {n_rows!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
        raise DataError(f"{NAME}: seed must be a whole number >= 0, got {seed!r}")
    return int(n_rows), int(seed)


def generate_customers(n_rows: int, seed: int = DEFAULT_SEED) -> np.ndarray:
    """(n_rows, 600) float32 0/1 purchase indicators of simulated customers (steps 1–3 of the
    module docstring): latent shopper types with sparse product propensities, Bernoulli draws."""
    from threadpoolctl import threadpool_limits

    n_rows, seed = _check(n_rows, seed)
    rng = np.random.default_rng([VERSION, seed])
    popularity = rng.lognormal(0.0, 1.0, FEATURES)
    rates = np.tile(popularity, (SHOPPER_TYPES, 1))
    for row in rates:
        favourites = rng.choice(FEATURES, FAVOURITES, replace=False)
        row[favourites] *= BOOST * rng.lognormal(0.0, 0.5, FAVOURITES)
    rates /= rates.sum(axis=1, keepdims=True)
    weights = rng.dirichlet(np.full(SHOPPER_TYPES, MIXING), n_rows)
    activity = MEAN_BASKET * rng.lognormal(-(ACTIVITY_SIGMA**2) / 2, ACTIVITY_SIGMA, n_rows)
    with threadpool_limits(limits=1):  # a BLAS product: one thread, bits independent of cores
        mixed = weights @ rates
    intensity = activity[:, None] * mixed
    bought = rng.random((n_rows, FEATURES)) < -np.expm1(-intensity)
    empty = np.flatnonzero(~bought.any(axis=1))
    bought[empty, intensity[empty].argmax(axis=1)] = True
    return bought.astype(np.float32)


def cluster_labels(
    features: np.ndarray, seed: int = DEFAULT_SEED, num_classes: int = NUM_CLASSES
) -> np.ndarray:
    """int64 labels 0..num_classes-1 by k-means on the unit-length rows (step 4; Shokri et al.
    2017, Sec. IV), fitted on the first FIT_ROWS rows with one thread, deterministic in `seed`."""
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    features = np.asarray(features)
    if features.ndim != 2 or not np.isfinite(features).all():
        raise DataError(f"{NAME}: features must be a finite 2-D array, got {features.shape}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
        raise DataError(f"{NAME}: num_classes must be a whole number, got {num_classes!r}")
    if not 2 <= num_classes <= min(features.shape[0], FIT_ROWS):
        raise DataError(
            f"{NAME}: num_classes must be in [2, rows fitted], got {num_classes} for "
            f"{features.shape[0]} rows"
        )
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    unit = (features / np.maximum(norms, 1.0)).astype(np.float32)
    with threadpool_limits(limits=1):
        kmeans = KMeans(
            num_classes,
            n_init=1,
            max_iter=KMEANS_MAX_ITER,
            random_state=seed,
            algorithm="lloyd",
        ).fit(unit[:FIT_ROWS])
        labels = kmeans.predict(unit)
    return labels.astype(np.int64)


def make_purchase_like(
    n_rows: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Features (n_rows, 600) float32 0/1 and labels (n_rows,) int64 in 0..99, built afresh
    (no cache): the customers of `generate_customers`, labelled by `cluster_labels`."""
    n_rows, seed = _check(n_rows, seed)
    features = generate_customers(n_rows, seed)
    return features, cluster_labels(features, seed)


@functools.lru_cache(maxsize=4)
def _cached(n_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    features, labels = make_purchase_like(n_rows, seed)
    features.flags.writeable = False
    labels.flags.writeable = False
    return features, labels


def purchase_like(n_rows: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> Dataset:
    """The Purchase-like data as a tabular Dataset (600 binary features, 100 classes, no
    canonical train/test cut, like Purchase-100); built once per process per (n_rows, seed)."""
    features, labels = _cached(*_check(n_rows, seed))
    return Dataset(
        name=NAME,
        features=torch.from_numpy(features.copy()),
        labels=torch.from_numpy(labels.copy()),
        num_classes=NUM_CLASSES,
        input_shape=(FEATURES,),
        kind="tabular",
    )


@register_dataset(NAME)
def load_purchase_like(root: Path | None = None) -> Dataset:
    """DEFAULT_ROWS (30,000) simulated customers, seed DEFAULT_SEED (0); `root` is not used."""
    return purchase_like(DEFAULT_ROWS, DEFAULT_SEED)
