"""The memorization job (`privacylab.memorize`, issue 18): the split and the secret's rows
(re-derived from the seed), every registered method through the whole game on a tiny digits
MLP (the contract keys; the numbers re-derived from the saved folder: test accuracy of the
saved models, LSB and sign bits read by hand from the released weights, capacity abuse's
query count ⌈bits / ⌊log2 10⌋⌉), the weight checks run on both models, LSB destroyed by
re-quantisation, the query detector flagging capacity abuse's synthetic queries, resuming
(a deleted result is rebuilt from the saved models with no training; a lost released model
is retrained to the same numbers) and every refusal as one line before any training."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import privacylab.attacks.memorization as memorization
from privacylab.attacks.memorization import MemorizationTask, SecretLayout, make_memorization
from privacylab.data import load_dataset
from privacylab.errors import PrivacylabError
from privacylab.memorize import (
    DEFAULTS,
    HOLDOUT,
    MemorizationConfig,
    MemorizationJobError,
    check_memorization_config,
    method_defaults,
    run_memorization_job,
    secret_rows,
    split_rows,
)
from privacylab.models import load_model
from privacylab.target import Access, Target

TINY = {"model": "mlp", "model_options": {"widths": [64]}, "epochs": 3, "lr": 0.01}
"""A holder's recipe that trains in about a second on 500 digits: 4,810 parameters."""

TRAIN, TEST = 500, 300

CONTRACT = {"method", "clean_accuracy", "honest_accuracy", "recovered", "bit_accuracy", "psnr",
            "queries", "folder", "epsilon", "delta", "items", "pixel_bits", "checks"}  # fmt: skip

SETTINGS = {
    "lsb": {},
    "correlation": {"bits": 20 * 64 * 8},
    "sign": {"bits": 4096},
    "capacity": {
        "recipe": {**TINY, "epochs": 20},
        "bits": 2 * 64 * 4,
        "pixel_bits": 4,
        "attack_options": {"generator": "noise"},
    },
}
"""Each method's tiny game: lsb with its defaults (100 8-bit images in the low 16 bits of
4,810 float32s); correlation 20 items; sign 16 4-bit images (4,096 of the 4,810 signs);
capacity 2 4-bit images (171 label queries of uniform-noise inputs), trained longer so the
synthetic rows are learnt."""


def tiny(**changes: object) -> MemorizationConfig:
    options: dict[str, object] = {
        "dataset": "digits",
        "method": "lsb",
        "train_size": TRAIN,
        "test_size": TEST,
        "recipe": dict(TINY),
    }
    options.update(changes)
    return MemorizationConfig(**options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def games(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("memorization")
    out = {}
    for method, extra in SETTINGS.items():
        folder = root / method
        out[method] = folder, run_memorization_job(tiny(method=method, **extra), folder)
    return out


def _accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model.eval()(x).argmax(1) == y).double().mean())


def _secret(folder: Path, result: dict) -> tuple[np.ndarray, np.ndarray]:
    """(the secret's quantised values (items, 64), the test rows) from splits.json, by hand."""
    splits = json.loads((folder / "splits.json").read_text())
    data = load_dataset("digits")
    train = np.asarray(splits["train"])
    rows = train[np.random.default_rng(0).permutation(len(train))[: result["items"]]]
    assert rows.tolist() == result["secret_rows"]
    levels = 2 ** result["pixel_bits"] - 1
    pixels = data.features[torch.as_tensor(rows)].reshape(len(rows), -1).numpy()
    return np.rint(pixels * levels).astype(np.int64), np.asarray(splits["test"])


def _stream(values: np.ndarray, bits: int) -> np.ndarray:
    """MSB-first bits of each value, by shifting."""
    shifts = np.arange(bits - 1, -1, -1)
    return ((values.reshape(-1, 1) >> shifts) & 1).reshape(-1)


def _weights(folder: Path) -> np.ndarray:
    model, _, _ = load_model(folder / "model")
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


