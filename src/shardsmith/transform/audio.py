"""Audio I/O with PyAV: probe, decode + resample + cut, channel policy, duration arithmetic.

The waveform the LTX audio VAE encodes is stereo at the encoder's rate, cut to the clip as
actually sampled. This module gives it from any file FFmpeg reads (audio files and the audio
stream of a video container) with PyAV alone (no torchaudio / torchcodec).

Every per-item problem becomes an :class:`~shardsmith.records.ItemError` naming the item and the
fix; no PyAV / FFmpeg exception escapes for a bad file. Reasons raised:

- ``empty_file`` (0 bytes), ``unreadable`` (missing, no permission, or FFmpeg cannot open it);
- ``no_audio_stream``: the file opens but holds no audio stream (a silent video, an image);
- ``audio_decode_error``: FFmpeg fails while decoding (corrupt packets, a broken container, the
  sample format / layout / rate changing mid-stream, or a stream with no decodable sample);
- from :func:`check_decoded` (what the audio cutter asks of each window it cut): ``audio_rate_too_low``
  (a source below :data:`MIN_AUDIO_RATE` Hz, or a window holding no sample) and ``audio_not_finite`` (NaN
  or infinite samples).

The audio timeline: time 0 is the first decoded sample of the stream and samples are taken as
contiguous (what a decode of the whole stream gives, as LTX's ``torchaudio.load`` does).

Policy (LTX-2's trainer, ``packages/ltx-trainer/scripts/process_videos.py``): the waveform is cut
to the requested duration and zero-padded at the end when the source ends early (LTX warns; here
:attr:`DecodedAudio.padded` records the seconds added, the caller reports it); channels are
converted by :func:`to_stereo` (mono duplicated, 5.1 / 7.1 down-mixed with LTX's normalised
weights, other layouts averaged then duplicated).
"""

from __future__ import annotations

import io
import math
import os
import wave as _wave
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

import av
import numpy as np

from shardsmith.records import ItemError

__all__ = [
    "AudioProbe",
    "DecodedAudio",
    "probe_audio",
    "decode_audio",
    "to_stereo",
    "num_samples",
    "resampled_length",
    "clip_window",
    "choose_duration",
    "parse_durations",
    "DOWNMIX_5_1",
    "DOWNMIX_7_1",
]

# LTX-2 ``_encode_audio`` (packages/ltx-trainer/scripts/process_videos.py): per output side, the
# front channel at 1 and centre + surround(s) at 0.707, normalised by the sum of the weights.
#: 5.1: (front, other) weights, other = centre and the side's surround; LFE dropped. 1 + 2 x 0.707 = 2.414
DOWNMIX_5_1 = (1.0 / 2.414, 0.707 / 2.414)
#: 7.1: (front, other) weights, other = centre and the side's two surrounds; LFE dropped. 1 + 3 x 0.707 = 3.121
DOWNMIX_7_1 = (1.0 / 3.121, 0.707 / 3.121)

# The surround channels (FFmpeg names) that go to each side in the 5.1 / 7.1 down-mix: side and back
# surrounds, and the front-of-centre pair 7.1(wide) carries where 7.1 has its side pair.
_LEFT_SURROUND = frozenset({"SL", "BL", "FLC"})
_RIGHT_SURROUND = frozenset({"SR", "BR", "FRC"})

#: a ``start`` later than this (seconds) seeks instead of decoding from the beginning
SEEK_AFTER = 2.0
#: seconds decoded before ``start`` after a seek (decoder state, resampler warm-up)
_PREROLL = 0.5
#: seconds of decoded samples discarded after a seek before the resampler is fed (codec state:
#: AAC overlap, MP3 bit reservoir, Opus pre-roll)
_DECODER_PREROLL = 0.1
#: containers whose audio timestamps count samples exactly: only these are seeked
_SEEKABLE = frozenset({"mov", "mp4", "m4a", "matroska", "webm", "wav", "flac", "ogg"})

_AUDIO_FIX = "give the item an audio file (columns.audio) or set audio.required: false / --skip-audio"
#: the lowest sample rate (Hz) taken from a source: telephone audio is 8,000 Hz, and below this a file is
#: mislabelled or broken (a 1 Hz WAV holds no sample in a clip's 0.7 s window: :func:`check_decoded`)
MIN_AUDIO_RATE = 1000
_DECODE_FIX = "re-encode its audio (e.g. ffmpeg -i in -c:a pcm_s16le out.wav) or remove it"


