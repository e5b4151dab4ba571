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
mp4 ogv mjpeg avi mov h264 mpg     PyAV (rgb24), the FIRST ``num_frames`` frames (all frames
webm wmv mkv                       when ``num_frames`` is None). With ``video_size``: float32
                                   tensor ``[3, T, H, W]`` in [-1, 1] (the image geometry
                                   above on every frame; FastGen ``VideoWDSLoader``, which
                                   returns ``(C, T, H, W)``). Without ``video_size``: uint8
                                   ``[T, H, W, 3]``. Fewer frames than ``num_frames`` raises
                                   :class:`TooFewFramesError`. See
                                   :mod:`shardsmith.loaders.video_decode`.
=================================  ==========================================================

Every decoder takes raw bytes and either returns a value or raises
:class:`MemberDecodeError` (wrapping the original exception) so that the loader can count
the failure with a reason: ``MemberDecodeError.reason`` is ``"decode"``, or ``"too_short"``
for :class:`TooFewFramesError` (the loader counts ``<reason>:<batch key>``).
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    import torch

# torch (and :mod:`shardsmith.loaders.pth_fast`, which needs it) is imported by the decoders that make
# tensors, not here: the suffix tables and checks below serve ``inspect`` and the loader configs without it

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif")
VIDEO_EXTS = ("mp4", "ogv", "mjpeg", "avi", "mov", "h264", "mpg", "webm", "wmv", "mkv")
AUDIO_EXTS = ("wav", "flac", "ogg")
TEXT_EXTS = ("txt", "text", "caption")
INT_EXTS = ("cls", "cls2", "class", "count", "index", "inx", "id")
TENSOR_EXTS = ("npy", "npz", "pth", "pt", "safetensors")
KNOWN_EXTS = IMAGE_EXTS + VIDEO_EXTS + AUDIO_EXTS + TEXT_EXTS + INT_EXTS + TENSOR_EXTS + ("json",)


class MemberDecodeError(ValueError):
    """A member's bytes could not be decoded (corrupt, wrong type, unsafe pickle...)."""

    reason = "decode"


class TooFewFramesError(MemberDecodeError):
    """A video member decodes to fewer frames than ``num_frames`` asks for (FastGen drops
    such a clip too: ``transform_video`` raises when T < ``sequence_length``)."""

    reason = "too_short"


class UnsupportedMemberError(ValueError):
    """The suffix has no decoder (or needs an optional package that is not installed)."""


def last_ext(suffix: str) -> str:
    """``"latent.pth" -> "pth"``; lower-cased."""
    return suffix.rsplit(".", 1)[-1].lower()


def check_supported(suffix: str) -> None:
    """Raise :class:`UnsupportedMemberError` now (at loader construction) for suffixes we
    cannot decode, instead of dropping every sample later."""
    ext = last_ext(suffix)
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

def size_hw(size: int | tuple[int, int]) -> tuple[int, int]:
    """``image_size`` / ``video_size`` -> ``(H, W)``: an int is a square, a pair is (H, W)."""
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def image_to_tensor(img, image_size: int | tuple[int, int] | None):
    """PIL image -> uint8 HWC tensor (``image_size=None``) or float CHW in [-1, 1] of
    ``image_size`` (int = square, or ``(H, W)``): resize to cover, bicubic, center crop."""
    from PIL import Image  # noqa: PLC0415

    from shardsmith.transform.buckets import resize_crop  # noqa: PLC0415

    import torch  # noqa: PLC0415 - see the imports

    img = img.convert("RGB")
    if image_size is None:
        return torch.from_numpy(np.array(img, dtype=np.uint8, copy=True))
    th, tw = size_hw(image_size)
    rc = resize_crop(img.width, img.height, tw, th)  # the one cover-resize + centre-crop rule
    if (rc.resize_w, rc.resize_h) != img.size:
        img = img.resize((rc.resize_w, rc.resize_h), Image.BICUBIC)
    img = img.crop(rc.box)
    arr = np.asarray(img, dtype=np.float32)
    t = torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()
    return t / 127.5 - 1.0


def decode_image(data: bytes, image_size=None):
    from PIL import Image  # noqa: PLC0415

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        return image_to_tensor(im, image_size)


def check_image(data: bytes) -> None:
    """Raise what :func:`decode_image` raises for ``data``, without making a tensor (``inspect``): the
    pixels are decoded and converted to RGB as the loader does; the tensor step after that cannot fail."""
    from PIL import Image  # noqa: PLC0415

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        im.convert("RGB")


# ---------------------------------------------------------------------------- video

def decode_video(data: bytes, num_frames: int | None = None, video_size=None):
    """A video member -> :class:`~shardsmith.loaders.video_decode.DecodedClip` (frames, fps,
    ``cropping_params``); raises :class:`MemberDecodeError` / :class:`TooFewFramesError`."""
    from shardsmith.loaders.video_decode import decode_clip  # noqa: PLC0415 - imports PyAV

    try:
        return decode_clip(data, num_frames, None if video_size is None else size_hw(video_size))
    except MemberDecodeError:
        raise
    except Exception as e:  # noqa: BLE001 - every decode failure becomes a counted reason
        raise MemberDecodeError(f"cannot decode the video: {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------- tensors

def load_npy(data) -> torch.Tensor:
    import torch  # noqa: PLC0415

    arr = np.load(io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data, allow_pickle=False)
    return torch.from_numpy(np.ascontiguousarray(arr))


def load_npz(data) -> dict[str, torch.Tensor]:
    import torch  # noqa: PLC0415

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: torch.from_numpy(np.ascontiguousarray(z[k])) for k in z.files}


def load_pth(data) -> Any:
    """``torch.load`` with ``weights_only=True`` semantics always: tensors, dicts/lists of tensors
    and plain Python values load; any other pickle raises (it is never executed). Plain
    ``torch.save`` bytes take the fast reader of :mod:`shardsmith.loaders.pth_fast`."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        from shardsmith.loaders.pth_fast import load_pth_bytes  # noqa: PLC0415

        return load_pth_bytes(data)
    import torch  # noqa: PLC0415

    return torch.load(data, map_location="cpu", weights_only=True)


def load_safetensors(data: bytes) -> dict[str, torch.Tensor]:
    st = _require_safetensors()
    return st.load(bytes(data))


def decode_audio(data: bytes) -> dict:
    import torch  # noqa: PLC0415

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


def decode_member(suffix: str, data: bytes, *, image_size=None, num_frames=None, video_size=None) -> Any:
    """Decode one member's bytes by its suffix; raises :class:`MemberDecodeError` on failure
    and :class:`UnsupportedMemberError` for suffixes without a decoder. ``image_size`` applies
    to image members, ``num_frames`` and ``video_size`` to video members (see the table)."""
    ext = last_ext(suffix)
    if ext in IMAGE_EXTS:
        fn = lambda b: decode_image(b, image_size)  # noqa: E731
    elif ext in VIDEO_EXTS:
        fn = lambda b: decode_video(b, num_frames, video_size).frames  # noqa: E731
    elif ext in _SIMPLE:
        fn = _SIMPLE[ext]
    else:
        check_supported(suffix)  # raises the precise message
        raise UnsupportedMemberError(f"no decoder for {suffix!r}")
    try:
        return fn(data)
    except (UnsupportedMemberError, MemberDecodeError):
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
