"""Poisoning and backdooring a small CLIP (Carlini & Terzis 2022) on captioned 8x8 digits: one
clean model and two poisoned ones (module fixture). The backdoor takes (ASR and z-score far
above the clean model's, the z-score re-derived from the returned model); targeted poisoning
moves the attacker's images to the target label while the clean model does not; the crafts
build their poisons from the attacker's own images and captions only; bad options are one
PoisonError line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privacylab.attacks.poisoning import (
    BackdoorResult,
    PoisonError,
    PoisonTask,
    backdoor_names,
    make_backdoor,
    parse_trigger,
)
from privacylab.attacks.poisoning.contrastive import (
    ClipBackdoor,
    ClipPoison,
    caption_set,
    contrastive_split,
    image_embeddings,
    run_contrastive,
)
from privacylab.data import Dataset, load_dataset
from privacylab.data.captions import build_captions, captions_with
from privacylab.stats.backdoor import backdoor_z_score

GAME = {"train_size": 800, "test_size": 300, "epochs": 8, "seed": 0}
TRIGGER = "pattern:3@corner"


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits")


@pytest.fixture(scope="module")
def game(digits: Dataset) -> dict[str, object]:
    clean_result, clean = run_contrastive("clip-backdoor", data=digits, poisons=0, **GAME)
    backdoor, model = run_contrastive(
        "clip-backdoor", data=digits, poisons=60, trigger=TRIGGER, clean_model=clean, **GAME
    )
    poison, _ = run_contrastive(
        "clip-poison", data=digits, poisons=30, targets=5, clean_model=clean, **GAME
    )
    return {
        "clean_result": clean_result,
        "clean": clean,
        "backdoor": backdoor,
        "model": model,
        "poison": poison,
    }


def test_registered_with_their_threat_model() -> None:
    assert {"clip-poison", "clip-backdoor"} <= set(backdoor_names())
    for name in ("clip-poison", "clip-backdoor"):
        attack = make_backdoor(name)
        assert attack.threat_model.to_dict() == {
            "access": "label",
            "side_information": ["clean-data", "caption-set"],
        }


def test_backdoor_takes_and_the_clean_model_has_none(game) -> None:
    clean, bd = game["clean_result"], game["backdoor"]
    assert isinstance(bd, BackdoorResult)
    assert bd.poisons == 60 and bd.poison_rate == pytest.approx(60 / 860)
    assert bd.asr > 0.8 and bd.baseline_asr < 0.2
    assert clean.asr < 0.2 and clean.poisons == 0
    assert bd.z_score > 3.0 and bd.z_score > bd.details["baseline_z_score"] + 2.0
    assert abs(clean.z_score) < 2.0
    assert bd.clean_accuracy > 0.6 and bd.baseline_accuracy > 0.6
    assert bd.baseline_accuracy == pytest.approx(clean.clean_accuracy)
    assert bd.queries == GAME["test_size"]
    assert bd.trigger == {"spec": TRIGGER}
    assert {"dataset_size", "zero_shot_prompts", "caption_set_size"} <= set(bd.details)


def test_z_score_rederived_from_the_model(game, digits: Dataset) -> None:
    split = contrastive_split(digits, GAME["train_size"], GAME["test_size"], GAME["seed"])
    generator = torch.Generator().manual_seed(GAME["seed"] + 1)
    patched = parse_trigger(TRIGGER).stamp(split.test.features, generator)
    model = game["model"]
    expected = backdoor_z_score(
        image_embeddings(model, split.test.features), image_embeddings(model, patched)
    )
    assert game["backdoor"].z_score == pytest.approx(expected, rel=1e-9)


def test_targeted_poisoning_moves_the_target_images(game) -> None:
    poison = game["poison"]
    assert poison.poisons == 150 and poison.details["per_target_poisons"] == 30
    assert poison.asr == poison.details["poison_success"] == np.mean(poison.details["target_hits"])
    assert poison.asr >= 0.6 and poison.baseline_asr == 0.0
    assert all(label != 0 for label in poison.details["target_labels"])
    assert poison.z_score is None and poison.trigger is None
    assert poison.queries == 5


def test_crafts_use_only_the_attackers_rows_and_captions(digits: Dataset) -> None:
    split = contrastive_split(digits, 800, 300, 0)
    victim = split.victim.features.flatten(1)
    own = tuple(build_captions(split.attacker.labels, noise=0.1, seed=5))
    task = PoisonTask(split.attacker, 40, 3, captions=own, seed=2)
    wanted = set(captions_with("three", own))
    assert caption_set(task) == captions_with("three", own)

    crafted = ClipBackdoor("pattern:3@corner").craft(task)
    assert len(crafted) == 40 and set(crafted.captions) <= wanted
    assert (crafted.labels == 3).all() and crafted.trigger is not None
    outside = torch.ones(8, 8, dtype=torch.bool)
    outside[5:, 5:] = False
    source = split.attacker.features[:, 0][:, outside]
    for image in crafted.features[:, 0]:
        assert (image[outside] == source).all(dim=1).any()
        assert (image[5:, 5:] == parse_trigger("pattern:3@corner").box_pattern(1)[0]).all()
    rows = [
        int((image[outside] == source).all(dim=1).nonzero()[0]) for image in crafted.features[:, 0]
    ]
    assert len(set(rows)) == 40

    targeted = ClipPoison(target_index=7).craft(task)
    assert targeted.target_index == 7 and targeted.trigger is None
    assert (targeted.features == split.attacker.features[7]).all()
    assert set(targeted.captions) <= wanted and len(targeted) == 40
    for image in [*crafted.features, *targeted.features]:
        assert not (image.flatten() == victim).all(dim=1).any()


def test_caption_set_without_own_captions_is_the_attackers_templates(digits: Dataset) -> None:
    task = PoisonTask(digits.subset(range(50)), 5, 9)
    found = caption_set(task)
    assert found and all("nine" in c.split() or "9" in c.split() for c in found)
    with pytest.raises(PoisonError):
        caption_set(PoisonTask(digits.subset(range(50)), 5, 9, captions=("a seven",)))


@pytest.mark.parametrize(
    "options",
    [
        {"method": "clip-bogus"},
        {"poisons": -1},
        {"poisons": 800},
        {"trigger": "pattern:9@corner"},
        {"trigger": "star:3@corner"},
        {"train_size": 1500, "test_size": 297},
        {"target_class": 10},
        {"epochs": 0},
        {"targets": 0},
        {"caption_noise": 2.0},
        {"method": "clip-poison", "targets": 1000},
        {"seed": -1},
        {"caption_noise": "0.1"},
    ],
)
def test_bad_options_are_one_line(digits: Dataset, options: dict[str, object]) -> None:
    call = {"method": "clip-backdoor", "poisons": 10, "train_size": 800, "test_size": 300}
    call.update(options)
    method = call.pop("method")
    with pytest.raises(PoisonError) as info:
        run_contrastive(method, data=digits, **call)
    assert "\n" not in str(info.value)


def test_not_ten_digit_classes_is_refused(digits: Dataset) -> None:
    nine = Dataset("nine", digits.features, digits.labels % 9, 9, digits.input_shape, "image")
    with pytest.raises(PoisonError, match="digits 0-9"):
        run_contrastive("clip-backdoor", data=nine, poisons=5, train_size=800, test_size=300)
    with pytest.raises(PoisonError):
        ClipPoison(target_index=-1)
    with pytest.raises(PoisonError):
        ClipBackdoor(seed="1")  # type: ignore[arg-type]
    all_to_all = PoisonTask(digits.subset(range(20)), 2, 0, mode="all-to-all")
    for attack in (ClipPoison(), ClipBackdoor("pattern:3@corner")):
        with pytest.raises(PoisonError, match="all-to-one"):
            attack.craft(all_to_all)
    with pytest.raises(PoisonError):
        ClipPoison(target_index=10_000).craft(PoisonTask(digits.subset(range(20)), 2, 0))
