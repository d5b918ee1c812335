"""Distillation defences: DMP (Shejwalkar & Houmansadr 2021) chooses far, low-entropy reference
data and its student never reads a private label; SELENA (Tang et al. 2022) labels each
example only with sub-models that did not train on it; both weaken a loss attack at a stated
accuracy floor; both go through the durable job and load back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score
from torch import nn

from privacylab.attacks.membership.references import Recipe
from privacylab.data import Dataset
from privacylab.defenses import DefenseData, DefenseError, parse_defense
from privacylab.defenses.base import accuracy
from privacylab.defenses.fitting import DEFENSE_FILE, load_defended, train_defended
from privacylab.defenses.training import _distill as distill_module
from privacylab.defenses.training import selena as selena_module
from privacylab.defenses.training._distill import probabilities
from privacylab.defenses.training.dmp import (
    DMP,
    nearest_distance,
    prediction_entropy,
    select_reference,
)
from privacylab.defenses.training.selena import SELENA, exclusion_matrix, split_soft_labels
from privacylab.models import build_model
from privacylab.training import TrainConfig, train
from privacylab.training.hooks import Callback, TrainState

CLASSES, DIM = 20, 60
CONFIG = TrainConfig(epochs=30, batch_size=50, lr=0.05)


def synthetic(n: int, seed: int = 0, flip: float = 0.3) -> Dataset:
    """Purchase-style task: binary features, 20 class prototypes, each bit flipped w.p. 0.3."""
    rng = np.random.default_rng(seed)
    prototypes = rng.random((CLASSES, DIM)) < 0.5
    labels = rng.integers(0, CLASSES, n)
    features = prototypes[labels] ^ (rng.random((n, DIM)) < flip)
    return Dataset(
        "synthetic",
        torch.tensor(features, dtype=torch.float32),
        torch.tensor(labels),
        CLASSES,
        (DIM,),
        "tabular",
    )


DATA = synthetic(1600)
MEMBERS, HOLDOUT, TEST, PUBLIC = (DATA.subset(np.arange(i, i + 400)) for i in range(0, 1600, 400))
EXTRA = DefenseData(holdout=HOLDOUT, public=PUBLIC)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Many small trainings: thread hand-offs cost more than they save (measured 3-5x slower
    with 2 threads on a loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(seed: int) -> nn.Module:
    return build_model("mlp", (DIM,), CLASSES, seed=seed, widths=[64])


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return all(torch.equal(x, y) for x, y in pairs)


def relabelled(data: Dataset, seed: int) -> Dataset:
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(data)))
    return Dataset(
        data.name, data.features, data.labels[perm], data.num_classes, data.input_shape, data.kind
    )


# --- DMP: the choice of reference data --------------------------------------------------------


class ConfidenceTeacher(nn.Module):
    """Logits c·e_0 from the last feature c: the larger c, the lower the entropy."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(len(x), 4)
        logits[:, 0] = x[:, -1]
        return logits


def test_dmp_chooses_far_low_entropy_examples() -> None:
    private = torch.tensor([[0.0, 0, 10], [1, 0, 10], [0, 1, 10], [1, 1, 10]])
    near = private + 0.01  # near-duplicates of members: the most confident of all
    far_low = torch.tensor([[20.0 + i, 20, 6 + i] for i in range(4)])
    far_high = torch.tensor([[-20.0 - i, 20, 0] for i in range(4)])
    pool = torch.cat([near, far_low, far_high])  # positions 0-3, 4-7, 8-11
    teacher = ConfidenceTeacher()
    entropy = prediction_entropy(probabilities(teacher, pool))
    assert entropy[:4].max() < entropy[4:8].min() < entropy[8:].min()
    distance = nearest_distance(pool, private)
    assert torch.allclose(distance[:4], torch.full((4,), 0.01 * 3**0.5, dtype=torch.float64))
    chosen = DMP(size=4, far=2 / 3).choose(teacher, private, pool)
    assert chosen.tolist() == [4, 5, 6, 7]
    # Without the distance criterion, entropy alone would take the members' near-duplicates.
    assert DMP(size=4, far=1.0).choose(teacher, private, pool).tolist() == [0, 1, 2, 3]
    # Without the entropy criterion (keep = count), distance alone takes far, uncertain ones too.
    assert set(DMP(size=8, far=0.5).choose(teacher, private, pool)) == set(range(4, 12))


