"""Video I/O with PyAV: probe, decode chosen frames, resize + crop, model tensors.

Every per-item problem becomes an :class:`~shardsmith.records.ItemError` naming the
item and the fix; nothing here lets a PyAV / FFmpeg exception escape for a bad file.

Reasons raised:

- ``empty_file`` (0 bytes), ``unreadable`` (missing / permission / FFmpeg cannot open a
  file that looks like a known container), ``truncated`` (an MP4 whose ``moov`` index is
  missing because the file was cut short), ``not_a_video`` (no known container at all,
  e.g. a text file named ``.mp4``), ``no_video_stream`` (audio only, ...): from both
  :func:`probe_video` and :func:`decode_frames`.
- ``too_short`` (``skip=True``): the file yields fewer frames than needed, i.e. the
  metadata over-estimated the count or the tail is cut (the LTX / diffusion-pipe crash).
- ``decode_error`` (failed): corrupt data in the middle of the stream (decoding errors
  followed by more data), a frame FFmpeg flags as corrupt, or a broken container.

Rotation: phone clips carry a display matrix. :func:`probe_video` reports ``rotation``
(counter-clockwise degrees, PyAV's ``VideoFrame.rotation``) and gives ``width`` /
``height`` as *displayed* (after rotation); :func:`decode_frames` rotates by default so
its frames have exactly the probed ``width`` x ``height``.

Resize: :func:`resize_crop_frames` uses PIL bicubic per frame (PIL widens the filter
support when down-scaling, so it is antialiased, like LTX's bicubic resize and
torchvision's ``antialias=True``), then the centred crop.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import av
import numpy as np
from PIL import Image

from shardsmith.records import ItemError
from shardsmith.transform.buckets import ResizeCrop, resize_crop
from shardsmith.transform.geometry import Geometry

if TYPE_CHECKING:  # (torch is imported where a tensor is made: a probe or decode worker never needs it)
    import torch

__all__ = ["VideoProbe", "probe_video", "decode_frames", "resize_crop_frames", "to_model_input", "DEFAULT_FPS"]

#: fps assumed when a stream declares no rate at all (LTX does the same).
DEFAULT_FPS = 24.0

#: elementary-stream "containers" without timestamps (fps comes from the codec headers)
_RAW_FORMATS = frozenset({"h264", "hevc", "m4v", "mjpeg", "vvc", "cavsvideo", "vc1"})

_PTS_SAMPLE = 40  # packets whose timestamps are checked for variable frame rate
_REORDER = 8  # largest pts of the sample ignored: B-frame reordering leaves gaps there


@dataclass
class VideoProbe:
    """What :func:`probe_video` learns from a file without decoding it all.

    ``width`` / ``height`` are the displayed size (rotation applied; ``coded_width`` /
    ``coded_height`` are the stream's). ``frames`` is an *estimate* (see
    ``frames_source``: ``"metadata"`` = the container's count, ``"duration"`` =
    round(duration x fps), ``"packets"`` = demuxed packet count); a truncated file can
    over-state it, which :func:`decode_frames` reports as ``too_short``.
    """

    width: int
    height: int
    frames: int
    fps: float
    duration: float
    codec: str
    has_audio: bool
    audio_channels: int | None
    audio_rate: int | None
    rotation: int  # counter-clockwise degrees to display, one of 0/90/180/270
    vfr: bool
    coded_width: int = 0
    coded_height: int = 0
    frames_source: str = "metadata"
    container: str = ""
    truncated: bool = False  # MP4 box structure runs past the end of the file
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- helpers


def _sniff(head: bytes) -> str | None:
    """Name of the container the first bytes announce, or None."""
    if len(head) >= 8 and head[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip"):
        return "mp4/mov"
    if head[:4] == b"\x1aE\xdf\xa3":
        return "matroska/webm"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "avi"
    if head[:3] == b"FLV":
        return "flv"
    if head[:4] in (b"\x00\x00\x01\xba", b"\x00\x00\x01\xb3"):
        return "mpeg"
    if head[:1] == b"\x47" and len(head) > 188 and head[188:189] == b"\x47":
        return "mpeg-ts"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"0&\xb2u":
        return "asf/wmv"
    return None


def _mp4_boxes(path: str, size: int) -> tuple[list[str], str | None]:
    """Top-level MP4 box types and, if the last box runs past the end, a description."""
    types: list[str] = []
    with open(path, "rb") as f:
        pos = 0
        while pos + 8 <= size and len(types) < 10_000:
            f.seek(pos)
            hdr = f.read(16)
            n, typ = struct.unpack(">I4s", hdr[:8])
            name = typ.decode("latin-1")
            if n == 1 and len(hdr) >= 16:
                n = struct.unpack(">Q", hdr[8:16])[0]
            elif n == 0:
                n = size - pos
            if n < 8:
                return types, f"box {name!r} at byte {pos} has an invalid size {n}"
            types.append(name)
            if pos + n > size:
                return types, f"the {name!r} box claims {n:,} bytes but the file ends {pos + n - size:,} bytes early"
            pos += n
    return types, None


def media_size(path: str, name: str) -> int:
    """The size of a media file about to be opened: ``unreadable`` when it cannot be read,
    ``empty_file`` when it has no bytes (:class:`ItemError`, naming ``name`` and the fix)."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ItemError("unreadable", f"{name}: cannot read {path!r} ({e.strerror or e}); check the path") from None
    if size == 0:
        raise ItemError("empty_file", f"{name} is 0 bytes; re-copy it from the original or remove it")
    return size


