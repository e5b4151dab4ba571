"""``video_wds`` with ``audio: wav | flac``: each clip's audio as a member, cut to the written frames at
the source's own rate (read back with the stdlib ``wave`` and PyAV), no member for a silent clip,
``failed:audio_decode_error`` for a broken stream, and the same bytes from two builds."""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path

import av
import numpy as np
import pytest
import webdataset as wds

from shardsmith.build import build
from shardsmith.encode.audio_vae import wav_bytes
from shardsmith.formats.wds import FLAC, WAV
from shardsmith.plan.ledger import Ledger
from shardsmith import formats
from shardsmith.recipe import recipe_from_dict
from shardsmith.transform.audio import decode_audio, num_samples
from shardsmith.transform.audio import pcm16
from shardsmith.transform.video_samples import flac_bytes
from video_factory import broken_audio_video, pan_video

FPS = 24
BUCKET = "128x128x17"  # 17 frames at 24 fps: 0.708 s of audio per sample (128 px: x264 is reproducible)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """``stereo``: 20 frames at 24 fps, AAC stereo speech at 16 kHz (right = 0.8 x left), re-encoded;
    ``fast``: 40 frames at 48 fps (every other frame kept), mono speech at 22.05 kHz; ``exact``: already
    the bucket (passed through, its AAC track kept in the mp4), a tone at 44.1 kHz; ``silent``: no
    audio; ``broken``: an AAC stream whose packets do not decode."""
    root = tmp_path_factory.mktemp("vwa_src")
    pan_video(root / "stereo.mp4", frames=20, fps=FPS, size=(128, 128), photo="astronaut", audio="speech")
    pan_video(root / "fast.mp4", frames=40, fps=48, size=(128, 128), photo="coffee", audio="speech",
              audio_rate=22050, audio_layout="mono")
    pan_video(root / "exact.mp4", frames=17, fps=FPS, size=(128, 128), photo="rocket", audio="tone",
              audio_rate=44100)
    pan_video(root / "silent.mp4", frames=20, fps=FPS, size=(128, 128), photo="chelsea")
    broken_audio_video(root / "broken.mp4", frames=20, fps=FPS, size=(128, 128))
    for p in root.glob("*.mp4"):
        p.with_suffix(".txt").write_text(f"the {p.stem} clip", encoding="utf-8")
    return root


def _recipe(src: Path) -> dict:
    return {"sources": [{"path": str(src)}], "geometry": {"buckets": [BUCKET], "fps": FPS},
            "outputs": [{"format": "video_wds", "dir": "w", "audio": "wav"},
                        {"format": "video_wds", "name": "f", "dir": "f", "audio": "flac"}]}


@pytest.fixture(scope="module")
def built(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("vwa") / "out"
    return out, build(recipe_from_dict(_recipe(src)), out, quiet=True, workers=2)


def _read(folder: Path) -> dict[str, dict]:
    """Every sample of ``folder`` as the ``webdataset`` package reads it, by its source path."""
    shards = sorted(str(p) for p in folder.glob("*.tar"))
    return {json.loads(s["json"])["path"]: s for s in wds.WebDataset(shards, shardshuffle=False)}


def _wav(data: bytes) -> tuple[int, int, int, np.ndarray]:
    """(channels, rate, sample width, int16 [C, N]) of a WAV file's bytes (stdlib ``wave``)."""
    with wave.open(io.BytesIO(data)) as w:
        ch, rate, width, n = w.getnchannels(), w.getframerate(), w.getsampwidth(), w.getnframes()
        pcm = np.frombuffer(w.readframes(n), dtype="<i2").reshape(n, ch).T
    return ch, rate, width, pcm


def _flac(data: bytes) -> tuple[str, int, np.ndarray]:
    """(codec, rate, int16 [2, N]) of a FLAC file's bytes, decoded by PyAV."""
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.audio[0]
        arr = np.concatenate([f.to_ndarray() for f in c.decode(s)], axis=1)  # packed s16: [1, 2N]
        return s.codec_context.name, s.rate, arr.reshape(-1, 2).T