@dataclass(frozen=True)
class AudioProbe:
    """What :func:`probe_audio` learns from a file's first audio stream without decoding it all.

    ``layout`` is FFmpeg's layout name (``"mono"``, ``"stereo"``, ``"5.1"``, ``"5.1(side)"``,
    ``"7.1"``, ...; ``"2 channels"`` when the file names no order, as a plain WAV does); ``duration``
    is in seconds: the stream's duration (less Opus's pre-skip in Ogg, which FFmpeg counts and the
    decoder drops), else the container's, else the decoded sample count.
    """

    rate: int
    channels: int
    layout: str
    duration: float
    codec: str
    stream_index: int

    def to_json(self) -> dict:
        """Plain JSON (kept in the ledger)."""
        return {"rate": self.rate, "channels": self.channels, "layout": self.layout,
                "duration": self.duration, "codec": self.codec, "stream_index": self.stream_index}


@dataclass
class DecodedAudio:
    """The output of :func:`decode_audio`.

    ``wave``: float32 ``[2, N]`` (``[1, N]`` for a mono source decoded with ``keep_mono``) at ``rate`` with
    ``N == num_samples(duration, rate)`` exactly;
    ``probe``: the source stream (``layout`` / ``channels`` as decoded, when the decoder disagrees with
    the header); ``padded``: seconds of zeros appended because the source ended early (0.0 normally).
    """

    wave: np.ndarray
    rate: int
    probe: AudioProbe
    padded: float


# ----------------------------------------------------------------------------- pure arithmetic


def num_samples(duration: float, rate: int) -> int:
    """Samples in ``duration`` seconds at ``rate`` Hz: ``floor(duration x rate)``, LTX's
    ``int(duration * sample_rate)`` truncation, made immune to float error (a product within 1e-6
    of an integer counts as that integer: 0.29 s at 100 Hz is 29, not 28).

    Refuses (``ValueError``) a negative or non-finite duration and a rate below 1.
    """
    if not math.isfinite(duration) or duration < 0:
        raise ValueError(f"duration must be a finite number of seconds >= 0, got {duration!r}")
    if int(rate) != rate or rate < 1:
        raise ValueError(f"rate must be a positive whole number of Hz, got {rate!r}")
    return math.floor(duration * rate + 1e-6)


def reduced(orig: int, new: int) -> tuple[int, int]:
    """``(orig, new)`` divided by their gcd (``44100, 16000 -> 441, 160``). Refuses rates that are not
    positive whole numbers (``ValueError``)."""
    for name, r in (("source", orig), ("target", new)):
        if int(r) != r or r < 1:
            raise ValueError(f"the {name} rate must be a positive whole number of Hz, got {r!r}")
    g = math.gcd(int(orig), int(new))
    return int(orig) // g, int(new) // g


def resampled_length(n: int, orig: int, new: int) -> int:
    """Samples that ``n`` samples at ``orig`` Hz become at ``new`` Hz through the encoder's resampler
    (:mod:`shardsmith.encode.resample`, torchaudio's ``resample``): ``ceil(new' x n / orig')`` over the
    rates reduced by their gcd, the quotient rounded to float32 first as torchaudio's ``torch.as_tensor``
    does; ``n`` when the rates are equal. Refuses ``n < 0`` and rates below 1 (``ValueError``)."""
    if int(n) != n or n < 0:
        raise ValueError(f"a sample count must be a whole number >= 0, got {n!r}")
    o, p = reduced(orig, new)
    if o == p:
        return int(n)
    return math.ceil(float(np.float32(p * int(n) / o)))


def _start_sample(start: float, rate: int) -> int:
    """The output sample at ``start`` seconds: the nearest, halves up (``floor(start x rate + 0.5)``)."""
    if not math.isfinite(start) or start < 0:
        raise ValueError(f"start must be a finite number of seconds >= 0, got {start!r}")
    return math.floor(start * rate + 0.5)


