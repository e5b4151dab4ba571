"""Member decoders for the WebDataset loader, chosen by the LAST component of a member suffix.

``latent.pth`` and ``pth`` both decode as ``pth``; ``txt_emb.npy`` as ``npy``.

=================================  ==========================================================
suffix (last component)            result
=================================  ==========================================================
jpg jpeg png webp bmp tif tiff gif with ``image_size``: float32 tensor ``[3, H, W]`` in
                                   [-1, 1] (resize so the image covers H×W keeping its aspect,
                                   bicubic, then center crop; FastGen ``ImageWDSLoader``).
                                   Without ``image_size``: uint8 tensor ``[H, W, 3]`` (RGB,
                                   untouched pixels; samples of different sizes collate to a
                                   list, not a stacked tensor).
npy                                ``torch.Tensor`` (``np.load(allow_pickle=False)``)
npz                                ``dict[str, torch.Tensor]`` (``allow_pickle=False``)
pth pt                             ``torch.load(..., weights_only=True)``, always: a pickle
                                   that would run code raises instead of executing.
safetensors                        ``dict[str, torch.Tensor]`` (needs ``pip install
                                   safetensors``)
json                               parsed JSON
txt text caption                   stripped UTF-8 ``str`` (invalid UTF-8 raises)
cls cls2 class count index inx id  ``int``
wav flac ogg                       ``{"audio": float32 [C, T], "sample_rate": int}`` via
                                   ``soundfile`` (``pip install soundfile``)
mp4 ogv mjpeg avi mov h264 mpg     refused with :class:`UnsupportedMemberError`: video
webm wmv mkv                       decoding arrives with the video loader issue.
=================================  ==========================================================

Every decoder takes raw bytes and either returns a value or raises
:class:`MemberDecodeError` (wrapping the original exception) so that the loader can count
the failure with a reason.
"""

from __future__ import annotations

import io
import json
from typing import Any, Callable

import numpy as np
import torch

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif")
VIDEO_EXTS = ("mp4", "ogv", "mjpeg", "avi", "mov", "h264", "mpg", "webm", "wmv", "mkv")
AUDIO_EXTS = ("wav", "flac", "ogg")
TEXT_EXTS = ("txt", "text", "caption")
INT_EXTS = ("cls", "cls2", "class", "count", "index", "inx", "id")
TENSOR_EXTS = ("npy", "npz", "pth", "pt", "safetensors")
KNOWN_EXTS = IMAGE_EXTS + AUDIO_EXTS + TEXT_EXTS + INT_EXTS + TENSOR_EXTS + ("json",)


class MemberDecodeError(ValueError):
    """A member's bytes could not be decoded (corrupt, wrong type, unsafe pickle...)."""


class UnsupportedMemberError(ValueError):
    """The suffix has no decoder (or needs an optional package that is not installed)."""


def last_ext(suffix: str) -> str:
    """``"latent.pth" -> "pth"``; lower-cased."""
    return suffix.rsplit(".", 1)[-1].lower()


def check_supported(suffix: str) -> None:
    """Raise :class:`UnsupportedMemberError` now (at loader construction) for suffixes we
    cannot decode, instead of dropping every sample later."""
    ext = last_ext(suffix)
    if ext in VIDEO_EXTS:
        raise UnsupportedMemberError(
            f"member suffix {suffix!r}: video decoding is not part of the image/latent WebDataset "
            "loader; it arrives with the video loader issue. Use pre-encoded latent members "
            "(e.g. 'latent.pth') meanwhile.")
    if ext not in KNOWN_EXTS:
        raise UnsupportedMemberError(
            f"member suffix {suffix!r}: no decoder for '.{ext}'. Known: {', '.join(KNOWN_EXTS)}")
    if ext == "safetensors":
        _require_safetensors()
    if ext in AUDIO_EXTS:
        _require_soundfile()


def _require_safetensors():
    try:
        import safetensors.torch as st  # noqa: PLC0415
    except ImportError as e:
        raise UnsupportedMemberError(
            "reading '.safetensors' needs the safetensors package: pip install safetensors") from e
    return st


def _require_soundfile():
    try:
        import soundfile as sf  # noqa: PLC0415
    except ImportError as e:
        raise UnsupportedMemberError(
            "decoding audio members (wav/flac/ogg) needs the soundfile package: "
            "pip install soundfile") from e
    return sf


# ---------------------------------------------------------------------------- images

