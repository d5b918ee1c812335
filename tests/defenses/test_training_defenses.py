"""Training-time defences (issue 12): the contract every registered `TrainingDefense` keeps
(trained as a durable job, saved and read back to the same outputs, nothing pickled), what each
simple defence changes in training, and that L2 and early stopping shrink the generalisation
gap and the loss attack's AUC on a small overfit setting (digits with noisy labels)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
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
from privacylab.data import Dataset, load_dataset
from privacylab.defenses import (
    DEFENSES,
    DefenseData,
    DefenseError,
    TrainingDefense,
    defense_names,
    fitting,
    make_defense,
    parse_defense,
)
from privacylab.defenses.fitting import load_defended, train_defended
from privacylab.defenses.training.augmentation import Augmentation
from privacylab.defenses.training.dp import DPSGD
from privacylab.defenses.training.dropout import Dropout
from privacylab.defenses.training.early_stopping import STATE_FILE, GapStopping
from privacylab.defenses.training.l2 import L2
from privacylab.defenses.training.label_smoothing import LabelSmoothing
from privacylab.defenses.training.stacking import (
    AveragedEnsemble,
    Stacking,
    disjoint_parts,
    member_seed,
)
from privacylab.models import build_model
from privacylab.training import PrivacyConfig, TrainConfig, train
from privacylab.training.defaults import dp_defaults
from privacylab.training.hooks import TrainState
from privacylab.training.trainer import EpochRecord

DIGITS = load_dataset("digits")
ORDER = np.random.default_rng(12).permutation(len(DIGITS))
MEMBERS, HOLDOUT, PUBLIC, TEST = ORDER[:90], ORDER[90:150], ORDER[150:210], ORDER[300:800]
TRAINING = [name for name in defense_names() if issubclass(DEFENSES.get(name), TrainingDefense)]
CHEAP = {"dp": {"tune": "recipe"}}
"""Contract overrides: DP's default tuning trains ~400 steps; its rule is checked on its own."""


def _mlp(seed: int, **options: Any) -> nn.Module:
    return build_model(
        "mlp", DIGITS.input_shape, DIGITS.num_classes, seed=seed, widths=[16], **options
    )


# --- the contract -----------------------------------------------------------------------------


def test_the_simple_defences_are_registered() -> None:
    for name in ("l2", "dropout", "label-smoothing", "early-stopping", "augmentation"):
        assert name in TRAINING
    assert {"stacking", "dp"} <= set(TRAINING)