def clip_window(first_frame: int, source_fps: float, frames: int, fps: float) -> tuple[float, float]:
    """``(start, duration)`` in seconds of the audio matching a video sample.

    It starts at the time of the clip's first chosen source frame (``first_frame / source_fps``)
    and lasts ``frames / fps``: the bucket's frame count over the sample's effective fps, i.e. the
    clip's duration as actually sampled. Refuses (``ValueError``) ``first_frame < 0``,
    ``frames < 1`` and rates that are not positive.
    """
    if first_frame < 0:
        raise ValueError(f"first_frame must be >= 0, got {first_frame}")
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    if not (source_fps > 0 and fps > 0) or not math.isfinite(source_fps) or not math.isfinite(fps):
        raise ValueError(f"frame rates must be positive, got source_fps={source_fps!r}, fps={fps!r}")
    return first_frame / source_fps, frames / fps


def choose_duration(duration: float, buckets: Sequence[float]) -> float | None:
    """The largest bucket not longer than ``duration`` seconds (a bucket within 1e-9 s of the
    file's duration fits); None when the file is shorter than every bucket (LTX skips it).

    Refuses (``ValueError``) an empty bucket list and a bucket that is not a positive number.
    """
    if not buckets:
        raise ValueError("no duration buckets given")
    for b in buckets:
        if not (b > 0) or not math.isfinite(b):
            raise ValueError(f"duration buckets must be positive seconds, got {b!r}")
    fits = [float(b) for b in buckets if b <= duration + 1e-9]
    return max(fits) if fits else None


def parse_durations(text: str) -> list[float]:
    """LTX's ``--audio-durations`` syntax: ``"2.0;4.0;8.0"`` -> ``[2.0, 4.0, 8.0]`` (in the order
    written; spaces around a value are allowed).

    Refuses (``ValueError``, naming the bad part): an empty text or part, a value that is not a
    number, one that is not finite or not > 0, and a repeated value.
    """
    if not text or not text.strip():
        raise ValueError("no durations given")
    out: list[float] = []
    for i, part in enumerate(text.split(";"), 1):
        s = part.strip()
        if not s:
            raise ValueError(f"part {i} is empty")
        try:
            v = float(s)
        except ValueError:
            raise ValueError(f"part {i} ({s!r}) is not a number of seconds") from None
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"part {i} ({s!r}) must be a duration > 0 seconds")
        if v in out:
            raise ValueError(f"part {i} ({s!r}) repeats the duration {v:g}")
        out.append(v)
    return out


# ----------------------------------------------------------------------------- channels


def _channel_names(layout: str, count: int) -> list[str] | None:
    """FFmpeg's channel names of ``layout`` in storage order, None when it names no usable order."""
    try:
        lay = av.AudioLayout(layout)
    except (ValueError, TypeError, av.FFmpegError):
        return None
    names = [c.name for c in lay.channels]
    if len(names) != count or len(set(names)) != count:
        return None
    return names


def to_stereo(x: np.ndarray, layout: str) -> np.ndarray:
    """float32 ``[C, N]`` in the channel order of FFmpeg layout ``layout`` -> float32 ``[2, N]``.

    - 1 channel: duplicated; 2 channels: unchanged.
    - 5.1 (``FL FR FC LFE`` + one surround per side: ``5.1``, ``5.1(side)``) and 7.1 (two per side:
      ``7.1``, ``7.1(wide)``, ``7.1(wide-side)``): LTX-2's down-mix,
      ``L = a*FL + b*(FC + left surrounds)``, ``R = a*FR + b*(FC + right surrounds)``, LFE dropped,
      ``(a, b)`` = :data:`DOWNMIX_5_1` / :data:`DOWNMIX_7_1`. Channels are found by name, so the
      order of the layout (not LTX's assumed index order) decides which is which.
    - Any other layout of more than 2 channels (quad, 2.1, hexagonal, an unnamed order, ...): the
      mean of all channels, duplicated (LTX's fallback).

    Refuses (``ValueError``) anything but a 2-D ``[C, N]`` array with C >= 1, and a layout whose
    named channel count differs from C.
    """
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"expected a [C, N] waveform, got shape {x.shape}")
    c = x.shape[0]
    x = x.astype(np.float32, copy=False)
    try:
        declared = av.AudioLayout(layout).nb_channels
    except (ValueError, TypeError, av.FFmpegError):
        declared = None
    if declared is not None and declared != c:
        raise ValueError(f"layout {layout!r} has {declared} channels but the waveform has {c}")
    if c == 1:
        return np.concatenate([x, x])
    if c == 2:
        return x.copy()
    names = _channel_names(layout, c)
    if names is not None and {"FL", "FR", "FC", "LFE"} <= set(names):
        rest = [n for n in names if n not in ("FL", "FR", "FC", "LFE")]
        left = [n for n in rest if n in _LEFT_SURROUND]
        right = [n for n in rest if n in _RIGHT_SURROUND]
        if len(left) == len(right) == len(rest) / 2 and len(left) in (1, 2):
            a, b = DOWNMIX_5_1 if len(left) == 1 else DOWNMIX_7_1
            ch = {n: x[i].astype(np.float64) for i, n in enumerate(names)}
            lo = a * ch["FL"] + b * (ch["FC"] + sum(ch[n] for n in left))
            ro = a * ch["FR"] + b * (ch["FC"] + sum(ch[n] for n in right))
            return np.stack([lo, ro]).astype(np.float32)
    mono = x.mean(axis=0, dtype=np.float64).astype(np.float32)
    return np.stack([mono, mono])


