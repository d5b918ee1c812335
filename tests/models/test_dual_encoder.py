"""The small CLIP (Radford et al. 2021): the per-example loss is the symmetric cross-entropy of
Fig. 3 written out by hand (scipy's logsumexp), the zero-shot head is the arg-max of the cosine
to each class's normalised mean prompt embedding, the temperature is initialised and clamped as
in Sec. 2.5, and a few hundred captioned 8x8 digits trained with the one trainer give a
zero-shot classifier far above chance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from sklearn.datasets import load_digits

from privacylab.attacks.poisoning.contrastive import train_dual_encoder, zero_shot_classifier
from privacylab.data.captions import CLASS_NAMES, CaptionTokenizer, build_captions, prompts
from privacylab.models.dual_encoder import (
    MAX_LOGIT_SCALE,
    DualEncoder,
    ZeroShotClassifier,
    clip_loss,
)
from privacylab.models.errors import ModelError

TOK = CaptionTokenizer()


@pytest.fixture(scope="module")
def trained() -> tuple[DualEncoder, torch.Tensor, torch.Tensor, float]:
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.int64)
    train, test = slice(0, 600), slice(1200, 1500)
    ids = TOK.encode(build_captions(y[train], noise=0.0, seed=0), 16)
    torch.manual_seed(0)
    model = DualEncoder((1, 8, 8), TOK.vocab_size, dim=32)
    with torch.no_grad():
        before = float(
            (zero_shot_classifier(model, TOK)(x[test]).argmax(1) == y[test]).float().mean()
        )
    train_dual_encoder(model, x[train], ids, epochs=8, batch_size=64, lr=3e-3, seed=0)
    return model.eval(), x[test], y[test], before


def test_loss_is_the_symmetric_cross_entropy_by_hand() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.3, 1.5, -0.7], [1.1, 0.2, 0.9]])
    a = logits.double().numpy()
    rows = [logsumexp(a[i]) - a[i, i] for i in range(3)]
    cols = [logsumexp(a[:, i]) - a[i, i] for i in range(3)]
    expected = (np.array(rows) + np.array(cols)) / 2
    got = clip_loss(logits, torch.zeros(3))
    assert got.shape == (3,)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
    with pytest.raises(ModelError):
        clip_loss(torch.zeros(2, 3))


def test_logits_are_scaled_cosines_and_the_scale_is_clamped() -> None:
    torch.manual_seed(1)
    model = DualEncoder((1, 8, 8), TOK.vocab_size, dim=16)
    assert math.isclose(float(model.logit_scale.detach()), 1 / 0.07, rel_tol=1e-6)
    images = torch.rand(4, 1, 8, 8)
    ids = TOK.encode(["a photo of the digit two", "handwritten 3", "the number nine", "x"], 8)
    f, g = model.encode_image(images), model.encode_text(ids)
    np.testing.assert_allclose(f.norm(dim=1).detach().numpy(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(g.norm(dim=1).detach().numpy(), 1.0, rtol=1e-6)
    cos = torch.nn.functional.cosine_similarity(
        model.image(images)[:, None], model.text(ids)[None], dim=-1
    )
    torch.testing.assert_close(model(images, ids), cos / 0.07, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        model.log_scale.fill_(10.0)
    assert float(model.logit_scale.detach()) == MAX_LOGIT_SCALE


def test_padding_does_not_change_a_caption() -> None:
    model = DualEncoder((1, 8, 8), TOK.vocab_size)
    short = TOK.encode(["a handwritten seven"], 3)
    long = TOK.encode(["a handwritten seven"], 12)
    torch.testing.assert_close(model.encode_text(short), model.encode_text(long))


def test_zero_shot_head_is_argmax_cosine_to_class_mean_prompts(trained) -> None:
    model, x, _, _ = trained
    head = zero_shot_classifier(model, TOK)
    with torch.no_grad():
        f = model.encode_image(x).double().numpy()
        weights = []
        for name in CLASS_NAMES:
            g = model.encode_text(TOK.encode(prompts(name), 16)).double().numpy()
            mean = (g / np.linalg.norm(g, axis=1, keepdims=True)).mean(axis=0)
            weights.append(mean / np.linalg.norm(mean))
        expected = (f @ np.array(weights).T).argmax(1)
        logits = head(x)
    assert head.num_classes == 10 and logits.shape == (len(x), 10)
    np.testing.assert_array_equal(logits.argmax(1).numpy(), expected)
    np.testing.assert_allclose(
        logits.double().numpy(),
        float(model.logit_scale.detach()) * f @ np.array(weights).T,
        atol=1e-3,
    )


def test_contrastive_training_lifts_zero_shot_accuracy(trained) -> None:
    model, x, y, before = trained
    with torch.no_grad():
        accuracy = float((zero_shot_classifier(model, TOK)(x).argmax(1) == y).float().mean())
    assert before < 0.3
    assert accuracy > 0.6, accuracy


def test_bad_configuration_is_one_line() -> None:
    for call in (
        lambda: DualEncoder((8, 8), 10),
        lambda: DualEncoder((1, 2, 2), 10),
        lambda: DualEncoder((1, 8, 8), 0),
        lambda: DualEncoder((1, 8, 8), 10, dim=True),
        lambda: DualEncoder((1, 8, 8), 10, pad_id=10),
        lambda: DualEncoder((1, 8, 8), 10, pad_id="0"),  # type: ignore[arg-type]
        lambda: DualEncoder(("a", 8, 8), 10),
        lambda: DualEncoder(5, 10),  # type: ignore[arg-type]
        lambda: ZeroShotClassifier(DualEncoder((1, 8, 8), 10), [torch.zeros(1, 3).long()]),
        lambda: ZeroShotClassifier(DualEncoder((1, 8, 8), 10), [torch.zeros(3).long()] * 2),
    ):
        with pytest.raises(ModelError) as info:
            call()
        assert "\n" not in str(info.value)
