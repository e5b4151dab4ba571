"""Inpainting masks tied to their target's geometry (issue 18): load, cut onto the target's pixels,
pool onto the latent grid; audio masks onto the audio latent's steps.

Contracts:

- :func:`load_mask`: a mask file -> float32 ``[F, H, W]`` in [0, 1] (grayscale; an image is one
  frame). Reasons: ``mask_unreadable``, ``mask_bad_shape``, ``mask_bad_values``, ``mask_too_short``.
- :func:`mask_to_target` (pure): the *target's* resize and crop (the mask's own :class:`Geometry`
  from :func:`~shardsmith.transform.geometry.for_partner`) and its frames, so the mask lands pixel for
  pixel on the target's pixels -> uint8 {0, 1} ``[F_out, H_b, W_b]``. Never a stretch (LTX stretches
  the mask to the latent's pixel grid, ignoring the target's cover-resize and centred crop).
- :func:`target_mask`: both, for one item (loads only the frames the target takes).
- :func:`latent_mask` (pure): pixel mask -> float32 0/1 ``[F', H', W']`` on the VAE's grid
  (frame 0 alone, then groups of ``temporal`` frames).
- :func:`audio_mask` (pure): 1-D mask -> float32 0/1 ``[steps]`` (nearest, then > 0.5: LTX's rule);
  :func:`audio_envelope` (pure) and :func:`load_audio_mask` for mask files.

Resize rule (:func:`mask_to_target`): the float mask is resized with PIL **bilinear** (mode ``F``;
PIL widens the filter when down-scaling, so each output pixel is the area-weighted mean of the source
pixels under it) to the target's resize size, using the same pixel-centre mapping as the target's
bicubic resize, then cropped with the target's box (pixels outside the source, if the box reaches
outside, are 0), then binarised: 1 where the value is **> 0.5**. A pixel is therefore 1 when most of
the source area behind it is masked, and mask edges stay where the target's edges are (within a pixel).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from shardsmith.records import ItemError
from shardsmith.transform.geometry import Geometry, for_partner

__all__ = ["IMAGE_SUFFIXES", "ARRAY_SUFFIXES", "load_mask", "mask_to_target", "target_mask", "latent_mask",
           "audio_mask", "audio_envelope", "load_audio_mask", "THRESHOLD"]

#: a mask value above this is "masked" (pixels after the resize; latent cells under ``rule="mean"``; audio)
THRESHOLD = 0.5
#: files read as one still picture with PIL (an animated one: its first frame, as targets are)
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif"})
#: files read as arrays: ``.npy`` (numpy, no pickles) and ``.pt`` / ``.pth`` (torch, ``weights_only``)
ARRAY_SUFFIXES = frozenset({".npy", ".pt", ".pth"})
#: the largest picture a mask image may declare (PIL's own default bomb limit)
MAX_PIXELS = 89_478_485

_SHAPES = "[H, W] (one frame), [F, H, W], [F, 1, H, W] or [F, H, W, 1]"


def _name(item_id: str, path: str | os.PathLike) -> str:
    return f"{item_id}: its mask {os.path.basename(os.fspath(path))}"


# ----------------------------------------------------------------------------- loading


def load_mask(path: str | os.PathLike, item_id: str, *, frames: Sequence[int] | None = None,
              data: bytes | None = None) -> np.ndarray:
    """The mask in ``path`` as float32 ``[F, H, W]`` in [0, 1], grayscale.

    - An image (:data:`IMAGE_SUFFIXES`): one frame, upright (EXIF orientation applied, as the
      target's decode does); 8-bit values / 255, 16-bit / 65535, 1-bit as 0/1; a colour picture is
      reduced to its luma 0.299 R + 0.587 G + 0.114 B; **alpha is ignored**.
    - ``.npy`` (``allow_pickle=False``) / ``.pt`` / ``.pth`` (``torch.load(weights_only=True)``: a
      tensor, or a dict whose ``mask`` key holds one): ``[H, W]`` (one frame), ``[F, H, W]``,
      ``[F, 1, H, W]`` or ``[F, H, W, 1]``; bool and floats in
      [0, 1] as they are, integers in [0, 1] as they are, integers in [0, 255] divided by 255.
    - anything else: a video (PyAV; display rotation applied), luma / 255 of every frame (as many
      as the probe counts) or of the frames ``frames``.

    ``frames``: the frame indices wanted from a moving mask (a video or an array with F > 1), in
    this order (repeats allowed): then ``F == len(frames)``. A still mask ignores it (F = 1).
    ``data``: the file's bytes, already read (and checked against the plan's sha256 by the caller): an image
    or an array is read from them, not from ``path`` again (a video is decoded from ``path``).

    Raises :class:`ItemError`: ``mask_unreadable`` (missing, empty, corrupt, not a mask format),
    ``mask_bad_shape`` (another layout than the above), ``mask_bad_values`` (NaN, negative, floats
    above 1, integers above 255), ``mask_too_short`` (a wanted frame is beyond the mask's end).
    """
    path = os.fspath(path)
    name = _name(item_id, path)
    if data is None and not os.path.isfile(path):
        raise ItemError("mask_unreadable", f"{name}: {path!r} does not exist or is not a file; check the mask column")
    suffix = Path(path).suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return _load_image(path, name, data)
    if suffix in ARRAY_SUFFIXES:
        arr = _values(_shape(_load_array(path, suffix, name, data), name), name)
        if frames is not None and arr.shape[0] > 1:
            idx = [int(i) for i in frames]
            if idx and (max(idx) >= arr.shape[0] or min(idx) < 0):
                raise ItemError("mask_too_short", f"{name} has {arr.shape[0]} frames but frame {max(idx)} is "
                                "needed; give a mask as long as the target clip")
            arr = arr[idx]
        return np.ascontiguousarray(arr)
    return _load_video(path, name, frames)


def _load_image(path: str, name: str, data: bytes | None = None) -> np.ndarray:
    from shardsmith.transform.image import identify

    try:
        if data is None:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        raise ItemError("mask_unreadable", f"{name}: cannot read it ({e.strerror or e}); check the path") from None
    try:
        img = identify(data, name=name, max_pixels=MAX_PIXELS)
        img.seek(0)
        img.load()
    except ItemError as e:
        raise ItemError("mask_unreadable", f"{e.detail} ({e.reason})") from None
    except Exception as e:  # noqa: BLE001 - any decoder error is this item's problem
        raise ItemError("mask_unreadable", f"{name} cannot be decoded ({e}); re-save it as a PNG") from None
    try:
        if img.getexif().get(0x0112, 1) in (2, 3, 4, 5, 6, 7, 8):
            img = ImageOps.exif_transpose(img)
    except Exception:  # noqa: BLE001 - a broken EXIF block: keep the picture as stored, like the target
        pass
    mode = img.mode
    if mode == "1":
        arr = np.asarray(img, dtype=np.float32)
    elif mode in ("L", "LA", "La"):
        arr = np.asarray(img.getchannel(0), dtype=np.float32) / 255.0
    elif mode.startswith("I;16") or mode == "I":
        arr = np.asarray(img, dtype=np.float32) / 65535.0
    elif mode == "F":
        arr = np.asarray(img, dtype=np.float32)
    else:  # RGB, RGBA, P, PA, CMYK, YCbCr ...: luma of the colour, alpha ignored
        rgb = img.convert("RGBA" if mode in ("P", "PA") else "RGB") if mode != "RGB" else img
        arr = _luma(np.asarray(rgb)[..., :3])
    return _values(arr[None], name)


def _load_array(path: str, suffix: str, name: str, data: bytes | None = None) -> np.ndarray:
    import io

    src = io.BytesIO(data) if data is not None else path
    if suffix == ".npy":
        try:
            arr = np.load(src, allow_pickle=False)
        except Exception as e:  # noqa: BLE001
            raise ItemError("mask_unreadable", f"{name} is not a readable .npy array ({e}); save it with "
                            "numpy.save (no pickled objects)") from None
        if not isinstance(arr, np.ndarray):
            raise ItemError("mask_bad_shape", f"{name} holds {type(arr).__name__}, not one array; save one array")
        return arr
    import torch

    try:
        obj = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise ItemError("mask_unreadable", f"{name} is not a readable torch file ({e}); save a tensor, or a dict "
                        "{'mask': tensor}, with torch.save") from None
    if isinstance(obj, dict):
        if "mask" not in obj:
            raise ItemError("mask_bad_shape", f"{name} is a dict without a 'mask' key (keys: "
                            f"{sorted(map(str, obj))[:8]}); save {{'mask': tensor}} or the tensor itself")
        obj = obj["mask"]
    if not isinstance(obj, torch.Tensor):
        raise ItemError("mask_bad_shape", f"{name} holds {type(obj).__name__}, not a tensor; save a tensor")
    if obj.is_floating_point() and obj.dtype != torch.float64:
        obj = obj.float()
    return obj.detach().cpu().numpy()


def _load_video(path: str, name: str, frames: Sequence[int] | None) -> np.ndarray:
    from shardsmith.transform.video import decode_frames, probe_video

    try:
        if frames is None:
            frames = range(probe_video(path, name).frames)
        rgb = decode_frames(path, list(frames), name)
    except ItemError as e:
        reason = "mask_too_short" if e.reason == "too_short" else "mask_unreadable"
        raise ItemError(reason, f"{e.detail} ({e.reason})") from None
    return _luma(rgb)


def _luma(rgb: np.ndarray) -> np.ndarray:
    """uint8 ``[..., 3]`` -> float32 ``[...]`` in [0, 1]: (0.299 R + 0.587 G + 0.114 B) / 255."""
    r, g, b = (rgb[..., i].astype(np.float32) for i in range(3))
    return np.clip((0.299 * r + 0.587 * g + 0.114 * b) / 255.0, 0.0, 1.0)


def _shape(arr: np.ndarray, name: str) -> np.ndarray:
    """An array in one of :data:`_SHAPES` as ``[F, H, W]``, else ``mask_bad_shape``."""
    shape = arr.shape
    if arr.ndim == 4 and shape[1] == 1:
        arr = arr[:, 0]
    elif arr.ndim == 4 and shape[3] == 1:
        arr = arr[..., 0]
    elif arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or 0 in arr.shape:
        raise ItemError("mask_bad_shape", f"{name} has shape {list(shape)}; a mask array is {_SHAPES} (grayscale)")
    if arr.shape[2] in (3, 4) and arr.shape[1] > 4 * arr.shape[2]:
        raise ItemError("mask_bad_shape", f"{name} has shape {list(shape)}, which looks like an [H, W, C] colour "
                        f"picture; give it as one grayscale channel ({_SHAPES})")
    return arr


def _values(arr: np.ndarray, name: str) -> np.ndarray:
    """float32 in [0, 1] from bool, integers (0/1, or 0..255 scaled by 1/255) or floats in [0, 1]."""
    kind = arr.dtype.kind
    if kind == "b":
        return arr.astype(np.float32)
    if kind not in "iuf":
        raise ItemError("mask_bad_shape", f"{name} holds {arr.dtype} values; a mask holds numbers or booleans")
    if kind == "f" and not np.isfinite(arr).all():
        raise ItemError("mask_bad_values", f"{name} holds NaN or infinite values; give values in [0, 1]")
    lo, hi = float(arr.min()), float(arr.max())
    if lo < -1e-6:
        raise ItemError("mask_bad_values", f"{name} holds negative values (down to {lo:g}); give values in [0, 1]")
    if kind == "f" and hi > 1 + 1e-6:
        raise ItemError("mask_bad_values", f"{name} holds float values up to {hi:g}; give floats in [0, 1] "
                        "(divide 0..255 masks by 255)")
    if kind in "iu" and hi > 255:
        raise ItemError("mask_bad_values", f"{name} holds integers up to {hi:g}; give 0/1 or 0..255 values")
    out = arr.astype(np.float32)
    if kind in "iu" and hi > 1:
        out /= 255.0
    return np.clip(out, 0.0, 1.0)


# ----------------------------------------------------------------------------- onto the target


def mask_to_target(mask: np.ndarray, geom: Geometry, *, name: str = "the item") -> np.ndarray:
    """The mask cut exactly as its target: uint8 {0, 1} ``[F_out, H_b, W_b]``.

    ``mask``: ``[F, H, W]`` (or ``[H, W]``) values in [0, 1]; ``geom``: the mask's own geometry,
    ``for_partner(target_geom, "mask", W, H)`` (its ``source_size`` must be (W, H): ``ValueError``
    otherwise, a caller's bug). Frames: the target's ``geom.frame_indices`` (``None``, a still
    target, means frame 0); a still mask (F = 1) is repeated over them; a moving mask must hold every
    index (``ItemError mask_too_short``). Pixels: bilinear resize to ``geom.resize``, crop
    ``geom.crop``, then ``> 0.5`` (see the module docstring).
    """
    m = np.asarray(mask)
    if m.ndim == 2:
        m = m[None]
    if m.ndim != 3:
        raise ValueError(f"expected a [F, H, W] mask, got shape {m.shape}")
    f, h, w = m.shape
    if (w, h) != tuple(geom.source_size):
        raise ValueError(f"the geometry applies to {geom.source_size[0]}x{geom.source_size[1]}, but the mask is "
                         f"{w}x{h}: use for_partner(target_geom, 'mask', {w}, {h})")
    idx = list(geom.frame_indices) if geom.frame_indices is not None else [0]
    if f == 1:
        picks = [0] * len(idx)
    elif max(idx) >= f:
        raise ItemError("mask_too_short", f"{name}: its mask has {f} frames but the target takes frame {max(idx)}; "
                        "give a mask as long as the target clip")
    else:
        picks = idx
    done: dict[int, np.ndarray] = {}
    for i in picks:
        if i not in done:
            done[i] = _cut_frame(m[i], geom)
    return np.stack([done[i] for i in picks])


def _cut_frame(frame: np.ndarray, geom: Geometry) -> np.ndarray:
    """One ``[H, W]`` frame -> uint8 {0, 1} ``[H_b, W_b]``: bilinear resize, crop, > 0.5."""
    img = Image.fromarray(np.ascontiguousarray(frame, dtype=np.float32), mode="F")
    if img.size != tuple(geom.resize):
        img = img.resize(tuple(geom.resize), Image.BILINEAR)
    return (np.asarray(img.crop(tuple(geom.crop)), dtype=np.float32) > THRESHOLD).astype(np.uint8)


def target_mask(path: str | os.PathLike, geom: Geometry, item_id: str, *, data: bytes | None = None) -> np.ndarray:
    """The item's mask file on its target's pixels: :func:`load_mask` (only the frames the target
    takes; ``data``: its bytes, already read), :func:`~shardsmith.transform.geometry.for_partner`
    (``mask_geometry_mismatch`` for another aspect ratio, never stretched), :func:`mask_to_target`. uint8
    {0, 1} ``[F_out, H_b, W_b]``."""
    idx = list(geom.frame_indices) if geom.frame_indices is not None else [0]
    m = load_mask(path, item_id, frames=idx, data=data)
    pg = for_partner(geom, "mask", m.shape[2], m.shape[1], name=item_id)
    if m.shape[0] > 1:  # a moving mask: its frames already are the target's, in order
        pg = replace(pg, frame_indices=tuple(range(len(idx))))
    return mask_to_target(m, pg, name=item_id)


# ----------------------------------------------------------------------------- onto the latent grid


def latent_mask(pixel_mask: np.ndarray, spatial: int, temporal: int, rule: str = "any") -> np.ndarray:
    """A pixel mask ``[F, H, W]`` pooled onto the VAE's latent grid: float32 0/1 ``[F', H', W']`` with
    ``F' = 1 + (F - 1) // temporal``, ``H' = H // spatial``, ``W' = W // spatial``.

    Latent frame 0 is pixel frame 0 alone; latent frame k >= 1 is pixel frames
    ``1 + (k - 1) * temporal ... k * temporal`` (the causal VAE's 1 + 8k layout). LTX's
    ``compute_video_masks`` instead pads the frames and max-pools groups of 8 *from frame 0*
    (frames 0-7, 8-15, ...), which puts every later frame into the wrong latent: we never do.
    A latent cell covers ``spatial`` x ``spatial`` pixels of each frame of its group:

    - ``rule="any"``: 1 when any pixel of the group is > 0.5 (a masked pixel is never lost);
    - ``rule="mean"``: 1 when the mean of the group's values is > 0.5.

    Raises ``ValueError`` for ``F`` not ``1 + temporal * k`` or ``H`` / ``W`` not multiples of
    ``spatial`` (the VAE could not have encoded such a target), or another rule.
    """
    if rule not in ("any", "mean"):
        raise ValueError(f"rule must be 'any' or 'mean', not {rule!r}")
    if spatial < 1 or temporal < 1:
        raise ValueError(f"compression factors must be >= 1 (spatial={spatial}, temporal={temporal})")
    m = np.asarray(pixel_mask)
    if m.ndim != 3 or 0 in m.shape:
        raise ValueError(f"expected a [F, H, W] pixel mask, got shape {m.shape}")
    f, h, w = m.shape
    if (f - 1) % temporal:
        raise ValueError(f"the mask has {f} frames, not 1 + {temporal}k: the VAE takes frame 0 alone, then groups of "
                         f"{temporal}")
    if h % spatial or w % spatial:
        raise ValueError(f"the mask is {w}x{h}, not a multiple of {spatial} on both sides")
    m = m.astype(np.float32)
    if rule == "any":
        m = (m > THRESHOLD).astype(np.float32)
    hh, ww = h // spatial, w // spatial
    first = m[:1].reshape(1, 1, hh, spatial, ww, spatial)
    rest = m[1:].reshape((f - 1) // temporal, temporal, hh, spatial, ww, spatial)
    out = np.empty((1 + (f - 1) // temporal, hh, ww), np.float32)
    for dst, groups in ((out[:1], first), (out[1:], rest)):
        if groups.shape[0]:
            pooled = groups.max(axis=(1, 3, 5)) if rule == "any" else groups.mean(axis=(1, 3, 5))
            dst[...] = (pooled > THRESHOLD) if rule == "mean" else pooled
    return out


# ----------------------------------------------------------------------------- audio


def audio_mask(mask: np.ndarray, steps: int) -> np.ndarray:
    """A 1-D mask (any length N >= 1, values in [0, 1]) on ``steps`` audio latent steps: float32 0/1
    ``[steps]``. Nearest resampling as ``torch.nn.functional.interpolate(mode="nearest")`` does it
    (step i takes value ``floor(i * N / steps)``), then 1 where the value is > 0.5 (LTX's rule)."""
    m = np.asarray(mask)
    if m.ndim != 1 or m.shape[0] < 1:
        raise ValueError(f"expected a 1-D mask, got shape {m.shape}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, not {steps}")
    n = m.shape[0]
    idx = (np.arange(steps, dtype=np.int64) * n) // steps
    return (m.astype(np.float32)[idx] > THRESHOLD).astype(np.float32)


def audio_envelope(wave: np.ndarray, steps: int) -> np.ndarray:
    """An audio mask recording (``[C, N]`` or ``[N]`` samples) as float32 ``[steps]``: the mean
    |amplitude| over the channels and over each step's window of samples
    ``floor(i * N / steps) ... floor((i + 1) * N / steps) - 1`` (a window with no sample takes the
    sample at its start). LTX nearest-resamples its envelope instead: on a per-sample envelope that
    picks single samples, which flicker with the waveform's zero crossings; a window mean does not."""
    x = np.asarray(wave, dtype=np.float64)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"expected [C, N] or [N] samples, got shape {np.shape(wave)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, not {steps}")
    env = np.abs(x).mean(axis=0)
    n = env.shape[0]
    lo = (np.arange(steps, dtype=np.int64) * n) // steps
    hi = np.maximum((np.arange(1, steps + 1, dtype=np.int64) * n) // steps, lo + 1)
    csum = np.concatenate([[0.0], np.cumsum(env)])
    return ((csum[np.minimum(hi, n)] - csum[lo]) / (np.minimum(hi, n) - lo)).astype(np.float32)


def load_audio_mask(path: str | os.PathLike, item_id: str, steps: int, *, rate: int = 16000, start: float = 0.0,
                    duration: float | None = None, data: bytes | None = None) -> np.ndarray:
    """An audio mask file on ``steps`` latent steps: float32 0/1 ``[steps]``.

    ``.npy`` / ``.pt`` / ``.pth`` (a tensor or ``{'mask': tensor}``, shape ``[N]`` or ``[1, N]``, the
    values as :func:`load_mask` takes them) -> :func:`audio_mask`. Anything else is decoded as audio
    (``decode_audio`` at ``rate``, the window ``[start, start + duration)`` the target's audio was cut
    to) -> :func:`audio_envelope` -> > 0.5. Reasons: ``mask_unreadable``, ``mask_bad_shape``,
    ``mask_bad_values`` (also a recording whose decoded samples are NaN or infinite: a float WAV can hold them,
    and every comparison with NaN is false, so its mask would come out all zeros). ``data``: an array file's
    bytes, already read (a recording is decoded from ``path``).
    """
    path = os.fspath(path)
    name = _name(item_id, path)
    if data is None and not os.path.isfile(path):
        raise ItemError("mask_unreadable", f"{name}: {path!r} does not exist or is not a file; check the mask column")
    suffix = Path(path).suffix.lower()
    if suffix in ARRAY_SUFFIXES:
        arr = _load_array(path, suffix, name, data)
        if arr.ndim == 2 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.ndim != 1 or arr.shape[0] < 1:
            raise ItemError("mask_bad_shape", f"{name} has shape {list(arr.shape)}; an audio mask is [N] or [1, N]")
        return audio_mask(_values(arr, name), steps)
    from shardsmith.transform.audio import decode_audio

    try:
        dec = decode_audio(path, item_id, rate=rate, start=start, duration=duration)
    except ItemError as e:
        raise ItemError("mask_unreadable", f"{name}: {e.detail} ({e.reason})") from None
    wave = np.asarray(dec.wave)
    if not np.isfinite(wave).all():
        bad = int(np.count_nonzero(~np.isfinite(wave)))
        raise ItemError("mask_bad_values", f"{name} decodes to {bad} NaN or infinite sample(s) in the window its target "
                        "takes; an audio mask's envelope needs finite samples: re-export the recording (or give the "
                        "mask as an array of values in [0, 1])")
    return audio_mask(audio_envelope(wave, steps), steps)
