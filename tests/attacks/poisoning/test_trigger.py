"""Triggers: the one stamping rule x' = (1 − α m) ⊙ x + α m ⊙ p (Gu et al. 2017; Liu et al.
2018) checked against a hand computation, placements (corner, fixed, random: inside the image,
seeded, covering every place), the spec grammar's round trip, and one-line errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from privacylab.attacks.poisoning.trigger import (
    SHAPES,
    Trigger,
    TriggerError,
    parse_trigger,
    shape_mask,
)


def _one_line(error: pytest.ExceptionInfo[BaseException]) -> None:
    text = str(error.value)
    assert text and "\n" not in text


def test_square_stamp_matches_hand_computation() -> None:
    image = torch.arange(16, dtype=torch.float32).view(1, 1, 4, 4) / 16
    out = Trigger("square", 2, (1, 2), alpha=0.25).stamp(image)
    expected = image.clone()
    for row in (1, 2):
        for col in (2, 3):
            expected[0, 0, row, col] = 0.75 * image[0, 0, row, col] + 0.25 * 1.0
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-7)
    assert torch.equal(image, torch.arange(16, dtype=torch.float32).view(1, 1, 4, 4) / 16)


def test_checkerboard_pattern_opaque_at_corner() -> None:
    image = torch.full((2, 3, 6, 5), 0.5)
    out = Trigger("pattern", 3, "corner").stamp(image)
    box = out[:, :, 3:6, 2:5]
    board = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    assert torch.equal(box, board.expand(2, 3, 3, 3))
    outside = out.clone()
    outside[:, :, 3:6, 2:5] = 0.5
    assert torch.equal(outside, image)


def test_learned_pattern_and_soft_mask_blend_per_pixel() -> None:
    torch.manual_seed(0)
    image = torch.rand(1, 3, 5, 5)
    pattern = torch.rand(3, 2, 2)
    mask = torch.tensor([[1.0, 0.5], [0.0, 0.25]])
    trigger = Trigger("square", 2, (0, 3), alpha=0.8).with_pattern(pattern, mask)
    out = trigger.stamp(image)
    for c in range(3):
        for i in range(2):
            for j in range(2):
                m = 0.8 * float(mask[i, j])
                want = (1 - m) * float(image[0, c, i, 3 + j]) + m * float(pattern[c, i, j])
                assert float(out[0, c, i, 3 + j]) == pytest.approx(want, abs=1e-6)
    assert torch.equal(out[..., :, :3], image[..., :, :3])
    assert torch.equal(out[..., 2:, 3:], image[..., 2:, 3:])


def test_full_mask_is_where_the_stamp_writes() -> None:
    trigger = Trigger("logo", 5, "corner", alpha=0.5)
    canvas = trigger.full_mask((1, 9, 7))
    assert canvas.shape == (9, 7)
    assert torch.equal(canvas[4:, 2:], 0.5 * shape_mask("logo", 5))
    assert canvas[:4].abs().sum() == 0 and canvas[:, :2].abs().sum() == 0
    changed = trigger.stamp(torch.zeros(1, 1, 9, 7))[0, 0] != 0
    assert torch.equal(changed, canvas > 0)


@pytest.mark.parametrize("shape", SHAPES)
def test_shape_masks_are_binary_and_drawn(shape: str) -> None:
    for size in (1, 2, 5, 9):
        mask = shape_mask(shape, size)
        assert mask.shape == (size, size)
        assert set(mask.unique().tolist()) <= {0.0, 1.0}
        assert mask.sum() > 0
    if shape in ("logo", "watermark"):
        assert shape_mask(shape, 9).sum() < 81


@given(
    height=st.integers(1, 12),
    width=st.integers(1, 12),
    size=st.integers(1, 12),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_places_inside_and_seeded(height: int, width: int, size: int, seed: int) -> None:
    trigger = Trigger("square", size, "random")
    if size > min(height, width):
        with pytest.raises(TriggerError):
            trigger.places(3, (1, height, width))
        return
    first = trigger.places(50, (1, height, width), torch.Generator().manual_seed(seed))
    again = trigger.places(50, (1, height, width), torch.Generator().manual_seed(seed))
    assert torch.equal(first, again)
    assert first.shape == (50, 2)
    assert (first >= 0).all()
    assert (first[:, 0] <= height - size).all() and (first[:, 1] <= width - size).all()


def test_random_places_cover_every_position_and_differ_by_seed() -> None:
    trigger = Trigger("square", 3, "random")
    places = trigger.places(4000, (1, 8, 6), torch.Generator().manual_seed(0))
    seen = {tuple(p) for p in places.tolist()}
    assert seen == {(r, c) for r in range(6) for c in range(4)}
    counts = torch.bincount(places[:, 0] * 4 + places[:, 1], minlength=24).float()
    assert counts.min() > 4000 / 24 * 0.6
    other = trigger.places(4000, (1, 8, 6), torch.Generator().manual_seed(1))
    assert not torch.equal(places, other)
    stamped = trigger.stamp(torch.zeros(40, 1, 8, 6), torch.Generator().manual_seed(3))
    assert (stamped.flatten(1).sum(1) == 9).all()


def test_corner_is_bottom_right() -> None:
    places = Trigger("square", 4, "corner").places(2, (3, 28, 30))
    assert places.tolist() == [[24, 26], [24, 26]]


@given(
    shape=st.sampled_from(SHAPES),
    size=st.integers(1, 40),
    where=st.one_of(
        st.sampled_from(["corner", "random"]),
        st.tuples(st.integers(0, 50), st.integers(0, 50)),
    ),
    alpha=st.one_of(st.just(1.0), st.floats(0.01, 1.0)),
)
def test_spec_round_trip(shape: str, size: int, where: object, alpha: float) -> None:
    trigger = Trigger(shape, size, where, alpha)  # type: ignore[arg-type]
    again = parse_trigger(trigger.spec)
    assert (again.shape, again.size, again.position) == (shape, size, trigger.position)
    assert again.alpha == pytest.approx(alpha, rel=1e-5)
    assert Trigger.from_dict(trigger.to_dict()) == parse_trigger(trigger.spec)


def test_learned_trigger_round_trips_with_its_tensors() -> None:
    torch.manual_seed(1)
    trigger = Trigger("square", 3, (1, 1)).with_pattern(torch.rand(1, 3, 3), torch.rand(3, 3))
    again = Trigger.from_dict(trigger.to_dict())
    assert again.learned and again.spec == trigger.spec
    image = torch.rand(2, 1, 6, 6)
    torch.testing.assert_close(again.stamp(image), trigger.stamp(image))


def test_shorthands() -> None:
    assert parse_trigger("random") == Trigger("square", 4, "random")
    assert parse_trigger(" Corner ") == Trigger("square", 4, "corner")
    assert parse_trigger("logo:7@3,4") == Trigger("logo", 7, (3, 4))
    trigger = Trigger("pattern", 2)
    assert parse_trigger(trigger) is trigger


@pytest.mark.parametrize(
    "spec",
    [
        "circle:4@corner",
        "square:0@corner",
        "square:4@middle",
        "square:4@corner:1.5",
        "square:4@corner:0",
        "square:4@corner:-0.2",
        "square:4@corner:nan",
        "square:4@corner:abc",
        "square:x@corner",
        "square",
        "",
    ],
)
def test_bad_specs_are_one_line(spec: str) -> None:
    with pytest.raises(TriggerError) as error:
        parse_trigger(spec)
    _one_line(error)


def test_too_large_or_outside_is_one_line() -> None:
    with pytest.raises(TriggerError, match="larger than the 8x8") as error:
        parse_trigger("square:9@corner").stamp(torch.zeros(1, 1, 8, 8))
    _one_line(error)
    with pytest.raises(TriggerError, match="leaves") as error:
        Trigger("square", 3, (6, 0)).check((1, 8, 8))
    _one_line(error)
    with pytest.raises(TriggerError):
        Trigger("square", 2).stamp(torch.zeros(8, 8))
    with pytest.raises(TriggerError):
        Trigger("square", 2).check((64,))
    with pytest.raises(TriggerError):
        Trigger("square", 2, "random").full_mask((1, 8, 8))
    with pytest.raises(TriggerError):
        Trigger("square", 2, mask=torch.ones(3, 3))
    with pytest.raises(TriggerError):
        Trigger("square", 2, pattern=torch.ones(2, 2))
    with pytest.raises(TriggerError):
        Trigger("square", 2).with_pattern(torch.ones(2, 2, 2)).box_pattern(3)
    with pytest.raises(TriggerError):
        Trigger.from_dict({"spec": 4})
    with pytest.raises(TriggerError):
        Trigger("square", True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "build",
    [
        lambda: Trigger("square", 2, (1,)),
        lambda: Trigger("square", 2, ("a", 1)),
        lambda: Trigger("square", 2, (1.7, 2)),
        lambda: Trigger("square", 2, (-1, 0)),
        lambda: Trigger("square", 2, "corner", "0.5"),  # type: ignore[arg-type]
        lambda: Trigger("square", 2, mask=torch.full((2, 2), 5.0)),
        lambda: Trigger("square", 2, mask=torch.full((2, 2), float("nan"))),
        lambda: Trigger("square", 2, pattern=-torch.ones(1, 2, 2)),
        lambda: Trigger.from_dict({"spec": "square:2@corner", "mask": [[2, 0], [0, 0]]}),
        lambda: Trigger("square", 2).stamp(torch.zeros(2, 1, 4, 4), places=torch.tensor([[0, 0]])),
        lambda: Trigger("square", 2).stamp(
            torch.zeros(2, 1, 4, 4), places=torch.tensor([[3, 3], [0, 0]])
        ),
    ],
)
def test_malformed_triggers_and_places_are_one_line(build: object) -> None:
    with pytest.raises(TriggerError) as error:
        build()  # type: ignore[operator]
    _one_line(error)


def test_given_places_are_the_boxes_written() -> None:
    places = torch.tensor([[0, 0], [2, 1]])
    out = Trigger("square", 2).stamp(torch.zeros(2, 1, 4, 4), places=places)
    assert out[0, 0, :2, :2].eq(1).all() and out[0].sum() == 4
    assert out[1, 0, 2:, 1:3].eq(1).all() and out[1].sum() == 4
    assert Trigger("square", 2, "corner", 1).alpha == 1.0