# ----------------------------------------------------------------------------- open / probe


def _open(path: str, name: str):
    """Open ``path`` with PyAV or raise ``empty_file`` / ``unreadable`` (never an FFmpeg exception)."""
    from shardsmith.transform.video import media_size

    media_size(path, name)
    try:
        return av.open(path, "r")
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise ItemError(
            "unreadable",
            f"{name}: FFmpeg cannot open {path!r} ({exc}); it is not a media file or it is corrupt: "
            "re-copy or re-encode it",
        ) from None


def _audio_stream(container, path: str, name: str):
    if not container.streams.audio:
        others = sorted({s.type for s in container.streams})
        raise ItemError(
            "no_audio_stream",
            f"{name} has no audio stream ({os.path.basename(path)}: streams {', '.join(others) or 'none'}); "
            + _AUDIO_FIX,
        )
    return container.streams.audio[0]


def _decode_error(name: str, exc: BaseException, where: str = "") -> ItemError:
    return ItemError("audio_decode_error", f"{name}: {where}{exc}; {_DECODE_FIX}")


def _frames(container, stream, name: str) -> Iterator:
    """The decoded frames of ``stream`` from the container's current position, decoder flushed at the end."""
    packets = container.demux(stream)
    while True:
        try:
            packet = next(packets)
        except StopIteration:
            return
        except (av.FFmpegError, OSError) as e:
            raise _decode_error(name, e, "the container is corrupt: ") from None
        try:
            frames = packet.decode()
        except (av.FFmpegError, OSError, MemoryError) as e:
            raise _decode_error(name, e, "decoding its audio failed: ") from None
        yield from frames


def _ogg_opus_preskip(container, cc) -> int:
    """Opus in Ogg: FFmpeg's stream duration counts the encoder's pre-skip (samples at 48 kHz,
    OpusHead bytes 10-11) that the decoder drops; the pre-skip, else 0."""
    if cc is None or cc.name != "opus" or "ogg" not in container.format.name.split(","):
        return 0
    head = bytes(cc.extradata or b"")
    if len(head) < 12 or not head.startswith(b"OpusHead"):
        return 0
    return int.from_bytes(head[10:12], "little")


def _probe_open(container, stream, path: str, name: str) -> AudioProbe:
    """The probe of ``stream`` in the open ``container``; a duration neither states is counted by
    decoding in a container of its own (``container`` is left where it was)."""
    cc = stream.codec_context
    layout = cc.layout
    channels = int(getattr(cc, "channels", 0) or (layout.nb_channels if layout is not None else 0))
    duration = None
    if stream.duration and stream.time_base:
        duration = float(stream.duration * stream.time_base)
        skip = _ogg_opus_preskip(container, cc)
        if skip and duration * 48000 > skip:
            duration -= skip / 48000
    elif container.duration:
        duration = container.duration / av.time_base
    rate = int(cc.sample_rate or stream.rate or 0)
    if duration is None:
        n = 0
        other = _open(path, name)
        try:
            for fr in _frames(other, other.streams.audio[0], name):
                n += fr.samples
                rate = rate or fr.sample_rate
        finally:
            other.close()
        duration = n / rate if rate else 0.0
    return AudioProbe(
        rate=rate,
        channels=channels,
        layout=layout.name if layout is not None else "",
        duration=duration,
        codec=cc.name if cc is not None else "unknown",
        stream_index=int(stream.index),
    )


