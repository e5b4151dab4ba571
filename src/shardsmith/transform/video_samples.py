"""``video_wds`` samples: one clip -> ``mp4`` (cut to its bucket), ``txt`` (caption), ``json``.

Runs in worker processes (picklable, like every sample maker); writes no file.

Contract of :class:`VideoSampleMaker` (one :class:`PlannedItem` in, one :class:`SampleResult` out):

- The clip's geometry is the latent outputs' decision
  (:meth:`~shardsmith.transform.latent_pixels.LatentPixelMaker.video_geometry`): among the buckets
  of ``geometry.buckets`` with F > 1, closest aspect ratio, then most frames at ``geometry.fps``,
  then largest area; ``skipped:too_short`` / ``skipped:too_small`` as there.
- Passthrough (``passthrough: true``): the source bytes, unchanged, when the file is an H.264
  stream in an ``.mp4`` file (MP4 / QuickTime container), shown upright (no display rotation:
  FastGen's decoder ignores it), of exactly the bucket's width and height, with exactly the
  bucket's frame count (the container's count, every frame decoding) at the target fps (constant
  rate, not truncated). Its audio track, if any, stays (``json.audio = "kept"``).
- Otherwise the chosen frames are decoded, resized and cropped to the bucket (PIL bicubic, as the
  latent path) and re-encoded with PyAV: libx264, yuv420p, ``crf`` / ``preset``, one thread,
  bit-exact muxer flags (no creation time, no muxer version string), ``fps`` = the clip's output
  fps. The same frames give the same bytes on every run with one PyAV/FFmpeg build. The audio is
  dropped (``json.audio = "dropped"``; ``"none"`` when the source had none).
- Audio (``audio: wav | flac``; nothing of this with the default ``none``): a clip with an audio
  stream also gets a ``wav`` / ``flac`` member, its audio cut to the written frames
  (:func:`~shardsmith.transform.audio.clip_window`: from the first chosen source frame's time for
  the bucket's frames ÷ the sample's fps), decoded at the stream's own sample rate, stereo as
  :func:`~shardsmith.transform.audio.to_stereo` makes it (zero-padded when the stream ends early),
  16-bit PCM: a WAV file (:func:`~shardsmith.transform.audio.wav_bytes`) or FLAC (:func:`flac_bytes`),
  the same bytes on every run; ``json.audio`` = ``"wav"`` / ``"flac"`` and ``json.audio_window``
  its start, duration, rate, samples and padding. A clip without audio gets no member
  (``json.audio = "none"``); one whose audio does not decode is ``failed:audio_decode_error`` (the
  detail names the file and FFmpeg's message).
- Members: ``mp4``; ``txt`` = the caption (UTF-8). A clip without a caption (or only whitespace)
  is ``skipped:no_caption`` unless ``require_caption: false``, which writes an empty ``txt``;
  ``json`` = source, id, path, sha256, fps, frames, original size and fps and frame count, crop
  (FastGen's ``cropping_params`` names), the source frame indices, bucket, passthrough, audio,
  codec, licence, origin and the table's metadata.
- Images (and other non-video kinds) are ``skipped:unsupported_kind_<kind>`` with a detail.
"""

from __future__ import annotations

import io
import json
import math
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from shardsmith.formats.wds import FLAC, JSON, MP4, TXT, WAV
from shardsmith.recipe import ImageRules, VideoWdsOutput
from shardsmith.records import NO_CAPTION, WRITTEN, ItemError, PlannedItem, SampleResult, SourceInfo
from shardsmith.transform.audio import check_decoded, clip_window, decode_audio, pcm16, probe_audio, wav_bytes
from shardsmith.transform.buckets import parse_buckets
from shardsmith.transform.geometry import Geometry
from shardsmith.transform.latent_pixels import LatentPixelMaker
from shardsmith.transform.samples import read_checked
from shardsmith.transform.video import VideoProbe, probe_video

#: the codec names (PyAV decoder names) a passthrough clip may have, by the output's ``codec``
PASSTHROUGH_CODECS = {"h264": ("h264",)}
#: the encoder PyAV uses for the output's ``codec``
ENCODERS = {"h264": "libx264"}
#: file suffixes of a clip whose bytes may become the ``mp4`` member as they are
MP4_SUFFIXES = (".mp4", ".m4v")


