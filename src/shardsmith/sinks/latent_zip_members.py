"""Turn encoded latents into a ``latent_zip`` sample's one member: the ``.npy`` bytes of a float32
``[2C, H', W']`` array (the VAE posterior's mean, then its std), as ``np.save`` writes it without
pickle (a :class:`~shardsmith.encode.finisher.MemberRenderer`).

Contract
- ``start(stage)`` refuses a stage whose VAE does not store ``mean_std`` or is not an image VAE,
  and an output side that is not a multiple of the VAE's spatial factor (the recipe and
  ``precheck`` refuse these first; this guards a pretrained config that was not on disk).
- ``render(batch, z, texts)`` sets ``res.members = {"npy": bytes}`` and drops ``res.pixels``;
  text embeddings are not stored (the ZIP holds labels, not captions).
- ``sizes`` gives the member's exact size before encoding (shape and dtype decide it).
"""

from __future__ import annotations

import functools
import io

import numpy as np
import torch

from shardsmith.errors import UserError
from shardsmith.formats.zip import LATENT_MEMBER
from shardsmith.records import PlannedItem, SampleResult


class LatentZipModelError(UserError):
    """The loaded VAE cannot make this latent ZIP (the message names the key and the fix)."""


def npy_bytes(arr: np.ndarray) -> bytes:
    """``np.save`` of ``arr`` as float32, no pickle."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr, dtype=np.float32), allow_pickle=False)
    return buf.getvalue()


@functools.lru_cache(maxsize=16)
def _npy_size(shape: tuple[int, ...]) -> int:
    return len(npy_bytes(np.zeros(shape, dtype=np.float32)))


class LatentZipMembers:
    """The members of one ``latent_zip`` output's samples."""

    def __init__(self, output):
        self.o = output

    def start(self, stage) -> None:
        spec = stage.vae.spec
        if spec.store != "mean_std":
            raise LatentZipModelError(f"output {self.o.name!r} (latent_zip) needs models.vae.store: mean_std; the "
                                      f"loaded VAE stores {spec.store!r}")
        if spec.kind != "image_vae":
            raise LatentZipModelError(f"output {self.o.name!r} (latent_zip) holds image latents; models.vae is a "
                                      f"{spec.kind}: use an image VAE family (sd, sdxl, flux)")
        if self.o.side % spec.spatial:
            raise LatentZipModelError(f"output {self.o.name!r}: resolution {self.o.side} is not a multiple of "
                                      f"{spec.spatial}, the loaded VAE's spatial factor; use "
                                      f"{self.o.side // spec.spatial * spec.spatial or spec.spatial}")

    def render(self, batch: list[tuple[PlannedItem, SampleResult]], z: torch.Tensor, texts) -> None:
        arr = z.detach().to("cpu", torch.float32).numpy()
        for i, (_item, res) in enumerate(batch):
            res.members = {LATENT_MEMBER: npy_bytes(arr[i])}
            res.pixels = None

    def sizes(self, item: PlannedItem, res: SampleResult, stage) -> list[tuple[str, int]]:
        frames = res.pixels.shape  # [1, H, W, 3]
        return [(LATENT_MEMBER, _npy_size(tuple(stage.vae.spec.latent_shape((3, *frames[1:3])))))]
