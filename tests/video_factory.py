"""Deterministic generators of *real* test videos for shardsmith's video tests.

Every video pans across a real photograph from scikit-image's offline sample data
(``astronaut``, ``chelsea``, ``coffee`` ...), the way the LTX trainer's own test clip
pans across the astronaut. Files are small (<= 256x256, <= 3 s) and written with PyAV's
bundled FFmpeg (libx264 / mpeg4 video, AAC audio). Frame content is a pure function of
the arguments; the encoded bytes are deterministic for a given PyAV build (x264 runs
single-threaded and without macroblock-tree rate control for that reason).

Nasty files:

- :func:`vfr_video` - irregular frame timestamps (pts set by hand on a 1/1000 time base).
- :func:`truncated_video` - the first half of a good file's bytes.
- :func:`lying_metadata_video` - a file whose container still claims N frames but whose
  media data only holds the first part (the ``mdat`` tail is cut, the ``moov`` index
  written first with ``+faststart`` is kept intact).
- :func:`text_as_mp4` - a text file with a ``.mp4`` name.

Audio: ``audio="tone"`` synthesises a deterministic two-partial tone; ``audio="speech"``
uses ``espeak-ng -w`` when that binary exists and otherwise falls back to a
*speech-like* synthetic signal (a 140 Hz glottal buzz through moving vowel formants,
gated into syllables). :data:`SPEECH_IS_REAL` says which one you got. ``audio_layout``
(``"mono"``, ``"stereo"``, ``"5.1"``) picks the track's channels (:func:`channel_signals`).

Audio files: :func:`audio_file` writes ``.wav`` (PCM s16), ``.flac``, ``.mp3``, ``.m4a`` (AAC)
or ``.ogg`` (Vorbis; Opus when not stereo) of :func:`audio_signal`, with whichever encoder the bundled FFmpeg has
(:func:`audio_encoder` is None for a suffix it cannot write). :func:`broken_audio_video` is a
video whose AAC stream probes fine but whose packets are garbage past the first few.

This is a plain module (no pytest fixtures).
"""

from __future__ import annotations

import fractions
import os
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import av
import numpy as np

__all__ = [
    "PHOTOS",
    "SPEECH_IS_REAL",
    "pan_frames",
    "pan_video",
    "vfr_video",
    "truncated_video",
    "lying_metadata_video",
    "text_as_mp4",
    "raw_h264_video",
    "audio_only_file",
    "speech_wave",
    "channel_signals",
    "audio_signal",
    "audio_encoder",
    "audio_file",
    "broken_audio_video",
    "AUDIO_SUFFIXES",
]

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "camera")

#: True when ``audio="speech"`` is real synthesised speech (espeak-ng present).
SPEECH_IS_REAL: bool = shutil.which("espeak-ng") is not None

_PHOTO_CACHE: dict[str, np.ndarray] = {}


def _photo(name: str) -> np.ndarray:
    """The skimage sample photo ``name`` as uint8 RGB [H, W, 3]."""
    if name not in _PHOTO_CACHE:
        from skimage import data

        if name not in PHOTOS:
            raise KeyError(f"unknown photo {name!r}; choose from {PHOTOS}")
        im = np.asarray(getattr(data, name)())
        if im.ndim == 2:
            im = np.repeat(im[:, :, None], 3, axis=2)
        _PHOTO_CACHE[name] = np.ascontiguousarray(im[:, :, :3].astype(np.uint8))
    return _PHOTO_CACHE[name]


def pan_frames(frames: int, size: tuple[int, int] = (256, 256), photo: str = "astronaut") -> np.ndarray:
    """The raw RGB frames a pan video encodes: uint8 [F, H, W, 3], ``size`` is (W, H).

    A window with the output's aspect ratio, 3/4 of the photo's limiting side, slides
    diagonally from the top-left to the bottom-right corner of the photo (one step per
    frame); each window is resized to ``size`` with PIL bicubic (big photos are first
    box-reduced by an integer factor).
    """
    from PIL import Image

    w, h = size
    img = Image.fromarray(_photo(photo))
    # box-reduce big photos first (keeps >= 1.5x oversampling): much faster, same look
    factor = int(0.75 * min(img.width / w, img.height / h) / 1.5)
    if factor >= 2:
        img = img.reduce(factor)
    sw, sh = img.size
    scale = 0.75 * min(sw / w, sh / h)
    cw, ch = int(w * scale), int(h * scale)
    out = np.empty((frames, h, w, 3), np.uint8)
    for i in range(frames):
        t = i / max(1, frames - 1)
        x0 = round(t * (sw - cw))
        y0 = round(t * (sh - ch))
        out[i] = np.asarray(img.resize((w, h), Image.BICUBIC, box=(x0, y0, x0 + cw, y0 + ch)))
    return out