def probe_audio(path: str, item_id: str) -> AudioProbe:
    """Probe the first audio stream of an audio file (wav, flac, mp3, m4a, ogg, ...) or of a video
    container from its headers (it decodes only when neither stream nor container states a duration).

    Raises :class:`ItemError`: ``no_audio_stream`` (the detail names the file and the fix: an audio
    file via ``columns.audio``, or ``audio.required: false`` / ``--skip-audio``), ``empty_file``,
    ``unreadable``, and ``audio_decode_error`` only when the duration had to be decoded and failed.
    """
    path = os.fspath(path)
    container = _open(path, item_id)
    try:
        stream = _audio_stream(container, path, item_id)
        return _probe_open(container, stream, path, item_id)
    finally:
        container.close()


# ----------------------------------------------------------------------------- decode


class _Window:
    """Output samples ``[lo, hi)`` of a stream fed in order from output sample ``pos``, written into one
    float32 ``[C, hi - lo]`` array (zeros where nothing was written); ``filled``: the samples written from
    ``lo`` on (they arrive in order, so they are contiguous)."""

    def __init__(self, lo: int, hi: int, pos: int = 0):
        self.lo, self.hi, self.pos = lo, hi, pos
        self.out: np.ndarray | None = None
        self.filled = 0

    def _span(self, n: int) -> tuple[int, int, int] | None:
        """Advance by ``n`` input samples: ``(first, last)`` of them inside the window and where the first
        goes in it, or None."""
        a = self.pos
        self.pos += n
        lo, hi = max(a, self.lo), min(self.pos, self.hi)
        if hi <= lo:
            return None
        self.filled = hi - self.lo
        return lo - a, hi - a, lo - self.lo

    def _dst(self, channels: int) -> np.ndarray:
        if self.out is None:
            self.out = np.zeros((channels, self.hi - self.lo), np.float32)
        return self.out

    def add(self, arr: np.ndarray) -> None:
        """Float32 ``[C, n]`` samples (a resampler's output)."""
        span = self._span(arr.shape[1])
        if span is not None:
            i0, i1, j = span
            self._dst(arr.shape[0])[:, j:j + i1 - i0] = arr[:, i0:i1]

    def add_frame(self, fr) -> None:
        """A decoded frame at the window's rate, converted to float32 as swresample converts it
        (:func:`_convert_into`), only the part inside the window."""
        span = self._span(fr.samples)
        if span is not None:
            i0, i1, j = span
            _convert_into(fr, i0, i1, self._dst(fr.layout.nb_channels)[:, j:j + i1 - i0])

    def result(self, channels: int) -> np.ndarray:
        return self.out if self.out is not None else np.zeros((channels, self.hi - self.lo), np.float32)

    @property
    def done(self) -> bool:
        return self.pos >= self.hi


def _drop_head(frame, k: int):
    """``frame`` without its first ``k`` samples (same format, layout and rate)."""
    arr = frame.to_ndarray()
    step = 1 if frame.format.is_planar else frame.layout.nb_channels
    out = av.AudioFrame.from_ndarray(np.ascontiguousarray(arr[:, k * step :]), format=frame.format.name,
                                     layout=frame.layout.name)
    out.sample_rate = frame.sample_rate
    return out


class _Fallback(Exception):
    """The seek cannot guarantee a decode-from-zero result: decode from the beginning instead."""


#: sample formats (planar or packed) -> ``(dtype, offset, scale)``: their samples' numpy type and their
#: conversion to float32 as swresample converts them (``(x - offset) * scale``, exact for the integer
#: formats; scale None: a float cast, to the nearest)
_TO_FLOAT = {"u8": (np.uint8, 128, 2.0 ** -7), "s16": (np.int16, 0, 2.0 ** -15),
             "s32": (np.int32, 0, 2.0 ** -31), "s64": (np.int64, 0, 2.0 ** -63),
             "flt": (np.float32, 0, None), "dbl": (np.float64, 0, None)}