@pytest.mark.parametrize("name", TRAINING)
def test_contract_train_save_load(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every registered training-time defence, defaults (DP: recipe's settings), trained by the
    durable worker; the model read back answers exactly as the one `fit` returned."""
    defense = make_defense(name, **CHEAP.get(name, {}))
    assert defense.kind == "training" and defense.paper and "training" in defense.changes
    config = TrainConfig(epochs=2, batch_size=32, lr=0.1, seed=0)
    recipe = Recipe("digits", "mlp", config.to_dict(), {"widths": [16]}, defense=defense.spec)
    probe = DIGITS.features[TEST[:64]]
    before: dict[str, torch.Tensor] = {}
    real = fitting.training_defense

    def capturing(spec: str) -> TrainingDefense:
        instance = real(spec)
        save = instance.save

        def save_and_remember(model: nn.Module, *args: Any, **kwargs: Any) -> None:
            with torch.no_grad():
                before["out"] = model.eval()(probe).clone()
            save(model, *args, **kwargs)

        instance.save = save_and_remember  # type: ignore[method-assign]
        return instance

    monkeypatch.setattr(fitting, "training_defense", capturing)
    job = {
        "recipe": recipe.to_dict(),
        "indices": MEMBERS.tolist(),
        "holdout": HOLDOUT.tolist(),
        "public": PUBLIC.tolist(),
        "seed": 3,
        "folder": str(tmp_path / "model"),
    }
    record = train_defended(job)
    monkeypatch.undo()
    loaded = load_defended(tmp_path / "model")
    assert not loaded.training
    with torch.no_grad():
        after = loaded(probe)
    assert after.shape == (64, DIGITS.num_classes)
    torch.testing.assert_close(after, before["out"], rtol=0, atol=1e-6)
    assert record["defense"] == defense.spec and record["train_size"] == len(MEMBERS)
    assert record["train_accuracy"] is None or 0.0 <= record["train_accuracy"] <= 1.0
    json.dumps(record)
    files = [p for p in (tmp_path / "model").rglob("*") if p.is_file()]
    assert files and all(p.suffix in (".json", ".safetensors") for p in files)
    assert not (tmp_path / "model" / "checkpoint").exists()
    if isinstance(defense, DPSGD):
        assert 0 < record["epsilon"] <= defense.params["epsilon"]
    else:
        assert record["epsilon"] is None


@pytest.mark.parametrize(
    "spec",
    [
        "l2:-1",
        "l2:nan",
        "l2:abc",
        "dp:0",
        "dp:-3",
        "dp:8:0",
        "dp:8:1",
        "dp:tune=maybe",
        "dropout:1",
        "dropout:-0.1",
        "label-smoothing:1",
        "label-smoothing:-0.5",
        "early-stopping:0",
        "early-stopping:1.5",
        "stacking:1",
        "augmentation:0",
        "augmentation:flip=0",
        "augmentation:flip=0.6",
        "augmentation:noise=0",
        "l2:1e-3:2",
        "l2:mu=1",
    ],
)
def test_bad_specs_are_one_line_defense_errors(spec: str) -> None:
    with pytest.raises(DefenseError) as error:
        parse_defense(spec)
    assert "\n" not in str(error.value)


def test_default_specs_are_canonical() -> None:
    assert parse_defense("l2:1e-3").spec == "l2:lam=0.001"
    assert make_defense("dp", epsilon=8).label == "dp"
    assert parse_defense("dp:8").spec == make_defense("dp").spec
    assert parse_defense("label_smoothing:0.2").spec == "label-smoothing:eps=0.2"


# --- L2 ---------------------------------------------------------------------------------------


def test_l2_is_one_gradient_step_of_loss_plus_lambda_sum_of_squares() -> None:
    """One full-batch SGD step under `l2:λ` equals w − lr·∇(CE + λ·Σw²), computed by hand."""
    lam, lr = 0.05, 0.5
    data = DIGITS.subset(ORDER[:40])
    config = L2(lam=lam).configure(TrainConfig(epochs=1, batch_size=40, lr=lr, optimizer="sgd"))
    assert config.weight_decay == pytest.approx(2 * lam)
    model = build_model("logreg", DIGITS.input_shape, DIGITS.num_classes, seed=1)
    manual = build_model("logreg", DIGITS.input_shape, DIGITS.num_classes, seed=1)
    trained = train(model, data, config).model
    loss = F.cross_entropy(manual(data.features), data.labels)
    loss = loss + lam * sum((p**2).sum() for p in manual.parameters())
    grads = torch.autograd.grad(loss, list(manual.parameters()))
    with torch.no_grad():
        expected = [p - lr * g for p, g in zip(manual.parameters(), grads, strict=True)]
    for got, want in zip(trained.parameters(), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_l2_adds_to_the_recipes_weight_decay() -> None:
    assert L2(lam=0.01).configure(TrainConfig(weight_decay=0.1)).weight_decay == pytest.approx(0.12)
    assert L2(lam=0).configure(TrainConfig()).weight_decay == 0


# --- the overfit setting: digits with 30% of the training labels replaced at random ----------


def _noisy_members() -> Dataset:
    data = DIGITS.subset(ORDER[:100])
    generator = torch.Generator().manual_seed(1)
    flip = torch.rand(len(data), generator=generator) < 0.3
    labels = data.labels.clone()
    labels[flip] = torch.randint(0, 10, (int(flip.sum()),), generator=generator)
    return replace(data, labels=labels)


NOISY = _noisy_members()
OVERFIT = TrainConfig(epochs=20, batch_size=10, lr=0.1, optimizer="momentum", seed=0)


def _wide(seed: int, **options: Any) -> nn.Module:
    return build_model(
        "mlp", DIGITS.input_shape, DIGITS.num_classes, seed=seed, widths=[64], **options
    )


def _gap_and_auc(model: nn.Module) -> tuple[float, float]:
    """Train − test accuracy, and the loss attack's AUC (Yeom et al. 2018: lower loss means
    member) on the noisy members against 500 test rows."""
    test = DIGITS.subset(TEST)
    model.eval()
    with torch.no_grad():
        out_in, out_out = model(NOISY.features), model(test.features)
        loss_in = F.cross_entropy(out_in, NOISY.labels, reduction="none")
        loss_out = F.cross_entropy(out_out, test.labels, reduction="none")
        gap = (out_in.argmax(1) == NOISY.labels).float().mean() - (
            out_out.argmax(1) == test.labels
        ).float().mean()
    truth = np.r_[np.ones(len(loss_in)), np.zeros(len(loss_out))]
    return float(gap), float(roc_auc_score(truth, -np.r_[loss_in.numpy(), loss_out.numpy()]))


@pytest.fixture(scope="module")
def overfit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The undefended model, l2:2e-2, early stopping and label smoothing, trained once on the
    noisy members."""
    folder = tmp_path_factory.mktemp("overfit")
    extra = DefenseData(holdout=DIGITS.subset(HOLDOUT))
    out: dict[str, Any] = {"none": train(_wide(0), NOISY, OVERFIT).model}
    for spec in ("l2:2e-2", "early-stopping", "label-smoothing:0.2"):
        fitted = parse_defense(spec).fit(  # type: ignore[attr-defined]
            _wide, NOISY, OVERFIT, extra, seed=0, folder=folder / spec
        )
        out[spec] = fitted
    return out


def test_undefended_setting_overfits(overfit: dict[str, Any]) -> None:
    gap, auc = _gap_and_auc(overfit["none"])
    assert gap > 0.2 and auc > 0.65


def test_l2_shrinks_the_weights_the_gap_and_the_attack(overfit: dict[str, Any]) -> None:
    none, defended = overfit["none"], overfit["l2:2e-2"].model
    norm = lambda m: float(sum((p.detach() ** 2).sum() for p in m.parameters()))  # noqa: E731
    assert norm(defended) < 0.5 * norm(none)
    gap_none, auc_none = _gap_and_auc(none)
    gap, auc = _gap_and_auc(defended)
    assert gap < gap_none - 0.05  # measured: 0.17 against 0.27
    assert auc < auc_none - 0.05  # measured: 0.57 against 0.67


def test_early_stopping_stops_early_keeps_its_best_epoch_and_leaks_less(
    overfit: dict[str, Any],
) -> None:
    fitted = overfit["early-stopping"]
    notes = fitted.notes
    assert notes["epochs_run"] < OVERFIT.epochs and "early stopping" in notes["stopped"]
    assert notes["best_epoch"] == notes["epochs_run"] - 3  # patience 3
    gaps = np.array(notes["gaps"])
    assert notes["gap"] == pytest.approx(gaps[notes["best_epoch"] - 1])
    holdout = DIGITS.subset(HOLDOUT)
    with torch.no_grad():
        kept = (fitted.model(holdout.features).argmax(1) == holdout.labels).float().mean()
    assert float(kept) == pytest.approx(notes["best_holdout_accuracy"])
    assert notes["gap"] == pytest.approx(fitted.train_accuracy - notes["best_holdout_accuracy"])
    gap_none, auc_none = _gap_and_auc(overfit["none"])
    gap, auc = _gap_and_auc(fitted.model)
    assert gap < gap_none - 0.1  # measured: 0.02 against 0.27
    assert auc < auc_none - 0.05  # measured: 0.56 against 0.67


def test_early_stopping_needs_a_holdout(tmp_path: Path) -> None:
    with pytest.raises(DefenseError, match="holdout"):
        parse_defense("early-stopping").fit(  # type: ignore[attr-defined]
            _mlp, NOISY, OVERFIT, DefenseData(), seed=0, folder=tmp_path
        )


def _record(epoch: int, train_acc: float, eval_acc: float) -> EpochRecord:
    return EpochRecord(epoch, 0.0, train_acc, 0.0, eval_acc)


@pytest.mark.parametrize(("tradeoff", "best"), [(0.0, 3), (0.5, 2), (1.0, 2), (10.0, 1)])
def test_gap_stopping_trades_holdout_accuracy_against_the_gap(tradeoff: float, best: int) -> None:
    """Scores h − α·(t − h): α = 0 keeps the best holdout accuracy, a large α the smallest
    gap."""
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = GapStopping(5, tradeoff)
    for epoch, (t, h) in enumerate([(0.5, 0.45), (0.7, 0.6), (1.0, 0.65)], start=1):
        state = TrainState(epoch, epoch, model, optimizer, record=_record(epoch, t, h))
        monitor.on_epoch_end(state)
    assert monitor.best_epoch == best


def test_gap_stopping_keeps_the_best_epoch_and_survives_a_restart(tmp_path: Path) -> None:
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = GapStopping(2, folder=tmp_path)
    history = [(0.5, 0.4), (0.8, 0.6), (0.9, 0.6), (1.0, 0.55)]
    saved = None
    for epoch in range(1, len(history) + 1):
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        state = TrainState(
            epoch, epoch, model, optimizer, record=_record(epoch, *history[epoch - 1])
        )
        monitor.on_epoch_end(state)
        if epoch == 2:
            saved = {k: v.clone() for k, v in model.state_dict().items()}
        if epoch < 4:
            assert state.stop_reason is None
    assert state.stop_reason and "best at epoch 2" in state.stop_reason
    assert monitor.best_epoch == 2 and monitor.best_gap == pytest.approx(0.2)
    assert monitor.gaps == pytest.approx([0.1, 0.2, 0.3, 0.45])
    assert (tmp_path / STATE_FILE).is_file()
    again = GapStopping(2, folder=tmp_path)
    assert again.best_epoch == 2 and again.waited == 2 and again.gaps == monitor.gaps
    assert saved is not None and again.best_state is not None
    torch.testing.assert_close(again.best_state["weight"], saved["weight"])
    replay = TrainState(4, 4, model, optimizer, record=_record(4, 1.0, 0.55))
    again.on_epoch_end(replay)  # an epoch already seen (a kill before the checkpoint) is not
    assert again.gaps == monitor.gaps and replay.stop_reason  # counted twice, and still stops


class _KilledError(Exception):
    pass


class _KillAt:
    """Raises after the epoch-end callbacks before it, i.e. before that epoch's checkpoint."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, state: TrainState) -> None:
        if state.epoch == self.epoch:
            raise _KilledError


def test_early_stopping_resumes_a_killed_run_to_the_same_model(tmp_path: Path) -> None:
    """Killed after the monitor saw epoch 3 but before the trainer's checkpoint of it: the
    re-run replays epoch 3 and ends with the uninterrupted run's best epoch, gaps and weights."""
    data, holdout = DIGITS.subset(MEMBERS), DIGITS.subset(HOLDOUT)
    config = TrainConfig(epochs=8, batch_size=30, lr=0.1, seed=0)

    def run(folder: Path, kill: int | None) -> tuple[GapStopping, nn.Module]:
        monitor = GapStopping(2, folder=folder)
        hooks: list[Any] = [monitor] + ([_KillAt(kill)] if kill else [])
        result = train(
            _mlp(0), data, config, eval_data=holdout, checkpoint_dir=folder, callbacks=hooks
        )
        return monitor, result.model

    whole, _ = run(tmp_path / "whole", None)
    with pytest.raises(_KilledError):
        run(tmp_path / "killed", 3)
    resumed, _ = run(tmp_path / "killed", None)
    assert resumed.gaps == pytest.approx(whole.gaps) and len(resumed.gaps) == len(whole.gaps)
    assert resumed.best_epoch == whole.best_epoch
    assert resumed.best_state is not None and whole.best_state is not None
    for key, value in whole.best_state.items():
        torch.testing.assert_close(resumed.best_state[key], value)


# --- dropout ----------------------------------------------------------------------------------


def test_dropout_model_drops_units_in_training_mode_only() -> None:
    defense = parse_defense("dropout:0.3")
    assert isinstance(defense, Dropout)
    model = _mlp(0, **defense.model_options({"dropout": 0.0}))
    layers = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert layers and all(m.p == 0.3 for m in layers)
    x = DIGITS.features[:32]
    torch.manual_seed(0)
    model.train()
    assert not torch.equal(model(x), model(x))
    model.eval()
    assert torch.equal(model(x), model(x))


def test_dropout_refuses_a_model_without_the_option(tmp_path: Path) -> None:
    defense = parse_defense("dropout")
    assert isinstance(defense, Dropout)
    defense.check_model("mlp")
    with pytest.raises(DefenseError, match="dropout option"):
        defense.check_model("logreg")

    def logreg(seed: int) -> nn.Module:
        options = defense.model_options({})
        return build_model("logreg", DIGITS.input_shape, DIGITS.num_classes, seed=seed, **options)

    with pytest.raises(DefenseError, match="dropout option"):
        defense.fit(logreg, NOISY, OVERFIT, DefenseData(), seed=0, folder=tmp_path)


# --- label smoothing --------------------------------------------------------------------------


@given(
    eps=st.floats(0.0, 0.85, allow_nan=False),
    k=st.integers(2, 12),
    seed=st.integers(0, 100),
)
def test_label_smoothing_targets_are_the_seeds(eps: float, k: int, seed: int) -> None:
    """PyTorch's smoothing s = ε·k/(k−1) is cross-entropy against targets 1−ε / ε/(k−1)."""
    if eps >= (k - 1) / k:
        with pytest.raises(DefenseError):
            LabelSmoothing(eps=eps).smoothing(k)
        return
    s = LabelSmoothing(eps=eps).smoothing(k)
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, k, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, k, (5,), generator=generator)
    target = torch.full((5, k), eps / (k - 1), dtype=torch.float64)
    target[torch.arange(5), labels] = 1 - eps
    want = -(target * torch.log_softmax(logits, 1)).sum(1)
    got = F.cross_entropy(logits, labels, reduction="none", label_smoothing=s)
    torch.testing.assert_close(got, want)


