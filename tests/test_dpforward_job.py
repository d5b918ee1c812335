"""The DP-Forward job (`privacylab.dpforward`, Du et al. 2023) on the tiny encoder and a small
review corpus: the facts keys and privacy of each method, the folder round trip (safetensors
and JSON, the deployed model noisy at inference), a finished folder reported as is, a folder of
other options refused, and a killed run resumed to bit-identical weights."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from privacylab.accounting import MatrixGaussian, PldAccountant, SelfComposed
from privacylab.data.reviews import ReviewConfig, build_reviews
from privacylab.dpforward import (
    DPForwardConfig,
    DPForwardError,
    forward_facts,
    load_dpforward,
    train_dpforward,
)
from privacylab.models.minilm import encode_texts
from privacylab.training.dpforward import ForwardNoise

FACT_KEYS = {
    "method",
    "position",
    "frozen",
    "encoder",
    "layers",
    "epsilon",
    "delta",
    "event",
    "accountant",
    "privacy",
    "label_epsilon",
    "accuracy",
    "train_accuracy",
    "members",
    "non_members",
    "epochs",
    "seconds",
    "seconds_per_step",
    "folder",
}
PRIVACY_KEYS = {
    "notion",
    "adjacency",
    "sensitivity",
    "clip",
    "epsilon",
    "delta",
    "accountant",
    "event",
    "releases",
    "inference_epsilon",
    "label_epsilon",
    "label_event",
    "total_epsilon",
    "shuffled",
}

TINY = {"encoder": "tiny", "documents": 96, "max_len": 20, "batch_size": 16, "lr": 3e-3}


def _config(**options: object) -> DPForwardConfig:
    return DPForwardConfig(**{**TINY, **options})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def forward(tmp_path_factory: pytest.TempPathFactory) -> tuple[DPForwardConfig, Path, dict]:
    folder = tmp_path_factory.mktemp("dpforward") / "fwd"
    config = _config(
        epsilon=4.0, position="layer:1", label_epsilon=2.0, clip=0.5, epochs=2, reduce=8
    )
    return config, folder, train_dpforward(config, folder)


def test_dp_forward_facts_and_privacy(forward: tuple) -> None:
    _, folder, facts = forward
    assert set(facts) == FACT_KEYS
    assert facts["method"] == "dp-forward" and facts["position"] == "layer:1"
    assert facts["encoder"] == "tiny" and facts["layers"] == 2 and facts["epochs"] == 2
    assert facts["folder"] == str(folder) and facts["accountant"] == "pld"
    reviews = build_reviews(ReviewConfig(documents=96, seed=0))
    assert facts["members"] == len(reviews.subset("train"))
    assert facts["non_members"] == len(reviews.subset("test"))
    assert 0.0 <= facts["accuracy"] <= 1.0 and 0.0 <= facts["train_accuracy"] <= 1.0
    assert facts["seconds_per_step"] > 0 and facts["seconds"] > 0
    privacy = facts["privacy"]
    assert set(privacy) == PRIVACY_KEYS
    assert privacy["sensitivity"] == 2 * 0.5 and privacy["clip"] == 0.5
    assert privacy["releases"] == 2 and privacy["notion"] == "SeqLDP"
    assert facts["epsilon"] == privacy["epsilon"] == pytest.approx(4.0, rel=1e-6)
    assert facts["event"] == privacy["event"]
    event = SelfComposed(MatrixGaussian(privacy["event"]["event"]["noise_multiplier"], 20, 8), 2)
    assert privacy["event"] == event.to_dict()
    assert PldAccountant().compose(event).epsilon(1e-5) == pytest.approx(4.0, rel=1e-6)
    assert privacy["inference_epsilon"] < facts["epsilon"]
    assert facts["label_epsilon"] == privacy["label_epsilon"] == 2.0
    assert facts["epsilon"] < privacy["total_epsilon"] <= facts["epsilon"] + 2.0 + 1e-6
    # 38 users cannot amplify a local ε of ~3 by shuffling (FMT21's condition fails)
    assert privacy["shuffled"] is None


def test_round_trip(forward: tuple) -> None:
    config, folder, facts = forward
    assert forward_facts(folder) == facts
    loaded = load_dpforward(folder)
    assert loaded.facts == facts
    assert loaded.config == config.validate()
    assert loaded.reviews.to_dict() == build_reviews(ReviewConfig(documents=96)).to_dict()
    model = loaded.model
    assert not model.training and isinstance(model.release, ForwardNoise)
    assert str(model.position) == "layer:1" and model.release.clip == 0.5
    assert model.release.down.out_features == 8 and model.release.mechanism.columns == 8
    assert model.release.mechanism.scale == pytest.approx(
        facts["privacy"]["event"]["event"]["noise_multiplier"] * 1.0
    )
    saved = load_file(str(folder / "model.safetensors"))
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved[name]), name
    test = loaded.reviews.subset("test")
    ids = encode_texts(loaded.tokenizer, test.texts[:8], config.max_len)
    with torch.no_grad():
        first, second = model(ids), model(ids)
    assert not torch.allclose(first, second)  # inference is noisy (local DP at inference)
    again = load_dpforward(folder)
    with torch.no_grad():
        assert torch.equal(again.model(ids), first)  # the noise stream is seeded and saved


def test_finished_folder_reported_as_is_and_other_options_refused(forward: tuple) -> None:
    config, folder, facts = forward
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert train_dpforward(config, folder) == facts
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(DPForwardError, match=r"epsilon=4\.0, not 3\.0") as info:
        train_dpforward(_config(**{**_kwargs(config), "epsilon": 3.0}), folder)
    assert "\n" not in str(info.value)
    with pytest.raises(DPForwardError, match="clip"):
        train_dpforward(_config(**{**_kwargs(config), "clip": 1.0}), folder)


def _kwargs(config: DPForwardConfig) -> dict:
    return {k: v for k, v in config.to_dict().items() if k not in TINY}


class _KilledError(Exception):
    pass


class _KillInEpoch:
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_step_end(self, state: object) -> None:
        if state.epoch == self.epoch:  # type: ignore[attr-defined]
            raise _KilledError


@pytest.mark.parametrize("method", ["dp-forward", "dp-sgd", "frozen"])
def test_killed_run_resumes_to_the_same_weights(tmp_path: Path, method: str) -> None:
    frozen = method == "frozen"
    method = "dp-forward" if frozen else method
    config = _config(
        method=method, epsilon=6.0, position="output", epochs=2, documents=60, frozen=frozen
    )
    whole = train_dpforward(config, tmp_path / "whole")
    with pytest.raises(_KilledError):
        train_dpforward(config, tmp_path / "killed", callbacks=[_KillInEpoch(2)])
    assert (tmp_path / "killed" / "checkpoint" / "checkpoint.safetensors").is_file()
    assert not (tmp_path / "killed" / "model.json").exists()
    resumed = train_dpforward(config, tmp_path / "killed")
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    for key in ("epsilon", "accuracy", "train_accuracy", "event"):
        assert resumed[key] == whole[key], key
    if method == "dp-sgd":
        spent = whole["privacy"]
        assert whole["accountant"] == "pld" and spent["accountant"] == "pld"
        assert 0 < whole["epsilon"] <= 6.0 * (1 + 1e-9)
        assert whole["event"] == spent["event"] and spent["max_grad_norm"] == 0.1
        assert whole["label_epsilon"] is None


def test_non_private_has_no_epsilon(tmp_path: Path) -> None:
    facts = train_dpforward(_config(method="non-private", epochs=1, documents=48), tmp_path)
    assert set(facts) == FACT_KEYS
    assert facts["epsilon"] is None and facts["event"] is None and facts["accountant"] is None
    assert facts["privacy"] is None and facts["delta"] is None
    loaded = load_dpforward(tmp_path)
    assert loaded.model.release is None and loaded.config.epsilon is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"epsilon": 0.0}, "epsilon must be a finite number > 0"),
        ({"epsilon": -2.0}, "epsilon must be a finite number > 0"),
        ({"epsilon": math.nan}, "epsilon must be a finite number > 0"),
        ({"position": "middle"}, "unknown position 'middle'"),
        ({"position": "layer:3"}, "layer index 3 is out of range"),
        ({"position": "layer:0"}, "layer index 0 is out of range"),
        ({"clip": 0.0}, "clip C must be a finite number > 0"),
        ({"clip": -1.0}, "clip C must be a finite number > 0"),
        ({"method": "dp-magic"}, "unknown method"),
        ({"encoder": "gpt"}, "unknown encoder"),
        ({"method": "dp-sgd", "label_epsilon": 1.0}, "label epsilon"),
        ({"delta": 1.0}, "delta must be in"),
        ({"epochs": 0}, "epochs must be a whole number"),
        ({"max_len": 2}, "max_len"),
        ({"layers": 7, "encoder": "minilm"}, "layers must be a whole number in \\[1, 6\\]"),
        ({"documents": 10}, "documents"),
        ({"method": "dp-sgd", "reduce": 8}, "reduce"),
        ({"reduce": 0}, "reduce must be a whole number"),
    ],
)
def test_bad_options_are_one_line(options: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(DPForwardError, match=message) as info:
        train_dpforward(_config(**options), tmp_path / "never")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "never").exists()


def test_not_a_model_folder(tmp_path: Path) -> None:
    with pytest.raises(DPForwardError, match="no DP-Forward model"):
        load_dpforward(tmp_path)
    (tmp_path / "model.json").write_text("{not json")
    with pytest.raises(DPForwardError, match="cannot read"):
        forward_facts(tmp_path)


def test_frozen_releases_each_sequence_once(tmp_path: Path) -> None:
    """Du et al. 2023, Sec. 3.3: with f(.) frozen, each training sequence is released once and
    p(.) trains on those releases every epoch: the event is one aMGM release at the target ε,
    the noise √epochs smaller than releasing every epoch, f(.) keeps its pretrained weights and
    p(.) is trained."""
    options = {"epsilon": 4.0, "position": "layer:1", "epochs": 3, "documents": 60}
    frozen = train_dpforward(_config(frozen=True, **options), tmp_path / "frozen")
    every = train_dpforward(_config(**options), tmp_path / "every")
    assert frozen["privacy"]["releases"] == 1 and every["privacy"]["releases"] == 3
    assert frozen["epsilon"] == pytest.approx(4.0, rel=1e-6)
    one = frozen["event"]["event"]["noise_multiplier"]
    three = every["event"]["event"]["noise_multiplier"]
    assert three == pytest.approx(math.sqrt(3) * one, rel=1e-9)
    assert frozen["event"]["count"] == 1
    trained = load_file(str(tmp_path / "frozen" / "model.safetensors"))
    reference = _config(**options)
    from privacylab.models.minilm import tiny_bert

    pretrained = tiny_bert(layers=reference.depth, max_len=reference.max_len, seed=0)
    for name, value in pretrained.state_dict().items():
        key = f"encoder.{name}"
        if key in trained and (".layer.0." in key or "embeddings" in key):
            assert torch.equal(trained[key], value), key
    assert not torch.equal(
        trained["encoder.encoder.layer.1.output.dense.weight"],
        pretrained.state_dict()["encoder.layer.1.output.dense.weight"],
    )
    with pytest.raises(DPForwardError, match=r"frozen .* is for dp-forward"):
        _config(method="dp-sgd", epsilon=4.0, frozen=True).validate()


@pytest.mark.parametrize("frozen", [True, False])
def test_each_training_sequence_is_released_as_accounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, frozen: bool
) -> None:
    """Every release a member's sequence goes through, counted at the noise layer against the
    token ids that produced it: `releases` (1 when frozen) in all, as the facts account; per
    epoch, only the training releases (the trainer's evaluation passes of the training set are
    measurement, module docstring of `privacylab.training.dpforward`). Frozen with reduce: M1
    (user side) keeps its seeded map, M2 (provider side) is trained with p(.)."""
    from collections import Counter

    from privacylab.models.encoder import EncoderClassifier

    seen: list[torch.Tensor] = []
    released: Counter = Counter()
    before, user_side = EncoderClassifier.before, ForwardNoise.user_side

    def spy_before(self, ids, position=None):  # type: ignore[no-untyped-def]
        seen.append(ids)
        return before(self, ids, position)

    def spy_user_side(self, matrix):  # type: ignore[no-untyped-def]
        if frozen or self.training:
            released.update(tuple(row.tolist()) for row in seen[-1])
        return user_side(self, matrix)

    monkeypatch.setattr(EncoderClassifier, "before", spy_before)
    monkeypatch.setattr(ForwardNoise, "user_side", spy_user_side)
    config = _config(
        epsilon=4.0, position="layer:1", epochs=2, documents=60, frozen=frozen, reduce=8
    )
    facts = train_dpforward(config, tmp_path)
    releases = facts["privacy"]["releases"]
    assert releases == (1 if frozen else 2)
    reviews = build_reviews(ReviewConfig(documents=60, seed=0))
    members = encode_texts(load_dpforward(tmp_path).tokenizer, reviews.subset("train").texts, 20)
    copies = Counter(tuple(row.tolist()) for row in members)
    assert {key: released[key] for key in copies} == {k: releases * n for k, n in copies.items()}
    if frozen:
        assert sum(released.values()) == facts["members"] + facts["non_members"]
        trained = load_file(str(tmp_path / "model.safetensors"))
        start = ForwardNoise(1.0, None, seed=0, reduce=8, dim=trained["release.up.weight"].shape[0])
        assert torch.equal(trained["release.down.weight"], start.down.weight.detach())
        assert not torch.equal(trained["release.up.weight"], start.up.weight.detach())


def test_folder_written_before_newer_options_is_read_as_their_defaults(tmp_path: Path) -> None:
    """A folder whose recorded options lack `reduce` and `frozen` (written before they existed)
    is the run with their defaults: reported as it is, not refused as other options."""
    config = _config(epsilon=4.0, epochs=1, documents=48)
    facts = train_dpforward(config, tmp_path)
    for path in (tmp_path / "model.json", tmp_path / "checkpoint" / "config.json"):
        data = json.loads(path.read_text())
        options = data.get("config", data)
        del options["reduce"], options["frozen"]
        path.write_text(json.dumps(data))
    assert train_dpforward(config, tmp_path) == facts
    with pytest.raises(DPForwardError, match="frozen=False, not True"):
        train_dpforward(replace(config, frozen=True), tmp_path)
