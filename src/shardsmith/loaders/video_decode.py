"""Decode one video member's bytes as FastGen's ``VideoWDSLoader`` does (PyAV, rgb24).

FastGen v0.1.0 (shared/reference/fastgen.md §2.1, §2.3, §6): the member is decoded with
PyAV to rgb24 frames; ``transform_video`` raises when the clip has fewer than
``sequence_length`` frames, keeps the FIRST ``sequence_length`` frames, resizes with the
aspect kept so the frame covers the target, centre-crops, maps ``x / 127.5 - 1`` and returns
``(C, T, H, W)``; the batch is ``real`` ``[B, 3, T, H, W]`` in [-1, 1] plus
``cropping_params`` (``resize_w, resize_h, crop_x0, crop_y0, crop_w, crop_h``).

:func:`decode_clip` does the same:

- frames ``0 .. num_frames - 1`` in presentation order, consecutive at the file's native
  rate (FastGen has no fps control and no stride). FastGen's training-time ``segment``
  decoder may start at a random offset; this loader always starts at frame 0 (FastGen's
  ``full`` decoder), so a deterministic pass is reproducible. Decoding stops after the last
  frame needed, so a long clip costs only ``num_frames`` decoded frames;
- geometry: :func:`shardsmith.transform.buckets.resize_crop` (the same rule as the image
  decoder and the build pipeline) applied per frame by
  :func:`shardsmith.transform.video.resize_crop_frames` (PIL bicubic, antialiased);
- frames are used in their coded orientation: like FastGen's ``to_ndarray("rgb24")``, a
  display-rotation matrix is not applied;
- ``fps`` (the stream's average rate) is reported on :class:`DecodedClip` but is not put
  in the batch: FastGen v0.1.0's batch carries no fps (§2.3, §6).

Without ``size`` the frames come back untouched as uint8 ``[T, H, W, 3]`` (the image
decoder's ``image_size=None`` contract). Errors are :class:`MemberDecodeError` (cannot open,
no video stream, corrupt data, no frame decodes, frame size changes) or
:class:`TooFewFramesError` (fewer frames than asked; the message says how many it had).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from shardsmith.loaders.decoders import MemberDecodeError, TooFewFramesError

__all__ = ["DecodedClip", "decode_clip"]


@dataclass
class DecodedClip:
    """``frames``: float32 ``[3, T, H, W]`` in [-1, 1] (with a size) or uint8 ``[T, H, W, 3]``.
    ``cropping_params``: FastGen's dict (None without a size). ``source_size``: (W, H) coded."""

    frames: torch.Tensor
    fps: Optional[float]
    cropping_params: Optional[dict[str, int]]
    source_size: tuple[int, int]


def _fps(stream) -> Optional[float]:
    for attr in ("average_rate", "guessed_rate", "base_rate"):
        r = getattr(stream, attr, None)
        if r is not None and r > 0:
            return float(r)
    return None


def _open_video(data: bytes):
    """``(container, first video stream)`` of a member (cover-art streams skipped); the caller
    closes the container. Raises :class:`MemberDecodeError` saying what is wrong."""
    import av  # noqa: PLC0415

    if not data:
        raise MemberDecodeError("empty video member (0 bytes)")
    try:
        container = av.open(io.BytesIO(bytes(data)), mode="r")
    except Exception as e:  # noqa: BLE001 - FFmpeg/OS errors of a broken file
        raise MemberDecodeError(f"cannot open the video ({type(e).__name__}: {e}); the member is corrupt, "
                                "truncated or not a video") from e
    attached = int(av.stream.Disposition.attached_pic)
    streams = [s for s in container.streams.video if not (int(s.disposition) & attached)]
    if not streams:
        kinds = sorted({s.type for s in container.streams})
        container.close()
        raise MemberDecodeError(f"no video stream in the member (streams: {', '.join(kinds) or 'none'})")
    return container, streams[0]


def _checked_frames(container, stream):
    """The decoded frames of ``stream``, in order; a frame flagged corrupt or an FFmpeg error
    becomes :class:`MemberDecodeError` saying after how many frames."""
    import av  # noqa: PLC0415

    n = 0
    try:
        for fr in container.decode(stream):
            if getattr(fr, "is_corrupt", False):
                raise MemberDecodeError(f"frame {n} decodes as corrupt")
            yield fr
            n += 1
    except av.FFmpegError as e:
        raise MemberDecodeError(f"corrupt video data: decoding failed after {n} frame(s) ({e})") from e


_NO_FRAME = "no frame of the video stream decodes (corrupt or truncated)"


def count_decodable_frames(data: bytes) -> int:
    """Decode every frame of a video member without converting or keeping any (constant memory,
    for ``inspect``) and return how many decode; :class:`MemberDecodeError` as :func:`decode_clip`."""
    container, stream = _open_video(data)
    try:
        n = sum(1 for _ in _checked_frames(container, stream))
    finally:
        container.close()
    if n == 0:
        raise MemberDecodeError(_NO_FRAME)
    return n


def decode_clip(data: bytes, num_frames: Optional[int], size: Optional[tuple[int, int]]) -> DecodedClip:
    """Decode the first ``num_frames`` frames (all when None) of a video held in ``data``;
    ``size`` = (H, W) resizes and centre-crops them to float32 ``[3, T, H, W]`` in [-1, 1]."""
    from shardsmith.transform.buckets import resize_crop  # noqa: PLC0415
    from shardsmith.transform.video import resize_crop_frames  # noqa: PLC0415

    if num_frames is not None and num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    container, stream = _open_video(data)
    decoded = _checked_frames(container, stream)
    try:
        fps = _fps(stream)
        out: Optional[np.ndarray] = None  # [T, h, w, 3] uint8, filled frame by frame
        rc = None
        src = (0, 0)
        kept: list[np.ndarray] = []  # frames when the count is not known up front
        n = 0
        for fr in decoded:
            arr = fr.to_ndarray(format="rgb24")
            if n == 0:
                src = (arr.shape[1], arr.shape[0])
                if size is not None:
                    rc = resize_crop(src[0], src[1], size[1], size[0])
            elif (arr.shape[1], arr.shape[0]) != src:
                raise MemberDecodeError(f"frame size changes mid-stream ({src[0]}x{src[1]} -> "
                                        f"{arr.shape[1]}x{arr.shape[0]} at frame {n})")
            if rc is not None:  # resize now: memory stays at the output size
                arr = resize_crop_frames(arr[None], rc)[0]
            if num_frames is None:
                kept.append(arr)
            else:
                if out is None:
                    out = np.empty((num_frames, *arr.shape), np.uint8)
                out[n] = arr
            n += 1
            if num_frames is not None and n >= num_frames:
                break
    finally:
        decoded.close()  # before the container: the decoder iterator must not outlive it
        container.close()
    if n == 0:
        raise MemberDecodeError(_NO_FRAME)
    if num_frames is not None and n < num_frames:
        raise TooFewFramesError(f"clip has {n} frame(s) but num_frames asks for {num_frames}")
    frames = out if out is not None else np.stack(kept)
    if rc is None:
        return DecodedClip(torch.from_numpy(frames), fps, None, src)
    # [T, H, W, 3] uint8 -> [3, T, H, W] float32 in [-1, 1], in place on one contiguous copy
    t = torch.from_numpy(frames).permute(3, 0, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    t.div_(127.5).sub_(1.0)
    return DecodedClip(t, fps, rc.as_dict(), src)