def output_rate(fps: float) -> Fraction:
    """The encoder's frame rate for ``fps`` (``30000/1001`` for 29.97, ``24`` for 24.0)."""
    return Fraction(fps).limit_denominator(1001)


def encode_mp4(frames: np.ndarray, fps: float, *, codec: str = "h264", crf: int = 18, preset: str = "medium") -> bytes:
    """uint8 RGB ``[F, H, W, 3]`` (even H and W) -> the bytes of an mp4 of F frames at ``fps``.

    Deterministic: one encoder thread, fixed options, bit-exact muxer and codec flags."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"expected uint8 [F,H,W,3] frames, got {frames.dtype} {frames.shape}")
    _, h, w, _ = frames.shape
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4", options={"fflags": "+bitexact"}) as c:
        s = c.add_stream(ENCODERS[codec], rate=output_rate(fps))
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        # mbtree=0: with x264's macroblock-tree rate control this FFmpeg build's output varies between runs
        s.options = {"crf": str(crf), "preset": preset, "threads": "1", "x264-params": "mbtree=0"}
        s.codec_context.flags |= av.codec.context.Flags.bitexact
        for i, arr in enumerate(frames):
            fr = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            fr.pts = i
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return buf.getvalue()


def flac_bytes(wave: np.ndarray, rate: int) -> bytes:
    """A stereo waveform float ``[2, N]`` as the bytes of a 16-bit FLAC file at ``rate`` Hz (lossless: it decodes
    to :func:`pcm16` of ``wave``). Deterministic: bit-exact muxer and encoder (no version string)."""
    pcm = pcm16(wave)
    if pcm.ndim != 2 or pcm.shape[0] != 2:
        raise ValueError(f"expected a stereo waveform [2, N], got shape {pcm.shape}")
    buf = io.BytesIO()
    with av.open(buf, "w", format="flac", options={"fflags": "+bitexact"}) as c:
        s = c.add_stream("flac", rate=int(rate), layout="stereo")
        s.format = "s16"
        s.codec_context.flags |= av.codec.context.Flags.bitexact
        if pcm.shape[1]:
            fr = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm.T.reshape(1, -1)), format="s16", layout="stereo")
            fr.sample_rate, fr.pts = int(rate), 0
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return buf.getvalue()


def _decodable_frames(path: str) -> int:
    """How many frames of the first video stream decode (0 when decoding fails anywhere)."""
    try:
        with av.open(path) as c:
            return sum(1 for _ in c.decode(c.streams.video[0]))
    except (av.FFmpegError, OSError, IndexError):
        return 0


class VideoSampleMaker:
    """Members ``mp4``, ``txt``, ``json`` of one ``video_wds`` sample (see the module contract)."""

    def __init__(self, output: VideoWdsOutput, buckets: list[str], rules: ImageRules, target_fps: float | None,
                 sources: list[SourceInfo]):
        self.o, self.sources, self.target_fps = output, sources, target_fps
        clips = [b for b in parse_buckets(buckets) if b.frames > 1]
        self.pixels = LatentPixelMaker(clips, rules, target_fps)

    @staticmethod
    def is_heavy(item: PlannedItem) -> bool:
        """A clip takes seconds to decode and encode: the worker pool sends it on its own."""
        return item.kind == "video"

    def __call__(self, item: PlannedItem) -> SampleResult:
        try:
            return self._make(item)
        except ItemError as e:
            return SampleResult(idx=item.idx, status=e.status, detail=e.detail)

    def _caption(self, item: PlannedItem) -> bytes:
        cap = item.caption
        if cap is None or not cap.strip():
            if self.o.require_caption:
                raise ItemError(NO_CAPTION, f"{item.item_id} has no caption, and output {self.o.name!r} (video_wds) "
                                "is read by video loaders whose condition is the txt member (FastGen's key_map "
                                "{real: mp4, condition: txt}); give it a caption (columns.caption, or a sidecar "
                                ".txt), or set require_caption: false on the output to write an empty txt",
                                skip=True)
            return b""
        return cap.encode("utf-8")

    def _make(self, item: PlannedItem) -> SampleResult:
        if item.kind != "video":
            raise ItemError(f"unsupported_kind_{item.kind}",
                            f"{item.item_id} is {item.kind} media, and output {self.o.name!r} (video_wds) writes "
                            "video clips only; limit the output's sources: to the clips, or write the images "
                            "with a wds or latent output", skip=True)
        txt = self._caption(item)
        read_checked(item)  # same bytes as planned (and readable)
        pr = probe_video(item.path, item.item_id)
        geom = self.pixels.video_geometry(item, pr)
        sound = self._sound(item, pr, geom) if self.o.audio != "none" and pr.has_audio else None  # before the video
        why_not = self._why_not_passthrough(item, pr, geom)
        if why_not is None:
            with open(item.path, "rb") as f:
                mp4 = f.read()
            audio, applied = ("kept" if pr.has_audio else "none"), geom
        else:
            frames, applied = self.pixels.video_frames(item, geom)
            mp4 = encode_mp4(frames, geom.fps, codec=self.o.codec, crf=self.o.crf, preset=self.o.preset)
            audio = "dropped" if pr.has_audio else "none"
        b = geom.bucket
        src = self.sources[item.source]
        meta = {
            "id": item.item_id, "source": src.name, "path": item.relpath, "sha256": item.sha256,
            "fps": geom.fps, "frames": b.frames, "size": [b.width, b.height], "bucket": str(b),
            "original_size": [pr.width, pr.height], "original_fps": pr.fps, "original_frames": pr.frames,
            "rotation": pr.rotation, "crop": applied.resize_crop.as_dict(), "frame_indices": list(geom.frame_indices),
            "passthrough": why_not is None, "reencoded_because": why_not, "audio": audio,
            "codec": "h264" if why_not is None else self.o.codec, "caption": item.caption,
            "license": src.license, "origin": src.origin, "meta": item.meta,
        }
        members = {MP4: mp4, TXT: txt}
        if sound is not None:
            meta["audio"], meta["audio_window"] = self.o.audio, sound[1]
            members[WAV if self.o.audio == "wav" else FLAC] = sound[0]
        members[JSON] = json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return SampleResult(idx=item.idx, status=WRITTEN, members=members,
                            info={"bucket": str(b), "passthrough": why_not is None})

    def _sound(self, item: PlannedItem, pr: VideoProbe, geom: Geometry) -> tuple[bytes, dict]:
        """The clip's audio member (``wav`` or ``flac`` bytes) over the sample's frames, and its window
        (see the module contract); ``ItemError`` (``audio_decode_error``, ...) when it does not decode."""
        rate = pr.audio_rate or probe_audio(item.path, item.item_id).rate
        first = geom.frame_indices[0] if geom.frame_indices else 0
        start, duration = clip_window(first, pr.fps, geom.bucket.frames, geom.fps)
        dec = check_decoded(decode_audio(item.path, item.item_id, rate=rate, start=start, duration=duration),
                            f"{item.item_id} ({item.relpath})", duration)  # (NaN in a float track: no member)
        if self.o.audio == "wav":
            data = wav_bytes(dec.wave, dec.rate)
        else:
            data = flac_bytes(dec.wave, dec.rate)
        return data, {"start": start, "duration": duration, "rate": dec.rate, "samples": int(dec.wave.shape[-1]),
                      "source_channels": dec.probe.channels, "layout": dec.probe.layout, "padded": dec.padded}

    def _why_not_passthrough(self, item: PlannedItem, pr: VideoProbe, geom: Geometry) -> str | None:
        """None when the file's bytes already are the sample's clip; else why it is re-encoded."""
        b = geom.bucket
        if not self.o.passthrough:
            return "passthrough: false"
        if pr.codec not in PASSTHROUGH_CODECS[self.o.codec] or not pr.container.startswith("mov") \
                or Path(item.path).suffix.lower() not in MP4_SUFFIXES:
            return f"{pr.codec} in {Path(item.path).suffix or 'a file'} ({pr.container}), not {self.o.codec} in mp4"
        if pr.rotation:
            return f"display rotation {pr.rotation} (video loaders ignore it)"
        if (pr.width, pr.height) != (b.width, b.height):
            return f"size {pr.width}x{pr.height}, bucket {b.width}x{b.height}"
        if pr.frames != b.frames or pr.frames_source != "metadata" or pr.truncated:
            return f"{pr.frames} frames ({pr.frames_source}), bucket {b.frames}"
        if pr.vfr or not math.isclose(pr.fps, geom.fps, rel_tol=1e-6):
            return f"{pr.fps:g} fps{' (variable)' if pr.vfr else ''}, target {geom.fps:g}"
        n = _decodable_frames(item.path)
        if n != b.frames:
            return f"{n} of {pr.frames} frames decode"
        return None