# (source rate, duration) of each clip with audio: the 17 written frames at 24 fps, from frame 0
EXPECTED = {"stereo.mp4": 16000, "fast.mp4": 22050, "exact.mp4": 44100}


def test_wav_members_hold_the_written_frames_audio_at_the_source_rate(built, src):
    out, m = built
    samples = _read(out / "w")
    assert sorted(samples) == ["exact.mp4", "fast.mp4", "silent.mp4", "stereo.mp4"]
    for path, rate in EXPECTED.items():
        s = samples[path]
        assert set(k for k in s if not k.startswith("__")) == {"mp4", "txt", "json", WAV}, path
        meta = json.loads(s["json"])
        ch, got_rate, width, pcm = _wav(s[WAV])
        n = num_samples(17 / FPS, rate)
        assert (ch, got_rate, width, pcm.shape) == (2, rate, 2, (2, n)), path
        assert meta["audio"] == "wav" and meta["frames"] == 17 and meta["fps"] == FPS
        assert meta["audio_window"] == {"start": 0.0, "duration": 17 / FPS, "rate": rate, "samples": n,
                                        "source_channels": 1 if path == "fast.mp4" else 2,
                                        "layout": "mono" if path == "fast.mp4" else "stereo", "padded": 0.0}
        # exactly the audio decode of that window, quantised to 16 bits
        dec = decode_audio(str(src / path), path, rate=rate, start=0.0, duration=17 / FPS)
        assert s[WAV] == wav_bytes(dec.wave, rate)
        assert np.abs(pcm).max() > 1000, path  # real sound, not silence
    # 48 fps: every other frame kept, audio still 17/24 s; mono duplicated to both channels
    fast = _wav(samples["fast.mp4"][WAV])[3]
    assert json.loads(samples["fast.mp4"]["json"])["frame_indices"] == list(range(0, 34, 2))
    assert np.array_equal(fast[0], fast[1])
    # the stereo source's right channel is 0.8 x its left (AAC is lossy: close, not equal)
    left, right = _wav(samples["stereo.mp4"][WAV])[3].astype(np.float64)
    assert abs(np.dot(left, right) / np.dot(left, left) - 0.8) < 0.02
    # the passthrough clip keeps its track in the mp4 and also gets the wav
    exact = json.loads(samples["exact.mp4"]["json"])
    assert exact["passthrough"] is True and samples["exact.mp4"]["mp4"] == (src / "exact.mp4").read_bytes()


def test_flac_members_decode_to_the_wav_members_samples(built):
    out, _ = built
    wavs, flacs = _read(out / "w"), _read(out / "f")
    for path, rate in EXPECTED.items():
        s = flacs[path]
        assert set(k for k in s if not k.startswith("__")) == {"mp4", "txt", "json", FLAC}, path
        codec, got_rate, pcm = _flac(s[FLAC])
        assert codec == "flac" and got_rate == rate and pcm.shape == (2, num_samples(17 / FPS, rate))
        assert np.array_equal(pcm, _wav(wavs[path][WAV])[3]), path  # lossless: the same 16-bit samples
        assert json.loads(s["json"])["audio"] == "flac"
        assert b"Lavf" not in s[FLAC] and b"Lavc" not in s[FLAC]  # bit-exact: no version strings


def test_a_silent_clip_gets_no_audio_member_and_a_broken_one_fails(built):
    out, m = built
    for d, name in (("w", "video_wds"), ("f", "f")):
        silent = _read(out / d)["silent.mp4"]
        assert set(k for k in silent if not k.startswith("__")) == {"mp4", "txt", "json"}
        meta = json.loads(silent["json"])
        assert meta["audio"] == "none" and "audio_window" not in meta
        c = m["outputs"][name]["counts"]
        assert c["written"] == 4 and c["failed"] == {"audio_decode_error": 1} and c["skipped"] == {}
    led = Ledger(out / formats.LEDGER_FILE)
    try:
        [(_item, status, detail)] = led.result_details("video_wds", "train", "failed:%")
    finally:
        led.close()
    assert status == "failed:audio_decode_error"
    assert "broken.mp4" in detail and "Invalid data found when processing input" in detail


