"""Decode any image into an upright sRGB RGB picture, then resize / crop / encode it.

``decode_image`` is the one entry point for untrusted bytes. It refuses (with an
:class:`ItemError` naming the item and the fix) empty files, non-images, decompression
bombs and truncated or corrupt data; it applies EXIF orientation, converts an embedded
ICC profile to sRGB, maps every PIL mode (CMYK, L, LA, P, I;16, I, F, 1 ...) to RGB and
composites alpha on the configured background. Animated images keep their first frame.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageCms, ImageOps, UnidentifiedImageError

from shardsmith.records import ItemError
from shardsmith.transform import geometry

Image.MAX_IMAGE_PIXELS = None  # we enforce images.max_pixels ourselves, before decoding

try:  # HEIC / HEIF (phone photos): Pillow reads them through the optional pillow-heif plugin
    from pillow_heif import register_heif_opener

    register_heif_opener()
    HEIF_PLUGIN = True
except ImportError:
    HEIF_PLUGIN = False

_HEIF_BRANDS = (b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1")

_SRGB = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))
_PIL_EXT = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}


@dataclass
class DecodedImage:
    image: Image.Image  # mode RGB, upright, sRGB
    source_size: tuple[int, int]  # (w, h) as stored in the file, before EXIF rotation
    source_format: str | None  # PIL format name: JPEG, PNG ...
    source_mode: str
    notes: dict = field(default_factory=dict)  # what was done: exif_transposed, icc_to_srgb, alpha, frames

    @property
    def untouched(self) -> bool:
        """True when the pixels are exactly what a plain RGB decode of the bytes gives."""
        return not self.notes and self.source_mode in ("RGB", "L")


def _to_8bit(img: Image.Image) -> Image.Image:
    arr = np.asarray(img)
    if img.mode.startswith("I;16") or (arr.dtype.kind in "iu" and arr.size and arr.max() > 255):
        arr = (arr.astype(np.uint32) // 257).clip(0, 255)
    elif arr.dtype.kind == "f":
        arr = arr * 255.0 if arr.size and float(np.nanmax(arr)) <= 1.0 else arr
        arr = np.nan_to_num(arr).clip(0, 255)
    else:
        arr = arr.clip(0, 255)
    return Image.fromarray(arr.astype(np.uint8), "L")


def identify(data: bytes, *, name: str, max_pixels: int) -> Image.Image:
    """Open (not decode) an image and screen it: empty, not an image, decompression bomb."""
    if not data:
        raise ItemError("empty_file", f"{name} is 0 bytes; re-copy it from the original or remove it")
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        if not HEIF_PLUGIN and data[4:8] == b"ftyp" and data[8:12] in _HEIF_BRANDS:
            raise ItemError("heif_needs_plugin", f"{name} is a HEIC/HEIF image, which Pillow reads only with its "
                            "pillow-heif plugin: pip install pillow-heif, then rebuild (--overwrite); or convert "
                            "it to JPEG or PNG") from None
        raise ItemError("not_an_image", f"{name} is not an image PIL can identify ({len(data):,} bytes); "
                        "remove it or fix its extension") from None
    except Exception as exc:  # noqa: BLE001 - any parser error is a per-item failure
        raise ItemError("decode_error", f"{name} cannot be opened: {exc}") from None
    w, h = img.size
    if w * h > max_pixels:
        raise ItemError("decompression_bomb", f"{name} declares {w}x{h} = {w * h:,} pixels, above "
                        f"images.max_pixels={max_pixels:,}; raise images.max_pixels if the image is genuine")
    return img


def decode_image(data: bytes, *, name: str, max_pixels: int,
                 background: tuple[int, int, int] = (255, 255, 255),
                 draft: tuple[int, int] | None = None) -> DecodedImage:
    """Bytes -> :class:`DecodedImage` (RGB). Raises :class:`ItemError` on any bad input.

    ``draft`` (w, h as stored): a JPEG is decoded at the smallest of libjpeg's DCT scales (1/2, 1/4,
    1/8) that still covers it (PIL's ``Image.draft``), a fraction of the work of a full decode; the
    picture is then smaller than ``source_size`` (other formats ignore it)."""
    img = identify(data, name=name, max_pixels=max_pixels)
    w, h = img.size
    if draft is not None and img.format == "JPEG":
        img.draft(None, draft)
    notes: dict = {}
    fmt, mode = img.format, img.mode
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            frames = getattr(img, "n_frames", 1)
            if frames > 1:
                notes["frames"] = frames
                img.seek(0)
            img.load()
    except OSError as exc:
        msg = str(exc)
        reason = "truncated" if "truncated" in msg or "broken data stream" in msg else "decode_error"
        raise ItemError(reason, f"{name} is {'truncated' if reason == 'truncated' else 'corrupt'} ({msg}); "
                        "re-copy it from the original or remove it") from None
    except Exception as exc:  # noqa: BLE001
        raise ItemError("decode_error", f"{name} cannot be decoded: {exc}; re-save it or remove it") from None

    icc = img.info.get("icc_profile")
    try:
        orientation = img.getexif().get(0x0112, 1)
        if orientation in (2, 3, 4, 5, 6, 7, 8):  # exif_transpose copies even when upright: only call it here
            img = ImageOps.exif_transpose(img)
            notes["exif_transposed"] = orientation
    except Exception:  # noqa: BLE001 - a broken EXIF block must not lose the picture
        notes["exif_error"] = True

    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        img = _to_8bit(img)
        notes["bit_depth_reduced"] = mode
    elif img.mode == "1":
        img = img.convert("L")
    elif img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif img.mode in ("PA", "La"):
        img = img.convert("RGBA")

    if icc and img.mode in ("RGB", "RGBA", "CMYK", "L", "LA"):
        try:
            src = ImageCms.ImageCmsProfile(io.BytesIO(icc))
            if ImageCms.getProfileDescription(src).strip() not in ("sRGB", "sRGB built-in", "sRGB IEC61966-2.1"):
                alpha = img.getchannel("A") if img.mode in ("RGBA", "LA") else None
                base = img.convert("RGB" if img.mode in ("RGBA", "LA") else img.mode) if alpha else img
                conv = ImageCms.profileToProfile(base, src, _SRGB, outputMode="RGB")
                if conv is not None:
                    img = conv
                    if alpha is not None:
                        img.putalpha(alpha)
                    notes["icc_to_srgb"] = ImageCms.getProfileDescription(src).strip()
        except Exception as exc:  # noqa: BLE001 - a broken profile: keep the pixels, record it
            notes["icc_error"] = str(exc)[:200]

    if img.mode in ("RGBA", "LA", "RGBa"):
        rgba = img.convert("RGBA")
        if rgba.getchannel("A").getextrema() != (255, 255):
            notes["alpha_composited"] = True
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        canvas.alpha_composite(rgba)
        img = canvas.convert("RGB")
    elif img.mode != "RGB":
        if img.mode == "CMYK":
            notes.setdefault("cmyk_converted", True)
        img = img.convert("RGB")
    return DecodedImage(image=img, source_size=(w, h), source_format=fmt, source_mode=mode, notes=notes)


def encode_image(img: Image.Image, fmt: str, quality: int) -> bytes:
    """Encode RGB ``img`` as ``jpg`` / ``png`` / ``webp``; deterministic bytes for equal input."""
    buf = io.BytesIO()
    if fmt == "jpg":
        img.save(buf, format="JPEG", quality=quality)
    elif fmt == "png":
        img.save(buf, format="PNG", compress_level=6)
    elif fmt == "webp":
        img.save(buf, format="WEBP", quality=quality, method=4)
    else:
        raise ValueError(f"unknown image format {fmt!r}")
    return buf.getvalue()


def passthrough_ok(dec: DecodedImage, fmt: str, resized: bool) -> str | None:
    """None if the original bytes can be stored as-is, else the reason they cannot."""
    if _PIL_EXT.get(dec.source_format or "") != fmt:
        return f"source is {dec.source_format}, output is {fmt}"
    if resized:
        return "resized"
    if not dec.untouched:
        return "pixels changed: " + ",".join(sorted(dec.notes))
    return None


def resize_max_side(img: Image.Image, max_side: int | None, upscale: bool) -> Image.Image:
    size = geometry.fit_max_side(img.width, img.height, max_side, upscale)
    return img if size == img.size else img.resize(size, Image.Resampling.LANCZOS)


def fixed_size(img: Image.Image, size: int, mode: str, upscale: bool,
               background: tuple[int, int, int]) -> Image.Image | None:
    """img2dataset's ``resize_mode`` at ``image_size`` = ``size`` (the same geometry; PIL's Lanczos):

    - ``center_crop``: the shorter side to ``size``, then the centred ``size`` x ``size`` crop;
    - ``keep_ratio``: the shorter side to ``size``, no crop;
    - ``border``: the longer side to ``size``, then centred on a ``size`` x ``size`` canvas of
      ``background`` (img2dataset pads with white, ``images.background``'s default).

    Without ``upscale`` nothing is enlarged: a ``border`` image smaller than ``size`` is padded as it
    is; for the other modes an image whose shorter side is below ``size`` gives None (too small).
    ``img`` itself is returned when nothing changes."""
    w, h = img.size
    if mode in ("center_crop", "keep_ratio"):
        short = min(w, h)
        if short < size and not upscale:
            return None
        if short != size:
            scale = size / short
            nw, nh = (size, max(1, round(h * scale))) if w <= h else (max(1, round(w * scale)), size)
            img = img.resize((nw, nh), Image.Resampling.LANCZOS)
        if mode == "center_crop" and img.size != (size, size):
            x, y = (img.width - size) // 2, (img.height - size) // 2
            img = img.crop((x, y, x + size, y + size))
        return img
    if mode != "border":
        raise ValueError(f"unknown resize_mode {mode!r}")
    long = max(w, h)
    if long > size or (long < size and upscale):
        scale = size / long
        nw, nh = (size, max(1, round(h * scale))) if w >= h else (max(1, round(w * scale)), size)
        img = img.resize((nw, nh), Image.Resampling.LANCZOS)
    if img.size == (size, size):
        return img
    canvas = Image.new("RGB", (size, size), tuple(background))
    canvas.paste(img, ((size - img.width) // 2, (size - img.height) // 2))
    return canvas


def edm_transform(img: Image.Image, transform: str, out_w: int, out_h: int) -> Image.Image | None:
    """EDM/EDM2 ``dataset_tool`` transforms on an RGB image; None where EDM drops the image."""
    if transform == "center-crop":
        return img.crop(geometry.center_square_box(*img.size)).resize((out_w, out_h), Image.Resampling.LANCZOS)
    if transform == "center-crop-wide":
        w, h = img.size
        ch = geometry.wide_crop_height(w, h, out_w)
        if w < out_w or ch < out_h:
            return None
        band = img.crop(geometry.wide_box(w, h, out_w)).resize((out_w, out_h), Image.Resampling.LANCZOS)
        canvas = Image.new("RGB", (out_w, out_w), (0, 0, 0))
        canvas.paste(band, (0, (out_w - out_h) // 2))
        return canvas
    if transform == "center-crop-dhariwal":
        for _ in range(geometry.dhariwal_halvings(img.width, img.height, out_w)):
            img = img.resize((img.width // 2, img.height // 2), Image.Resampling.BOX)
        img = img.resize(geometry.dhariwal_resize(img.width, img.height, out_w), Image.Resampling.BICUBIC)
        return img.crop(geometry.center_box(img.width, img.height, out_w, out_w))
    raise ValueError(f"unknown transform {transform!r}")