# ----------------------------------------------------------------------- split and secret


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(20, 600),
    train=st.integers(1, 300),
    test=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_split_rows_are_disjoint(rows, train, test, seed) -> None:
    config = tiny(train_size=train, test_size=test, seed=seed)
    if train + test > rows:
        with pytest.raises(MemorizationJobError, match=f"has {rows} rows"):
            split_rows(rows, config)
        return
    parts = split_rows(rows, config)
    assert len(parts["test"]) == test and len(parts["train"]) == train
    assert len(parts["holdout"]) == min(HOLDOUT, rows - train - test)
    joined = np.concatenate(list(parts.values()))
    assert len(np.unique(joined)) == len(joined) and joined.max() < rows
    order = np.random.default_rng(seed).permutation(rows)
    assert np.array_equal(parts["test"], order[:test])
    assert np.array_equal(parts["train"], order[test : test + train])


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 500), items=st.integers(1, 500), seed=st.integers(0, 1000))
def test_secret_rows_are_a_seeded_prefix(rows, items, seed) -> None:
    if items > rows:
        with pytest.raises(MemorizationJobError, match=f"{items} items exceed the {rows}"):
            secret_rows(rows, items, seed)
        return
    chosen = secret_rows(rows, items, seed)
    more = secret_rows(rows, rows, seed)
    assert np.array_equal(chosen, more[:items]) and len(set(chosen.tolist())) == items


def test_delta_reaches_the_training() -> None:
    """--delta is the δ DP-SGD trains at (it was reported but the recipe's 1e-5 was used)."""
    recipe = tiny(method="sign", epsilon=8.0, delta=1e-6).victim_recipe()
    assert recipe.delta == 1e-6 and recipe.epsilon == 8.0
    privacy = recipe.config(0).privacy
    assert privacy is not None and privacy.delta == 1e-6 and privacy.epsilon == 8.0


def test_method_defaults_fit_the_default_setting() -> None:
    for method in memorization.memorization_names():
        items, bits = method_defaults(method)
        assert DEFAULTS.get(method, (items, bits)) == (items, bits), method
        prepared = check_memorization_config(MemorizationConfig(method=method))
        assert prepared.layout.items == items and prepared.layout.value_bits == bits


# ------------------------------------------------------------------------------ the games


def test_every_method_gives_the_contract_keys(games) -> None:
    assert set(games) == set(memorization.memorization_names())
    for method, (folder, result) in games.items():
        assert set(result) >= CONTRACT, method
        assert result["method"] == method and result["folder"] == str(folder.resolve())
        assert json.loads((folder / "result.json").read_text()) == result
        for name in ("config.json", "splits.json", "results.json", "index.html"):
            assert (folder / name).is_file(), (method, name)
        assert not (folder / "checkpoints").exists()
        assert result["epsilon"] is None and result["delta"] is None
        assert 0.5 <= result["bit_accuracy"] <= 1.0, method


def test_accuracies_are_those_of_the_saved_models(games) -> None:
    data = load_dataset("digits")
    for folder, result in games.values():
        _, test = _secret(folder, result)
        x, y = data.features[torch.as_tensor(test)], data.labels[torch.as_tensor(test)]
        honest, _, meta = load_model(folder / "honest")
        released, _, _ = load_model(folder / "model")
        assert meta["memorization"]["role"] == "honest"
        assert result["honest_accuracy"] == pytest.approx(_accuracy(honest, x, y), abs=1e-9)
        assert result["clean_accuracy"] == pytest.approx(_accuracy(released, x, y), abs=1e-9)