def image_to_tensor(img, image_size: int | tuple[int, int] | None):
    """PIL image -> uint8 HWC tensor (``image_size=None``) or float CHW in [-1, 1] of
    ``image_size`` (int = square, or ``(H, W)``): resize to cover, bicubic, center crop."""
    from PIL import Image  # noqa: PLC0415

    img = img.convert("RGB")
    if image_size is None:
        return torch.from_numpy(np.array(img, dtype=np.uint8, copy=True))
    th, tw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    w, h = img.size
    scale = max(th / h, tw / w)
    nw, nh = max(tw, round(w * scale)), max(th, round(h * scale))
    if (nw, nh) != (w, h):
        img = img.resize((nw, nh), Image.BICUBIC)
    left, top = (nw - tw) // 2, (nh - th) // 2
    img = img.crop((left, top, left + tw, top + th))
    arr = np.asarray(img, dtype=np.float32)
    t = torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()
    return t / 127.5 - 1.0


def decode_image(data: bytes, image_size=None):
    from PIL import Image  # noqa: PLC0415

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        return image_to_tensor(im, image_size)


# ---------------------------------------------------------------------------- tensors

def load_npy(data) -> torch.Tensor:
    arr = np.load(io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data, allow_pickle=False)
    return torch.from_numpy(np.ascontiguousarray(arr))


def load_npz(data) -> dict[str, torch.Tensor]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: torch.from_numpy(np.ascontiguousarray(z[k])) for k in z.files}


def load_pth(data) -> Any:
    """``torch.load`` with ``weights_only=True`` always: tensors, dicts/lists of tensors and
    plain Python values load; any other pickle raises (it is never executed)."""
    src = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    return torch.load(src, map_location="cpu", weights_only=True)


def load_safetensors(data: bytes) -> dict[str, torch.Tensor]:
    st = _require_safetensors()
    return st.load(bytes(data))


def decode_audio(data: bytes) -> dict:
    sf = _require_soundfile()
    arr, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return {"audio": torch.from_numpy(np.ascontiguousarray(arr.T)), "sample_rate": int(rate)}


def decode_text(data: bytes) -> str:
    return bytes(data).decode("utf-8").strip()


def decode_int(data: bytes) -> int:
    return int(bytes(data).decode("utf-8").strip())


def decode_json(data: bytes):
    return json.loads(bytes(data).decode("utf-8"))


_SIMPLE: dict[str, Callable[[bytes], Any]] = {
    "npy": load_npy, "npz": load_npz, "pth": load_pth, "pt": load_pth,
    "safetensors": load_safetensors, "json": decode_json,
    **{e: decode_text for e in TEXT_EXTS}, **{e: decode_int for e in INT_EXTS},
    **{e: decode_audio for e in AUDIO_EXTS},
}


def decode_member(suffix: str, data: bytes, *, image_size=None) -> Any:
    """Decode one member's bytes by its suffix; raises :class:`MemberDecodeError` on failure
    and :class:`UnsupportedMemberError` for suffixes without a decoder."""
    ext = last_ext(suffix)
    if ext in IMAGE_EXTS:
        fn = lambda b: decode_image(b, image_size)  # noqa: E731
    elif ext in _SIMPLE:
        fn = _SIMPLE[ext]
    else:
        check_supported(suffix)  # raises the precise message
        raise UnsupportedMemberError(f"no decoder for {suffix!r}")
    try:
        return fn(data)
    except UnsupportedMemberError:
        raise
    except Exception as e:  # noqa: BLE001 - every decode failure becomes a counted reason
        raise MemberDecodeError(f"cannot decode '.{suffix}' member: {type(e).__name__}: {e}") from e


def load_constant_file(path) -> Any:
    """Load a ``files_map`` constant (``.npy`` / ``.pth`` / ``.pt`` / ``.safetensors``) from
    disk, safely (no pickle execution). A safetensors file with one tensor gives that tensor."""
    from pathlib import Path  # noqa: PLC0415

    path = Path(path)
    ext = path.suffix.lower().lstrip(".")
    if ext == "npy":
        with open(path, "rb") as f:
            return load_npy(f.read())
    if ext in ("pth", "pt"):
        with open(path, "rb") as f:
            return load_pth(f.read())
    if ext == "safetensors":
        d = load_safetensors(path.read_bytes())
        return next(iter(d.values())) if len(d) == 1 else d
    raise UnsupportedMemberError(
        f"files_map file {str(path)!r}: unsupported extension '.{ext}' (use .npy, .pth or .safetensors)")
