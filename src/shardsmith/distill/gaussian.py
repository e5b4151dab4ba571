"""An analytic teacher: the exact velocity / denoiser of a Gaussian data distribution.

Data per sample: ``x0 ~ N(mu * 1, STD**2 * I)`` with ``mu = cond_mean(cond)`` (the mean of the
``[B, L, D]`` conditioning over all but the batch dimension, shape ``[B]``), broadcast over ``x``.

Contract (``x``: ``[B, ...]``; ``t`` / ``sigma``: a float tensor ``[B]`` or a number; ``mu``: a
tensor ``[B]`` or a number; results are shaped like ``x`` and in ``x``'s dtype, computed in float64
for float64 input and float32 otherwise)
- ``velocity(x, t, cond)``: the flow-matching velocity ``E[eps - x0 | x_t = x]`` for
  ``x_t = (1 - t) x0 + t eps``: with ``m_t = (1 - t) mu`` and ``sd_t = sqrt((1 - t)^2 STD^2 + t^2)``,
  ``v = -mu + (sd_t' / sd_t) (x - m_t)``, ``sd_t' = (t - (1 - t) STD^2) / sd_t``.
- ``denoise(x, sigma, cond)``: the EDM denoiser ``E[x0 | x0 + sigma eps = x] =
  mu + STD^2 / (STD^2 + sigma^2) (x - mu)``.
- ``flow_solution(x_start, t_start, t, mu)``: the exact flow map of ``dx/dt = velocity``:
  ``m_t + (sd_t / sd_start) (x_start - m_start)``.
- ``edm_solution(x_start, sigma_start, sigma, mu)``: the exact flow map of
  ``dx/dsigma = (x - denoise) / sigma``: ``mu + sqrt((STD^2 + sigma^2) / (STD^2 + sigma_start^2)) (x_start - mu)``.
- Guidance: both fields are affine in ``x`` with a slope independent of ``mu`` and linear in ``mu``,
  so ``u + w (c - u)`` is exactly the field of the Gaussian with mean ``mu_u + w (mu_c - mu_u)``.
"""

from __future__ import annotations

import math

import torch

#: the per-coordinate standard deviation of the data
STD = 0.5


def cond_mean(cond: torch.Tensor) -> torch.Tensor:
    """The per-sample data mean ``mu`` ``[B]`` of a conditioning tensor ``[B, ...]``."""
    if cond.dim() == 1:
        return cond.float()
    return cond.float().mean(dim=tuple(range(1, cond.dim())))


def _dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _per_sample(value: torch.Tensor | float, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``value`` (a number or ``[B]``) shaped ``[B, 1, 1, ...]`` to broadcast over ``x``."""
    v = torch.as_tensor(value, device=x.device).to(dtype)
    if v.dim() == 0:
        return v
    if v.dim() != 1 or v.shape[0] != x.shape[0]:
        raise ValueError(f"a per-sample value of shape {tuple(v.shape)} does not match a batch of {x.shape[0]}")
    return v.reshape(-1, *([1] * (x.dim() - 1)))


def _sd(t: torch.Tensor | float) -> torch.Tensor | float:
    s2 = STD * STD
    if isinstance(t, torch.Tensor):
        return torch.sqrt((1 - t) ** 2 * s2 + t * t)
    return math.sqrt((1 - t) ** 2 * s2 + t * t)


def velocity(x: torch.Tensor, t: torch.Tensor | float, cond: torch.Tensor) -> torch.Tensor:
    """The exact flow-matching velocity at ``(x, t)``."""
    dt = _dtype(x)
    xx, tt = x.to(dt), _per_sample(t, x, dt)
    mu = _per_sample(cond_mean(cond), x, dt)
    sd = _sd(tt)
    slope = (tt - (1 - tt) * STD * STD) / (sd * sd)
    return (-mu + slope * (xx - (1 - tt) * mu)).to(x.dtype)


def denoise(x: torch.Tensor, sigma: torch.Tensor | float, cond: torch.Tensor) -> torch.Tensor:
    """The exact EDM denoiser ``E[x0 | x]`` at noise level ``sigma``."""
    dt = _dtype(x)
    xx, ss = x.to(dt), _per_sample(sigma, x, dt)
    mu = _per_sample(cond_mean(cond), x, dt)
    s2 = STD * STD
    return (mu + s2 / (s2 + ss * ss) * (xx - mu)).to(x.dtype)


def flow_solution(x_start: torch.Tensor, t_start: float, t: float, mu: torch.Tensor | float) -> torch.Tensor:
    """The exact state at ``t`` of the flow ODE started at ``(x_start, t_start)``."""
    dt = _dtype(x_start)
    xx, m = x_start.to(dt), _per_sample(mu, x_start, dt)
    t_start, t = float(t_start), float(t)
    return ((1 - t) * m + (_sd(t) / _sd(t_start)) * (xx - (1 - t_start) * m)).to(x_start.dtype)


def edm_solution(x_start: torch.Tensor, sigma_start: float, sigma: float, mu: torch.Tensor | float) -> torch.Tensor:
    """The exact state at ``sigma`` of the EDM ODE started at ``(x_start, sigma_start)``."""
    dt = _dtype(x_start)
    xx, m = x_start.to(dt), _per_sample(mu, x_start, dt)
    s2 = STD * STD
    scale = math.sqrt((s2 + float(sigma) ** 2) / (s2 + float(sigma_start) ** 2))
    return (m + scale * (xx - m)).to(x_start.dtype)