def _open(path: str, name: str):
    """Open ``path`` with PyAV or raise the right ItemError (never an FFmpeg exception)."""
    size = media_size(path, name)
    try:
        return av.open(path, "r"), size
    except (av.FFmpegError, OSError, ValueError) as exc:
        try:
            with open(path, "rb") as f:
                head = f.read(256)
        except OSError as e:
            raise ItemError("unreadable", f"{name}: cannot read {path!r} ({e})") from None
        kind = _sniff(head)
        if kind is None:
            raise ItemError(
                "not_a_video",
                f"{name} is not a video FFmpeg can open (no known container header); "
                "check that it is really a video file, or remove it",
            ) from None
        if kind == "mp4/mov":
            types, problem = _mp4_boxes(path, size)
            if "moov" not in types:
                why = problem or f"top-level boxes {types}"
                raise ItemError(
                    "truncated",
                    f"{name} looks like an MP4 but has no 'moov' index ({why}); the file was probably "
                    "cut short (interrupted download or copy): re-copy it from the original",
                ) from None
        raise ItemError(
            "unreadable",
            f"{name} looks like {kind} but FFmpeg cannot open it ({exc}); it is corrupt or truncated: "
            "re-copy or re-encode it",
        ) from None


def _video_stream(container, name: str):
    streams = [
        s
        for s in container.streams.video
        if not (int(s.disposition) & int(av.stream.Disposition.attached_pic))
    ]
    if not streams:
        others = sorted({s.type for s in container.streams})
        raise ItemError(
            "no_video_stream",
            f"{name} has no video stream (streams: {', '.join(others) or 'none'}); "
            "use it as an audio item or remove it",
        )
    return streams[0]


def _norm_rotation(deg) -> int:
    try:
        r = int(round(float(deg))) % 360
    except (TypeError, ValueError):
        return 0
    return min((0, 90, 180, 270, 360), key=lambda v: abs(v - r)) % 360


