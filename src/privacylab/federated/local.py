"""A client's local training as one pure function of the parameters the server sent: the
client computes its update with it, and a gradient-inversion attacker replays it on dummy
data (Zhu et al. 2019, Alg. 1 line 4: the dummy gradient; Geiping et al. 2020, Sec. 5: the
unrolled multi-step FedAvg update), so both sides run exactly the same procedure.

Parameters are swapped in with `torch.func.functional_call`; the model's own parameters and
buffers are never written (buffers are copied, so BatchNorm running statistics of the caller's
model do not move). The model runs in training mode, as a client's would.

With `privacy` (a `LocalPrivacy`), every local step is a DP-SGD step (Abadi et al. 2016, Alg. 1,
lines 5-8): per-example gradients by `torch.func.vmap(torch.func.grad(...))` over
`functional_call`, each clipped to L2 norm C over all parameters together, summed, plus
N(0, (σ C)^2) per coordinate drawn from the caller's generator, divided by the local batch size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from privacylab.federated.protocol import FederatedError, LocalPrivacy, LocalTraining

__all__ = [
    "cross_entropy",
    "local_update",
    "module_names",
    "private_gradient",
    "training_mode",
]


def cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    """Mean cross-entropy of `logits` against int labels (n,) or probability rows (n, k): the
    soft form is what DLG optimises its dummy labels through (Zhu et al. 2019, Sec. 3.2)."""
    if y.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):
        return F.cross_entropy(logits, y.long())
    return -(y * F.log_softmax(logits, dim=1)).sum(1).mean()


def module_names(model: nn.Module, names: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Map each parameter name of the global model to the name it has in `model`, which may
    wrap it (a counting view of a `Target` names them `inner.<name>`)."""
    own = {n for n, _ in model.named_parameters()}
    for prefix in ("", "inner."):
        if all(prefix + n in own for n in names):
            return {n: prefix + n for n in names}
    missing = sorted(n for n in names if n not in own and f"inner.{n}" not in own)
    raise FederatedError(f"the model has no parameter named {missing[0]!r}")


@contextmanager
def training_mode(model: nn.Module, train: bool = True) -> Iterator[None]:
    """Put `model` (and every submodule) in training mode for the block, then restore each
    module's own mode."""
    modes = [(m, m.training) for m in model.modules()]
    model.train(train)
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode


def local_update(
    model: nn.Module,
    state: Mapping[str, Tensor],
    x: Tensor,
    y: Tensor,
    training: LocalTraining,
    *,
    create_graph: bool = False,
    privacy: LocalPrivacy | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """What a client holding (`x`, `y`) sends after local training from `state`, keyed like
    `state`: the gradient of the mean cross-entropy (FedSGD) or w_0 - w_T after the local SGD
    steps of `training` (FedAvg). `y` is int labels or probability rows. With `create_graph`
    the result stays differentiable in `x`, `y` and `state` (the attacker's replay). With
    `privacy`, each step's gradient is `private_gradient` (DP-SGD, noise from `generator`,
    which is then required; not differentiable, so not with `create_graph`)."""
    n = int(x.shape[0])
    if n == 0 or int(y.shape[0]) != n:
        raise FederatedError(f"a client update needs n >= 1 rows with n labels, got {n}/{len(y)}")
    if privacy is not None:
        _check_private(model, privacy, generator, create_graph)
    names = module_names(model, tuple(state))
    params = {names[k]: v.clone().requires_grad_(True) for k, v in state.items()}
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    start_params = dict(params)
    with training_mode(model):
        for start, stop in training.batches(n):
            if privacy is not None:
                assert generator is not None
                noisy = private_gradient(
                    model, params, buffers, x[start:stop], y[start:stop], privacy, generator
                )
                grads = tuple(noisy[key] for key in params)
            else:
                logits = functional_call(model, {**params, **buffers}, (x[start:stop],))
                loss = cross_entropy(logits, y[start:stop])
                grads = torch.autograd.grad(loss, list(params.values()), create_graph=create_graph)
            if training.algorithm == "fedsgd":
                return {k: g for k, g in zip(state, grads, strict=True)}
            stepped = {}
            for (key, value), grad in zip(params.items(), grads, strict=True):
                new = value - training.lr * grad
                stepped[key] = new if create_graph else new.detach().requires_grad_(True)
            params = stepped
    return (
        {k: (start_params[names[k]] - params[names[k]]) for k in state}
        if create_graph
        else {k: (state[k] - params[names[k]]).detach() for k in state}
    )


def _check_private(
    model: nn.Module,
    privacy: LocalPrivacy,
    generator: torch.Generator | None,
    create_graph: bool,
) -> None:
    if not isinstance(privacy, LocalPrivacy):
        raise FederatedError(f"privacy must be a LocalPrivacy, got {type(privacy).__name__}")
    if create_graph:
        raise FederatedError(
            "a DP-SGD client's update is noisy and not replayed differentiably: "
            "create_graph=True cannot be combined with privacy"
        )
    if not isinstance(generator, torch.Generator):
        raise FederatedError("local DP-SGD draws noise: pass generator=torch.Generator()")
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        raise FederatedError(
            "local DP-SGD needs per-example gradients, and BatchNorm mixes the examples of a "
            "batch; use a model without BatchNorm (GroupNorm or none)"
        )


def private_gradient(
    model: nn.Module,
    params: Mapping[str, Tensor],
    buffers: Mapping[str, Tensor],
    x: Tensor,
    y: Tensor,
    privacy: LocalPrivacy,
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """One DP-SGD gradient on the batch (`x`, `y`) (Abadi et al. 2016, Alg. 1, lines 5-8):
    the per-example gradients g_i of the cross-entropy (`vmap(grad(...))` over
    `functional_call`), each scaled by min(1, C / ||g_i||) with ||g_i|| the L2 norm over all
    parameters together, summed, plus N(0, (σ C)^2) per coordinate (drawn from `generator`
    on its own device, parameter by parameter in `params` order), divided by the batch size.
    Detached; keyed like `params`."""
    detached = {k: v.detach() for k, v in params.items()}

    def loss(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        logits = functional_call(model, {**p, **buffers}, (xi.unsqueeze(0),))
        return cross_entropy(logits, yi.unsqueeze(0))

    per_example = torch.func.vmap(
        torch.func.grad(loss), in_dims=(None, 0, 0), randomness="different"
    )(detached, x, y)
    size = int(x.shape[0])
    squares = sum(g.reshape(size, -1).pow(2).sum(1) for g in per_example.values())
    norms = torch.as_tensor(squares).sqrt()
    clip = float(privacy.clip)
    factor = torch.where(norms > clip, clip / norms.clamp_min(1e-30), torch.ones_like(norms))
    std = float(privacy.noise_multiplier) * clip
    out: dict[str, Tensor] = {}
    for key, grads in per_example.items():
        shape = (size,) + (1,) * (grads.dim() - 1)
        summed = (grads * factor.reshape(shape)).sum(0)
        noise = torch.randn(
            tuple(summed.shape), generator=generator, dtype=summed.dtype, device=generator.device
        )
        out[key] = (summed + std * noise.to(summed.device)) / size
    return out