def test_label_smoothing_lowers_confidence_on_training_data(overfit: dict[str, Any]) -> None:
    plain, smoothed = overfit["none"], overfit["label-smoothing:0.2"]
    with torch.no_grad():
        top_plain = plain(NOISY.features).softmax(1).amax(1).mean()
        top_smoothed = smoothed.model(NOISY.features).softmax(1).amax(1).mean()
    assert top_smoothed < top_plain - 0.1  # measured: 0.68 against 0.83
    assert smoothed.train_accuracy > 0.8  # it still fits the (noisy) training labels


# --- stacking ---------------------------------------------------------------------------------


@given(n=st.integers(1, 300), k=st.integers(2, 9), seed=st.integers(0, 2**31 - 1))
def test_stacking_parts_are_disjoint_and_cover_the_rows(n: int, k: int, seed: int) -> None:
    if k > n:
        with pytest.raises(DefenseError):
            disjoint_parts(n, k, seed)
        return
    parts = disjoint_parts(n, k, seed)
    assert len(parts) == k
    joined = np.concatenate(parts)
    assert np.array_equal(np.sort(joined), np.arange(n))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(np.array_equal(a, b) for a, b in zip(parts, disjoint_parts(n, k, seed), strict=True))


def test_averaged_ensemble_returns_the_log_of_the_mean_probability() -> None:
    torch.manual_seed(0)
    members = [nn.Linear(4, 3), nn.Linear(4, 3)]
    x = torch.randn(6, 4)
    want = (members[0](x).softmax(1) + members[1](x).softmax(1)) / 2
    with torch.no_grad():
        torch.testing.assert_close(AveragedEnsemble(members)(x).exp(), want)