def _rotate(arr: np.ndarray, rotation: int) -> np.ndarray:
    k = (rotation // 90) % 4
    return np.ascontiguousarray(np.rot90(arr, k=k)) if k else arr


# ----------------------------------------------------------------------------- probe


def probe_video(path: str | os.PathLike, name: str) -> VideoProbe:
    """Probe a video file once: size, frame estimate, fps, audio, rotation, vfr.

    fps: the stream's ``average_rate``, else ``base_rate``, else :data:`DEFAULT_FPS`
    (with a note); for a raw elementary stream (``.h264`` ...) FFmpeg's average_rate is
    a made-up 25, so the codec-derived ``guessed_rate`` is used instead. Frames:
    ``stream.frames`` if > 0, else round(duration x fps), else
    the number of demuxed video packets. Also demuxes the first packets (timestamps for
    ``vfr``) and decodes the first frame (``rotation``; proves the codec decodes).
    ``vfr`` is True when ``average_rate`` and ``guessed_rate`` differ by > 1 %, or the
    first packets' (sorted) timestamp steps vary by more than 1.5x.

    Raises :class:`ItemError`: ``empty_file``, ``not_a_video``, ``no_video_stream``,
    ``truncated``, ``unreadable`` or ``decode_error`` (first frame undecodable).
    """
    path = os.fspath(path)
    container, size = _open(path, name)
    notes: list[str] = []
    try:
        stream = _video_stream(container, name)
        cc = stream.codec_context
        codec = cc.name if cc is not None else "unknown"
        cw, ch = int(stream.width or 0), int(stream.height or 0)

        fps = None
        raw = container.format.name in _RAW_FORMATS
        if raw and stream.guessed_rate and stream.guessed_rate > 0:
            # a raw elementary stream has no container timing: FFmpeg's average_rate is
            # its demuxer default (25), the codec's own timing info is in guessed_rate
            fps = float(stream.guessed_rate)
            notes.append(f"raw {container.format.name} stream: fps {fps:g} from the codec's timing info")
        for attr in ("average_rate", "base_rate"):
            r = getattr(stream, attr, None)
            if fps is None and r is not None and r > 0:
                fps = float(r)
        if fps is None:
            fps = DEFAULT_FPS
            notes.append(f"no frame rate in the stream; assuming {DEFAULT_FPS:g} fps")

        duration = None
        if stream.duration and stream.time_base:
            duration = float(stream.duration * stream.time_base)
        elif container.duration:
            duration = container.duration / av.time_base
            notes.append("stream has no duration; using the container's")

        frames, frames_source = int(stream.frames or 0), "metadata"
        if frames <= 0 and duration:
            frames, frames_source = int(round(duration * fps)), "duration"
        count_packets = frames <= 0

        pts: list[int] = []
        first = None
        n_packets = 0
        decode_exc = None
        reached_end = False
        try:
            for packet in container.demux(stream):
                if packet.size == 0 and packet.pts is None:  # flush packet: end of the stream
                    reached_end = True
                    if first is None:
                        frs = packet.decode()
                        first = frs[0] if frs else None
                    continue
                n_packets += 1
                if len(pts) < _PTS_SAMPLE and packet.pts is not None:
                    pts.append(int(packet.pts))
                if first is None and decode_exc is None:
                    try:
                        frs = packet.decode()
                        if frs:
                            first = frs[0]
                    except av.FFmpegError as e:
                        decode_exc = e
                if not count_packets and first is not None and len(pts) >= _PTS_SAMPLE:
                    break
        except av.FFmpegError as e:
            if first is None:
                decode_exc = decode_exc or e
            notes.append(f"demuxing stopped early: {e}")
        if first is None:
            why = f" ({decode_exc})" if decode_exc else ""
            raise ItemError(
                "decode_error",
                f"{name}: no frame of its {codec} stream could be decoded{why}; "
                "re-encode it (e.g. H.264) or remove it",
            )
        if count_packets:
            frames, frames_source = n_packets, "packets"
        if duration is None:
            duration = frames / fps if fps else 0.0
            notes.append("no duration in the file; derived from frames / fps")

        rotation = _norm_rotation(getattr(first, "rotation", 0))
        if not rotation and stream.metadata.get("rotate"):
            # legacy tag: clockwise degrees (FFmpeg normally turns it into a display matrix)
            try:
                rotation = _norm_rotation(-float(stream.metadata["rotate"]))
            except ValueError:
                notes.append(f"ignored unreadable rotate tag {stream.metadata['rotate']!r}")
        w, h = (ch, cw) if rotation in (90, 270) else (cw, ch)
        if not cw or not ch:
            cw, ch = first.width, first.height
            w, h = (ch, cw) if rotation in (90, 270) else (cw, ch)

        truncated = False
        if container.format.name.startswith("mov"):
            _, problem = _mp4_boxes(path, size)
            if problem:
                truncated = True
                notes.append(f"file is truncated ({problem}); the frame count over-states what decodes")

        vfr = False
        avg, guess = stream.average_rate, stream.guessed_rate
        if not raw and avg and guess and abs(float(avg) - float(guess)) > 0.01 * float(guess):
            vfr = True
            notes.append(f"average rate {float(avg):.3f} != guessed rate {float(guess):.3f}: variable frame rate")
        # packets come in decode order: with B-frames the highest sampled pts may skip
        # frames stored later in the file, so unless every packet was read (and the file
        # is whole) only the lower part of the sorted sample is compared
        head = sorted(pts)
        if not (reached_end and not truncated):
            head = head[: max(0, len(head) - _REORDER)]
        steps = [b - a for a, b in zip(head, head[1:]) if b > a]
        if len(steps) >= 2 and max(steps) > 1.5 * min(steps):
            if not vfr:
                notes.append("irregular timestamps in the first packets: variable frame rate")
            vfr = True

        audio = [s for s in container.streams.audio]
        a_ch = a_rate = None
        if audio:
            acc = audio[0].codec_context
            a_ch = int(getattr(acc, "channels", 0) or (acc.layout.nb_channels if acc.layout else 0)) or None
            a_rate = int(acc.sample_rate or 0) or None

        return VideoProbe(
            width=w,
            height=h,
            frames=frames,
            fps=fps,
            duration=float(duration),
            codec=codec,
            has_audio=bool(audio),
            audio_channels=a_ch,
            audio_rate=a_rate,
            rotation=rotation,
            vfr=vfr,
            coded_width=cw,
            coded_height=ch,
            frames_source=frames_source,
            container=container.format.name,
            truncated=truncated,
            notes=notes,
        )
    finally:
        container.close()


# ----------------------------------------------------------------------------- decode


def decode_frames(
    path: str | os.PathLike,
    indices: Sequence[int],
    name: str,
    *,
    autorotate: bool = True,
) -> np.ndarray:
    """Decode the frames at ``indices`` (0-based, decode order = presentation order).

    Decodes sequentially from the start up to ``max(indices)`` and keeps the wanted
    frames; returns uint8 RGB ``[len(indices), H, W, 3]`` in the order (and with the
    repeats) of ``indices``. With ``autorotate`` the display rotation is applied, so H x W
    is the probe's ``height`` x ``width``.

    Raises :class:`ItemError`: ``too_short`` (``skip=True``) when the file yields fewer
    frames than needed, including a tail cut mid-packet; ``decode_error`` when decoding
    fails with more data after the failure (corruption mid-stream) or a wanted frame is
    flagged corrupt; plus the open errors of :func:`probe_video`. Never pads.
    """
    idx = [int(i) for i in indices]
    if not idx or min(idx) < 0:
        raise ValueError(f"indices must be a non-empty list of frame numbers >= 0, got {list(indices)[:8]}")
    path = os.fspath(path)
    container, _ = _open(path, name)
    wanted = set(idx)
    need = max(idx) + 1
    got: dict[int, np.ndarray] = {}
    n = 0
    try:
        stream = _video_stream(container, name)
        meta = int(stream.frames or 0)
        said = f"metadata said {meta}" if meta > 0 else "metadata gave no count"
        err: Exception | None = None
        err_at = 0
        packets = container.demux(stream)
        while n < need:
            try:
                packet = next(packets)
            except StopIteration:
                break
            except av.FFmpegError as e:
                raise ItemError(
                    "decode_error",
                    f"{name}: the container is corrupt after frame {n} ({e}); re-encode or re-copy it",
                ) from None
            is_flush = packet.size == 0 and packet.pts is None
            if err is not None and not is_flush:
                raise ItemError(
                    "decode_error",
                    f"{name}: corrupt data mid-stream: decoding failed after frame {err_at} ({err}) and the "
                    "file goes on; re-encode it or remove it",
                )
            try:
                frames = packet.decode()
            except av.FFmpegError as e:
                err, err_at = e, n
                continue
            for fr in frames:
                if n in wanted:
                    if getattr(fr, "is_corrupt", False):
                        raise ItemError(
                            "decode_error", f"{name}: frame {n} decodes as corrupt; re-encode it or remove it"
                        )
                    arr = fr.to_ndarray(format="rgb24")
                    if autorotate:
                        arr = _rotate(arr, _norm_rotation(fr.rotation))
                    got[n] = arr
                n += 1
                if n >= need:
                    break
        if n < need:
            tail = f"; the file ends in a broken packet ({err}), so it is truncated" if err is not None else ""
            raise ItemError(
                "too_short",
                f"{name}: decoded only {n} frames ({said}) but frame {need - 1} is needed{tail}; "
                "skipped. Re-copy or re-encode it, or add a bucket with fewer frames",
                skip=True,
            )
    except ItemError:
        raise
    except (av.FFmpegError, OSError, MemoryError) as e:
        raise ItemError(
            "decode_error", f"{name}: decoding failed at frame {n} ({e}); re-encode it or remove it"
        ) from None
    finally:
        container.close()
    shapes = {a.shape for a in got.values()}
    if len(shapes) > 1:
        raise ItemError("decode_error", f"{name}: frame size changes mid-stream ({sorted(shapes)}); re-encode it")
    return np.stack([got[i] for i in idx])


# ----------------------------------------------------------------------------- pixels


def _checked(w: int, h: int, rc: ResizeCrop | Geometry, what: str) -> ResizeCrop:
    """``rc`` as a :class:`ResizeCrop`, refused (``ValueError``) when it was made for another size
    than ``w`` x ``h``: a :class:`Geometry` names the size it applies to (a partner's geometry
    resizes it onto its target's pixels); a bare ResizeCrop must be the cover-resize of ``w`` x ``h``."""
    if isinstance(rc, Geometry):
        if (w, h) != rc.source_size:
            raise ValueError(f"the geometry applies to {rc.source_size[0]}x{rc.source_size[1]}, but {what} is {w}x{h}")
        return rc.resize_crop
    _check_resize_crop(w, h, rc, what)
    return rc


def resize_crop_frames(frames: np.ndarray, rc: ResizeCrop | Geometry) -> np.ndarray:
    """Apply ``rc`` (an item's :class:`Geometry` or its :class:`ResizeCrop`) to uint8
    ``[F, H, W, 3]`` frames: PIL bicubic resize, then crop.

    A :class:`Geometry` must be for these frames' size (``source_size``); a bare ResizeCrop must be
    their cover-resize (``resize_crop(W, H, crop_w, crop_h)``'s resize size). One computed for
    another source size (e.g. before rotation) is refused instead of silently distorting the
    aspect ratio. Returns uint8
    ``[F, crop_h, crop_w, 3]``.
    """
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"expected uint8 [F,H,W,3] frames, got {frames.dtype} {frames.shape}")
    f, h, w, _ = frames.shape
    rc = _checked(w, h, rc, "frames")
    if rc.crop_x0 + rc.crop_w > rc.resize_w or rc.crop_y0 + rc.crop_h > rc.resize_h or min(rc.crop_x0, rc.crop_y0) < 0:
        raise ValueError(f"crop box {rc.box} lies outside the resized {rc.resize_w}x{rc.resize_h} frame")
    out = np.empty((f, rc.crop_h, rc.crop_w, 3), np.uint8)
    x0, y0, x1, y1 = rc.box
    same = (rc.resize_w, rc.resize_h) == (w, h)
    for i in range(f):
        if same:
            out[i] = frames[i, y0:y1, x0:x1]
        else:
            im = Image.fromarray(frames[i]).resize((rc.resize_w, rc.resize_h), Image.BICUBIC)
            out[i] = np.asarray(im.crop(rc.box))
    return out