def _convert_into(fr, i0: int, i1: int, dst: np.ndarray) -> None:
    """Samples ``[i0, i1)`` of a decoded frame into float32 ``dst`` ``[C, i1 - i0]``: what swresample gives
    converting it to ``fltp`` at its own rate and layout (integer formats ``(x - offset) * scale``, exact;
    float formats cast to the nearest float32), read from the frame's planes without a resampler."""
    dtype, offset, scale = _TO_FLOAT[fr.format.name.rstrip("p")]
    c = fr.layout.nb_channels
    if fr.format.is_planar:  # one plane per channel
        for ch, plane in enumerate(fr.planes[:c]):
            src = np.frombuffer(plane, dtype, fr.samples)[i0:i1]
            dst[ch] = src.astype(np.int16) - offset if offset else src
    else:  # packed: one plane, samples interleaved
        src = np.frombuffer(fr.planes[0], dtype, fr.samples * c).reshape(fr.samples, c)[i0:i1].T
        dst[...] = src.astype(np.int16) - offset if offset else src
    if scale is not None:
        dst *= np.float32(scale)


def _run(frames: Iterator, first, win: _Window, rate: int, name: str, *, skip: int = 0) -> None:
    """Resample ``first`` and then ``frames`` (dropping the first ``skip`` input samples) into ``win``
    until it is full; flush the resampler only when the stream ends first. At the source's own rate no
    resampler runs: each frame is converted to float32 as swresample would (:func:`_convert_into`)."""
    fmt, lay, src = first.format.name, first.layout.name, first.sample_rate
    as_is = rate == src and fmt.rstrip("p") in _TO_FLOAT
    resampler = None if as_is else av.AudioResampler(format="fltp", layout=first.layout, rate=rate)

    def feed(fr) -> None:
        if (fr.format.name, fr.layout.name, fr.sample_rate) != (fmt, lay, src):
            raise ItemError("audio_decode_error",
                            f"{name}: its audio changes from {fmt} {lay} {src} Hz to {fr.format.name} "
                            f"{fr.layout.name} {fr.sample_rate} Hz mid-stream; {_DECODE_FIX}")
        if resampler is None:
            win.add_frame(fr)
            return
        fr.pts = None  # timestamps never steer the resampler: both decode paths feed the same samples
        try:
            outs = resampler.resample(fr)
        except (av.FFmpegError, ValueError) as e:
            raise _decode_error(name, e, "resampling its audio failed: ") from None
        for o in outs:
            win.add(o.to_ndarray())

    for fr in _chain(first, frames):
        if skip >= fr.samples:
            skip -= fr.samples
            continue
        if skip:
            fr, skip = _drop_head(fr, skip), 0
        feed(fr)
        if win.done:
            return
    if resampler is None:
        return
    try:
        outs = resampler.resample(None)
    except av.FFmpegError as e:
        raise _decode_error(name, e, "resampling its audio failed: ") from None
    for o in outs:
        win.add(o.to_ndarray())


def _chain(first, rest: Iterator) -> Iterator:
    yield first
    yield from rest


def _seekable(container) -> bool:
    return bool(_SEEKABLE & set(container.format.name.split(",")))


def _seek_run(container, stream, first, o_start: int, n_out: int, rate: int, name: str) -> _Window:
    """Seek close before ``o_start`` and decode from there; raises :class:`_Fallback` when the landing
    point cannot be placed exactly on the decode-from-zero timeline."""
    src = first.sample_rate
    tb = first.time_base or stream.time_base
    if first.pts is None or not tb:
        raise _Fallback
    g = math.gcd(src, rate)
    q, p = src // g, rate // g  # q input samples make p output samples
    warm = 32 * max(1, math.ceil(p / q)) + 32  # output samples the resampler's filter needs to settle
    target = math.floor((o_start / rate - _PREROLL) * src)
    if target <= 0:
        raise _Fallback
    ts = first.pts + math.floor(Fraction(target, src) / Fraction(tb))
    try:
        container.seek(ts, stream=stream, backward=True)
    except (av.FFmpegError, OSError):
        raise _Fallback from None
    frames = _frames(container, stream, name)
    head = next(frames, None)
    if head is None or head.pts is None or head.sample_rate != src:
        raise _Fallback
    pos0 = round((head.pts - first.pts) * Fraction(tb) * src)
    s0 = math.ceil((pos0 + math.ceil(_DECODER_PREROLL * src)) / q) * q  # aligned: s0 x p / q is whole
    o0 = s0 // q * p
    if pos0 <= 0 or o0 + warm > o_start:
        raise _Fallback
    win = _Window(o_start, o_start + n_out, pos=o0)
    _run(_contiguous(head, frames, pos0, first.pts, Fraction(tb), src), head, win, rate, name, skip=s0 - pos0)
    return win