@given(
    n=st.integers(1, 60),
    data=st.data(),
)
def test_select_reference_properties(n: int, data: st.DataObject) -> None:
    count = data.draw(st.integers(1, n))
    far = data.draw(st.floats(0.01, 1.0))
    distance = torch.tensor(np.random.default_rng(n).permutation(n), dtype=torch.float64)
    entropy = torch.tensor(np.random.default_rng(n + 1).permutation(n), dtype=torch.float64)
    chosen = select_reference(distance, entropy, count, far)
    assert len(chosen) == count == len(set(chosen.tolist()))
    keep = max(count, int(np.ceil(far * n)))
    candidates = np.argsort(-distance.numpy())[:keep]
    assert set(chosen) <= set(candidates)
    rest = np.setdiff1d(candidates, chosen)
    if len(rest):
        assert entropy[chosen].max() < entropy[rest].min()


@pytest.fixture(scope="module")
def teacher() -> nn.Module:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = train(build(0), MEMBERS, CONFIG).model
    torch.set_num_threads(threads)
    return model


def test_dmp_student_never_reads_private_labels(teacher: nn.Module) -> None:
    dmp = DMP(size=0.5)
    config = TrainConfig(epochs=3, batch_size=50, lr=0.05)
    student, chosen = dmp.student(teacher, build, MEMBERS, EXTRA, config, seed=0)
    shuffled, chosen_again = dmp.student(
        teacher, build, relabelled(MEMBERS, 1), EXTRA, config, seed=0
    )
    assert same_weights(student, shuffled)
    assert chosen.tolist() == chosen_again.tolist() and len(chosen) == 200


def test_dmp_never_reads_public_labels(tmp_path: Path) -> None:
    config = TrainConfig(epochs=3, batch_size=50, lr=0.05)
    dmp = DMP(size=100)
    first = dmp.fit(build, MEMBERS, config, EXTRA, seed=0, folder=tmp_path / "a")
    other = DefenseData(holdout=HOLDOUT, public=relabelled(PUBLIC, 2))
    second = dmp.fit(build, MEMBERS, config, other, seed=0, folder=tmp_path / "b")
    assert same_weights(first.model, second.model)
    assert first.notes["reference_chosen"] == 100


# --- SELENA: Split-AI's assignment and soft labels ------------------------------------------


@given(n=st.integers(1, 40), K=st.integers(2, 12), data=st.data())
def test_exclusion_matrix_leaves_each_example_out_of_l_models(
    n: int,
    K: int,
    data: st.DataObject,
) -> None:
    L = data.draw(st.integers(1, K - 1))
    try:
        excluded = exclusion_matrix(n, K, L, seed=7)
    except DefenseError as error:  # some sub-model got no example: only possible for tiny n
        assert "no training example" in str(error) and n * (K - L) < 3 * K
        return
    assert excluded.shape == (n, K) and (excluded.sum(1) == L).all()
    assert (~excluded).any(0).all()
    assert (exclusion_matrix(n, K, L, seed=7) == excluded).all()


def test_soft_label_is_the_mean_of_the_excluding_models() -> None:
    K, L, n = 6, 2, 50
    excluded = exclusion_matrix(n, K, L, seed=3)
    predictions = torch.stack([F.one_hot(torch.full((n,), k), K).float() for k in range(K)])
    soft = split_soft_labels(predictions, excluded)
    assert torch.equal(soft, torch.as_tensor(excluded, dtype=torch.float32) / L)


