"""Adversarial regularisation (Nasr et al. 2018): the inference model's gain falls and a loss
attack weakens against λ = 0, at accuracy well above chance; λ = 0 is plain training; a killed
run resumes to the same weights; bad parameters are one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from privacylab.data import Dataset
from privacylab.defenses import DefenseData, DefenseError, parse_defense
from privacylab.defenses.base import accuracy
from privacylab.defenses.training import advreg as advreg_module
from privacylab.defenses.training.advreg import AdvReg, InferenceModel
from privacylab.models import build_model
from privacylab.training import PrivacyConfig, TrainConfig, train

CLASSES, DIM = 20, 60
CONFIG = TrainConfig(epochs=30, batch_size=80, lr=0.05)


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


DATA = synthetic(1200)
MEMBERS, HOLDOUT, TEST = (DATA.subset(np.arange(i, i + 400)) for i in (0, 400, 800))
EXTRA = DefenseData(holdout=HOLDOUT)


def build(seed: int) -> torch.nn.Module:
    return build_model("mlp", (DIM,), CLASSES, seed=seed, widths=[64])


def loss_auc(model: torch.nn.Module) -> float:
    """AUC of the loss attack (Yeom et al. 2018): members have the lower loss."""
    with torch.no_grad():
        losses = [
            F.cross_entropy(model(d.features), d.labels, reduction="none") for d in (MEMBERS, TEST)
        ]
    truth = np.r_[np.ones(len(MEMBERS)), np.zeros(len(TEST))]
    return float(roc_auc_score(truth, -torch.cat(losses).numpy()))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[object, object]:
    """λ = 0 and λ = 3 fits and plain training, on one thread: h's many small steps are
    slowed by thread hand-offs far more than they are sped up (measured 12x on a loaded
    2-core machine), and one thread count for all three keeps their sums comparable."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out: dict[object, object] = {}
        for lam in (0.0, 3.0):
            folder = tmp_path_factory.mktemp(f"advreg{lam:g}")
            out[lam] = AdvReg(lam=lam).fit(build, MEMBERS, CONFIG, EXTRA, seed=0, folder=folder)
        out["plain"] = train(build(0), MEMBERS, CONFIG, eval_data=HOLDOUT).model
    finally:
        torch.set_num_threads(threads)
    return out


