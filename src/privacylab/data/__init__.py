"""Datasets by name, membership splits and canaries.

`load_dataset(name, root)` returns a `Dataset`; embedded datasets (`mnist5k`, `digits`,
`breast_cancer`, the simulated `purchase-like`) need no files, the others are read from released
files under `root` and are never downloaded.
"""

from privacylab.data import cifar, embedded, idx, purchase_like, tabular, text  # noqa: F401 (loaders)
from privacylab.data.canaries import CANARY_KINDS, insert_canaries
from privacylab.data.cifar import NumpyOnlyUnpickler, load_numpy_pickle
from privacylab.data.dataset import Dataset, split_train_test, train_test_indices
from privacylab.data.errors import DataError
from privacylab.data.idx import read_idx
from privacylab.data.registry import available_datasets, load_dataset, register_dataset
from privacylab.data.splits import MembershipSplit, balanced_subsample, membership_split

__all__ = [
    "CANARY_KINDS",
    "DataError",
    "Dataset",
    "MembershipSplit",
    "NumpyOnlyUnpickler",
    "available_datasets",
    "balanced_subsample",
    "insert_canaries",
    "load_dataset",
    "load_numpy_pickle",
    "membership_split",
    "read_idx",
    "register_dataset",
    "split_train_test",
    "train_test_indices",
]
