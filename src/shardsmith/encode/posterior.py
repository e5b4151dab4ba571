"""A diagonal Gaussian posterior from an ``AutoencoderKL`` encoder's moments, without diffusers.

Contract
- :func:`mean_std` splits moments ``[B, 2C, ...]`` as diffusers' ``DiagonalGaussianDistribution`` does (mean,
  log-variance clamped to [-30, 20], std = exp(logvar / 2)): the same operations, so the same bytes.
- :func:`sample` draws ``mean + std * noise`` with the noise of diffusers' ``randn_tensor`` for one generator
  on the moments' device (the same draw, the same bytes).
"""

from __future__ import annotations

import torch


def mean_std(moments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean, logvar = torch.chunk(moments, 2, dim=1)
    return mean, torch.exp(0.5 * torch.clamp(logvar, -30.0, 20.0))


def sample(moments: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    mean, std = mean_std(moments)
    noise = torch.randn(mean.shape, generator=generator, device=moments.device, dtype=moments.dtype,
                        layout=torch.strided)
    return mean + std * noise