def test_stacking_members_learn_only_their_own_rows(tmp_path: Path) -> None:
    """Each member memorises the noisy labels of its own part and not of the others."""
    defense = parse_defense("stacking:2")
    assert isinstance(defense, Stacking)
    fitted = defense.fit(
        _wide, NOISY, replace(OVERFIT, epochs=12), DefenseData(), seed=5, folder=tmp_path
    )
    parts = defense.parts(len(NOISY), 5)
    assert fitted.notes["member_sizes"] == [len(p) for p in parts] == [50, 50]
    members = fitted.model.members
    with torch.no_grad():
        for i, member in enumerate(members):
            own = NOISY.subset(parts[i])
            other = NOISY.subset(parts[1 - i])
            acc_own = (member(own.features).argmax(1) == own.labels).float().mean()
            acc_other = (member(other.features).argmax(1) == other.labels).float().mean()
            assert acc_own > acc_other + 0.15
    assert 0 < fitted.train_accuracy <= 1


# --- augmentation -----------------------------------------------------------------------------


def _tabular(binary: bool, n: int = 400, d: int = 30) -> Dataset:
    generator = torch.Generator().manual_seed(4)
    features = torch.rand(n, d, generator=generator)
    features = (features < 0.2).float() if binary else features * 3 - 1
    labels = (features.sum(1) > features.sum(1).median()).long()
    return Dataset("synthetic", features, labels, 2, (d,), "tabular")