def _tone(duration: float, rate: int) -> np.ndarray:
    t = np.arange(int(round(duration * rate))) / rate
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 660 * t)
    return x.astype(np.float32)


def _speech_like(duration: float, rate: int) -> np.ndarray:
    """A deterministic vowel-ish signal: buzz source, two moving formants, syllable gate."""
    n = int(round(duration * rate))
    t = np.arange(n) / rate
    f0 = 140 + 20 * np.sin(2 * np.pi * 1.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    src = sum(np.sin(k * phase) / k for k in range(1, 30))
    out = np.zeros(n)
    for f_lo, f_hi, bw in ((500, 800, 80), (1200, 2200, 120)):
        fc = f_lo + (f_hi - f_lo) * (0.5 + 0.5 * np.sin(2 * np.pi * 2.1 * t))
        # crude time-varying resonator (2-pole), deterministic
        y1 = y2 = 0.0
        r = np.exp(-np.pi * bw / rate)
        c2 = -r * r
        y = np.empty(n)
        c1s = 2 * r * np.cos(2 * np.pi * fc / rate)
        for i in range(n):
            v = src[i] + c1s[i] * y1 + c2 * y2
            y[i] = v
            y2, y1 = y1, v
        out += y
    gate = 0.5 - 0.5 * np.cos(2 * np.pi * 4.0 * t)  # ~4 syllables / s
    out *= gate
    out /= np.max(np.abs(out)) + 1e-9
    return (0.5 * out).astype(np.float32)


def speech_wave(duration: float, rate: int = 16000, text: str = "shardsmith makes every failure loud") -> np.ndarray:
    """Mono float32 speech of ``duration`` seconds at ``rate`` Hz (padded / cut to length).

    Real speech via ``espeak-ng -w`` if the binary exists, else :func:`_speech_like`.
    """
    n = int(round(duration * rate))
    exe = shutil.which("espeak-ng")
    if exe is None:
        return _speech_like(duration, rate)
    with tempfile.TemporaryDirectory() as td:
        wav = os.path.join(td, "s.wav")
        subprocess.run([exe, "-w", wav, text], check=True, capture_output=True)
        with wave.open(wav) as wf:
            sr, raw = wf.getframerate(), wf.readframes(wf.getnframes())
    x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    if sr != rate:
        x = np.interp(np.arange(int(len(x) * rate / sr)) * sr / rate, np.arange(len(x)), x).astype(np.float32)
    out = np.zeros(n, np.float32)
    out[: min(n, len(x))] = x[:n]
    return out


def _encode_audio(container, stream, samples: np.ndarray, rate: int) -> None:
    """Encode mono float32 ``samples`` as stereo fltp into ``stream`` (AAC): left = samples, right = 0.8 x."""
    _encode_channels(container, stream, np.stack([samples, samples * 0.8]).astype(np.float32), rate, "stereo")


def channel_signals(mono: np.ndarray, layout: str, rate: int) -> np.ndarray:
    """float32 ``[C, N]`` for FFmpeg layout ``layout`` built from one mono signal: channel ``k`` (in
    the layout's order) is ``mono x (1 - 0.15 k)`` plus a quiet sine of ``300 + 150 k`` Hz (amplitude
    0.05), so every channel is distinct and identifiable. Mono is ``mono`` itself."""
    c = av.AudioLayout(layout).nb_channels
    if c == 1:
        return mono[None].astype(np.float32)
    t = np.arange(mono.shape[0]) / rate
    rows = [mono * max(0.1, 1.0 - 0.15 * k) + 0.05 * np.sin(2 * np.pi * (300 + 150 * k) * t) for k in range(c)]
    return np.stack(rows).astype(np.float32)


def audio_signal(kind: str = "speech", duration: float = 2.0, rate: int = 16000, layout: str = "stereo") -> np.ndarray:
    """The float32 ``[C, N]`` samples :func:`audio_file` encodes (``N = round(duration x rate)``):
    :func:`channel_signals` of ``kind`` = ``"speech"`` (:func:`speech_wave`) or ``"tone"``."""
    if kind == "speech":
        mono = speech_wave(duration, rate)
    elif kind == "tone":
        mono = _tone(duration, rate)
    else:
        raise ValueError(f"kind must be 'speech' or 'tone', not {kind!r}")
    return channel_signals(mono, layout, rate)


def _encode_channels(container, stream, x: np.ndarray, rate: int, layout: str) -> None:
    """Encode float32 ``[C, N]`` as fltp frames of 1024 samples (PyAV converts to the codec's format
    and frame size) into ``stream``, then flush it."""
    chunk = 1024
    for i in range(0, x.shape[1], chunk):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, i : i + chunk]), format="fltp", layout=layout)
        frame.sample_rate = rate
        frame.pts = i
        frame.time_base = fractions.Fraction(1, rate)
        for p in stream.encode(frame):
            container.mux(p)
    for p in stream.encode(None):
        container.mux(p)


