"""transform/audio.py: probe, decode + resample + cut, LTX-2's channel policy, duration arithmetic.

Media are real: espeak-ng speech muxed with PyAV into videos panning across real photos
(``video_factory.pan_video``) and audio files of every suffix (``video_factory.audio_file``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import json  # noqa: E402
import math  # noqa: E402

import av  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import video_factory as vf  # noqa: E402
from shardsmith.records import ItemError  # noqa: E402
from shardsmith.transform import audio as A  # noqa: E402
from shardsmith.transform.audio import (  # noqa: E402
    DOWNMIX_5_1,
    DOWNMIX_7_1,
    AudioProbe,
    choose_duration,
    clip_window,
    decode_audio,
    num_samples,
    parse_durations,
    probe_audio,
    to_stereo,
)

SUFFIXES = tuple(vf.AUDIO_SUFFIXES)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.asarray(x, np.float64) ** 2)))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return _rms(a - b) / _rms(b)


def _lag(a: np.ndarray, b: np.ndarray) -> int:
    """The shift (samples) of ``a`` against ``b`` that correlates best (0: aligned)."""
    n = len(a) + len(b)
    xc = np.fft.irfft(np.fft.rfft(a, n) * np.conj(np.fft.rfft(b, n)), n)
    k = int(np.argmax(xc))
    return k if k < n // 2 else k - n


def _need_encoder(suffix: str, channels: int = 2) -> None:
    if vf.audio_encoder(suffix, channels) is None:
        tried = vf.AUDIO_SUFFIXES[suffix][1]
        pytest.skip(f"PyAV's FFmpeg has no {channels}-channel encoder for {suffix} (tried {tried})")


def _decode_from_zero_then_cut(path, rate: int, start: float, duration: float) -> np.ndarray:
    """The reference: decode [0, start + duration) with no seek, then cut [start, start + duration)."""
    o = math.floor(start * rate + 0.5)
    n = num_samples(duration, rate)
    full = decode_audio(str(path), "ref", rate=rate, start=0.0, duration=(o + n) / rate + 1.0).wave
    return full[:, o : o + n]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """2 s pan videos (48 frames at 24 fps) with 48 kHz speech: mono, stereo and 5.1; one without audio."""
    d = tmp_path_factory.mktemp("clips")
    out = {}
    for lay, photo in (("mono", "chelsea"), ("stereo", "astronaut"), ("5.1", "coffee")):
        out[lay] = vf.pan_video(d / f"{lay}.mp4", frames=48, fps=24, size=(64, 64), photo=photo, audio="speech",
                                audio_rate=48000, audio_layout=lay)
    out["silent"] = vf.pan_video(d / "silent.mp4", frames=24, fps=24, size=(64, 64), photo="rocket")
    return out


# --------------------------------------------------------------------------- pure arithmetic


def test_num_samples_truncates_like_ltx_but_not_float_error():
    assert num_samples(2.0, 16000) == 32000
    assert num_samples(121 / 24, 16000) == 80666  # 80666.67 truncated, as LTX's int(d * sr)
    assert num_samples(0.29, 100) == 29  # 0.29 * 100 == 28.999999999999996 in floats
    assert num_samples(1.2345, 16000) == 19752
    assert num_samples(0.0, 16000) == 0
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="duration"):
            num_samples(bad, 16000)
    for bad in (0, -16000, 16000.5):
        with pytest.raises(ValueError, match="rate"):
            num_samples(1.0, bad)


def test_clip_window_is_first_frame_time_and_sampled_duration():
    assert clip_window(12, 24.0, 121, 24.0) == (0.5, 121 / 24)
    assert clip_window(0, 30.0, 49, 30.0) == (0.0, 49 / 30)
    # a clip subsampled by 2 from a 24 fps source: 25 frames at an effective 12 fps last 25/12 s
    assert clip_window(24, 24.0, 25, 12.0) == (1.0, 25 / 12)
    # a 25 fps source sampled at 24 fps: the start is on the source's clock, the length on the sample's
    assert clip_window(50, 25.0, 49, 24.0) == (2.0, 49 / 24)
    with pytest.raises(ValueError, match="first_frame"):
        clip_window(-1, 24.0, 9, 24.0)
    with pytest.raises(ValueError, match="frames"):
        clip_window(0, 24.0, 0, 24.0)
    with pytest.raises(ValueError, match="frame rates"):
        clip_window(0, 0.0, 9, 24.0)
    with pytest.raises(ValueError, match="frame rates"):
        clip_window(0, 24.0, 9, -24.0)


def test_choose_duration_largest_bucket_not_longer_than_the_file():
    b = [2.0, 4.0, 8.0]
    assert choose_duration(9.5, b) == 8.0
    assert choose_duration(8.0, b) == 8.0  # equal fits
    assert choose_duration(7.999, b) == 4.0
    assert choose_duration(2.0, b) == 2.0
    assert choose_duration(1.99, b) is None  # shorter than every bucket: LTX skips it
    assert choose_duration(5.0, (8.0, 2.0, 4.0)) == 4.0  # order of the buckets does not matter
    assert choose_duration(4.0 - 1e-12, b) == 4.0  # float noise in a probed duration
    with pytest.raises(ValueError, match="no duration buckets"):
        choose_duration(3.0, [])
    with pytest.raises(ValueError, match="positive"):
        choose_duration(3.0, [2.0, 0.0])


def test_parse_durations_syntax_and_errors():
    assert parse_durations("2.0;4.0;8.0") == [2.0, 4.0, 8.0]
    assert parse_durations(" 1.5 ; 3") == [1.5, 3.0]
    assert parse_durations("8;2") == [8.0, 2.0]  # kept in the order written
    assert parse_durations("0.25") == [0.25]
    cases = {
        "": "no durations",
        "  ": "no durations",
        "2.0;;4.0": "part 2 is empty",
        "2.0;": "part 2 is empty",
        "2.0;abc": "part 2 \\('abc'\\) is not a number",
        "2x4": "part 1 \\('2x4'\\) is not a number",
        "2;-1": "part 2 \\('-1'\\) must be a duration > 0",
        "0;2": "part 1 \\('0'\\) must be a duration > 0",
        "nan": "part 1 \\('nan'\\) must be a duration > 0",
        "inf;2": "part 1 \\('inf'\\) must be a duration > 0",
        "2;4;2.0": "part 3 \\('2.0'\\) repeats the duration 2",
    }
    for text, msg in cases.items():
        with pytest.raises(ValueError, match=msg):
            parse_durations(text)


def test_start_sample_rounds_to_nearest_half_up():
    assert A._start_sample(0.5, 16000) == 8000
    assert A._start_sample(1 / 24, 16000) == 667  # 666.67
    assert A._start_sample(1.5 / 16000, 16000) == 2  # a half sample goes up
    assert A._start_sample(0.0, 16000) == 0
    with pytest.raises(ValueError, match="start"):
        A._start_sample(-0.01, 16000)


# --------------------------------------------------------------------------- channels


def _tagged(names: list[str], values: dict[str, float], n: int = 5) -> np.ndarray:
    """A [C, n] waveform whose channel named X is the constant values[X]."""
    return np.stack([np.full(n, values[c], np.float32) for c in names])


VALUES = {"FL": 0.11, "FR": 0.23, "FC": 0.31, "LFE": 0.97, "BL": 0.05, "BR": 0.07, "SL": 0.13, "SR": 0.17,
          "FLC": 0.19, "FRC": 0.29, "BC": 0.37}


def test_ltx_downmix_weights_are_its_normalised_coefficients():
    a5, b5 = DOWNMIX_5_1
    a7, b7 = DOWNMIX_7_1
    assert (a5, b5) == (1.0 / 2.414, 0.707 / 2.414)
    assert (a7, b7) == (1.0 / 3.121, 0.707 / 3.121)
    assert a5 + 2 * b5 == pytest.approx(1.0, abs=1e-12)  # each side's weights sum to 1
    assert a7 + 3 * b7 == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    "layout,names,left,right",
    [
        ("5.1", ["FL", "FR", "FC", "LFE", "BL", "BR"], ["BL"], ["BR"]),
        ("5.1(side)", ["FL", "FR", "FC", "LFE", "SL", "SR"], ["SL"], ["SR"]),
        # the same channels in another storage order: found by name, not by index
        ("FC+FL+FR+LFE+SL+SR", ["FC", "FL", "FR", "LFE", "SL", "SR"], ["SL"], ["SR"]),
        ("7.1", ["FL", "FR", "FC", "LFE", "BL", "BR", "SL", "SR"], ["BL", "SL"], ["BR", "SR"]),
        ("7.1(wide)", ["FL", "FR", "FC", "LFE", "BL", "BR", "FLC", "FRC"], ["BL", "FLC"], ["BR", "FRC"]),
    ],
)
def test_to_stereo_surround_downmix_exact(layout, names, left, right):
    x = _tagged(names, VALUES)
    a, b = DOWNMIX_5_1 if len(names) == 6 else DOWNMIX_7_1
    want_l = a * VALUES["FL"] + b * (VALUES["FC"] + sum(VALUES[n] for n in left))
    want_r = a * VALUES["FR"] + b * (VALUES["FC"] + sum(VALUES[n] for n in right))
    y = to_stereo(x, layout)
    assert y.dtype == np.float32 and y.shape == (2, 5)
    np.testing.assert_allclose(y[0], want_l, rtol=0, atol=1e-7)
    np.testing.assert_allclose(y[1], want_r, rtol=0, atol=1e-7)
    # LFE is dropped: changing it changes nothing
    x2 = x.copy()
    x2[names.index("LFE")] = -5.0
    np.testing.assert_array_equal(to_stereo(x2, layout), y)
    # a full-scale signal on every channel stays full scale (the weights are normalised)
    np.testing.assert_allclose(to_stereo(np.ones_like(x), layout), 1.0, atol=1e-6)


def test_to_stereo_mono_stereo_and_the_mean_fallback():
    m = np.array([[0.1, -0.2, 0.3]], np.float32)
    np.testing.assert_array_equal(to_stereo(m, "mono"), np.concatenate([m, m]))
    np.testing.assert_array_equal(to_stereo(m, "1 channels"), np.concatenate([m, m]))
    s = np.array([[0.1, 0.2], [0.5, -0.5]], np.float32)
    out = to_stereo(s, "stereo")
    np.testing.assert_array_equal(out, s)
    assert out is not s
    np.testing.assert_array_equal(to_stereo(s, "2 channels"), s)
    # > 2 channels that are not 5.1 / 7.1: the mean of all channels, duplicated (LTX's fallback)
    for layout, names in (("quad", ["FL", "FR", "BL", "BR"]), ("2.1", ["FL", "FR", "LFE"]),
                          ("hexagonal", ["FL", "FR", "FC", "BL", "BR", "BC"])):
        x = _tagged(names, VALUES)
        mean = np.mean([VALUES[n] for n in names])
        np.testing.assert_allclose(to_stereo(x, layout), mean, rtol=0, atol=1e-7)
    # 6 channels of no named order: the mean (LTX would take index 3 for LFE and drop it)
    x = _tagged(["FL", "FR", "FC", "LFE", "BL", "BR"], VALUES)
    np.testing.assert_allclose(to_stereo(x, "6 channels"), np.mean(x[:, 0]), rtol=0, atol=1e-7)


def test_to_stereo_refuses_shape_and_layout_mismatch():
    with pytest.raises(ValueError, match=r"\[C, N\]"):
        to_stereo(np.zeros(10, np.float32), "mono")
    with pytest.raises(ValueError, match=r"\[C, N\]"):
        to_stereo(np.zeros((0, 10), np.float32), "mono")
    with pytest.raises(ValueError, match="layout '5.1' has 6 channels but the waveform has 2"):
        to_stereo(np.zeros((2, 10), np.float32), "5.1")


def test_audio_probe_to_json_is_plain_json():
    p = AudioProbe(rate=48000, channels=6, layout="5.1(side)", duration=2.5, codec="aac", stream_index=1)
    j = p.to_json()
    assert json.loads(json.dumps(j)) == {"rate": 48000, "channels": 6, "layout": "5.1(side)", "duration": 2.5,
                                         "codec": "aac", "stream_index": 1}
    assert AudioProbe(**j) == p


# --------------------------------------------------------------------------- videos with speech


def test_video_audio_mono_stereo_51(clips):
    speech = vf.speech_wave(2.0, 48000)
    assert vf.SPEECH_IS_REAL  # espeak-ng is installed on this machine: real speech, not the fallback
    for lay, channels in (("mono", 1), ("stereo", 2), ("5.1", 6)):
        pr = probe_audio(str(clips[lay]), lay)
        assert (pr.rate, pr.channels, pr.layout, pr.codec, pr.stream_index) == (48000, channels, lay, "aac", 1)
        assert pr.duration == pytest.approx(2.0, abs=1e-9)
        dec = decode_audio(str(clips[lay]), lay, rate=16000)
        assert dec.wave.dtype == np.float32 and dec.wave.shape == (2, 32000)
        assert dec.rate == 16000 and dec.padded == 0.0 and dec.probe == pr
        assert _rms(dec.wave) > 0.02
        # the same track at its own rate, against what was encoded: aligned to the sample, close
        # (AAC is lossy, and PyAV's default bit rate for mono is low)
        native = decode_audio(str(clips[lay]), lay, rate=48000).wave
        src = vf.channel_signals(speech, lay, 48000) if lay != "stereo" else np.stack([speech, 0.8 * speech])
        want = to_stereo(src, lay)
        for ch in (0, 1):
            assert _lag(native[ch], want[ch]) == 0
            assert np.corrcoef(native[ch], want[ch])[0, 1] > 0.98
        assert _rel(native, want) < (0.25 if lay == "mono" else 0.1)
        if lay == "mono":
            np.testing.assert_array_equal(dec.wave[0], dec.wave[1])
        if lay == "stereo":
            assert _rms(dec.wave[1]) / _rms(dec.wave[0]) == pytest.approx(0.8, abs=0.03)
        if lay == "5.1":
            # LTX's down-mix, not the plain mean of the channels
            mean = np.repeat(src.mean(axis=0, keepdims=True), 2, axis=0)
            assert _rel(native, mean) > 3 * _rel(native, want)


def test_video_without_audio_stream(clips):
    for call in (lambda p: probe_audio(p, "clip-7"), lambda p: decode_audio(p, "clip-7", rate=16000)):
        with pytest.raises(ItemError) as ei:
            call(str(clips["silent"]))
        e = ei.value
        assert e.reason == "no_audio_stream" and e.status == "failed:no_audio_stream"
        assert "clip-7" in e.detail and "silent.mp4" in e.detail and "streams video" in e.detail
        assert "columns.audio" in e.detail and "audio.required: false" in e.detail and "--skip-audio" in e.detail


def test_broken_audio_stream_probes_then_fails_to_decode(tmp_path):
    p = vf.broken_audio_video(tmp_path / "broken.mp4", frames=24, fps=24, size=(64, 64))
    again = vf.broken_audio_video(tmp_path / "again.mp4", frames=24, fps=24, size=(64, 64))
    assert again.read_bytes() == p.read_bytes()  # deterministic
    pr = probe_audio(str(p), "bad-clip")
    assert (pr.rate, pr.channels, pr.layout, pr.codec) == (48000, 2, "stereo", "aac")
    assert pr.duration == pytest.approx(1.0, abs=1e-9)
    for start in (0.0, 0.5):
        with pytest.raises(ItemError) as ei:
            decode_audio(str(p), "bad-clip", rate=16000, start=start, duration=0.4)
        e = ei.value
        assert e.reason == "audio_decode_error" and not e.skip
        assert e.detail.startswith("bad-clip: ")
        assert "Invalid data found" in e.detail  # FFmpeg's own message
        assert "re-encode its audio" in e.detail


def test_open_errors(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "notes.mp3").write_text("not audio at all, a caption under the wrong name\n" * 8)
    cases = {"empty.wav": "empty_file", "notes.mp3": "unreadable", "missing.flac": "unreadable"}
    for name, reason in cases.items():
        for call in (lambda p: probe_audio(p, "it-1"), lambda p: decode_audio(p, "it-1", rate=16000)):
            with pytest.raises(ItemError) as ei:
                call(str(tmp_path / name))
            assert ei.value.reason == reason and "it-1" in ei.value.detail


# --------------------------------------------------------------------------- audio files


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_audio_file_each_suffix(tmp_path, suffix):
    _need_encoder(suffix)
    rate = 44100
    p = vf.audio_file(tmp_path / f"speech{suffix}", kind="speech", duration=2.0, rate=rate, layout="stereo")
    pr = probe_audio(str(p), p.name)
    assert pr.rate == rate and pr.channels == 2 and pr.stream_index == 0
    assert pr.codec == {".wav": "pcm_s16le", ".flac": "flac", ".mp3": "mp3float", ".m4a": "aac",
                        ".ogg": vf.audio_encoder(".ogg").replace("lib", "")}[suffix]
    assert pr.duration == pytest.approx(2.0, abs=0.01)
    dec = decode_audio(str(p), p.name, rate=16000)
    assert dec.wave.shape == (2, num_samples(pr.duration, 16000)) and dec.padded == 0.0
    assert _rms(dec.wave) > 0.02
    # at the source rate it is what was encoded, sample-aligned (no codec delay left in)
    native = decode_audio(str(p), p.name, rate=rate, duration=2.0).wave
    src = vf.audio_signal("speech", 2.0, rate, "stereo")
    for ch in (0, 1):
        assert _lag(native[ch], src[ch]) == 0
        assert np.corrcoef(native[ch], src[ch])[0, 1] > 0.98
    if suffix in (".wav", ".flac"):  # lossless (16-bit)
        np.testing.assert_allclose(native, src, rtol=0, atol=1.5 / 32768)


@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_lossless_51_file_downmix_exact(tmp_path, suffix):
    _need_encoder(suffix, 6)
    p = vf.audio_file(tmp_path / f"five{suffix}", kind="speech", duration=1.0, rate=16000, layout="5.1")
    dec = decode_audio(str(p), "five", rate=16000)
    assert dec.probe.layout == "5.1" and dec.probe.channels == 6
    src = vf.audio_signal("speech", 1.0, 16000, "5.1")
    np.testing.assert_allclose(dec.wave, to_stereo(src, "5.1"), rtol=0, atol=1.5 / 32768)


@pytest.mark.parametrize("suffix,layout", [(".m4a", "5.1"), (".ogg", "5.1"), (".m4a", "mono"), (".mp3", "mono"),
                                           (".ogg", "mono")])
def test_lossy_files_other_layouts(tmp_path, suffix, layout):
    channels = 6 if layout == "5.1" else 1
    _need_encoder(suffix, channels)
    p = vf.audio_file(tmp_path / f"x{suffix}", kind="speech", duration=1.0, rate=48000, layout=layout)
    dec = decode_audio(str(p), "x", rate=48000)
    assert dec.probe.channels == channels and dec.probe.layout == layout
    assert dec.wave.shape == (2, num_samples(dec.probe.duration, 48000))
    assert _rel(dec.wave[:, :48000], to_stereo(vf.audio_signal("speech", 1.0, 48000, layout), layout)) < 0.15


# --------------------------------------------------------------------------- resampling and cutting


def test_resample_48k_to_16k_exact_counts(tmp_path):
    p = vf.audio_file(tmp_path / "s48.wav", kind="speech", duration=2.5, rate=48000, layout="stereo")
    whole = decode_audio(str(p), "s48", rate=16000)
    assert whole.wave.shape == (2, 40000) and whole.padded == 0.0
    # the flush is handled: the last samples are real audio (the 300 Hz sine on channel 0), not padding
    assert _rms(whole.wave[:, -200:]) > 0.01
    for start, dur in ((0.0, 1.2345), (0.1, 2.4), (1 / 24, 121 / 24 / 3), (0.0, 2.5), (0.7, 0.0)):
        d = decode_audio(str(p), "s48", rate=16000, start=start, duration=dur)
        assert d.wave.shape == (2, num_samples(dur, 16000))
        assert d.padded == 0.0
    # 44.1 kHz -> 16 kHz and 16 kHz -> 24 kHz too
    q = vf.audio_file(tmp_path / "s44.flac", kind="speech", duration=1.0, rate=44100, layout="mono")
    assert decode_audio(str(q), "s44", rate=16000).wave.shape == (2, 16000)
    assert decode_audio(str(q), "s44", rate=16000, start=0.25, duration=0.5).wave.shape == (2, 8000)
    r = vf.audio_file(tmp_path / "s16.wav", kind="tone", duration=1.0, rate=16000, layout="mono")
    up = decode_audio(str(r), "s16", rate=24000)
    assert up.wave.shape == (2, 24000)
    # a 440 Hz tone survives resampling: its spectrum peaks at 440 Hz
    spec = np.abs(np.fft.rfft(up.wave[0]))
    assert np.argmax(spec) * up.rate / up.wave.shape[1] == pytest.approx(440, abs=1)


def test_zero_pad_when_source_ends_early(tmp_path):
    p = vf.audio_file(tmp_path / "short.wav", kind="speech", duration=1.0, rate=16000, layout="stereo")
    d = decode_audio(str(p), "short", rate=16000, start=0.25, duration=1.5)
    assert d.wave.shape == (2, 24000)
    assert d.padded == pytest.approx(0.75, abs=1e-12)
    assert not d.wave[:, 12000:].any()  # the padding is zeros
    np.testing.assert_array_equal(d.wave[:, :12000], decode_audio(str(p), "short", rate=16000).wave[:, 4000:])
    # past the end entirely: all padding
    e = decode_audio(str(p), "short", rate=16000, start=3.0, duration=0.5)
    assert e.wave.shape == (2, 8000) and not e.wave.any() and e.padded == pytest.approx(0.5)
    # duration None: to the end of the stream
    f = decode_audio(str(p), "short", rate=16000, start=0.5)
    assert f.wave.shape == (2, 8000) and f.padded == 0.0


def test_decode_refuses_bad_arguments(clips):
    with pytest.raises(ValueError, match="rate"):
        decode_audio(str(clips["stereo"]), "x", rate=0)
    with pytest.raises(ValueError, match="start"):
        decode_audio(str(clips["stereo"]), "x", rate=16000, start=-1.0)
    with pytest.raises(ValueError, match="duration"):
        decode_audio(str(clips["stereo"]), "x", rate=16000, duration=-1.0)


def _count_seeks(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = A._seek_run

    def spy(*a, **k):
        try:
            win = real(*a, **k)
        except A._Fallback:
            calls.append("fallback")
            raise
        calls.append("seek")
        return win

    monkeypatch.setattr(A, "_seek_run", spy)
    return calls


@pytest.mark.parametrize("suffix,rate_in", [(".wav", 44100), (".flac", 48000), (".m4a", 44100), (".m4a", 48000),
                                            (".ogg", 44100), (".mp3", 44100)])
def test_start_offset_equals_decode_from_zero_then_cut(tmp_path, monkeypatch, suffix, rate_in):
    _need_encoder(suffix)
    p = vf.audio_file(tmp_path / f"long{suffix}", kind="speech", duration=8.0, rate=rate_in, layout="stereo")
    calls = _count_seeks(monkeypatch)
    for start, dur in ((1.3, 1.0), (2.5, 1.0), (5.123, 2.0), (7.4, 1.5)):
        calls.clear()
        got = decode_audio(str(p), "long", rate=16000, start=start, duration=dur)
        want = _decode_from_zero_then_cut(p, 16000, start, dur)
        assert got.wave.shape == want.shape == (2, num_samples(dur, 16000))
        np.testing.assert_allclose(got.wave, want, rtol=0, atol=1e-6)
        assert _rms(got.wave) > 0.005
        seeks = suffix != ".mp3" and start > A.SEEK_AFTER  # mp3 timestamps are estimates: never seeked
        assert calls == (["seek"] if seeks else [])
    # a start that is not on a sample: the window begins at the nearest output sample
    got = decode_audio(str(p), "long", rate=16000, start=3.00004, duration=0.5)
    np.testing.assert_allclose(got.wave, _decode_from_zero_then_cut(p, 16000, 3.00004, 0.5), rtol=0, atol=1e-6)


def test_seek_in_video_and_fallback(tmp_path, monkeypatch):
    p = vf.pan_video(tmp_path / "v.mp4", frames=72, fps=24, size=(64, 64), photo="camera", audio="speech",
                     audio_rate=48000, audio_layout="5.1")
    start, dur = clip_window(54, 24.0, 17, 24.0)  # frame 54 at 24 fps: 2.25 s, 17 frames long
    calls = _count_seeks(monkeypatch)
    got = decode_audio(str(p), "v", rate=16000, start=start, duration=dur)
    assert calls == ["seek"]
    want = _decode_from_zero_then_cut(p, 16000, start, dur)
    assert got.wave.shape == (2, num_samples(17 / 24, 16000))
    np.testing.assert_allclose(got.wave, want, rtol=0, atol=1e-6)
    assert _rms(got.wave) > 0.005 and got.probe.layout == "5.1"
    # a landing point that cannot be placed exactly (here: too little room left before the start)
    # falls back to a decode from the beginning, with the same result
    monkeypatch.setattr(A, "_DECODER_PREROLL", 5.0)
    calls.clear()
    again = decode_audio(str(p), "v", rate=16000, start=start, duration=dur)
    assert calls == ["fallback"]
    np.testing.assert_array_equal(again.wave, want)


def test_ci_has_real_speech():
    """CI installs espeak-ng (.ci/run): the audio tests there run on real synthesised speech, never on the
    factory's speech-like fallback."""
    import os

    from video_factory import SPEECH_IS_REAL

    if os.environ.get("CI") and not SPEECH_IS_REAL:
        pytest.fail("CI has no espeak-ng: .ci/run must install it (the audio tests would use synthetic sound)")
    assert SPEECH_IS_REAL or not os.environ.get("CI")