def test_augmentation_flips_binary_features_at_the_given_rate() -> None:
    data = _tabular(binary=True)
    defense = Augmentation(copies=2, flip=0.1)
    enlarged = defense.augmented(data, seed=0)
    assert len(enlarged) == 3 * len(data)
    assert torch.equal(enlarged.features[: len(data)], data.features)
    assert torch.equal(enlarged.labels, data.labels.repeat(3))
    copies = enlarged.features[len(data) :]
    assert bool(((copies == 0) | (copies == 1)).all())
    rate = float((copies != data.features.repeat(2, 1)).float().mean())
    assert abs(rate - 0.1) < 0.01
    assert torch.equal(defense.augmented(data, seed=0).features, enlarged.features)
    assert not torch.equal(defense.augmented(data, seed=1).features, enlarged.features)


def test_augmentation_adds_scaled_gaussian_noise_to_continuous_features() -> None:
    data = _tabular(binary=False, n=2000)
    enlarged = Augmentation(copies=1, noise=0.2).augmented(data, seed=0)
    noise = enlarged.features[len(data) :] - data.features
    ratio = noise.std(0) / data.features.std(0)
    assert torch.allclose(ratio, torch.full_like(ratio, 0.2), atol=0.02)
    assert abs(float(noise.mean())) < 0.01


