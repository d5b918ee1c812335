"""Building models by name: shapes, seeding, options and the parameter-module contract."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privacylab.models import (
    PARAMETER_MODULES,
    ModelError,
    build_model,
    model_names,
    model_options,
    unsupported_parameter_modules,
)

CASES = [
    ("logreg", (1, 28, 28), {}),
    ("logreg", (30,), {}),
    ("mlp", (1, 28, 28), {}),
    ("mlp", (30,), {"widths": [16], "activation": "tanh", "dropout": 0.1}),
    ("mlp", (1, 8, 8), {"widths": (), "activation": "sigmoid"}),
    ("cnn", (1, 28, 28), {}),
    ("cnn", (3, 32, 32), {"norm": "group", "activation": "relu"}),
    ("lenet", (3, 32, 32), {}),
    ("lenet", (1, 28, 28), {}),
    ("lenet", (1, 8, 8), {}),
    ("transformer", (64,), {"vocab_size": 100}),
    ("transformer", (12,), {"vocab_size": 50, "max_len": 20, "dim": 32, "heads": 2, "pad_id": 0}),
]


def example_batch(name: str, shape: tuple[int, ...], n: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if name == "transformer":
        return torch.randint(0, 50, (n, *shape), generator=generator)
    return torch.rand(n, *shape, generator=generator)


def test_names() -> None:
    assert model_names() == ["cnn", "gpt", "lenet", "logreg", "mlp", "scatnet", "transformer"]
    assert model_options("mlp") == {"widths": (512, 256), "activation": "relu", "dropout": 0.0}


@pytest.mark.parametrize(("name", "shape", "options"), CASES)
def test_forward_shape_and_parameter_modules(name: str, shape: tuple, options: dict) -> None:
    model = build_model(name, shape, 7, seed=0, **options)
    out = model(example_batch(name, shape))
    assert out.shape == (3, 7) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert unsupported_parameter_modules(model) == []
    for module in model.modules():
        if any(True for _ in module.parameters(recurse=False)):
            assert isinstance(module, PARAMETER_MODULES)
    assert not any(
        isinstance(m, nn.MultiheadAttention | nn.modules.batchnorm._BatchNorm)
        for m in model.modules()
    )


def test_known_architectures() -> None:
    assert sum(p.numel() for p in build_model("cnn", (1, 28, 28), 10).parameters()) == 26010
    mlp = build_model("mlp", (1, 28, 28), 10)
    assert [m.out_features for m in mlp.modules() if isinstance(m, nn.Linear)] == [512, 256, 10]
    lenet = build_model("lenet", (3, 32, 32), 100)
    convs = [m for m in lenet.modules() if isinstance(m, nn.Conv2d)]
    assert [c.stride for c in convs] == [(2, 2), (2, 2), (1, 1)]
    assert all(c.out_channels == 12 and c.kernel_size == (5, 5) for c in convs)
    assert lenet[-1].in_features == 768
    assert sum(isinstance(m, nn.Sigmoid) for m in lenet.modules()) == 3
    groupnorm = build_model("cnn", (1, 28, 28), 10, norm="group")
    assert sum(isinstance(m, nn.GroupNorm) for m in groupnorm.modules()) == 2


@pytest.mark.parametrize(("name", "shape", "options"), CASES)
def test_seeded_build_is_deterministic_and_leaves_global_rng(
    name: str, shape: tuple, options: dict
) -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = build_model(name, shape, 5, seed=7, **options)
    assert torch.equal(torch.get_rng_state(), before)
    b = build_model(name, shape, 5, seed=7, **options)
    c = build_model(name, shape, 5, seed=8, **options)
    for (key, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), key
    assert any(
        not torch.equal(pa, pc)
        for pa, pc in zip(a.state_dict().values(), c.state_dict().values(), strict=True)
    )


def test_transformer_padding_is_ignored() -> None:
    model = build_model("transformer", (6,), 3, seed=0, vocab_size=20, pad_id=0).eval()
    short = torch.tensor([[5, 6, 7, 0, 0, 0]])
    unpadded = build_model("transformer", (3,), 3, seed=0, vocab_size=20, max_len=6, pad_id=0)
    unpadded.load_state_dict(model.state_dict())
    assert torch.allclose(model(short), unpadded.eval()(short[:, :3]), atol=1e-5)
    with pytest.raises(ModelError, match="max_len"):
        model(torch.zeros(1, 7, dtype=torch.int64))


def test_per_example_gradients_with_vmap_match_a_loop() -> None:
    from torch.func import functional_call, grad, vmap

    model = build_model("transformer", (8,), 4, seed=0, vocab_size=30, dim=16, heads=2)
    params = {k: v.detach() for k, v in model.named_parameters()}
    tokens = torch.randint(0, 30, (3, 8), generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 3])

    def loss(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, p, (x.unsqueeze(0),))
        return nn.functional.cross_entropy(logits, y.unsqueeze(0))

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, tokens, labels)
    for i in range(3):
        model.zero_grad()
        nn.functional.cross_entropy(model(tokens[i : i + 1]), labels[i : i + 1]).backward()
        for key, parameter in model.named_parameters():
            assert torch.allclose(per_example[key][i], parameter.grad, atol=1e-5), key


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("resnet", (1, 28, 28), 10), {}, "unknown model 'resnet'; available: cnn"),
        (("mlp", (1, 28, 28), 10), {"width": 3}, "no option width"),
        (("mlp", (1, 28, 28), 10), {"activation": "gelu"}, "activation"),
        (("mlp", (1, 28, 28), 10), {"dropout": 1.0}, "dropout"),
        (("mlp", (1, 28, 28), 10), {"widths": [0]}, "widths"),
        (("mlp", (1, 28, 28), 1), {}, "num_classes"),
        (("mlp", (), 10), {}, "input_shape"),
        (("mlp", (1, -2), 10), {}, "input_shape"),
        (("mlp", (1, 28, 28), 10), {"seed": -1}, "seed"),
        (("cnn", (784,), 10), {}, r"\(C, H, W\)"),
        (("cnn", (1, 8, 8), 10), {}, "too small"),
        (("cnn", (1, 28, 28), 10), {"norm": "batch"}, "GroupNorm|group"),
        (("cnn", (1, 28, 28), 10), {"norm": "group", "norm_groups": 5}, "divide"),
        (("transformer", (16,), 10), {}, "needs option vocab_size"),
        (("transformer", (1, 28, 28), 10), {"vocab_size": 10}, r"\(L,\)"),
        (("transformer", (16,), 10), {"vocab_size": 10, "dim": 30, "heads": 4}, "divisible"),
        (("transformer", (16,), 10), {"vocab_size": 10, "max_len": 8}, "max_len"),
        (("transformer", (16,), 10), {"vocab_size": 10, "pad_id": 10}, "pad_id"),
    ],
)
def test_bad_input_one_line(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(ModelError, match=match) as info:
        build_model(*args, **kwargs)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_contract_check_flags_stray_parameters() -> None:
    class Stray(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.norm = nn.BatchNorm1d(3)
            self.linear = nn.Linear(3, 2)

    flagged = unsupported_parameter_modules(Stray())
    assert flagged == ["<root> (Stray)", "norm (BatchNorm1d)"]