def _open_video_stream(container, codec: str, fps, size, *, time_base=None):
    w, h = size
    stream = container.add_stream(codec, rate=fps)
    stream.width, stream.height = w, h
    stream.pix_fmt = "yuv420p"
    if codec == "libx264":
        # single thread + fixed params: deterministic bytes, small files
        # mbtree=0: with x264's macroblock-tree rate control this build's output varies from run to
        # run for some clips (e.g. 96x64, 24 frames: several different byte strings out of 25 runs)
        stream.options = {"crf": "23", "preset": "veryfast", "threads": "1", "x264-params": "mbtree=0"}
        stream.codec_context.thread_count = 1
    if time_base is not None:
        stream.time_base = time_base
    return stream


def _write_frames(container, stream, pix) -> None:
    """Encode uint8 RGB frames with pts 0, 1, 2 ... and flush the encoder."""
    for i, frame in enumerate(pix):
        f = av.VideoFrame.from_ndarray(frame, format="rgb24")
        f.pts = i
        for p in stream.encode(f):
            container.mux(p)
    for p in stream.encode(None):
        container.mux(p)


def pan_video(
    path: str | os.PathLike,
    frames: int = 49,
    fps: int = 24,
    size: tuple[int, int] = (256, 256),
    photo: str = "astronaut",
    audio: str | None = None,
    codec: str = "libx264",
    audio_rate: int = 16000,
    faststart: bool = False,
    rotation: int | None = None,
    audio_layout: str = "stereo",
) -> Path:
    """Write a video panning across ``photo``: ``frames`` frames at ``fps`` (constant rate).

    The container follows the suffix: ``.mkv`` -> Matroska (which stores no frame
    count), ``.mov`` -> QuickTime, anything else -> MP4.

    ``audio``: None, ``"tone"`` or ``"speech"`` (see module doc) as an AAC track of exactly the
    clip's duration, ``audio_layout`` ``"stereo"`` (left = the signal, right = 0.8 x it; the
    default), ``"mono"`` (the signal) or ``"5.1"`` (:func:`channel_signals`). ``faststart``
    writes the ``moov`` index before the media data. ``rotation`` stores a display matrix
    (counter-clockwise degrees, PyAV's convention). Returns the path.
    """
    path = Path(path)
    if max(size) > 256 or frames / fps > 3.0 + 1e-9:
        raise ValueError("test videos stay small: <= 256x256 and <= 3 s")
    pix = pan_frames(frames, size, photo)
    opts = {"movflags": "+faststart"} if faststart else {}
    fmt = {".mkv": "matroska", ".mov": "mov"}.get(path.suffix.lower(), "mp4")
    with av.open(str(path), "w", format=fmt, options=opts) as c:
        vs = _open_video_stream(c, codec, fps, size)
        if rotation is not None:
            vs.set_display_rotation(rotation)
        as_ = None
        if audio is not None:
            if audio not in ("tone", "speech"):
                raise ValueError(f"audio must be None, 'tone' or 'speech', not {audio!r}")
            if audio_layout not in ("mono", "stereo", "5.1"):
                raise ValueError(f"audio_layout must be 'mono', 'stereo' or '5.1', not {audio_layout!r}")
            as_ = c.add_stream("aac", rate=audio_rate, layout=audio_layout)
        _write_frames(c, vs, pix[:frames])
        if as_ is not None:
            dur = frames / fps
            wav = _tone(dur, audio_rate) if audio == "tone" else speech_wave(dur, audio_rate)
            if audio_layout == "stereo":
                _encode_audio(c, as_, wav, audio_rate)
            else:
                _encode_channels(c, as_, channel_signals(wav, audio_layout, audio_rate), audio_rate, audio_layout)
    return path