def test_augmentation_trains_on_the_copies_and_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    data = _tabular(binary=True, n=64)
    config = TrainConfig(epochs=1, batch_size=32, seed=0)

    def build(seed: int) -> nn.Module:
        return build_model("mlp", (30,), 2, seed=seed, widths=[8])

    fitted = Augmentation().fit(build, data, config, DefenseData(), seed=0, folder=tmp_path / "a")
    assert fitted.notes["rows"] == 3 * 64 and 0 <= fitted.train_accuracy <= 1
    assert Augmentation().configure(TrainConfig()).augmentation is True
    private = replace(config, privacy=PrivacyConfig(epsilon=1.0))
    with pytest.raises(DefenseError, match="DP-SGD"):
        Augmentation().fit(build, data, private, DefenseData(), seed=0, folder=tmp_path / "b")
    text = Dataset(
        "tokens", torch.zeros(8, 5, dtype=torch.int64), torch.zeros(8).long(), 2, (5,), "text"
    )
    with pytest.raises(DefenseError, match="text"):
        Augmentation().augmented(text, seed=0)


# --- DP-SGD -----------------------------------------------------------------------------------


def test_dp_configures_private_training_with_the_defaults_rule() -> None:
    defense = parse_defense("dp:2:1e-6")
    assert isinstance(defense, DPSGD)
    recipe = TrainConfig(
        epochs=30,
        batch_size=128,
        lr=0.1,
        privacy=PrivacyConfig(noise_multiplier=3.0, accountant="rdp"),
    )
    config = defense.configure(defense.tuned(recipe, 1000))
    rule = dp_defaults(2.0, 1e-6, 1000)
    assert config.privacy is not None
    assert (config.privacy.epsilon, config.privacy.delta) == (2.0, 1e-6)
    assert config.privacy.noise_multiplier is None and config.privacy.accountant == "rdp"
    assert (config.batch_size, config.epochs, config.lr, config.optimizer) == (
        rule.batch_size,
        rule.epochs,
        rule.lr,
        rule.optimizer,
    )
    assert config.privacy.max_grad_norm == rule.max_grad_norm
    kept = parse_defense("dp:2:tune=recipe")
    assert kept.tuned(recipe, 1000) is recipe  # type: ignore[attr-defined]
    assert kept.configure(TrainConfig()).privacy.epsilon == 2.0  # type: ignore[attr-defined]


def test_dp_reports_epsilon_within_its_budget(tmp_path: Path) -> None:
    defense = parse_defense("dp:1:tune=recipe")
    data = DIGITS.subset(MEMBERS)
    config = TrainConfig(epochs=2, batch_size=30, lr=0.5, seed=0)
    fitted = defense.fit(_mlp, data, config, DefenseData(), seed=0, folder=tmp_path)  # type: ignore[attr-defined]
    assert fitted.epsilon is not None and 0.1 < fitted.epsilon <= 1.0
    assert math.isclose(fitted.notes["delta"], 1e-5)


def test_stacking_parts_and_member_seeds_follow_the_run_seed() -> None:
    """A seed not honoured would give every run the same split: two seeds, two splits."""
    stacking = Stacking(k=3)
    pairs = zip(stacking.parts(100, 0), stacking.parts(100, 1), strict=True)
    same = [np.array_equal(a, b) for a, b in pairs]
    assert not all(same)
    assert len({member_seed(s, i) for s in (0, 1) for i in range(3)}) == 6
