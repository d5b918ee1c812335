"""The backdoor job (`privacylab.backdoor`): the four disjoint row sets, the folder a BadNets run
writes (its numbers re-derived here from the saved models with a hand-stamped trigger, its
poisons made only of the attacker's rows), resuming (finished models reused, a lost model
retrained to the same numbers), the DP-SGD bound, the trojan path, and `defend_backdoor`
(before = the attack's own numbers; flagged-row precision/recall recomputed from the stored
indices; reuse and --fresh). One tiny MLP recipe on sklearn's 8x8 digits, one folder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.backdoor import (
    HOLDOUT,
    BackdoorConfig,
    BackdoorError,
    check_backdoor_config,
    defend_backdoor,
    external_images,
    load_backdoor_run,
    row_precision_recall,
    run_backdoor_attack,
    split_rows,
)
from privacylab.data import load_dataset
from privacylab.models import load_model

TINY = {"model": "mlp", "model_options": {"widths": [32]}, "epochs": 15, "lr": 0.01}
"""A victim that trains in well under a second on 400 digits."""

TRAIN, TEST = 400, 200


def tiny(**changes: object) -> BackdoorConfig:
    """A BadNets game on digits: a 2x2 white corner, 5% poison, target 0."""
    options: dict[str, object] = {
        "dataset": "digits",
        "method": "badnets",
        "poison_rate": 0.05,
        "trigger": "square:2@corner",
        "train_size": TRAIN,
        "test_size": TEST,
        "recipe": dict(TINY),
    }
    options.update(changes)
    return BackdoorConfig(**options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def game(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("badnets")
    return folder, run_backdoor_attack(tiny(), folder)


def _predict(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model.eval()(x).argmax(1).numpy()


def _corner(x: torch.Tensor, size: int = 2) -> torch.Tensor:
    """The trigger by hand: the bottom-right size x size pixels set to 1."""
    out = x.clone()
    out[:, :, -size:, -size:] = 1.0
    return out


# ---------------------------------------------------------------------------- splits, config


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(60, 400),
    train=st.integers(1, 30),
    test=st.integers(1, 30),
    seed=st.integers(0, 2**32 - 1),
)
def test_split_rows_are_disjoint_and_cover_every_row(rows, train, test, seed) -> None:
    config = tiny(train_size=train, test_size=test, seed=seed)
    if train + test + HOLDOUT + 1 > rows:
        with pytest.raises(BackdoorError, match=f"has {rows} rows"):
            split_rows(rows, config)
        return
    parts = split_rows(rows, config)
    sizes = {k: len(v) for k, v in parts.items()}
    assert sizes == {
        "test": test,
        "holdout": HOLDOUT,
        "train": train,
        "source": rows - train - test - HOLDOUT,
    }
    joined = np.concatenate(list(parts.values()))
    assert sorted(joined.tolist()) == list(range(rows))
    again = split_rows(rows, config)
    assert all(np.array_equal(parts[k], again[k]) for k in parts)


def test_config_round_trip_and_one_line_refusals() -> None:
    config = tiny(epsilon=2.0, attack_options={"neurons": 2})
    assert BackdoorConfig.from_dict(config.to_dict()) == config
    assert tiny(epsilon=2.0, delta=1e-7).victim_recipe().delta == 1e-7
    with pytest.raises(BackdoorError, match="unknown backdoor config keys: colour"):
        BackdoorConfig.from_dict({**config.to_dict(), "colour": 1})
    refusals = {
        "poison rate must be in \\(0, 1\\)": tiny(poison_rate=0.0),
        "poison rate must be in \\(0, 1\\), got 1.5": tiny(poison_rate=1.5),
        "exactly one of --poison-rate or --poisons": tiny(poisons=10),
        "exactly one of": tiny(poison_rate=None),
        "unknown backdoor method 'blend'; choose one of badnets, trojan": tiny(method="blend"),
        "unknown mode": tiny(mode="one-to-one"),
        "all-to-all applies to badnets only": tiny(method="trojan", mode="all-to-all"),
        "--epsilon trains a DP-SGD classifier": tiny(
            method="clip-backdoor", poisons=5, poison_rate=None, epsilon=1.0
        ),
        "--delta must be in \\(0, 1\\)": tiny(delta=1.0),
        "--epsilon must be a finite number > 0": tiny(epsilon=math.inf),
        "bad victim recipe: unknown victim recipe keys: depth": tiny(recipe={"depth": 3}),
        "give the victim's δ with --delta": tiny(epsilon=2.0, recipe={"delta": 1e-3}),
        "recipe epochs must be a whole number >= 1": tiny(recipe={"epochs": 0}),
        "uses no trigger": tiny(method="clip-poison", trigger="square:2@corner"),
        "have their own options \\(--trigger": tiny(attack_options={"trigger": "x"}),
        "unknown trigger shape 'star'": tiny(trigger="star:3@corner"),
        "bad trigger 'corner:3'": tiny(trigger="corner:3"),
    }
    for pattern, bad in refusals.items():
        with pytest.raises(Exception, match=pattern) as caught:
            bad.validate()
        assert "\n" not in str(caught.value)


def test_dataset_limits_are_checked_before_any_work() -> None:
    with pytest.raises(BackdoorError, match=r"trigger size 9 is larger than the 8x8 images"):
        check_backdoor_config(tiny(trigger="square:9@corner"))
    with pytest.raises(BackdoorError, match=r"--target-class must be in \[0, 10\)"):
        check_backdoor_config(tiny(target_class=10))
    with pytest.raises(BackdoorError, match="digits has 1797 rows"):
        check_backdoor_config(tiny(train_size=1500))
    with pytest.raises(BackdoorError, match="stamp \\(C, H, W\\) images"):
        check_backdoor_config(tiny(dataset="breast_cancer"))
    with pytest.raises(BackdoorError, match="badnets takes no option colour; it takes"):
        check_backdoor_config(tiny(attack_options={"colour": 1}))


def test_external_images_are_another_source_resized() -> None:
    digits = load_dataset("digits")
    mnist_like = external_images(load_dataset("mnist5k"), count=7, seed=3)
    assert tuple(mnist_like.shape) == (7, 1, 28, 28)
    assert float(mnist_like.min()) >= 0.0 and float(mnist_like.max()) <= 1.0
    assert torch.equal(mnist_like, external_images(load_dataset("mnist5k"), count=7, seed=3))
    small = external_images(digits, count=4)
    assert tuple(small.shape) == (4, 1, 8, 8)


def test_row_precision_recall_closed_form() -> None:
    poisons = np.arange(100, 110)
    counted = row_precision_recall(np.array([1, 100, 101, 101, 105]), poisons)
    assert counted == {
        "flagged": 4,
        "poisons": 10,
        "true_positives": 3,
        "precision": 0.75,
        "recall": 0.3,
    }
    assert row_precision_recall(None, poisons)["precision"] is None
    assert row_precision_recall(np.array([], dtype=int), poisons)["precision"] is None


# ------------------------------------------------------------------------------- the game


def test_folder_numbers_match_a_re_derivation(game) -> None:
    folder, result = game
    for name in ("config.json", "splits.json", "poisons.safetensors", "result.json"):
        assert (folder / name).is_file()
    assert json.loads((folder / "result.json").read_text()) == result
    assert result["poisons"] == round(0.05 * TRAIN / 0.95) == 21
    assert result["poison_rate"] == pytest.approx(21 / 421)
    assert result["epsilon"] is None and result["delta"] is None and result["z_score"] is None

    data = load_dataset("digits")
    splits = json.loads((folder / "splits.json").read_text())
    test = data.subset(splits["test"])
    truth = test.labels.numpy()
    model, _, meta = load_model(folder / "model")
    clean, _, clean_meta = load_model(folder / "clean")
    assert meta["backdoor"]["trigger"] == {"spec": "square:2@corner"}
    assert meta["backdoor"]["role"] == "attacked" and clean_meta["backdoor"]["role"] == "clean"
    assert meta["backdoor"]["target_class"] == 0 and meta["backdoor"]["method"] == "badnets"

    counted = truth != 0
    asr = float(np.mean(_predict(model, _corner(test.features))[counted] == 0))
    assert result["asr"] == pytest.approx(asr)
    assert result["clean_accuracy"] == pytest.approx(
        np.mean(_predict(model, test.features) == truth)
    )
    assert result["baseline_accuracy"] == pytest.approx(
        np.mean(_predict(clean, test.features) == truth)
    )
    baseline = float(np.mean(_predict(clean, _corner(test.features))[counted] == 0))
    assert result["baseline_asr"] == pytest.approx(baseline)
    assert result["asr"] >= 0.8 > 0.3 >= result["baseline_asr"]


def test_poisons_are_the_attackers_own_rows_stamped(game) -> None:
    folder, result = game
    from safetensors.torch import load_file

    data = load_dataset("digits")
    splits = json.loads((folder / "splits.json").read_text())
    poisons = load_file(str(folder / "poisons.safetensors"))
    assert poisons["labels"].tolist() == [0] * result["poisons"]
    assert torch.all(poisons["features"][:, :, -2:, -2:] == 1.0)
    source = set(splits["source"])
    keep = torch.ones(8, 8, dtype=torch.bool)
    keep[-2:, -2:] = False
    for row in poisons["features"]:
        same = (data.features[:, 0][:, keep] == row[0][keep]).all(1).nonzero().flatten()
        assert same.numel() >= 1 and set(same.tolist()) <= source
        assert data.labels[same[0]] != 0


def test_a_rerun_reuses_everything_and_a_lost_model_is_retrained_alike(game) -> None:
    folder, result = game
    stamps = {p: p.stat().st_mtime_ns for p in folder.glob("*/model.safetensors")}
    seen: list[str] = []
    again = run_backdoor_attack(tiny(), folder, progress=lambda s, d, t: seen.append(s))
    assert again == result
    assert seen == ["result (reused)"]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    (folder / "result.json").unlink()
    for name in ("model.safetensors", "model.json"):
        (folder / "model" / name).unlink()
    clean_stamp = (folder / "clean" / "model.safetensors").stat().st_mtime_ns
    redone = run_backdoor_attack(tiny(), folder)
    assert (folder / "clean" / "model.safetensors").stat().st_mtime_ns == clean_stamp
    same = ("asr", "clean_accuracy", "baseline_accuracy", "baseline_asr", "poisons")
    assert {k: redone[k] for k in same} == {k: result[k] for k in same}
    assert not (folder / "checkpoints").exists()


def test_a_folder_of_another_game_is_refused(game) -> None:
    folder, _ = game
    with pytest.raises(BackdoorError, match=r"other settings \(poison_rate, target_class\)"):
        run_backdoor_attack(tiny(poison_rate=0.1, target_class=3), folder)
    with pytest.raises(BackdoorError, match=r"other settings \(recipe\)"):
        run_backdoor_attack(tiny(recipe={**TINY, "epochs": 16}), folder)
    saved = json.loads((folder / "config.json").read_text())
    assert saved["recipe"]["epochs"] == 15 and saved["recipe"]["model"] == "mlp"
    assert saved["recipe"]["batch_size"] == BackdoorConfig().victim_recipe().batch_size


def _sorted_rows(x: torch.Tensor) -> list[tuple[float, ...]]:
    return sorted(tuple(row) for row in x.flatten(1).tolist())


def test_the_defender_receives_x_and_p_shuffled(game) -> None:
    """The received set is X ∪ P (checked row by row against splits.json and the poisons
    file), the poisons are not its last rows, and `poison_rows` points at exactly them."""
    from safetensors.torch import load_file

    folder, result = game
    run = load_backdoor_run(folder)
    data = load_dataset("digits")
    splits = json.loads((folder / "splits.json").read_text())
    poisons = load_file(str(folder / "poisons.safetensors"))
    rows = run.poison_rows
    assert len(run.training) == TRAIN + result["poisons"] == TRAIN + len(rows)
    assert not np.array_equal(rows, np.arange(TRAIN, len(run.training)))
    others = np.setdiff1d(np.arange(len(run.training)), rows)
    assert _sorted_rows(run.training.features[rows]) == _sorted_rows(poisons["features"])
    assert run.training.labels[rows].tolist() == poisons["labels"].tolist()
    x = data.subset(splits["train"])
    assert _sorted_rows(run.training.features[others]) == _sorted_rows(x.features)
    assert sorted(run.training.labels[others].tolist()) == sorted(x.labels.tolist())
    again = load_backdoor_run(folder)
    assert np.array_equal(again.poison_rows, rows)
    assert torch.equal(again.training.features, run.training.features)


def test_defend_before_is_the_attack_and_rows_are_scored_against_the_poisons(game) -> None:
    folder, result = game
    out = defend_backdoor(folder / "model", "spectral")
    assert out["before"]["asr"] == pytest.approx(result["asr"])
    assert out["before"]["accuracy"] == pytest.approx(result["clean_accuracy"])
    assert set(out["after"]) >= {"accuracy", "asr", "rejected_clean", "rejected_triggered"}
    assert out["target_class"] == 0 and out["attack"] == "badnets"
    assert out["correct_class"] == (
        None if out["flagged_class"] is None else out["flagged_class"] == 0
    )
    stored = json.loads((folder / "defenses" / "spectral.json").read_text())
    flagged = set(stored["flagged_rows"])
    poisons = set(load_backdoor_run(folder).poison_rows.tolist())
    assert len(poisons) == result["poisons"]
    rows = out["rows"]
    assert rows["flagged"] == len(flagged) and rows["poisons"] == len(poisons)
    assert rows["true_positives"] == len(flagged & poisons)
    assert rows["recall"] == pytest.approx(len(flagged & poisons) / len(poisons))
    assert "flagged_rows" not in out

    stamp = (folder / "defenses" / "spectral.json").stat().st_mtime_ns
    assert defend_backdoor(folder, "spectral") == out
    assert (folder / "defenses" / "spectral.json").stat().st_mtime_ns == stamp
    fresh = defend_backdoor(folder, "spectral", fresh=True)
    assert (folder / "defenses" / "spectral.json").stat().st_mtime_ns != stamp
    assert fresh["rows"] == out["rows"]


def test_a_killed_defence_resumes_its_retraining(game) -> None:
    """Killed after the retraining's last epoch (before its result is stored): the checkpoint
    is kept, named by the cleansed set, and the re-run resumes it to the numbers of a fresh
    run; the finished run leaves no checkpoint."""
    folder, _ = game
    options = {"epsilon": 0.2}

    class KilledError(Exception):
        pass

    def kill(stage: str, done: float, total: float) -> None:
        if stage.endswith("retrain") and total > 0 and done == total:
            raise KilledError

    with pytest.raises(KilledError):
        defend_backdoor(folder, "spectral", options=options, fresh=True, progress=kill)
    (left,) = (folder / "checkpoints").glob("spectral-retrain-*")
    saved = left / "checkpoint.safetensors"
    stamp = saved.stat().st_mtime_ns
    seen: list[int] = []

    def look(stage: str, done: float, total: float) -> None:
        if stage.endswith("retrain") and total > 0 and done == total:
            seen.append(saved.stat().st_mtime_ns)

    resumed = defend_backdoor(folder, "spectral", options=options, progress=look)
    assert seen == [stamp], "the re-run trained no epoch again"
    assert not (folder / "checkpoints").exists()
    again = defend_backdoor(folder, "spectral", options=options, fresh=True)
    assert resumed["after"] == again["after"] and resumed["rows"] == again["rows"]


def test_defend_refuses_unknown_methods_options_and_other_folders(game, tmp_path) -> None:
    folder, _ = game
    with pytest.raises(BackdoorError, match="unknown backdoor defence 'magic'; choose one of"):
        defend_backdoor(folder, "magic")
    with pytest.raises(BackdoorError, match="spectral takes no option colour"):
        defend_backdoor(folder, "spectral", options={"colour": 1})
    with pytest.raises(BackdoorError, match="holds no backdoor run"):
        defend_backdoor(tmp_path, "spectral")
    clip = tmp_path / "clip"
    clip.mkdir()
    config = tiny(method="clip-backdoor", poisons=5, poison_rate=None, trigger=None)
    (clip / "config.json").write_text(json.dumps(config.to_dict()))
    with pytest.raises(BackdoorError, match="the backdoor defences inspect classifiers"):
        load_backdoor_run(clip)


# ------------------------------------------------------------------- DP-SGD and the trojan


def test_dp_sgd_victim_reports_the_group_privacy_bound(tmp_path) -> None:
    from privacylab.defenses.backdoor.dp import poisoning_asr_bound

    config = tiny(epsilon=4.0, poisons=3, poison_rate=None, recipe={**TINY, "epochs": 2})
    result = run_backdoor_attack(config, tmp_path)
    assert result["epsilon"] == 4.0 and result["delta"] == 1e-5
    spent = result["privacy"]["epsilon"]
    assert 0 < spent <= 4.0 + 1e-9
    bound = poisoning_asr_bound(spent, 1e-5, 3, result["baseline_asr"])
    assert result["asr_bound"] == pytest.approx(bound)
    assert result["baseline_asr"] <= result["asr_bound"] <= 1.0


def test_trojan_path_saves_the_retrained_model(tmp_path) -> None:
    cheap = {
        "trigger_steps": 20,
        "images_per_class": 2,
        "inversion_steps": 10,
        "retrain_epochs": 2,
        "tv_iterations": 2,
    }
    config = tiny(method="trojan", trigger="square:3@corner", attack_options=cheap)
    result = run_backdoor_attack(config, tmp_path)
    assert result["method"] == "trojan" and result["poisons"] == 0
    assert set(result["details"]) >= {"orig", "orig_dec", "orig_tri", "ext_tri"}
    model, _, meta = load_model(tmp_path / "model")
    assert meta["backdoor"]["trigger"]["spec"] == "square:3@corner"
    run = load_backdoor_run(tmp_path)
    assert len(run.poison_rows) == 0 and len(run.training) == TRAIN
    test = run.test
    stamped = run.trigger.stamp(test.features, torch.Generator().manual_seed(1))
    counted = test.labels.numpy() != 0
    asr = float(np.mean(_predict(model, stamped)[counted] == 0))
    assert result["asr"] == pytest.approx(asr)