def vfr_video(
    path: str | os.PathLike,
    frames: int = 40,
    size: tuple[int, int] = (128, 128),
    photo: str = "chelsea",
    codec: str = "libx264",
) -> tuple[Path, list[int]]:
    """Write a variable-frame-rate mp4; returns (path, pts in milliseconds).

    Frame intervals cycle through 33, 50, 17 and 100 ms (so ~20 fps on average, with
    gaps a constant-rate reader would get wrong). Time base 1/1000.
    """
    path = Path(path)
    pix = pan_frames(frames, size, photo)
    steps = [33, 50, 17, 100]
    pts, t = [], 0
    for i in range(frames):
        pts.append(t)
        t += steps[i % len(steps)]
    if t / 1000 > 3.0:
        raise ValueError("test videos stay <= 3 s")
    with av.open(str(path), "w", format="mp4") as c:
        vs = _open_video_stream(c, codec, 30, size, time_base=fractions.Fraction(1, 1000))
        vs.codec_context.time_base = fractions.Fraction(1, 1000)
        for i in range(frames):
            f = av.VideoFrame.from_ndarray(pix[i], format="rgb24")
            f.pts = pts[i]
            f.time_base = fractions.Fraction(1, 1000)
            for p in vs.encode(f):
                c.mux(p)
        for p in vs.encode(None):
            c.mux(p)
    return path, pts


def truncated_video(src: str | os.PathLike, dst: str | os.PathLike, fraction: float = 0.5) -> Path:
    """Copy the first ``fraction`` of ``src``'s bytes to ``dst`` (a download cut short)."""
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[: int(len(data) * fraction)])
    return Path(dst)


def lying_metadata_video(
    path: str | os.PathLike,
    frames: int = 49,
    keep: float = 0.5,
    **kw,
) -> Path:
    """An mp4 whose container says ``frames`` frames but whose data holds fewer.

    Written with ``+faststart`` (index first), then the tail of the file is cut so only
    ``keep`` of the media bytes remain: ``stream.frames`` and the duration still claim
    the full clip, decoding yields fewer frames (what diffusion-pipe#542 crashed on).
    """
    path = Path(path)
    pan_video(path, frames=frames, faststart=True, **kw)
    data = path.read_bytes()
    mdat = data.find(b"mdat")
    if mdat < 4:
        raise RuntimeError("faststart mp4 without an mdat box")
    start = mdat + 4
    cut = start + int((len(data) - start) * keep)
    path.write_bytes(data[:cut])
    return path


def text_as_mp4(path: str | os.PathLike) -> Path:
    """A plain text file named ``*.mp4``."""
    path = Path(path)
    path.write_text("this is not a video, it is a caption file with the wrong name\n" * 4)
    return path


def audio_only_file(path: str | os.PathLike, duration: float = 1.0, rate: int = 16000) -> Path:
    """An .m4a (mp4 container) with one AAC audio stream and no video stream."""
    path = Path(path)
    with av.open(str(path), "w", format="mp4") as c:
        s = c.add_stream("aac", rate=rate, layout="stereo")
        _encode_audio(c, s, _tone(duration, rate), rate)
    return path


#: the audio file suffixes :func:`audio_file` writes: suffix -> (muxer, encoders to try in order)
AUDIO_SUFFIXES: dict[str, tuple[str, tuple[str, ...]]] = {
    ".wav": ("wav", ("pcm_s16le",)),
    ".flac": ("flac", ("flac",)),
    ".mp3": ("mp3", ("libmp3lame", "mp3")),
    ".m4a": ("ipod", ("aac",)),
    ".ogg": ("ogg", ("libvorbis", "vorbis", "libopus")),
}


def audio_encoder(suffix: str, channels: int = 2) -> str | None:
    """The encoder :func:`audio_file` uses for ``suffix`` and ``channels`` in this PyAV build, None if
    it has none (FFmpeg's own Vorbis encoder writes stereo only: other ``.ogg`` files are Opus)."""
    _, names = AUDIO_SUFFIXES[suffix.lower()]
    for n in names:
        if n == "vorbis" and channels != 2:
            continue
        try:
            av.Codec(n, "w")
        except Exception:  # noqa: BLE001 - av raises a private error type for unknown codecs
            continue
        return n
    return None


