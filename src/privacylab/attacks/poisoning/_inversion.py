"""Total-variation denoising and class-driven model inversion for the trojaning attack.

Liu et al. 2018 ("Trojaning Attack on Neural Networks", NDSS'18), Sec. IV-B, "Training data
generation": the attacker, holding no training data, reverse-engineers one input per class by
gradient steps that drive the class's output neuron to a target value (Algorithm 2), and
denoises after every step by minimising the total variation (Eqs. 3-5)

    E(x, y) = 1/2 Σ_n (x_n − y_n)²,
    V(y) = Σ_{i,j} √((y_{i+1,j} − y_{i,j})² + (y_{i,j+1} − y_{i,j})²),
    y* = argmin_y E(x, y) + λ V(y).

The minimiser is computed by Chambolle's dual projection algorithm (Chambolle 2004, "An
Algorithm for Total Variation Minimization and Applications", J. Math. Imaging Vis., Sec. 3,
Eq. (9) and Theorem 3.1, step τ ≤ 1/8), on forward differences with Neumann boundaries (the
difference past the last row or column is 0), per image and channel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["CHAMBOLLE_STEP", "invert_classes", "total_variation", "tv_denoise"]

CHAMBOLLE_STEP = 0.125
"""τ = 1/8, the largest step of Chambolle's Theorem 3.1 (convergence for τ ≤ 1/8)."""


def _gradient(u: Tensor) -> tuple[Tensor, Tensor]:
    """Forward differences along rows and columns, 0 past the last row/column."""
    gx = torch.zeros_like(u)
    gy = torch.zeros_like(u)
    gx[..., :-1, :] = u[..., 1:, :] - u[..., :-1, :]
    gy[..., :, :-1] = u[..., :, 1:] - u[..., :, :-1]
    return gx, gy


def _divergence(px: Tensor, py: Tensor) -> Tensor:
    """div = −∇ᵀ for fields whose last row (px) and last column (py) are 0."""
    dx = px.clone()
    dx[..., 1:, :] -= px[..., :-1, :]
    dy = py.clone()
    dy[..., :, 1:] -= py[..., :, :-1]
    return dx + dy


def total_variation(images: Tensor) -> Tensor:
    """V(y) of Liu et al.'s Eq. 4 (isotropic, forward differences) summed over the last two
    axes: one value per leading index (per image and channel for (n, C, H, W))."""
    gx, gy = _gradient(images)
    return torch.sqrt(gx**2 + gy**2).sum(dim=(-2, -1))


def tv_denoise(
    images: Tensor, weight: float, iterations: int = 10, step: float = CHAMBOLLE_STEP
) -> Tensor:
    """argmin_y 1/2 ||x − y||² + λ V(y) (Liu et al. Eq. 5) for every image (and channel) of
    `images` (..., H, W), λ = `weight`, by `iterations` of Chambolle's projection (2004,
    Eq. 9): p ← (p + τ ∇(div p − x/λ)) / (1 + τ |∇(div p − x/λ)|), y = x − λ div p, from
    p = 0. A constant image is a fixed point (its gradient is 0, so p stays 0)."""
    if weight <= 0:
        return images.clone()
    x = images.detach()
    px = torch.zeros_like(x)
    py = torch.zeros_like(x)
    for _ in range(int(iterations)):
        gx, gy = _gradient(_divergence(px, py) - x / weight)
        norm = 1.0 + step * torch.sqrt(gx**2 + gy**2)
        px = (px + step * gx) / norm
        py = (py + step * gy) / norm
    return x - weight * _divergence(px, py)


def invert_classes(
    logits_of: Callable[[Tensor], Tensor],
    initial: Tensor,
    classes: Tensor,
    *,
    target_value: float,
    steps: int,
    lr: float,
    threshold: float,
    denoise_weight: float | None,
    denoise_iterations: int,
) -> tuple[Tensor, Tensor]:
    """Algorithm 2 of Liu et al. 2018 for a batch: from `initial` (n, C, H, W), gradient steps
    on cost_i = (target_value − softmax(f(x_i))_{c_i})² for each row's class c_i (the class's
    output neuron, read as a probability as in the paper's tables), each step followed by
    DENOISE (`tv_denoise`, λ = `denoise_weight`; None skips it) and a clamp to [0, 1]. A row
    stops moving once its cost is below `threshold`. Steps are Adam's (the paper's plain
    x − lr·Δ, with per-coordinate step sizes so that one `lr` suits every model's scale).
    Returns the images and each row's final cost."""
    x = initial.detach().clone().clamp(0, 1).requires_grad_(True)
    optimizer = torch.optim.Adam([x], lr=lr)
    active = torch.ones(len(x), dtype=torch.bool, device=x.device)
    index = torch.arange(len(x), device=x.device)
    cost = torch.full((len(x),), float("inf"), device=x.device)
    for _ in range(int(steps)):
        probs = torch.softmax(logits_of(x), dim=1)[index, classes]
        cost = (target_value - probs) ** 2
        active = active & (cost.detach() >= threshold)
        if not bool(active.any()):
            break
        (grad,) = torch.autograd.grad(cost[active].sum(), x)
        grad[~active] = 0
        x.grad = grad
        before = x.detach().clone()
        optimizer.step()
        with torch.no_grad():
            x[~active] = before[~active]
            moved = x[active]
            if denoise_weight is not None:
                moved = tv_denoise(moved, denoise_weight, denoise_iterations)
            x[active] = moved.clamp(0, 1)
    return x.detach(), cost.detach()
