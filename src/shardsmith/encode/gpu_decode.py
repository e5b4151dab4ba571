"""GPU image decode: a batch of JPEGs decoded, oriented, resized and cropped on the encoder's device.

Contract
- Which decoder a build uses (``images.decoder`` settled once, kept in the ledger) is decided in
  :mod:`shardsmith.encode.decoder_choice`, which needs no torch.
- :class:`StagedImages`: one batch's rows, each an :class:`~shardsmith.transform.jpeg_pass.EncodedImage`
  or uint8 ``[1, H, W, 3]`` pixels decoded on the CPU (a PNG, a CMYK JPEG ...), all of one bucket.
  ``shape`` is the staged batch's ``[B, 1, H, W, 3]``; slicing gives rows that report failures to
  the whole batch's ``failed``.
- :func:`decode_rows(staged, device)`: uint8 ``[B, H, W, 3]`` on ``device``. The JPEGs are decoded in
  one call of :data:`DECODE` (nvJPEG in batches), turned upright by their EXIF orientation, resized
  with antialiased bicubic (PIL's kernel: the pixels differ from the CPU path's by rounding, see the
  README) and cropped by the CPU path's own geometry. A JPEG the GPU decoder refuses is decoded on the
  CPU instead (the exact CPU path); one that fails there too is a zero row and an
  :class:`~shardsmith.records.ItemError` in ``staged.failed[row]`` (the build records it as failed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from shardsmith.records import ItemError
from shardsmith.transform.jpeg_pass import EncodedImage

log = logging.getLogger(__name__)


def _torchvision_decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)


#: ``(list of uint8 1-D byte tensors, device) -> list of uint8 [3, H, W] as stored`` (no EXIF rotation).
#: torchvision's nvJPEG decoder; tests put a CPU decoder here.
DECODE: Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]] = _torchvision_decode


def gpu_decoder_problem() -> str | None:
    """None when torchvision's GPU JPEG decoder can be imported, else what is missing."""
    try:
        import importlib

        importlib.import_module("torchvision.io").decode_jpeg
    except Exception as exc:  # noqa: BLE001 - any import failure means: no GPU decoder here
        return f"torchvision's decode_jpeg cannot be imported ({type(exc).__name__}: {exc})"
    return None


@dataclass
class StagedImages:
    rows: list[EncodedImage | np.ndarray]
    failed: dict[int, ItemError] = field(default_factory=dict)
    _base: "StagedImages | None" = None
    _offset: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.rows), *self.rows[0].shape)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, s: slice) -> "StagedImages":
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("StagedImages takes a contiguous slice")
        start = range(len(self.rows))[s].start if len(self.rows) else 0
        root = self._base or self
        return StagedImages(self.rows[s], root.failed, root, self._offset + start)

    def fail(self, row: int, err: ItemError) -> None:
        self.failed[self._offset + row] = err


_TRANSPOSE = {  # EXIF orientation -> (transpose H/W, flip H, flip W) applied to [C, H, W], as PIL's exif_transpose
    2: (False, False, True), 3: (False, True, True), 4: (False, True, False),
    5: (True, False, False), 6: (True, False, True), 7: (True, True, True), 8: (True, True, False),
}


def orient(chw: torch.Tensor, orientation: int) -> torch.Tensor:
    """``[C, H, W]`` as stored -> upright, by EXIF orientation 1..8 (PIL's ``exif_transpose``)."""
    if orientation not in _TRANSPOSE:
        return chw
    transpose, flip_h, flip_w = _TRANSPOSE[orientation]
    if transpose:
        chw = chw.transpose(1, 2)
    dims = [d for d, f in ((1, flip_h), (2, flip_w)) if f]
    return chw.flip(dims) if dims else chw


def resize_crop(chw: torch.Tensor, resize: tuple[int, int], box: tuple[int, int, int, int]) -> torch.Tensor:
    """uint8 upright ``[3, H, W]`` -> uint8 ``[h, w, 3]``: resized to ``resize`` (w, h) with antialiased
    bicubic (PIL's kernel), rounded, then cropped to ``box``."""
    rw, rh = resize
    x0, y0, x1, y1 = box
    if (chw.shape[2], chw.shape[1]) != (rw, rh):
        f = F.interpolate(chw[None].float(), size=(rh, rw), mode="bicubic", antialias=True, align_corners=False)
        chw = f[0].round_().clamp_(0, 255).to(torch.uint8)
    return chw[:, y0:y1, x0:x1].permute(1, 2, 0)


def _cpu_row(img: EncodedImage) -> np.ndarray:
    """The CPU path's pixels of one JPEG (raises ItemError as the CPU path does)."""
    from shardsmith.transform.buckets import ResizeCrop
    from shardsmith.transform.image import decode_image
    from shardsmith.transform.video import resize_crop_image

    dec = decode_image(img.data, name=img.name, max_pixels=img.max_pixels, background=img.background)
    x0, y0, x1, y1 = img.box
    return resize_crop_image(dec.image, ResizeCrop(*img.resize, x0, y0, x1 - x0, y1 - y0))


def decode_rows(staged: StagedImages, device: torch.device | str) -> torch.Tensor:
    """The batch's pixels, uint8 ``[B, H, W, 3]`` on ``device`` (see the module)."""
    device = torch.device(device)
    out = torch.empty(staged.shape[0], *staged.shape[2:], dtype=torch.uint8, device=device)
    jpeg_rows = [i for i, r in enumerate(staged.rows) if isinstance(r, EncodedImage)]
    for i, r in enumerate(staged.rows):
        if not isinstance(r, EncodedImage):
            out[i].copy_(torch.from_numpy(np.ascontiguousarray(r[0])), non_blocking=False)
    decoded: dict[int, torch.Tensor] = {}
    if jpeg_rows:
        datas = [torch.frombuffer(bytearray(staged.rows[i].data), dtype=torch.uint8) for i in jpeg_rows]
        try:
            decoded = dict(zip(jpeg_rows, DECODE(datas, device)))
        except Exception as exc:  # noqa: BLE001 - one bad file fails nvJPEG's whole batch: decode one by one
            log.info("batch JPEG decode failed (%s); decoding its %d images one by one", exc, len(jpeg_rows))
            for i, d in zip(jpeg_rows, datas):
                try:
                    decoded[i] = DECODE([d], device)[0]
                except Exception:  # noqa: BLE001 - decoded on the CPU below
                    pass
    for i in jpeg_rows:
        img = staged.rows[i]
        chw = decoded.get(i)
        if chw is not None:
            chw = orient(chw, img.orientation)
            if (chw.shape[2], chw.shape[1]) != img.size:  # not the size the geometry was decided for
                chw = None
        if chw is not None:
            out[i].copy_(resize_crop(chw, img.resize, img.box))
            continue
        try:
            out[i].copy_(torch.from_numpy(np.ascontiguousarray(_cpu_row(img))))
        except ItemError as e:
            out[i].zero_()
            staged.fail(i, e)
    return out

