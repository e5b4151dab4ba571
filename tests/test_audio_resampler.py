"""Where audio is resampled (``audio.resampler``): by default as LTX-2 does it, the window cut at the
source's rate and resampled by torchaudio's sinc on the encoder's device before the mel; ``ffmpeg`` keeps
FFmpeg's swresample in the decode workers (the bytes of builds begun before the setting)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from shardsmith import formats
from shardsmith.build import build
from shardsmith.encode import resample as resample_mod
from shardsmith.encode.audio_vae import load_audio_vae
from shardsmith.formats.precomputed import PRECOMPUTED_STAMP
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.records import Waveform
from shardsmith.transform.audio import decode_audio, to_stereo
from video_factory import audio_file

FILES = (("a.flac", 44100, "mono"), ("b.m4a", 48000, "stereo"), ("c.wav", 22050, "5.1"))


@pytest.fixture(scope="module")
def tiny():
    return load_audio_vae(config="tiny")


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    src = tmp_path_factory.mktemp("speech")
    for name, rate, layout in FILES:
        audio_file(src / name, kind="speech", duration=1.4, rate=rate, layout=layout)
        (src / name).with_suffix(".txt").write_text(f"{name} speech", encoding="utf-8")
    return src


def _build(src: Path, out: Path, **audio) -> dict:
    rec = {"sources": [{"path": str(src)}],
           "models": {"text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio", "config": "tiny"},
                      "batch_size": 2},
           "audio": {"durations": "1.0", **audio}, "outputs": [{"format": "precomputed"}]}
    return build(recipe_from_dict(rec), out, quiet=True)


def _stamp(out: Path) -> dict:
    return json.loads((out / ".precomputed" / PRECOMPUTED_STAMP).read_text(encoding="utf-8"))


def _latents(out: Path) -> dict[str, torch.Tensor]:
    tree = out / ".precomputed" / "audio_latents"
    return {p.stem: torch.load(p, weights_only=True)["latents"] for p in sorted(tree.rglob("*.pt"))}


@pytest.mark.slow
def test_the_default_build_encodes_what_ltx2_s_own_steps_give(speech_dir, tmp_path, tiny):
    """LTX-2 (process_videos.py): decode at the file's rate, keep int(duration x rate) samples, stereo, then
    AudioProcessor: torchaudio's resample to 16 kHz, the mel, the encoder. shardsmith's latents are exactly
    those of that order (the resampler is torchaudio's, tests/test_resample.py)."""
    m = _build(speech_dir, tmp_path / "out")
    got = _latents(tmp_path / "out")
    assert sorted(got) == ["a", "b", "c"]
    assert m["outputs"]["precomputed"]["audio"]["resampler"].startswith("sinc: torchaudio.functional.resample")
    assert Ledger(tmp_path / "out" / formats.LEDGER_FILE).get_meta("audio_resampler") == "sinc"
    assert _stamp(tmp_path / "out")["audio_resampler"] == "sinc"  # a tree of the other resampler is not mixed in
    for name, rate, layout in FILES:
        with __import__("av").open(str(speech_dir / name)) as c:  # LTX's load: the whole stream, its own rate
            s = c.streams.audio[0]
            raw = np.concatenate([f.to_ndarray() for f in c.decode(s)], axis=1)
        scale = {np.dtype(np.int16): 2.0 ** 15, np.dtype(np.int32): 2.0 ** 31}.get(raw.dtype, 1.0)
        x = (raw / scale).astype(np.float32)  # torchaudio.load's normalised float32
        if x.shape[0] == 1 and layout != "mono":  # packed formats come interleaved as one row
            x = x.reshape(-1, s.channels).T
        x = to_stereo(np.ascontiguousarray(x[:, :int(1.0 * rate)]), s.layout.name)  # trimmed at the source rate
        at16k = resample_mod.resample(torch.from_numpy(x), rate, 16000)  # then resampled, as AudioProcessor does
        assert at16k.shape[-1] == 16000
        (want,) = tiny.encode([at16k.numpy()])
        assert (got[Path(name).stem] - want).abs().max() < 1e-5, name  # (a batch's CPU convolutions: 1e-5)


@pytest.mark.slow
def test_audio_resampler_ffmpeg_resamples_in_the_workers_as_builds_did_before(speech_dir, tmp_path, tiny):
    m = _build(speech_dir, tmp_path / "ff", resampler="ffmpeg")
    got = _latents(tmp_path / "ff")
    assert m["outputs"]["precomputed"]["audio"]["resampler"].startswith("ffmpeg: FFmpeg's swresample")
    assert "audio_resampler" not in _stamp(tmp_path / "ff")  # as the trees of builds before the setting
    _build(speech_dir, tmp_path / "sinc")
    sinc = _latents(tmp_path / "sinc")
    for name, _, _ in FILES:
        (want,) = tiny.encode([decode_audio(str(speech_dir / name), name, rate=16000, duration=1.0).wave])
        assert (got[Path(name).stem] - want).abs().max() < 1e-5, name  # (a batch's CPU convolutions: 1e-5)
        assert got[Path(name).stem].shape == sinc[Path(name).stem].shape
        assert (got[Path(name).stem] - sinc[Path(name).stem]).abs().max() > 1e-3, name  # another resampler


class _Ledger:
    def __init__(self, meta: dict, results: bool):
        self.meta, self.results = dict(meta), results

    def get_meta(self, key):
        return self.meta.get(key)

    def set_meta(self, key, value):
        self.meta[key] = value

    def has_results(self) -> bool:
        return self.results

    kept_choice = Ledger.kept_choice  # the real rule over this stand-in's meta


def test_a_build_keeps_the_resampler_it_began_with():
    rec = recipe_from_dict({"sources": [{"path": "."}], "models": {"text": {"family": "minilm"},
                                                                  "audio_vae": {"family": "ltx2_audio"}},
                            "outputs": [{"format": "precomputed"}]})
    fresh = _Ledger({}, results=False)
    assert resample_mod.settle(rec, fresh).audio.resampler == "sinc" and fresh.meta["audio_resampler"] == "sinc"
    older = _Ledger({}, results=True)  # results and no record: begun before the setting existed
    assert resample_mod.settle(rec, older).audio.resampler == "ffmpeg" and older.meta["audio_resampler"] == "ffmpeg"
    kept = _Ledger({"audio_resampler": "ffmpeg"}, results=True)
    assert resample_mod.settle(rec, kept).audio.resampler == "ffmpeg"
    assert rec.audio.resampler == "sinc"  # the user's recipe is not changed
    no_audio = recipe_from_dict({"sources": [{"path": "."}], "outputs": [{"format": "wds"}]})
    led = _Ledger({}, results=False)
    assert resample_mod.settle(no_audio, led) is no_audio and led.meta == {}


def test_a_mono_source_travels_as_one_channel_and_encodes_as_its_stereo_duplicate(speech_dir, tiny):
    from shardsmith.transform.audio_samples import AudioCutter

    mono = decode_audio(str(speech_dir / "a.flac"), "a", rate=None, duration=1.0, keep_mono=True)
    stereo = decode_audio(str(speech_dir / "a.flac"), "a", rate=None, duration=1.0)
    assert mono.wave.shape == (1, 44100) and stereo.wave.shape == (2, 44100)
    assert np.array_equal(stereo.wave, np.concatenate([mono.wave, mono.wave]))
    (z_mono,) = tiny.encode([Waveform(mono.wave, 44100)])
    (z_stereo,) = tiny.encode([Waveform(stereo.wave, 44100)])
    assert torch.equal(z_mono, z_stereo)
    cut = AudioCutter(16000).decode(str(speech_dir / "a.flac"), "a", 0.0, 1.0)
    assert cut.rate == 44100 and np.array_equal(cut.wave, mono.wave)  # the cutter's own path: the same window
    assert AudioCutter(16000, resampler="ffmpeg").decode(str(speech_dir / "a.flac"), "a", 0.0, 1.0).rate == 16000
    with pytest.raises(ValueError, match=r"audio clip 0: expected a stereo waveform \[2, N\]"):
        tiny.encode([mono.wave])  # a bare array is at the encoder's rate and stereo; mono comes as a Waveform


@pytest.mark.slow  # 3.5-4.5 s: the fast lane keeps under two minutes
def test_a_batch_of_mixed_source_rates_encodes_each_item_as_alone(tiny):
    """A pixel batch may hold clips whose audio comes at different rates: each (rate, length) group is
    resampled on its own, and every latent equals the item's latent encoded alone."""
    g = np.random.default_rng(0)
    a = Waveform(g.standard_normal((2, 44100)).astype(np.float32) * 0.1, 44100)
    b = Waveform(g.standard_normal((2, 48000)).astype(np.float32) * 0.1, 48000)
    c = g.standard_normal((2, 16000)).astype(np.float32) * 0.1  # an array: at the encoder's rate
    assert a.length_at(16000) == b.length_at(16000) == 16000
    staged = tiny.stage([a, None, b, c])
    assert sorted((rate, len(idx)) for idx, _, rate in staged.groups) == [(16000, 1), (44100, 1), (48000, 1)]
    out = tiny.launch(staged).result()
    assert out[1] is None
    for i, w in ((0, a), (2, b), (3, c)):
        (alone,) = tiny.encode([w])
        assert torch.equal(out[i], alone)


@pytest.mark.slow
@pytest.mark.parametrize("resampler", ["sinc", "ffmpeg"])
def test_a_clip_s_recorded_duration_is_ltx2_s(tmp_path, resampler):
    """LTX-2 records ``duration = samples / rate`` of the waveform it cut at the source's rate:
    int(17 / 24 x 44100) / 44100 = 0.708322 s for 17 frames at 24 fps of a 44.1 kHz track, not 17 / 24. With
    ``ffmpeg`` the record keeps the window, as builds did before."""
    from video_factory import pan_video

    src = tmp_path / "src"
    src.mkdir()
    pan_video(src / "c.mp4", frames=30, fps=24, size=(96, 64), audio="speech", audio_rate=44100,
              audio_layout="stereo").with_suffix(".txt").write_text("a clip", encoding="utf-8")
    rec = {"sources": [{"path": str(src)}], "geometry": {"buckets": ["64x64x17"]},
           "models": {"vae": {"family": "ltx2"}, "text": {"family": "minilm"},
                      "audio_vae": {"family": "ltx2_audio", "config": "tiny"}},
           "audio": {"resampler": resampler}, "outputs": [{"format": "precomputed"}]}
    build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    got = torch.load(tmp_path / "out" / ".precomputed" / "audio_latents" / "c.pt", weights_only=True)
    want = int(17 / 24 * 44100) / 44100 if resampler == "sinc" else 17 / 24
    assert got["duration"] == want
    assert got["num_time_steps"] == 17 * 16000 // 24 // 640 + 1  # 11333 samples at 16 kHz either way


def test_a_rate_the_encoder_s_kernel_cannot_take_is_resampled_by_ffmpeg_in_the_worker(tmp_path, tiny):
    """22,254 Hz (old Macintosh sound) and 16 kHz share only a factor 2: torchaudio's kernel would be 8,000
    phases of 11,141 taps (356 MB, and as many multiply-adds per sample), which exhausts a GPU on a batch.
    Such a file is resampled by FFmpeg in its worker, and its info says so; a usual rate is not."""
    from shardsmith.encode.resample import MAX_KERNEL, fits, kernel_size
    from shardsmith.transform.audio_samples import AudioCutter

    assert kernel_size(22254, 16000) > MAX_KERNEL and not fits(22254, 16000)
    assert fits(44100, 16000) and fits(22050, 16000) and fits(16000, 16000)
    odd = audio_file(tmp_path / "mac.wav", kind="speech", duration=1.2, rate=22254, layout="mono")
    usual = audio_file(tmp_path / "usual.wav", kind="speech", duration=1.2, rate=22050, layout="mono")
    cutter = AudioCutter(16000, durations=(1.0,))
    wave, info = cutter.for_file(_audio_item(odd))
    assert wave.rate == 16000 and wave.samples.shape == (2, 16000)
    assert (info["resampled_by"], info["source_rate"], info["cut_rate"]) == ("ffmpeg", 22254, 16000)
    assert np.array_equal(wave.samples, decode_audio(str(odd), "x", rate=16000, duration=1.0).wave)
    wave, info = cutter.for_file(_audio_item(usual))
    assert wave.rate == 22050 and wave.samples.shape == (1, 22050) and info["resampled_by"] == "encoder"
    (z,) = tiny.encode([wave])
    assert tuple(z.shape) == (2, 26, 16)


def test_a_rate_the_plan_probed_as_unfit_is_decoded_once(tmp_path, monkeypatch):
    """With the plan's probe facts, a file whose rate the kernel cannot take goes to FFmpeg's resampler at
    once: one decode, not a decode at the source's rate thrown away first. The samples are the same."""
    from shardsmith.transform import audio_samples
    from shardsmith.transform.audio import probe_audio

    odd = audio_file(tmp_path / "mac.wav", kind="speech", duration=1.2, rate=22254, layout="mono")
    facts = {"rate": probe_audio(str(odd), "x").rate, "channels": 1}
    calls = []
    real = audio_samples.decode_audio
    monkeypatch.setattr(audio_samples, "decode_audio", lambda *a, **k: calls.append(k["rate"]) or real(*a, **k))
    cutter = audio_samples.AudioCutter(16000, durations=(1.0,))
    wave, info = cutter.for_file(_audio_item(odd, facts))
    assert calls == [16000] and info["resampled_by"] == "ffmpeg"
    assert np.array_equal(wave.samples, real(str(odd), "x", rate=16000, duration=1.0).wave)
    calls.clear()
    cutter.for_file(_audio_item(odd))  # no facts (a plan without them): found out by decoding, as before
    assert calls == [None, 16000]


def _audio_item(path: Path, facts: dict | None = None):
    from shardsmith.records import MediaRef, PlannedItem

    media = {"target": MediaRef(str(path), path.name, "audio", audio=facts)}
    return PlannedItem(0, f"s/{path.name}", "k", 0, str(path), path.name, None, None, None, {}, None, None, "audio",
                       None, None, None, None, "train", "ok", media=media)


@pytest.mark.slow
def test_the_preflight_decodes_a_file_probed_at_an_unfit_rate_once(tmp_path, monkeypatch):
    """The audio preflight (in the build's own process) passes the plan's facts to the cutter, as the
    workers do: a 22,254 Hz file is decoded once, by FFmpeg's resampler, not first at its own rate."""
    from shardsmith.transform import audio_samples

    src = tmp_path / "src"
    src.mkdir()
    audio_file(src / "mac.wav", kind="speech", duration=1.2, rate=22254, layout="mono")
    calls = []
    real = audio_samples.decode_audio
    monkeypatch.setattr(audio_samples, "decode_audio", lambda *a, **k: calls.append(k["rate"]) or real(*a, **k))
    rec = {"sources": [{"path": str(src)}], "workers": 1, "audio": {"durations": "1.0"},
           "models": {"audio_vae": {"family": "ltx2_audio", "config": "tiny"}, "device": "cpu"},
           "outputs": [{"format": "latent_wds"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 1
    assert calls and None not in calls  # every decode in this process went straight to FFmpeg at 16 kHz