def test_split_ai_trains_and_labels_by_the_exclusion_matrix(monkeypatch) -> None:
    trained: list[tuple[torch.Tensor, nn.Module]] = []
    real_train = selena_module.train

    def recording(model, data, config, **kwargs):
        result = real_train(model, data, config, **kwargs)
        trained.append((data.features.clone(), result.model))
        return result

    monkeypatch.setattr(selena_module, "train", recording)
    members = MEMBERS.subset(np.arange(120))
    config = TrainConfig(epochs=2, batch_size=40, lr=0.05)
    soft, excluded, _ = SELENA(K=5, L=2).split_ai(build, members, config, seed=4)
    assert len(trained) == 5 and excluded.shape == (120, 5)
    for k, (features, _) in enumerate(trained):
        assert torch.equal(features, members.features[torch.from_numpy(~excluded[:, k])])
    for i in range(len(members)):
        outs = [k for k in range(5) if excluded[i, k]]
        expected = torch.stack(
            [probabilities(trained[k][1], members.features[i : i + 1])[0] for k in outs]
        )
        assert torch.allclose(soft[i], expected.mean(0), atol=1e-6)


# --- Both: privacy and utility on an overfit task -------------------------------------------


def loss_auc(model: nn.Module) -> float:
    """AUC of the loss attack (Yeom et al. 2018): members have the lower loss."""
    with torch.no_grad():
        losses = [
            F.cross_entropy(model(d.features), d.labels, reduction="none") for d in (MEMBERS, TEST)
        ]
    truth = np.r_[np.ones(len(MEMBERS)), np.zeros(len(TEST))]
    return float(roc_auc_score(truth, -torch.cat(losses).numpy()))


@pytest.mark.parametrize("spec", ["dmp", "selena"])
def test_weaker_loss_attack_above_accuracy_floor(
    spec: str, teacher: nn.Module, tmp_path: Path
) -> None:
    fitted = parse_defense(spec).fit(build, MEMBERS, CONFIG, EXTRA, seed=0, folder=tmp_path)
    undefended_gap = accuracy(teacher, MEMBERS) - accuracy(teacher, TEST)
    gap = fitted.train_accuracy - accuracy(fitted.model, TEST)
    assert loss_auc(fitted.model) < loss_auc(teacher) - 0.05  # measured: 0.80 -> 0.61 / 0.70
    assert gap < undefended_gap - 0.1
    assert accuracy(fitted.model, TEST) > 0.6  # undefended 0.74, chance 0.05


# --- The durable job and bad input ----------------------------------------------------------


@pytest.mark.parametrize("spec", ["dmp:size=150", "selena:K=3"])
def test_train_defended_round_trip(spec: str, tmp_path: Path) -> None:
    train_config = TrainConfig(epochs=3, batch_size=64, lr=0.05)
    recipe = Recipe("digits", "mlp", train_config.to_dict(), {"widths": [16]}, defense=spec)
    rows = np.random.default_rng(0).permutation(1797)
    job = {
        "recipe": recipe.to_dict(),
        "indices": rows[:300].tolist(),
        "holdout": rows[300:400].tolist(),
        "public": rows[400:700].tolist(),
        "seed": 3,
        "folder": str(tmp_path / "model"),
    }
    record = train_defended(job)
    loaded = load_defended(tmp_path / "model")
    assert not (tmp_path / "model" / "checkpoint").exists()
    assert json.loads((tmp_path / "model" / DEFENSE_FILE).read_text())["spec"] == record["defense"]

    from privacylab.data import load_dataset

    digits = load_dataset("digits")

    def build_digits(seed: int) -> nn.Module:
        return build_model("mlp", digits.input_shape, 10, seed=seed, widths=[16])

    extra = DefenseData(holdout=digits.subset(rows[300:400]), public=digits.subset(rows[400:700]))
    direct = parse_defense(spec).fit(
        build_digits,
        digits.subset(rows[:300]),
        TrainConfig(**{**train_config.to_dict(), "seed": 3}),
        extra,
        seed=3,
        folder=tmp_path / "direct",
    )
    assert same_weights(loaded, direct.model)
    assert record["train_accuracy"] == pytest.approx(direct.train_accuracy)