def test_lsb_bits_read_by_hand_are_the_secret(games) -> None:
    folder, result = games["lsb"]
    values, _ = _secret(folder, result)
    assert result["items"] == 100 and result["pixel_bits"] == 8
    low = _weights(folder).view(np.uint32).astype(np.int64) & 0xFFFF
    stream = _stream(low, 16)[: values.size * 8]
    assert np.array_equal(stream, _stream(values, 8))
    assert result["bit_accuracy"] == 1.0 and result["recovered"] == result["items"]
    honest, _, _ = load_model(folder / "honest")
    weights = torch.cat([p.detach().reshape(-1) for p in honest.parameters()]).numpy()
    high = _weights(folder).view(np.uint32) >> 16
    assert np.array_equal(high, weights.view(np.uint32) >> 16)
    assert result["bits_per_parameter"] == pytest.approx(values.size * 8 / low.size)
    assert abs(result["clean_accuracy"] - result["honest_accuracy"]) <= 0.01
    again = result["requantized"]
    assert again["bit_accuracy"] < 0.7 and again["recovered"] < result["items"] // 2
    assert abs(again["accuracy"] - result["clean_accuracy"]) <= 0.02


def test_sign_bits_read_by_hand_give_the_bit_accuracy(games) -> None:
    folder, result = games["sign"]
    values, _ = _secret(folder, result)
    truth = _stream(values, result["pixel_bits"])
    decoded = (_weights(folder)[: truth.size] > 0).astype(np.int64)
    assert result["bit_accuracy"] == pytest.approx(float(np.mean(decoded == truth)))
    honest, _, _ = load_model(folder / "honest")
    weights = torch.cat([p.detach().reshape(-1) for p in honest.parameters()]).numpy()
    chance = float(np.mean((weights[: truth.size] > 0) == truth))
    assert result["bit_accuracy"] > 0.75 and abs(chance - 0.5) < 0.05


def test_capacity_queries_and_the_detector(games) -> None:
    _, result = games["capacity"]
    assert result["access"] == "label" and result["parameters"] == 0
    assert result["queries"] == math.ceil(result["bits_encoded"] / 3)
    assert result["bits_per_query"] == pytest.approx(result["recovered_bits"] / result["queries"])
    assert result["bit_accuracy"] > 0.8
    folder = games["capacity"][0]
    values, _ = _secret(folder, result)
    honest, _, _ = load_model(folder / "honest")
    layout = SecretLayout.from_dict(result["layout"])
    task = MemorizationTask(layout, (1, 8, 8), 10, key=0)
    target = Target(honest, Access.LABEL, 10)
    decoded = make_memorization("capacity", generator="noise").run(target, task)
    chance = float(np.mean(np.asarray(decoded.bits) == _stream(values, 4)))
    assert target.queries == result["queries"]
    assert result["bit_accuracy"] > chance + 0.3
    watch = result["query_detector"]
    assert watch["queries"] == result["queries"]
    assert watch["flagged_queries"] > 0.9 and watch["test_fpr"] < 0.1
    assert watch["monitored"]["refused"] is True


def test_weight_checks_ran_on_both_models(games) -> None:
    from privacylab.defenses.memorization import WEIGHT_CHECKS

    for method, (_, result) in games.items():
        assert set(result["checks"]) == set(WEIGHT_CHECKS.names()), method
        for check in result["checks"].values():
            assert {"statistic", "threshold", "flagged", "honest_statistic", "honest_flagged"} <= (
                set(check)
            )
            assert check["flagged"] == (check["statistic"] > check["threshold"])
    lsb = games["lsb"][1]["checks"]["lsb-entropy"]
    assert lsb["statistic"] > lsb["honest_statistic"]


# ------------------------------------------------------------------------------ resuming


def test_a_deleted_result_is_rebuilt_without_training(games, monkeypatch, tmp_path) -> None:
    source, result = games["sign"]
    folder = tmp_path / "copy"
    shutil.copytree(source, folder)
    (folder / "result.json").unlink()
    stamps = {p: p.stat().st_mtime_ns for p in folder.glob("*/model.safetensors")}
    assert len(stamps) == 2

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("a saved model was trained again")

    monkeypatch.setattr(memorization, "train_honest", no_training)
    monkeypatch.setattr(memorization, "train_encoded", no_training)
    again = run_memorization_job(tiny(method="sign", **SETTINGS["sign"]), folder)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    drop = {"seconds", "folder"}
    assert {k: v for k, v in again.items() if k not in drop} == {
        k: v for k, v in result.items() if k not in drop
    }