def _contiguous(head, frames: Iterator, pos0: int, pts0: int, tb: Fraction, src: int) -> Iterator:
    """``frames`` (after ``head``), checking that each frame's timestamp continues the sample count;
    a gap or overlap raises :class:`_Fallback` (the seek's placement would not match a decode from 0)."""
    pos = pos0 + head.samples
    for fr in frames:
        if fr.pts is None or abs(round((fr.pts - pts0) * tb * src) - pos) > 1:
            raise _Fallback
        pos += fr.samples
        yield fr


def decode_audio(
    path: str, item_id: str, *, rate: int | None, start: float = 0.0, duration: float | None = None,
    keep_mono: bool = False,
) -> DecodedAudio:
    """Decode the first audio stream of ``path``, resample it to ``rate`` and cut
    ``[start, start + duration)`` as float32 stereo ``[2, N]``, ``N == num_samples(duration, rate)``.
    ``rate=None``: the stream's own rate (its first decoded frame's), so no resampling: the samples are
    the decoder's, converted to float32 (what LTX-2 cuts before its encoder resamples).

    - Resampling: PyAV's :class:`av.AudioResampler` (FFmpeg's swresample, format ``fltp``, the
      source layout kept), flushed at the end of the stream; the first output sample is the first
      input sample (no delay), so 48 kHz -> 16 kHz gives exactly a third of the samples.
    - The cut is in output samples: it begins at output sample ``floor(start x rate + 0.5)``
      (``start`` rounded to the nearest sample, halves up) and holds ``num_samples(duration, rate)``
      samples. ``duration=None``: to the end of the stream as probed (``probe.duration - start``).
    - A source that ends early is zero-padded at the end; :attr:`DecodedAudio.padded` says how many
      seconds (the caller reports it, as LTX warns).
    - Channels: :func:`to_stereo` on the decoded layout; with ``keep_mono`` a one-channel stream stays
      ``[1, N]`` (the audio encoder duplicates it on its device, as LTX-2 does: half the bytes to carry).
    - A ``start`` beyond :data:`SEEK_AFTER` seconds in a container with sample-exact timestamps
      (MP4/MOV, Matroska/WebM, WAV, FLAC, Ogg) seeks a little before it, discards the decoder's
      first samples and starts the resampler on a sample where the input and output grids meet, so
      the result equals a decode from 0 then cut; when the landing point is not exact (no
      timestamps, a timestamp gap) it decodes from the beginning instead. (Corrupt packets before
      the seek point then go unseen: only what is decoded can fail.)

    Raises :class:`ItemError`: ``audio_decode_error`` for any FFmpeg error while decoding (the detail
    names the item, FFmpeg's message and the fix), plus the errors of :func:`probe_audio`. Refuses
    (``ValueError``) ``rate < 1``, a negative ``start`` and a negative ``duration``.
    """
    path = os.fspath(path)
    if rate is not None and (int(rate) != rate or rate < 1):
        raise ValueError(f"rate must be a positive whole number of Hz, got {rate!r}")
    _start_sample(start, 1)  # (refuses a negative start before any file is opened)
    container = _open(path, item_id)
    try:
        stream = _audio_stream(container, path, item_id)
        probe = _probe_open(container, stream, path, item_id)
        if duration is None:
            duration = max(0.0, probe.duration - start)
        frames = _frames(container, stream, item_id)
        first = next(frames, None)
        if first is None:
            raise ItemError("audio_decode_error",
                            f"{item_id}: its {probe.codec} audio stream holds no decodable sample; {_DECODE_FIX}")
        if rate is None:
            rate = int(first.sample_rate)
        o_start, n_out = _start_sample(start, rate), num_samples(duration, rate)
        win = None
        if start > SEEK_AFTER and n_out > 0 and _seekable(container):
            try:
                win = _seek_run(container, stream, first, o_start, n_out, rate, item_id)
            except _Fallback:
                container.close()
                container = _open(path, item_id)
                stream = _audio_stream(container, path, item_id)
                frames = _frames(container, stream, item_id)
                first = next(frames, None)
                if first is None:
                    raise ItemError("audio_decode_error", f"{item_id}: its audio stream holds no decodable sample "
                                    f"on a second read; {_DECODE_FIX}") from None
        if win is None:
            win = _Window(o_start, o_start + n_out)
            if n_out > 0:
                _run(frames, first, win, rate, item_id)
        layout, channels = first.layout.name, first.layout.nb_channels
    finally:
        container.close()
    got = win.result(channels)  # zeros after the last sample written: a source that ended early, padded
    short = n_out - win.filled
    if (layout, channels) != (probe.layout, probe.channels):
        probe = replace(probe, layout=layout, channels=channels)
    kept = channels == 2 or (keep_mono and channels == 1)  # (the window's own array: no copy)
    wave = np.ascontiguousarray(got if kept else to_stereo(got, layout), dtype=np.float32)
    return DecodedAudio(wave=wave, rate=int(rate), probe=probe, padded=max(0, short) / rate)


