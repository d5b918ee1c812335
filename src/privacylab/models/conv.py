"""Convolutional models: the small CNN of the DP-SGD literature and the sigmoid LeNet of DLG."""

from __future__ import annotations

from torch import nn

from privacylab.models import _checks
from privacylab.models.errors import ModelError
from privacylab.models.registry import register_model

NORMS = (None, "group")


def _norm(norm: str | None, channels: int, groups: int) -> list[nn.Module]:
    if norm is None:
        return []
    if channels % groups:
        raise ModelError(f"cnn: norm_groups={groups} must divide the {channels} channels")
    return [nn.GroupNorm(groups, channels)]


@register_model("cnn")
def cnn(
    input_shape: tuple[int, ...],
    num_classes: int,
    activation: str = "tanh",
    norm: str | None = None,
    norm_groups: int = 4,
) -> nn.Module:
    """The small CNN of Papernot et al. 2021 ("Tempered Sigmoid Activations for Deep Learning
    with Differential Privacy", their MNIST model), also Opacus's MNIST example:

    conv 16 8x8 stride 2 pad 3 -> act -> maxpool 2 stride 1 -> conv 32 4x4 stride 2 -> act ->
    maxpool 2 stride 1 -> flatten -> linear 32 -> act -> linear `num_classes`.

    `activation` defaults to tanh, the tempered sigmoid Papernot et al. found best under DP.
    `norm="group"` puts GroupNorm(`norm_groups`) after each convolution; BatchNorm is refused
    because it mixes examples in a batch, which breaks per-example clipping. Works for any
    (C, H, W) input from 14x14 up, e.g. (1, 28, 28) and (3, 32, 32).
    """
    channels, _, _ = _checks.image_shape(input_shape, "cnn")
    if norm not in NORMS:
        hint = " (BatchNorm mixes examples; use norm='group')" if "batch" in str(norm) else ""
        raise ModelError(f"cnn: norm must be None or 'group', got {norm!r}{hint}")
    groups = _checks.positive_int("norm_groups", norm_groups, "cnn")
    act = _checks.activation_type(activation, "cnn")
    features = nn.Sequential(
        nn.Conv2d(channels, 16, 8, stride=2, padding=3),
        *_norm(norm, 16, groups),
        act(),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2),
        *_norm(norm, 32, groups),
        act(),
        nn.MaxPool2d(2, 1),
        nn.Flatten(),
    )
    flat = _checks.flat_size(features, input_shape, "cnn")
    return nn.Sequential(
        *features,
        nn.Linear(flat, 32),
        act(),
        nn.Linear(32, num_classes),
    )


@register_model("lenet")
def lenet(
    input_shape: tuple[int, ...],
    num_classes: int,
    activation: str = "sigmoid",
    init: str = "default",
) -> nn.Module:
    """The LeNet of Zhu, Liu & Han 2019 ("Deep Leakage from Gradients", their released code):

    three 5x5 convolutions with 12 channels, strides 2, 2, 1 and padding 2, each followed by a
    sigmoid, then one Linear layer to the logits. Sigmoid keeps the network twice differentiable,
    which gradient-matching attacks need. `init="uniform"` draws every weight and bias from
    U(-0.5, 0.5), the initialisation of the DLG experiments; "default" is PyTorch's.
    """
    if init not in ("default", "uniform"):
        raise ModelError(f'lenet: init must be "default" or "uniform", got {init!r}')
    channels, _, _ = _checks.image_shape(input_shape, "lenet")
    act = _checks.activation_type(activation, "lenet")
    features = nn.Sequential(
        nn.Conv2d(channels, 12, 5, stride=2, padding=2),
        act(),
        nn.Conv2d(12, 12, 5, stride=2, padding=2),
        act(),
        nn.Conv2d(12, 12, 5, stride=1, padding=2),
        act(),
        nn.Flatten(),
    )
    flat = _checks.flat_size(features, input_shape, "lenet")
    model = nn.Sequential(*features, nn.Linear(flat, num_classes))
    if init == "uniform":
        for param in model.parameters():
            nn.init.uniform_(param, -0.5, 0.5)
    return model
