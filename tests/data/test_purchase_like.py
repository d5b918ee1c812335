"""The embedded Purchase-like data (Shokri et al. 2017, Sec. IV, simulated): determinism, shape,
binary sparse features, 100 k-means classes, registration, and the overfitting it exists for."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import privacylab.data.purchase_like as purchase_like
from privacylab.data import DataError, Dataset, load_dataset
from privacylab.data.info import _info, dataset_info
from privacylab.models import build_model
from privacylab.training import TrainConfig, train

SMALL = 3_000


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Small matrix products on shared cores: one intra-op thread, restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def small() -> tuple[np.ndarray, np.ndarray]:
    return purchase_like.make_purchase_like(SMALL, seed=5)


def test_same_seed_same_arrays(small: tuple[np.ndarray, np.ndarray]) -> None:
    features, labels = purchase_like.make_purchase_like(SMALL, seed=5)
    np.testing.assert_array_equal(features, small[0])
    np.testing.assert_array_equal(labels, small[1])
    other, _ = purchase_like.make_purchase_like(SMALL, seed=6)
    assert not np.array_equal(other, small[0])


def test_same_arrays_on_any_thread_count(small: tuple[np.ndarray, np.ndarray]) -> None:
    """The table is a function of (n_rows, seed) only: BLAS/OpenMP thread counts (the mixed
    purchase rates are a matrix product, k-means is threaded) do not change a bit or a label."""
    from threadpoolctl import threadpool_limits

    for threads in (1, 2):
        with threadpool_limits(limits=threads):
            features, labels = purchase_like.make_purchase_like(SMALL, seed=5)
        np.testing.assert_array_equal(features, small[0])
        np.testing.assert_array_equal(labels, small[1])


def test_shapes_types_and_classes(small: tuple[np.ndarray, np.ndarray]) -> None:
    features, labels = small
    assert features.shape == (SMALL, 600) and features.dtype == np.float32
    assert labels.shape == (SMALL,) and labels.dtype == np.int64
    assert set(np.unique(labels)) == set(range(100))


def test_binary_and_sparse(small: tuple[np.ndarray, np.ndarray]) -> None:
    features = small[0]
    assert np.isin(features, (0.0, 1.0)).all()
    per_row = features.sum(axis=1)
    assert per_row.min() >= 1
    assert 20 <= per_row.mean() <= 32
    assert 0.03 <= features.mean() <= 0.055


def test_labels_are_nearest_centre_clusters(small: tuple[np.ndarray, np.ndarray]) -> None:
    """Labels are a function of the features (k-means, as Shokri et al.): clustering the same
    rows again gives the same classes, and identical rows share a class."""
    features, labels = small
    again = purchase_like.cluster_labels(features, seed=5)
    np.testing.assert_array_equal(again, labels)
    _, first, inverse = np.unique(features, axis=0, return_index=True, return_inverse=True)
    np.testing.assert_array_equal(labels, labels[first][inverse.reshape(-1)])


def test_dataset_object_and_cache() -> None:
    data = purchase_like.purchase_like(2_000, seed=1)
    assert data.kind == "tabular" and data.input_shape == (600,) and data.num_classes == 100
    assert data.name == "purchase-like" and data.train_size is None
    again = purchase_like.purchase_like(2_000, seed=1)
    assert torch.equal(again.features, data.features) and torch.equal(again.labels, data.labels)
    again.features[0, 0] = 7.0
    assert purchase_like.purchase_like(2_000, seed=1).features[0, 0] != 7.0


def test_registered_loader_and_info(monkeypatch: pytest.MonkeyPatch) -> None:
    """`load_dataset("purchase-like")` and `dataset_info` go through the registry; the row
    count is shrunk for speed (the default is DEFAULT_ROWS = 30,000)."""
    assert purchase_like.DEFAULT_ROWS == 30_000
    monkeypatch.setattr(purchase_like, "DEFAULT_ROWS", 2_000)
    _info.cache_clear()
    try:
        data = load_dataset("purchase-like")
        assert len(data) == 2_000 and data.kind == "tabular"
        assert load_dataset("purchase_like").features.shape == (2_000, 600)
        info = dataset_info("purchase-like", None)
        assert info == (2_000, (600,), 100, None)
    finally:
        _info.cache_clear()


@pytest.mark.parametrize(
    ("n_rows", "seed"), [(10, 0), (999, 0), (2.5, 0), (True, 0), (2_000, -1), (2_000, "a")]
)
def test_bad_arguments_are_one_line(n_rows: object, seed: object) -> None:
    with pytest.raises(DataError, match="purchase-like") as caught:
        purchase_like.make_purchase_like(n_rows, seed)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("features", "classes"),
    [(np.ones((50, 600)), 100), (np.ones(600), 2), (np.full((200, 4), np.nan), 2),
     (np.ones((200, 4)), 1), (np.ones((200, 4)), 2.0)],
)  # fmt: skip
def test_cluster_labels_bad_input_is_one_line(features: np.ndarray, classes: object) -> None:
    with pytest.raises(DataError, match="purchase-like") as caught:
        purchase_like.cluster_labels(features, num_classes=classes)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


def test_small_mlp_overfits(small: tuple[np.ndarray, np.ndarray]) -> None:
    """The regime of Shokri et al.'s Purchase-100 target on a small version: 1,000 members,
    train accuracy 1, test accuracy far below, and the loss separates members (Yeom et al.)."""
    features, labels = (torch.from_numpy(a) for a in small)
    members, others = slice(0, 1_000), slice(1_000, 2_000)
    torch.manual_seed(0)
    model = build_model("mlp", (600,), 100, widths=(256,), seed=0)
    data = Dataset("purchase-like", features[members], labels[members], 100, (600,), "tabular")
    train(model, data, TrainConfig(epochs=30, batch_size=64, lr=0.05, seed=0))
    model.eval()
    with torch.no_grad():
        logits_in, logits_out = model(features[members]), model(features[others])
    train_acc = (logits_in.argmax(1) == labels[members]).float().mean().item()
    test_acc = (logits_out.argmax(1) == labels[others]).float().mean().item()
    assert train_acc == 1.0
    assert 0.2 <= test_acc <= 0.8
    loss_in = torch.nn.functional.cross_entropy(logits_in, labels[members], reduction="none")
    loss_out = torch.nn.functional.cross_entropy(logits_out, labels[others], reduction="none")
    truth = np.r_[np.ones(1_000), np.zeros(1_000)]
    auc = roc_auc_score(truth, -torch.cat([loss_in, loss_out]).numpy())
    assert auc > 0.75