def test_bad_parameters_are_one_line(tmp_path: Path) -> None:
    for spec in (
        "dmp:size=0",
        "dmp:size=2.5",
        "dmp:temperature=0",
        "dmp:far=1.5",
        "selena:K=1",
        "selena:K=3:L=3",
        "selena:L=-1",
        "selena:K=2.5",
    ):
        with pytest.raises(DefenseError) as error:
            parse_defense(spec)
        assert "\n" not in str(error.value)
    assert parse_defense("selena").left_out == 4 and parse_defense("selena:25").left_out == 10
    assert parse_defense("selena:K=4:L=1").left_out == 1
    with pytest.raises(DefenseError, match="public"):
        DMP().fit(build, MEMBERS, CONFIG, DefenseData(holdout=HOLDOUT), seed=0, folder=tmp_path)
    with pytest.raises(DefenseError, match="larger than the public pool"):
        DMP(size=401).fit(build, MEMBERS, CONFIG, EXTRA, seed=0, folder=tmp_path)


def test_selena_killed_run_resumes_to_same_weights(tmp_path: Path, monkeypatch) -> None:
    members = MEMBERS.subset(np.arange(120))
    config = TrainConfig(epochs=2, batch_size=40, lr=0.05)
    defense = SELENA(K=4, L=1)
    whole = defense.fit(build, members, config, EXTRA, seed=5, folder=tmp_path / "whole")
    real_train = selena_module.train
    calls = []

    def dies_on_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_train(*args, **kwargs)

    monkeypatch.setattr(selena_module, "train", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        defense.fit(build, members, config, EXTRA, seed=5, folder=tmp_path / "killed")
    monkeypatch.setattr(selena_module, "train", real_train)
    assert (tmp_path / "killed" / "checkpoint" / "split-1").exists()
    resumed = defense.fit(build, members, config, EXTRA, seed=5, folder=tmp_path / "killed")
    assert same_weights(whole.model, resumed.model)
    assert resumed.notes == whole.notes


class _KilledError(Exception):
    pass


class _KillAt(Callback):
    """Dies after the callbacks of epoch `epoch`, before the trainer checkpoints it."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, state: TrainState) -> None:
        if state.epoch == self.epoch:
            raise _KilledError


def test_dmp_killed_in_the_students_training_resumes_to_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Teacher finished, student killed in its second epoch: the re-run reuses the teacher,
    chooses the same reference data and resumes the student to the uninterrupted weights."""
    config = TrainConfig(epochs=3, batch_size=50, lr=0.05)
    dmp = DMP(size=100)
    whole = dmp.fit(build, MEMBERS, config, EXTRA, seed=6, folder=tmp_path / "whole")
    real_train = distill_module.train

    def killed_student(*args: Any, **kwargs: Any) -> Any:
        return real_train(*args, callbacks=[_KillAt(2)], **kwargs)

    monkeypatch.setattr(distill_module, "train", killed_student)
    with pytest.raises(_KilledError):
        dmp.fit(build, MEMBERS, config, EXTRA, seed=6, folder=tmp_path / "killed")
    monkeypatch.setattr(distill_module, "train", real_train)
    assert (tmp_path / "killed" / "checkpoint" / "student").exists()
    resumed = dmp.fit(build, MEMBERS, config, EXTRA, seed=6, folder=tmp_path / "killed")
    assert same_weights(whole.model, resumed.model)
    assert resumed.notes == whole.notes


def test_split_ai_assignment_follows_the_run_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split-AI draws its exclusion matrix from the run's seed: same seed, same matrix; another
    seed, another one (the sub-model trainings are stubbed: only the assignment is compared)."""

    class Stub:
        def __init__(self, model: nn.Module) -> None:
            self.model = model

    monkeypatch.setattr(selena_module, "train", lambda model, *a, **k: Stub(model))
    members = MEMBERS.subset(np.arange(60))
    config = TrainConfig(epochs=1)
    selena = SELENA(K=4, L=1)
    first = selena.split_ai(build, members, config, seed=0)[1]
    assert (selena.split_ai(build, members, config, seed=0)[1] == first).all()
    assert not (selena.split_ai(build, members, config, seed=1)[1] == first).all()