def audio_file(
    path: str | os.PathLike,
    kind: str = "speech",
    duration: float = 2.0,
    rate: int = 16000,
    layout: str = "stereo",
) -> Path:
    """Write :func:`audio_signal` (``kind``, ``duration``, ``rate``, ``layout``) as an audio file whose
    format follows the suffix (:data:`AUDIO_SUFFIXES`). ``.mp3`` holds at most 2 channels; Opus
    (``.ogg`` that is not stereo, or when no Vorbis encoder exists) needs 8/12/16/24/48 kHz.
    Raises ``ValueError`` for an unknown suffix and ``RuntimeError`` when FFmpeg has no encoder for it. Deterministic bytes."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in AUDIO_SUFFIXES:
        raise ValueError(f"suffix must be one of {sorted(AUDIO_SUFFIXES)}, not {suffix!r}")
    fmt = AUDIO_SUFFIXES[suffix][0]
    channels = av.AudioLayout(layout).nb_channels
    codec = audio_encoder(suffix, channels)
    if codec is None:
        raise RuntimeError(f"PyAV's FFmpeg has no encoder for {channels}-channel {suffix} "
                           f"(tried {AUDIO_SUFFIXES[suffix][1]})")
    if suffix == ".mp3" and channels > 2:
        raise ValueError("mp3 holds at most 2 channels")
    if codec == "libopus" and rate not in (8000, 12000, 16000, 24000, 48000):
        raise ValueError(f"Opus (.ogg with {channels} channels) needs 8, 12, 16, 24 or 48 kHz, not {rate} Hz")
    x = audio_signal(kind, duration, rate, layout)
    opts = {"strict": "experimental"} if codec == "vorbis" else {}
    # no encoder tag and no creation time in the headers: the bytes depend on the arguments only
    with av.open(str(path), "w", format=fmt, options={"fflags": "+bitexact"}) as c:
        s = c.add_stream(codec, rate=rate, layout=layout, options=opts)
        _encode_channels(c, s, x, rate, layout)
    return path


def broken_audio_video(
    path: str | os.PathLike,
    frames: int = 48,
    fps: int = 24,
    size: tuple[int, int] = (64, 64),
    good_packets: int = 3,
    audio_rate: int = 48000,
) -> Path:
    """An mp4 whose AAC audio stream probes fine (codec, layout, rate and duration in its headers) but
    whose packets after the first ``good_packets`` are random bytes (seeded, so the file is the same
    every call): FFmpeg's AAC decoder refuses them (``Invalid data found when processing input``).
    The video stream is intact."""
    path = Path(path)
    with tempfile.TemporaryDirectory() as td:
        good = pan_video(Path(td) / "good.mp4", frames=frames, fps=fps, size=size, audio="speech",
                         audio_rate=audio_rate)
        rng = np.random.default_rng(1234)
        with av.open(str(good)) as ic, av.open(str(path), "w", format="mp4") as oc:
            vi, ai = ic.streams.video[0], ic.streams.audio[0]
            vo, ao = oc.add_stream_from_template(vi), oc.add_stream_from_template(ai)
            n = 0
            for p in ic.demux():
                if p.size == 0:
                    continue
                if p.stream is ai:
                    if n >= good_packets:
                        g = av.Packet(rng.integers(0, 256, p.size, dtype=np.uint8).tobytes())
                        g.pts, g.dts, g.time_base, g.duration = p.pts, p.dts, p.time_base, p.duration
                        p = g
                    n += 1
                    p.stream = ao
                else:
                    p.stream = vo
                oc.mux(p)
    return path


def raw_h264_video(path: str | os.PathLike, frames: int = 20, fps: int = 24, size=(64, 64), photo="coffee") -> Path:
    """A raw H.264 elementary stream (``.h264``): no container, no frame count, no duration."""
    path = Path(path)
    pix = pan_frames(frames, size, photo)
    with av.open(str(path), "w", format="h264") as c:
        vs = _open_video_stream(c, "libx264", fps, size)
        _write_frames(c, vs, pix[:frames])
    return path


def captioned_clips_table(root: Path, photos: int = 2) -> tuple[Path, list[dict]]:
    """A JSONL table under ``root`` of three real clips (20, 5 and 12 frames: the middle one too
    short for a 9-frame bucket) and ``photos`` real photos, every row captioned; returns
    (table path, rows)."""
    from media_factory import real_photos, write_table

    (root / "media").mkdir(parents=True, exist_ok=True)
    pan_video(root / "media" / "pan_long.mp4", frames=20, fps=24, size=(96, 64))
    pan_video(root / "media" / "pan_short.mp4", frames=5, fps=24, size=(64, 64), photo="chelsea")
    pan_video(root / "media" / "pan_mid.mp4", frames=12, fps=24, size=(64, 64), photo="coffee")
    shots = real_photos(root / "media", photos, seed=5, min_side=70, max_side=100)
    rows = [{"media": "media/pan_long.mp4", "caption": "a slow pan across an astronaut"},
            {"media": "media/pan_short.mp4", "caption": "a cat, far too short"},
            {"media": "media/pan_mid.mp4", "caption": "a cup of coffee seen from above"},
            *({"media": f"media/{p.name}", "caption": f"still photo {p.stem}"} for p in shots)]
    return write_table(root, rows, "jsonl"), rows