def resize_crop_image(image: "Image.Image", rc: ResizeCrop | Geometry) -> np.ndarray:
    """One RGB PIL image -> uint8 ``[crop_h, crop_w, 3]``: the same PIL bicubic resize and crop
    as :func:`resize_crop_frames`, on the PIL image itself (no round trip through numpy)."""
    rc = _checked(image.size[0], image.size[1], rc, "an image")
    if image.size != (rc.resize_w, rc.resize_h):
        image = image.resize((rc.resize_w, rc.resize_h), Image.BICUBIC)
    return np.asarray(image.crop(rc.box))


def _check_resize_crop(w: int, h: int, rc: ResizeCrop, what: str) -> None:
    """Refuse a ResizeCrop computed for another source size than ``w`` x ``h`` (it would
    silently distort the aspect ratio)."""
    expect = resize_crop(w, h, rc.crop_w, rc.crop_h)
    if (expect.resize_w, expect.resize_h) != (rc.resize_w, rc.resize_h):
        raise ValueError(f"ResizeCrop resizes to {rc.resize_w}x{rc.resize_h}, but {what} of {w}x{h} cover "
                         f"{rc.crop_w}x{rc.crop_h} at {expect.resize_w}x{expect.resize_h}: it was computed for "
                         "another size")


def to_model_input(frames: np.ndarray) -> torch.Tensor:
    """uint8 ``[F, H, W, 3]`` -> float32 ``[C, F, H, W]`` in [-1, 1] (x / 127.5 - 1)."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"expected uint8 [F,H,W,3] frames, got {frames.dtype} {frames.shape}")
    import torch

    t = torch.from_numpy(np.ascontiguousarray(frames)).permute(3, 0, 1, 2).float()
    return (t / 127.5 - 1.0).contiguous()