def test_a_lost_released_model_is_retrained_to_the_same_numbers(games, monkeypatch, tmp_path):
    source, result = games["lsb"]
    folder = tmp_path / "copy"
    shutil.copytree(source, folder)
    (folder / "result.json").unlink()
    shutil.rmtree(folder / "model")

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("the saved honest model was trained again")

    monkeypatch.setattr(memorization, "train_honest", no_training)
    again = run_memorization_job(tiny(), folder)
    for key in ("clean_accuracy", "honest_accuracy", "bit_accuracy", "recovered", "checks"):
        assert again[key] == result[key], key


class _Killed(BaseException):
    """A kill: not an Exception, so nothing on the way catches it."""


def test_a_kill_during_training_resumes_from_the_checkpoint(games, monkeypatch, tmp_path):
    """Killed right after the released model's second epoch is checkpointed (the 5th save:
    3 honest epochs, then 2 of the malicious training): the re-run reuses the saved honest
    model, resumes the malicious training at epoch 2 from its checkpoint, and ends with the
    uninterrupted run's weights and numbers."""
    from privacylab.training.checkpoint import Checkpoint

    source, result = games["sign"]
    config = tiny(method="sign", **SETTINGS["sign"])
    folder = tmp_path / "killed"
    save, load = Checkpoint.save, Checkpoint.load
    saves: list[int] = []

    def save_then_die(self, *args, **kwargs):
        save(self, *args, **kwargs)
        saves.append(1)
        if len(saves) == 5:
            raise _Killed

    monkeypatch.setattr(Checkpoint, "save", save_then_die)
    with pytest.raises(_Killed):
        run_memorization_job(config, folder)
    assert (folder / "honest").is_dir() and not (folder / "model").exists()
    assert not (folder / "result.json").exists()

    resumed: list[int] = []

    def spy(self, *args, **kwargs):
        state = load(self, *args, **kwargs)
        resumed.append(None if state is None else state["epoch"])
        return state

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("the saved honest model was trained again")

    monkeypatch.setattr(Checkpoint, "save", save)
    monkeypatch.setattr(Checkpoint, "load", spy)
    monkeypatch.setattr(memorization, "train_honest", no_training)
    again = run_memorization_job(config, folder)
    assert resumed == [2]
    assert np.array_equal(_weights(folder), _weights(source))
    drop = {"seconds", "folder"}
    assert {k: v for k, v in again.items() if k not in drop} == {
        k: v for k, v in result.items() if k not in drop
    }
    assert not (folder / "checkpoints").exists()


def test_a_kill_while_reporting_leaves_no_result_and_the_rerun_reports(
    games, monkeypatch, tmp_path
):
    """result.json marks a finished run, so it is written after the report: killed while
    reporting, the folder has none, and the re-run (no training) writes both."""
    import privacylab.report.memorization as report

    source, result = games["sign"]
    folder = tmp_path / "copy"
    shutil.copytree(source, folder)
    for name in ("result.json", "results.json", "index.html"):
        (folder / name).unlink()

    def killed(*args: object, **kwargs: object) -> None:
        raise _Killed

    monkeypatch.setattr(report, "add_memorization_run", killed)
    with pytest.raises(_Killed):
        run_memorization_job(tiny(method="sign", **SETTINGS["sign"]), folder)
    assert not (folder / "result.json").exists()
    monkeypatch.undo()
    again = run_memorization_job(tiny(method="sign", **SETTINGS["sign"]), folder)
    assert (folder / "index.html").is_file() and (folder / "results.json").is_file()
    assert json.loads((folder / "result.json").read_text()) == again
    assert again["bit_accuracy"] == result["bit_accuracy"]