def test_a_seek_at_the_source_s_rate_gives_the_decode_from_zero_then_cut(tmp_path, monkeypatch):
    """``rate=None`` (audio.resampler: sinc): no resampler in the worker; a clip that starts late still seeks,
    and its window equals a decode from the beginning cut at the source's 48 kHz, sample for sample."""
    p = vf.pan_video(tmp_path / "v.mp4", frames=72, fps=24, size=(64, 64), photo="camera", audio="speech",
                     audio_rate=48000, audio_layout="5.1")
    start, dur = clip_window(54, 24.0, 17, 24.0)  # 2.25 s in, 0.708 s long
    calls = _count_seeks(monkeypatch)
    got = decode_audio(str(p), "v", rate=None, start=start, duration=dur, keep_mono=True)
    assert calls == ["seek"] and got.rate == 48000
    assert got.wave.shape == (2, num_samples(17 / 24, 48000))  # 5.1 down-mixed (keep_mono keeps only mono)
    want = _decode_from_zero_then_cut(p, 48000, start, dur)
    assert np.array_equal(got.wave, want)
    assert _rms(got.wave) > 0.005


def _pcm_file(path, codec: str, fmt: str, rate: int, layout: str, sample_fmt: str | None = None):
    """Real speech in container ``fmt`` with audio codec ``codec`` (PyAV converts the float samples to the
    codec's sample format, ``sample_fmt`` where the codec takes several)."""
    import fractions

    x = vf.audio_signal("speech", 0.7, rate, layout)
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=rate, layout=layout)
        if sample_fmt:
            s.codec_context.format = sample_fmt
        for i in range(0, x.shape[1], 1024):
            fr = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, i:i + 1024]), format="fltp", layout=layout)
            fr.sample_rate, fr.pts, fr.time_base = rate, i, fractions.Fraction(1, rate)
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return path


