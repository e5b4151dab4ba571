"""The one rule of a video inpainting mask, wherever it is stored: ``video_masks/<path>.pt``
``{"mask": ...}`` beside ``latents/<path>.pt`` in a ``.precomputed/`` tree, or ``<key>.mask.pth`` beside
``<key>.latent.pth`` in a latent WebDataset sample. The mask is 0/1 on its latent's grid: a tensor
``[F', H', W']`` equal to ``latents.shape[1:]`` (``[C, F', H', W']``), as the build writes it
(``transform.masks.latent_mask``) and as the LTX trainer reshapes it to the latent's tokens.

:func:`mask_grid_problem` says why a mask breaks the rule (``verify``'s ``mask_grid`` check of a tree,
the WebDataset loader's ``mask_grid:<key>`` drop), or ``None``.
"""

from __future__ import annotations

from typing import Any


def mask_grid_problem(mask: Any, latents: Any = None) -> str | None:
    """Why ``mask`` is not a 0/1 tensor ``[F', H', W']`` on the grid of ``latents`` (the latent tensor
    ``[C, F', H', W']``; None or not a tensor: the grid is not compared), or None."""
    import torch

    if not torch.is_tensor(mask) or mask.ndim != 3:
        return f"mask is {list(mask.shape) if torch.is_tensor(mask) else type(mask).__name__}, not [F', H', W']"
    if torch.is_tensor(latents) and tuple(mask.shape) != tuple(latents.shape[1:]):
        return f"mask {list(mask.shape)} vs latent grid {list(latents.shape[1:])}"
    if not bool(((mask == 0) | (mask == 1)).all()):
        return "mask holds values other than 0 and 1"
    return None


def audio_mask_problem(mask: Any, latents: Any = None) -> str | None:
    """Why ``mask`` is not a 0/1 tensor ``[T]`` on the steps of ``latents`` (the audio latent ``[C, T, F]``;
    None or not a tensor: the steps are not compared), or None: the rule of ``audio_masks/<path>.pt``
    ``{"mask": ...}`` beside ``audio_latents/`` and of ``audio_mask.pth`` beside ``audio_latent.pth``."""
    import torch

    if not torch.is_tensor(mask) or mask.ndim != 1:
        return f"audio mask is {list(mask.shape) if torch.is_tensor(mask) else type(mask).__name__}, not [T]"
    if torch.is_tensor(latents) and latents.ndim == 3 and mask.shape[0] != latents.shape[1]:
        return f"audio mask [{mask.shape[0]}] vs audio latent steps [{latents.shape[1]}]"
    if not bool(((mask == 0) | (mask == 1)).all()):
        return "audio mask holds values other than 0 and 1"
    return None
