"""The worker's side of GPU image decode: a JPEG passed on undecoded, with its geometry decided.

With ``images.decoder`` resolved to ``gpu`` (:func:`shardsmith.encode.decoder_choice.resolve_decoder`), a
decode worker does not decode a plain JPEG: it reads the header only (size, mode, EXIF orientation,
colour profile), checks the file ends where a JPEG ends, decides the item's geometry from its upright
size exactly as the CPU path does, and hands on an :class:`EncodedImage` (the compressed bytes, a
tenth of the decoded pixels' size). The encode stage decodes a batch of them on the GPU
(:mod:`shardsmith.encode.gpu_decode`).

Contract
- :func:`gpu_refusal(img, data)` says why an opened (not decoded) image must take the CPU path, or
  None when the GPU decoder gives what the CPU path gives up to resampling: a baseline or progressive
  8-bit JPEG in RGB (YCbCr) or grey, without a colour profile other than sRGB, ending in its
  end-of-image marker (a truncated file is decoded on the CPU, which names it ``failed:truncated``).
- :class:`EncodedImage` looks like the pixels it stands for where the build sizes a sample
  (``shape`` ``[1, H, W, 3]``, ``dtype`` uint8).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageCms

_SRGB_NAMES = ("sRGB", "sRGB built-in", "sRGB IEC61966-2.1")
_EOI = b"\xff\xd9"


@dataclass(frozen=True)
class EncodedImage:
    """A JPEG to decode on the device: its bytes, its EXIF orientation (1..8; applied after decode),
    and the geometry the CPU path would apply to the upright picture: resize to ``resize`` (w, h),
    then keep ``box`` (x0, y0, x1, y1) of the resized picture."""

    data: bytes
    orientation: int
    size: tuple[int, int]  # (w, h) upright: the size the geometry was decided for
    resize: tuple[int, int]
    box: tuple[int, int, int, int]
    name: str  # the item's id, for messages
    max_pixels: int
    background: tuple[int, int, int]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (1, self.box[3] - self.box[1], self.box[2] - self.box[0], 3)

    dtype = np.dtype(np.uint8)


def exif_orientation(img: Image.Image) -> int:
    """The EXIF orientation tag (1 when absent or unreadable)."""
    try:
        o = int(img.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 - a broken EXIF block: the CPU path keeps the picture as stored
        return 1
    return o if 1 <= o <= 8 else 1


def upright_size(w: int, h: int, orientation: int) -> tuple[int, int]:
    """The picture's (w, h) once its EXIF orientation is applied (5..8 swap the sides)."""
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


def _ends_as_jpeg(data: bytes) -> bool:
    """An end-of-image marker in the last KiB (entropy-coded data never holds one: a 0xFF there is
    stuffed; some cameras and copy tools append a few bytes after it)."""
    return data.rfind(_EOI, max(0, len(data) - 1024)) != -1


def gpu_refusal(img: Image.Image, data: bytes) -> str | None:
    """None when the GPU decoder may take this opened JPEG, else the reason it goes to the CPU."""
    if img.format != "JPEG":
        return f"{img.format} is decoded on the CPU"
    if img.mode not in ("RGB", "L"):
        return f"a {img.mode} JPEG is decoded on the CPU"
    if getattr(img, "bits", 8) != 8:
        return "a 12-bit JPEG is decoded on the CPU"
    icc = img.info.get("icc_profile")
    if icc:
        try:
            desc = ImageCms.getProfileDescription(ImageCms.ImageCmsProfile(io.BytesIO(icc))).strip()
        except Exception:  # noqa: BLE001 - the CPU path records the broken profile
            return "a broken colour profile is handled on the CPU"
        if desc not in _SRGB_NAMES:
            return f"colour profile {desc!r} is converted to sRGB on the CPU"
    if not _ends_as_jpeg(data):
        return "no end-of-image marker (truncated?): decoded on the CPU"
    return None