def test_the_decoder_is_not_the_encoding_instance(games, monkeypatch, tmp_path) -> None:
    """The provider's decoder runs apart from its training code: the job decodes with a fresh
    attack, so nothing `encode` kept on its instance (the secret) reaches `run`."""
    from privacylab.attacks.memorization.lsb import LSBEncoding

    source, result = games["lsb"]
    folder = tmp_path / "copy"
    shutil.copytree(source, folder)
    (folder / "result.json").unlink()
    shutil.rmtree(folder / "model")
    encoders, decoders = [], []
    encode, run = LSBEncoding.encode, LSBEncoding.run

    def spy_encode(self, secret, *args, **kwargs):
        encoders.append(self)
        self.stash = secret
        return encode(self, secret, *args, **kwargs)

    def spy_run(self, target, task):
        decoders.append(self)
        assert not hasattr(self, "stash")
        return run(self, target, task)

    monkeypatch.setattr(LSBEncoding, "encode", spy_encode)
    monkeypatch.setattr(LSBEncoding, "run", spy_run)
    again = run_memorization_job(tiny(), folder)
    assert len(encoders) == 1 and len(decoders) == 2
    assert all(d is not encoders[0] for d in decoders)
    assert again["bit_accuracy"] == result["bit_accuracy"] == 1.0


def test_a_finished_result_is_reused_and_another_game_refused(games) -> None:
    folder, result = games["lsb"]
    assert run_memorization_job(tiny(), folder) == result
    with pytest.raises(MemorizationJobError, match="other settings \\(seed\\)"):
        run_memorization_job(tiny(seed=3), folder)


# ------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"method": "steganography"}, "unknown memorization method 'steganography'; choose"),
        ({"dataset": "nope"}, "nope"),
        (
            {"bits": 10**7},
            "lsb: the secret needs 9999872 bits but this model can hold at most 76960 bits",
        ),
        ({"bits": 511}, "511 bits hold no whole item of 512 bits"),
        ({"bits": 0}, "--bits must be a whole number >= 1"),
        ({"epsilon": 1.0}, "lsb writes the weights after training; DP-SGD cannot apply to it"),
        ({"method": "sign", "epsilon": -1.0}, "--epsilon must be a finite number > 0"),
        ({"pixel_bits": 17}, "--pixel-bits must be in 1..16"),
        (
            {"dataset": "breast_cancer", "pixel_bits": 8},
            "--pixel-bits applies to images",
        ),
        ({"train_size": 1700}, "digits has 1797 rows"),
        ({"train_size": 50}, "the secret's 51 items exceed the 50 training rows"),
        ({"attack_options": {"colour": 1}}, "lsb takes no option colour; it takes bits, offset"),
        ({"method": "capacity", "bits": 10**6}, "capacity: the secret needs"),
        (
            {
                "method": "capacity",
                "bits": 25 * 256,
                "train_size": 1000,
                "attack_options": {"ratio": 3.0},
            },
            "at most 6144 bits (the pixel generator makes 2048 distinct inputs; 24 items",
        ),
        ({"recipe": {"epochs": 0}}, "recipe epochs must be a whole number >= 1"),
        ({"recipe": {"epsilon": 2.0}}, "give the holder's ε with --epsilon"),
        ({"recipe": {"delta": 1e-3}}, "give the holder's δ with --delta"),
        ({"recipe": {"lr": "x"}}, "bad victim recipe: learning rate must be a number"),
        ({"device": "tpu"}, "unknown device 'tpu'; use cpu or cuda"),
        ({"device": ""}, "unknown device ''; use cpu or cuda"),
    ],
)
def test_refusals_are_one_line_before_any_work(tmp_path, changes, message) -> None:
    options = {"train_size": TRAIN, "test_size": TEST, **changes}
    if changes.get("train_size") == 50:
        options["bits"] = 51 * 512
    if changes.get("dataset") == "breast_cancer":
        options.update(train_size=300, test_size=100)
    folder = tmp_path / "run"
    with pytest.raises(
        PrivacylabError, match=message.replace("(", "\\(").replace(")", "\\)")
    ) as error:
        run_memorization_job(tiny(**options), folder)
    assert "\n" not in str(error.value)
    assert not folder.exists()