def test_lambda_zero_is_plain_training(runs: dict) -> None:
    plain = runs["plain"]
    pairs = zip(plain.state_dict().values(), runs[0.0].model.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_inference_gain_falls(runs: dict) -> None:
    free, defended = (np.array(runs[lam].notes["inference_accuracy"]) for lam in (0.0, 3.0))
    assert len(free) == len(defended) == CONFIG.epochs
    # Against the undefended classifier h learns to tell members apart as it overfits ...
    assert free[-5:].mean() > free[:5].mean() + 0.1
    # ... against the defended one it gains markedly less.
    assert defended[-5:].mean() < free[-5:].mean() - 0.04


def test_loss_attack_weaker_accuracy_above_chance(runs: dict) -> None:
    free, defended = runs[0.0].model, runs[3.0].model
    assert loss_auc(defended) < loss_auc(free) - 0.03
    assert accuracy(defended, TEST) > 0.35  # chance is 0.05
    assert runs[3.0].train_accuracy < runs[0.0].train_accuracy


def test_killed_run_resumes_to_same_weights(tmp_path: Path, monkeypatch) -> None:
    config = TrainConfig(epochs=4, batch_size=100, lr=0.05)
    defense = AdvReg(lam=3, warmup=1)
    whole = defense.fit(build, MEMBERS, config, EXTRA, seed=1, folder=tmp_path / "whole").model
    original = advreg_module.AdversarialGame.on_epoch_end

    def killed(self, state) -> None:  # dies after h's save, before the trainer's (epoch 2)
        original(self, state)
        if state.epoch == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(advreg_module.AdversarialGame, "on_epoch_end", killed)
    with pytest.raises(KeyboardInterrupt):
        defense.fit(build, MEMBERS, config, EXTRA, seed=1, folder=tmp_path / "killed")
    monkeypatch.setattr(advreg_module.AdversarialGame, "on_epoch_end", original)
    resumed = defense.fit(build, MEMBERS, config, EXTRA, seed=1, folder=tmp_path / "killed")
    for a, b in zip(whole.state_dict().values(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert len(resumed.notes["inference_accuracy"]) == config.epochs


def test_inference_model_shape() -> None:
    h = InferenceModel(CLASSES)
    probs = torch.softmax(torch.randn(7, CLASSES), 1)
    assert h(probs, torch.arange(7)).shape == (7,)
    assert h.predictions[0].out_features == 1024 and h.labels[0].out_features == 128


def test_spec_and_bad_input(tmp_path: Path) -> None:
    assert parse_defense("advreg:3").params["lam"] == 3.0
    assert parse_defense("advreg:1:k=2").params["k"] == 2
    for spec in ("advreg:-1", "advreg:3:k=0", "advreg:nan", "advreg:penalty=sq"):
        with pytest.raises(DefenseError) as error:
            parse_defense(spec)
        assert "\n" not in str(error.value)
    with pytest.raises(DefenseError, match="holdout"):
        AdvReg().fit(build, MEMBERS, CONFIG, DefenseData(), seed=0, folder=tmp_path)
    private = TrainConfig(epochs=1, privacy=PrivacyConfig(epsilon=8.0))
    with pytest.raises(DefenseError, match="DP-SGD"):
        AdvReg().fit(build, MEMBERS, private, EXTRA, seed=0, folder=tmp_path)


def test_train_defended_round_trip(tmp_path: Path) -> None:
    from privacylab.attacks.membership.references import Recipe
    from privacylab.data import load_dataset
    from privacylab.defenses.fitting import load_defended, train_defended

    config = TrainConfig(epochs=2, batch_size=100, lr=0.05)
    recipe = Recipe("digits", "mlp", config.to_dict(), {"widths": [16]}, defense="advreg:1")
    rows = np.random.default_rng(0).permutation(1797)
    job = {
        "recipe": recipe.to_dict(),
        "indices": rows[:200].tolist(),
        "holdout": rows[200:400].tolist(),
        "public": None,
        "seed": 2,
        "folder": str(tmp_path / "model"),
    }
    record = train_defended(job)
    assert record["defense"] == parse_defense("advreg:1").spec
    assert len(record["notes"]["inference_accuracy"]) == 2
    assert not (tmp_path / "model" / "checkpoint").exists()
    digits = load_dataset("digits")
    direct = AdvReg(lam=1).fit(
        lambda seed: build_model("mlp", digits.input_shape, 10, seed=seed, widths=[16]),
        digits.subset(rows[:200]),
        TrainConfig(**{**config.to_dict(), "seed": 2}),
        DefenseData(holdout=digits.subset(rows[200:400])),
        seed=2,
        folder=tmp_path / "direct",
    )
    loaded = load_defended(tmp_path / "model")
    pairs = zip(loaded.state_dict().values(), direct.model.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_inference_model_takes_k_steps_per_classifier_step_on_members_vs_holdout() -> None:
    """Alg. 1: k steps of h before the classifier's first step and after every one, each on a
    batch of members and a batch of the defender's reference set (never the test data)."""
    config = TrainConfig(epochs=2, batch_size=100, lr=0.05)  # 400 members: 4 steps an epoch
    for k in (1, 3):
        model = build(0)
        game = AdvReg(lam=1, k=k, warmup=0).game(model, MEMBERS, EXTRA, config, seed=0)
        assert game.members is MEMBERS and game.references is HOLDOUT
        seen: list[int] = []
        batch = game._batch

        def recording(data: Dataset, device: torch.device, batch=batch, seen=seen):
            seen.append(len(data) if data is MEMBERS else -len(data) if data is HOLDOUT else 0)
            return batch(data, device)

        game._batch = recording  # type: ignore[method-assign]
        train(model, MEMBERS, config, regularizer=game, callbacks=[game])
        steps = 2 * 4 + 1
        assert seen == [400, -400] * (k * steps)
        first = next(game.inference.parameters())
        assert int(game.optimizer.state[first]["step"]) == k * steps


def test_penalty_is_lambda_times_h_or_log_h_after_warmup() -> None:
    """The classifier's term per member: λ·h (prob) or λ·log h (eq. 7, log), zero during the
    warm-up epochs; its gradient reaches the logits, never h."""
    logits = torch.randn(6, CLASSES, requires_grad=True)
    labels = torch.arange(6)
    for penalty, g in (("prob", torch.sigmoid), ("log", F.logsigmoid)):
        game = AdvReg(lam=2.5, penalty=penalty, warmup=1).game(
            build(0), MEMBERS, EXTRA, CONFIG, seed=0
        )
        game.primed = True
        assert torch.equal(game(build(0), MEMBERS.features[:6], labels, logits), torch.zeros(6))
        game.epochs_done = 1
        term = game(build(0), MEMBERS.features[:6], labels, logits)
        with torch.no_grad():
            expected = 2.5 * g(game.inference(torch.softmax(logits, 1), labels))
        torch.testing.assert_close(term, expected)
        term.sum().backward()
        assert logits.grad is not None and logits.grad.abs().sum() > 0
        assert all(p.grad is None for p in game.inference.parameters())
        logits.grad = None


def test_inference_state_follows_the_classifier_to_its_device() -> None:
    """h's Adam moments restored from a checkpoint sit on the CPU; once the trainer has moved
    the classifier, h and those moments must be on its device too (else a resumed GPU run
    fails at h's first step). The meta device stands in for an accelerator."""
    model = build(0)
    game = AdvReg().game(model, MEMBERS, EXTRA, CONFIG, seed=0)
    game.inference_steps()
    model.to("meta")
    game._device()
    assert all(p.device.type == "meta" for p in game.inference.parameters())
    for slots in game.optimizer.state.values():
        assert slots["exp_avg"].device.type == "meta"
        assert slots["exp_avg_sq"].device.type == "meta"


def test_resume_without_the_inference_models_checkpoint_is_refused(tmp_path: Path) -> None:
    """A classifier resumed against a fresh h would silently give other weights than the
    uninterrupted run: one-line DefenseError instead."""
    config = TrainConfig(epochs=2, batch_size=100, lr=0.05)
    defense = AdvReg(lam=1, warmup=0)
    defense.fit(build, MEMBERS, config, EXTRA, seed=1, folder=tmp_path)
    shutil.rmtree(tmp_path / "checkpoint" / "inference")
    with pytest.raises(DefenseError, match="inference model") as error:
        defense.fit(build, MEMBERS, config, EXTRA, seed=1, folder=tmp_path)
    assert "\n" not in str(error.value)