def check_decoded(dec: DecodedAudio, who: str, duration: float) -> DecodedAudio:
    """``dec`` (a window of ``duration`` seconds; ``who`` names the item and its audio file) when it is fit to
    encode, else the item's :class:`ItemError`: ``audio_rate_too_low`` for a source below
    :data:`MIN_AUDIO_RATE` Hz or a window that holds no sample, ``audio_not_finite`` for NaN or infinite
    samples (a float WAV can hold them: the encoder would write latents of NaN). Cheap: one pass over the cut
    samples, in the decode worker."""
    src = int(dec.probe.rate)
    if src < MIN_AUDIO_RATE or (duration > 0 and dec.wave.shape[-1] == 0):
        raise ItemError("audio_rate_too_low",
                        f"{who} is sampled at {src} Hz, below the {MIN_AUDIO_RATE} Hz shardsmith takes (its "
                        f"{duration:.3f} s window holds {int(dec.wave.shape[-1])} sample(s)); resample the file "
                        "(e.g. ffmpeg -i in -ar 16000 out.wav) or remove it")
    finite = np.isfinite(dec.wave)
    if not finite.all():
        raise ItemError("audio_not_finite",
                        f"{who} holds {int(finite.size - np.count_nonzero(finite))} NaN or infinite audio "
                        "sample(s) in the window cut (a float WAV can); fix the file (e.g. numpy.nan_to_num its "
                        "samples and write it again) or remove it")
    return dec


def pcm16(wave: np.ndarray) -> np.ndarray:
    """float ``[C, N]`` in [-1, 1] (clipped) -> int16 ``[C, N]``: ``round(x * 32767)``."""
    return np.round(np.clip(np.asarray(wave, dtype=np.float64), -1.0, 1.0) * 32767.0).astype(np.int16)


def wav_bytes(wave: np.ndarray, rate: int) -> bytes:
    """A waveform (``[channels, N]`` or ``[N]``, floats in [-1, 1]; values outside are clipped) as the bytes
    of a 16-bit PCM WAV file at ``rate`` Hz (:func:`pcm16`, channels interleaved; stdlib ``wave``).
    Refuses another shape or non-finite samples (``ValueError``)."""
    a = np.asarray(wave, dtype=np.float64)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2 or a.shape[0] < 1:
        raise ValueError(f"expected a waveform [channels, N] or [N], got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("waveform has non-finite samples")
    pcm = pcm16(a).astype("<i2").T  # [N, channels]
    buf = io.BytesIO()
    with _wave.open(buf, "wb") as w:
        w.setnchannels(a.shape[0])
        w.setsampwidth(2)
        w.setframerate(int(rate))
        w.writeframes(np.ascontiguousarray(pcm).tobytes())
    return buf.getvalue()
