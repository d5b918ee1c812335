"""Label recovery from one update: the iDLG rule (single example) and batch counts."""

from __future__ import annotations

import pytest
import torch

from privacylab.attacks.inversion import InversionError
from privacylab.attacks.inversion.labels import output_layer, recover_labels
from privacylab.federated import LocalTraining
from privacylab.federated.clients import observe as observe_clients

NUM_CLASSES = 10


def _rows(seed: int, n: int, total: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(total, generator=gen)[:n].tolist()


@pytest.mark.parametrize("model_name", ["lenet", "mlp_relu"])
def test_single_example_rule_is_exact(request, digits, observe, model_name):
    model = request.getfixturevalue(model_name)
    x, y = digits
    for row in _rows(1, 20, len(y)):
        update = observe(model, x[row : row + 1], y[row : row + 1])
        labels = recover_labels(update, model, 1, NUM_CLASSES)
        assert labels is not None and labels.tolist() == [int(y[row])]


def test_single_example_rule_without_bias_uses_row_norms(digits, observe):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(64, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 10, bias=False),
    )
    x, y = digits
    hits = 0
    for row in _rows(2, 20, len(y)):
        update = observe(model, x[row : row + 1], y[row : row + 1])
        hits += recover_labels(update, model, 1, NUM_CLASSES).tolist() == [int(y[row])]
    assert hits == 20  # tanh features take both signs: the sign rule would fail, norms do not


@pytest.mark.parametrize("model_name", ["lenet", "mlp_relu"])
@pytest.mark.parametrize(
    "labels",
    [
        [3, 3, 3, 7],
        [0, 1, 2, 3, 4, 5, 6, 7],
        [2, 2, 5, 5, 5, 9, 9, 9, 9, 1, 1, 0],
        [int(c) for c in torch.arange(24) % 10],  # 24 > 10 classes: every class repeated
    ],
)
def test_batch_counts_are_exact(request, digits, observe, model_name, labels):
    model = request.getfixturevalue(model_name)
    x, y = digits
    rows = []
    for label in labels:  # the first unused row of each wanted class
        candidates = (y == label).nonzero().flatten().tolist()
        rows.append(next(r for r in candidates if r not in rows))
    index = torch.tensor(rows)
    update = observe(model, x[index], y[index])
    recovered = recover_labels(update, model, len(rows), NUM_CLASSES)
    assert recovered is not None
    assert recovered.tolist() == sorted(labels)


@pytest.mark.parametrize("epochs", [1, 5])
def test_fedavg_counts_need_the_procedure(lenet, digits, observe, epochs):
    x, y = digits
    training = LocalTraining("fedavg", epochs=epochs, lr=0.1)
    for seed in range(4):
        index = torch.tensor(_rows(seed, 8, len(y)))
        update = observe(lenet, x[index], y[index], training)
        assert recover_labels(update, lenet, 8, NUM_CLASSES) is None
        labels = recover_labels(update, lenet, 8, NUM_CLASSES, training=training)
        assert labels.tolist() == sorted(y[index].tolist())


def test_refusals(digits, observe):
    x, y = digits
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10), torch.nn.Softplus())
    update = observe(model, x[:2], y[:2])
    assert output_layer(model, update, NUM_CLASSES) == ("1.weight", "1.bias")
    assert recover_labels(update, model, 2, 7) is None  # not 7 outputs
    conv_head = torch.nn.Sequential(torch.nn.Conv2d(1, 10, 8), torch.nn.Flatten())
    update = observe(conv_head, x[:1], y[:1])
    assert recover_labels(update, conv_head, 1, NUM_CLASSES) is None
    with pytest.raises(InversionError, match="batch_size"):
        recover_labels(update, model, 0, NUM_CLASSES)


def test_fedavg_counts_under_secure_aggregation(lenet, digits):
    """The server sees the mean of 2 clients' deltas, each of 2 local steps on 4 rows: the
    delta is divided by one client's step count (with the round's 4 steps: 1 of 10)."""
    x, y = digits
    training = LocalTraining("fedavg", epochs=1, batch_size=2, lr=0.1)
    hits = 0
    for seed in range(10):
        index = torch.tensor(_rows(seed, 8, len(y)))
        (update,) = observe_clients(
            lenet, x[index], y[index], training=training, clients=2, secure_aggregation=True
        )
        assert update.aggregated and update.num_examples == 8
        labels = recover_labels(update, lenet, 8, NUM_CLASSES, training=training)
        hits += labels.tolist() == sorted(y[index].tolist())
    assert hits >= 8  # measured 9 of 10