@pytest.mark.parametrize("codec,fmt,suffix,sample_fmt,layout", [
    ("pcm_u8", "wav", ".wav", None, "mono"),
    ("pcm_s16le", "wav", ".wav", None, "stereo"),
    ("pcm_s24le", "wav", ".wav", None, "5.1"),  # decodes as s32
    ("pcm_s32le", "wav", ".wav", None, "stereo"),
    ("pcm_f32le", "wav", ".wav", None, "mono"),
    ("pcm_f64le", "wav", ".wav", None, "stereo"),
    ("flac", "flac", ".flac", "s16", "mono"),
    ("flac", "flac", ".flac", "s32", "stereo"),  # 24-bit FLAC
    ("aac", "ipod", ".m4a", None, "stereo"),  # fltp
    ("libmp3lame", "mp3", ".mp3", None, "stereo"),  # fltp or s16p, as the build's FFmpeg has it
])
def test_at_the_source_s_rate_the_samples_are_swresample_s_without_a_resampler(tmp_path, codec, fmt, suffix,
                                                                              sample_fmt, layout):
    """``rate=None`` converts each decoded frame to float32 itself instead of running FFmpeg's resampler at
    the same rate: the samples must be exactly what swresample gives (the decoder's format, planar or packed,
    u8 / s16 / s32 / float / double), so the sinc path's bytes do not depend on which one converted them."""
    if codec not in av.codecs_available:
        pytest.skip(f"this FFmpeg has no {codec} encoder")
    p = _pcm_file(tmp_path / f"a{suffix}", codec, fmt, 44100, layout, sample_fmt)
    got = decode_audio(str(p), "a", rate=None, duration=0.5)
    with av.open(str(p)) as c:
        frames = list(c.decode(c.streams.audio[0]))
    res = av.AudioResampler(format="fltp", layout=frames[0].layout, rate=frames[0].sample_rate)
    parts = []
    for fr in frames:
        fr.pts = None
        parts += [o.to_ndarray() for o in res.resample(fr)]
    parts += [o.to_ndarray() for o in res.resample(None)]
    want = A.to_stereo(np.concatenate(parts, axis=1)[:, :num_samples(0.5, frames[0].sample_rate)], frames[0].layout.name)
    assert got.rate == 44100 and got.wave.shape == want.shape
    assert np.array_equal(got.wave, want), frames[0].format.name