def test_two_builds_give_the_same_bytes(built, src, tmp_path):
    out, _ = built
    build(recipe_from_dict(_recipe(src)), tmp_path / "out", quiet=True, workers=1)
    for d in ("w", "f"):
        names = sorted(p.name for p in (out / d).iterdir())
        assert names == sorted(p.name for p in (tmp_path / "out" / d).iterdir()) and "00000.tar" in names
        for name in names:
            assert (out / d / name).read_bytes() == (tmp_path / "out" / d / name).read_bytes(), (d, name)


def test_flac_bytes_are_lossless_and_deterministic():
    t = np.arange(4000) / 8000
    w = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 1.5 * np.sin(2 * np.pi * 220 * t)]).astype(np.float32)
    a, b = flac_bytes(w, 8000), flac_bytes(w, 8000)
    assert a == b and a[:4] == b"fLaC"
    codec, rate, pcm = _flac(a)
    assert (codec, rate) == ("flac", 8000) and np.array_equal(pcm, pcm16(w))
    assert pcm[1].max() == 32767 and pcm[1].min() == -32767  # clipped to [-1, 1] before quantising
    with pytest.raises(ValueError, match=r"stereo waveform \[2, N\]"):
        flac_bytes(w[:1], 8000)


def test_audio_defaults_to_none_and_refuses_other_values(tmp_path):
    base = {"sources": [{"path": str(tmp_path)}], "geometry": {"buckets": [BUCKET]}}
    r = recipe_from_dict({**base, "outputs": [{"format": "video_wds"}]})
    assert r.outputs[0].audio == "none"
    with pytest.raises(Exception, match="audio"):
        recipe_from_dict({**base, "outputs": [{"format": "video_wds", "audio": "mp3"}]})


def _nan_audio_mov(path: Path, frames: int = 20) -> Path:
    """A clip whose float (pcm_f32le) track holds NaN samples from its first 0.2 s on."""
    with av.open(str(path), "w", format="mov") as c:
        v = c.add_stream("mpeg4", rate=FPS)
        v.width = v.height = 128
        v.pix_fmt = "yuv420p"
        a = c.add_stream("pcm_f32le", rate=16000)
        a.layout = "mono"
        for i in range(frames):
            for p in v.encode(av.VideoFrame.from_ndarray(np.full((128, 128, 3), 10 * i, np.uint8), format="rgb24")):
                c.mux(p)
        samples = np.sin(np.arange(16000 * frames // FPS) / 10).astype(np.float32)
        samples[100:2000] = np.nan
        fr = av.AudioFrame.from_ndarray(samples[None], format="flt", layout="mono")
        fr.sample_rate, fr.pts = 16000, 0
        for p in [*a.encode(fr), *a.encode(None), *v.encode(None)]:
            c.mux(p)
    return path


def test_a_clip_whose_audio_holds_nan_fails_as_audio_not_finite(tmp_path):
    """A float track with NaN reached wav_bytes' ValueError in the decode worker: a traceback that ended the build."""
    src = tmp_path / "src"
    src.mkdir()
    _nan_audio_mov(src / "nan.mov")
    pan_video(src / "good.mp4", frames=20, fps=FPS, size=(128, 128), photo="astronaut", audio="speech")
    for p in (src / "nan.mov", src / "good.mp4"):
        p.with_suffix(".txt").write_text(f"the {p.stem} clip", encoding="utf-8")
    m = build(recipe_from_dict({"sources": [{"path": str(src)}], "geometry": {"buckets": [BUCKET], "fps": FPS},
                                "outputs": [{"format": "video_wds", "dir": "w", "audio": "wav"}]}),
              tmp_path / "out", quiet=True, workers=1)
    assert m["counts"]["written"] == 1 and m["counts"]["failed"] == {"audio_not_finite": 1}, m["counts"]
    assert "NaN or infinite audio" in m["counts"]["examples"]["failed:audio_not_finite"]["detail"]
