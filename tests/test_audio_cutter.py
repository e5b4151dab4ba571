"""``AudioCutter.for_file`` takes an audio-only item's duration from the plan's probe (the worker opens
the file once, to decode it), and probes again only where the plan has no duration for it."""

from __future__ import annotations

import numpy as np
import pytest

import shardsmith.transform.audio_samples as audio_samples
from shardsmith.records import ItemError, MediaRef, PlannedItem
from shardsmith.transform.audio import probe_audio
from shardsmith.transform.audio_samples import AudioCutter
from video_factory import audio_file


def _item(path, audio):
    media = {"target": MediaRef(str(path), path.name, "audio", audio=audio)}
    return PlannedItem(0, f"s/{path.name}", "k", 0, str(path), path.name, None, None, None, {}, None, None, "audio",
                       None, None, None, None, "train", "ok", media=media)


@pytest.fixture()
def speech(tmp_path):
    return audio_file(tmp_path / "s.flac", kind="speech", duration=2.6, rate=44100, layout="mono")


def test_the_plan_s_probe_gives_the_duration_and_the_file_is_not_probed_again(speech, monkeypatch):
    facts = probe_audio(str(speech), "s").to_json()
    want, want_info = AudioCutter(16000, durations=(1.0, 2.0)).for_file(_item(speech, None))  # probes

    def refuse(*a, **k):
        raise AssertionError("probed again")

    monkeypatch.setattr(audio_samples, "probe_audio", refuse)
    got, info = AudioCutter(16000, durations=(1.0, 2.0)).for_file(_item(speech, facts))
    # cut at the source's 44.1 kHz (the encoder resamples it): 2.0 s is 88,200 samples there, 32,000 at 16 kHz;
    # mono stays one channel (the encoder duplicates it)
    assert got.rate == 44100 and got.samples.shape == (1, 88200) and got.samples.dtype == np.float32
    assert np.array_equal(got.samples, want.samples) and got.length_at(16000) == 32000
    assert info == want_info and info["duration"] == 2.0
    assert (info["samples"], info["rate"], info["cut_samples"], info["cut_rate"]) == (32000, 16000, 88200, 44100)
    whole, _ = AudioCutter(16000).for_file(_item(speech, facts))  # no buckets: the whole file, as probed
    assert whole.samples.shape == (1, round(facts["duration"] * 44100))
    with pytest.raises(ItemError, match="lasts 2.600 s, shorter than the smallest audio duration bucket"):
        AudioCutter(16000, durations=(4.0,)).for_file(_item(speech, facts))


def test_with_the_ffmpeg_resampler_the_worker_resamples_to_the_encoder_s_rate(speech):
    facts = probe_audio(str(speech), "s").to_json()
    got, info = AudioCutter(16000, durations=(2.0,), resampler="ffmpeg").for_file(_item(speech, facts))
    assert got.rate == 16000 and got.samples.shape == (2, 32000)
    assert (info["samples"], info["rate"], info["cut_samples"], info["cut_rate"]) == (32000, 16000, 32000, 16000)


def test_a_plan_that_found_no_audio_is_probed_again_for_the_reason(tmp_path):
    not_audio = tmp_path / "n.wav"
    not_audio.write_bytes(b"RIFF" + bytes(60))
    with pytest.raises(ItemError) as e:
        AudioCutter(16000, durations=(1.0,)).for_file(_item(not_audio, {"none": "unreadable"}))
    assert e.value.reason in ("unreadable", "no_audio_stream", "empty_file") and "n.wav" in e.value.detail


def _facts(seconds):
    return {"rate": 44100, "channels": 1, "layout": "mono", "duration": seconds, "codec": "flac", "stream_index": 0}


def test_short_audio_files_travel_to_the_workers_in_chunks_long_ones_alone(tmp_path):
    """An audio-only item decodes in milliseconds: it goes to the decode workers in a chunk, as images do
    (alone, each paid a task's round trip and only 2 x workers waveforms were decoded ahead of the
    encoder). A waveform longer than LIGHT_AUDIO_S, or one whose duration the plan does not give, travels
    alone as a clip does."""
    from shardsmith.recipe import ImageRules
    from shardsmith.transform.audio_samples import LIGHT_AUDIO_S, audio_seconds
    from shardsmith.transform.buckets import parse_buckets
    from shardsmith.transform.latent_pixels import LatentPixelMaker

    f = tmp_path / "a.flac"
    bucketed, whole = AudioCutter(16000, durations=(4.0, 8.0)), AudioCutter(16000)
    assert audio_seconds(_item(f, _facts(9.5)), bucketed) == 8.0
    assert audio_seconds(_item(f, _facts(3.0)), bucketed) == 0.0  # too short: skipped, nothing decoded
    assert audio_seconds(_item(f, _facts(600.0)), whole) == 600.0
    assert audio_seconds(_item(f, None), bucketed) == float("inf")
    assert audio_seconds(_item(f, _facts(5.0)), None) == float("inf")
    assert LIGHT_AUDIO_S >= 8.0  # LTX's audio buckets (a few seconds) stay light

    def maker(cutter):
        return LatentPixelMaker(parse_buckets(["64x64x1"]), ImageRules(), audio=cutter)

    assert maker(bucketed).is_heavy(_item(f, _facts(9.5))) is False
    assert maker(bucketed).is_heavy(_item(f, _facts(600.0))) is False  # cut to its 8 s bucket
    assert maker(whole).is_heavy(_item(f, _facts(600.0))) is True  # ten minutes decoded whole
    assert maker(whole).is_heavy(_item(f, _facts(LIGHT_AUDIO_S))) is False
    assert maker(bucketed).is_heavy(_item(f, None)) is True  # no duration from the plan: may be long
    # large: a waveform sent at a high source rate (audio.resampler: sinc) travels alone; mono counts one channel
    hi = {**_facts(9.5), "rate": 192000, "channels": 2, "layout": "stereo"}
    assert maker(bucketed).is_heavy(_item(f, hi)) is True  # 8 s x 192 kHz x 2 = 3.1M samples
    assert maker(bucketed).is_heavy(_item(f, {**hi, "rate": 48000})) is False  # 0.77M samples
    assert maker(bucketed).is_heavy(_item(f, {**hi, "rate": 96000, "channels": 1})) is False  # 0.77M, mono
    ffmpeg = AudioCutter(16000, durations=(4.0, 8.0), resampler="ffmpeg")  # sent at 16 kHz stereo whatever the source
    assert maker(ffmpeg).is_heavy(_item(f, hi)) is False
    video = _item(f, None)
    video.kind = "video"
    assert maker(bucketed).is_heavy(video) is True
    image = _item(f, None)
    image.kind = "image"
    assert maker(bucketed).is_heavy(image) is False


def test_scan_probes_audio_files_in_chunks_and_clips_alone(tmp_path):
    """``shardsmith scan`` probes an audio file by its header (milliseconds): in a chunk, as the build sends
    it; a clip's probe decodes a frame and goes alone."""
    from shardsmith.scan.media import ClipProber

    f = tmp_path / "a.flac"
    assert ClipProber.is_heavy(_item(f, _facts(9.5))) is False
    video = _item(f, None)
    video.kind = "video"
    assert ClipProber.is_heavy(video) is True
