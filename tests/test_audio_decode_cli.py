"""``shardsmith decode`` on a build with audio latents (issue 17): each ``audio_latents/<rel>.pt`` (and each
``audio_latent.pth`` member) becomes ``<rel>.wav`` through the recorded audio VAE's decoder and vocoder,
journalled like the pictures (``--overwrite`` replaces exactly them), and the report says loudly that
the weights are random."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from shardsmith.build import build
from shardsmith.encode.audio_vae import load_audio_vae, wav_bytes
from shardsmith.recipe import recipe_from_dict
from shardsmith.verify.decode import DecodeError, decode
from video_factory import audio_file, pan_video

pytestmark = pytest.mark.slow

FPS = 24
BUCKET = "64x64x17"  # 17 frames at 24 fps: 0.708 s of audio per sample


def cli(*args):
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.fixture(scope="module")
def av_build(tmp_path_factory):
    """Two clips with speech (one under a subfolder), one build with a precomputed tree and latent shards."""
    src = tmp_path_factory.mktemp("adec_src")
    (src / "sub").mkdir()
    for path, photo in ((src / "talk.mp4", "astronaut"), (src / "sub" / "chat.mp4", "coffee")):
        pan_video(path, frames=30, fps=FPS, size=(96, 64), photo=photo, audio="speech")
        path.with_suffix(".txt").write_text(f"{photo} talking", encoding="utf-8")
    out = tmp_path_factory.mktemp("adec") / "out"
    rec = {"sources": [{"path": str(src)}], "geometry": {"buckets": [BUCKET]},
           "models": {"vae": {"family": "ltx"}, "text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"},
                      "batch_size": 2},
           "outputs": [{"format": "precomputed"}, {"format": "latent_wds", "dir": "lat"}]}
    build(recipe_from_dict(rec), out, quiet=True)
    return out


@pytest.fixture(scope="module")
def audio_vae():
    """The audio VAE the build recorded (tiny config, seeded random weights), to decode independently."""
    return load_audio_vae("ltx2_audio", config="tiny")


def _wav(path: Path) -> tuple[int, int, int, int]:
    with wave.open(str(path)) as w:
        return w.getnchannels(), w.getframerate(), w.getsampwidth(), w.getnframes()


def _expected_frames(avae, t: int) -> int:
    """Samples the vocoder gives for T latent steps: the decoder's 4T - 3 mel frames, times its upsampling."""
    return (avae.settings.temporal * t - 3) * math.prod(avae.vocoder.config.upsample_factors)


def test_decode_writes_one_wav_per_audio_latent(av_build, audio_vae, tmp_path):
    out = av_build
    dec = tmp_path / "dec"
    r = cli("decode", out, "--out", dec, "--device", "cpu", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"decoded 2 WAV(s) of precomputed/train at 24000 Hz (stereo, 16-bit) into {dec}" in r.stdout
    assert "note: the audio VAE has RANDOM WEIGHTS: the sounds are meaningless" in r.stdout
    assert "note: the VAE has RANDOM WEIGHTS" in r.stdout  # the pictures' note too
    tree = out / ".precomputed" / "audio_latents"
    rels = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*.pt"))
    assert rels == ["sub/chat.pt", "talk.pt"]
    assert sorted(p.relative_to(dec).as_posix() for p in dec.rglob("*.wav")) == ["sub/chat.wav", "talk.wav"]
    assert audio_vae.output_rate == 24000 and math.prod(audio_vae.vocoder.config.upsample_factors) == 240
    for rel in rels:
        lat = torch.load(tree / rel, weights_only=True)["latents"]
        t = lat.shape[1]
        assert t == 18  # 0.708 s at 16 kHz: 11333 samples -> 71 mel frames -> 18 latent steps
        wav_file = dec / Path(rel).with_suffix(".wav")
        assert _wav(wav_file) == (2, 24000, 2, _expected_frames(audio_vae, t)) == (2, 24000, 2, 16560)
        wave_, rate = audio_vae.decode(lat[None])
        assert wav_file.read_bytes() == wav_bytes(wave_[0].numpy(), rate)  # the recorded VAE's very sound
        with wave.open(str(wav_file)) as w:
            assert np.abs(np.frombuffer(w.readframes(w.getnframes()), "<i2")).max() > 0
    rep = json.loads((dec / "decode_report.json").read_text())
    a = rep["audio"]
    assert (a["wavs"], a["rate"], a["random_weights"]) == (2, 24000, True) and "RANDOM WEIGHTS" in a["note"]
    assert {row["file"]: (row["samples"], row["latent_shape"]) for row in a["rows"]} == {
        "talk.wav": (16560, [2, 18, 16]), "sub/chat.wav": (16560, [2, 18, 16])}
    assert rep["samples"] == 2 and {row["file"] for row in rep["rows"]} == {"talk.mp4", "sub/chat.mp4"}
    journal = (dec / ".decode_files").read_text().split()
    assert sorted(journal) == ["sub/chat.mp4", "sub/chat.wav", "talk.mp4", "talk.wav"]


def test_overwrite_replaces_exactly_the_decode(av_build, tmp_path):
    out = av_build
    dec = tmp_path / "dec"
    decode(out, dec, device="cpu", limit=1)  # an earlier, smaller decode: one picture, one WAV
    assert sorted(p.relative_to(dec).as_posix() for p in dec.rglob("*") if p.is_file()) == [
        ".decode_files", ".shardsmith/lock", "decode_report.json", "sub/chat.mp4", "sub/chat.wav"]  # (its lock)
    before = (dec / "sub" / "chat.wav").read_bytes()
    r = cli("decode", out, "--out", dec, "--device", "cpu", "-q")
    assert r.returncode == 2 and "holds an earlier decode" in r.stderr and "--overwrite" in r.stderr
    r = cli("decode", out, "--out", dec, "--device", "cpu", "-q", "--overwrite")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.relative_to(dec).as_posix() for p in dec.rglob("*") if p.is_file()) == [
        ".decode_files", ".shardsmith/lock", "decode_report.json", "sub/chat.mp4", "sub/chat.wav", "talk.mp4",
        "talk.wav"]
    assert (dec / "sub" / "chat.wav").read_bytes() == before
    assert sorted((dec / ".decode_files").read_text().split()) == ["sub/chat.mp4", "sub/chat.wav", "talk.mp4",
                                                                    "talk.wav"]
    # a file decode did not write: refused even with --overwrite, and kept
    (dec / "sub" / "mine.wav").write_bytes(b"mine")
    with pytest.raises(DecodeError, match="holds files decode did not write: sub/mine.wav"):
        decode(out, dec, device="cpu", overwrite=True)
    assert (dec / "sub" / "mine.wav").read_bytes() == b"mine" and (dec / "talk.wav").is_file()


def test_latent_shards_decode_to_the_same_wavs(av_build, tmp_path):
    out = av_build
    pre = decode(out, tmp_path / "pre", device="cpu", output="precomputed")
    lat = decode(out, tmp_path / "lat", device="cpu", output="latent_wds")
    assert lat["audio"]["wavs"] == pre["audio"]["wavs"] == 2
    for name in ("talk.wav", "sub/chat.wav"):
        assert (tmp_path / "lat" / name).read_bytes() == (tmp_path / "pre" / name).read_bytes()
    assert [r["latent_duration"] for r in lat["audio"]["rows"]] == pytest.approx([17 / FPS] * 2, abs=1e-9)


def test_an_audio_only_dataset_decodes_its_audio(tmp_path, audio_vae):
    src = tmp_path / "src"
    src.mkdir()
    audio_file(src / "voice.wav", kind="speech", duration=1.3, rate=22050, layout="mono")
    (src / "voice.txt").write_text("a voice", encoding="utf-8")
    rec = {"sources": [{"path": str(src)}],
           "models": {"text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"}},
           "audio": {"durations": "1.0"}, "outputs": [{"format": "precomputed"}]}
    build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    rep = decode(tmp_path / "out", tmp_path / "dec", device="cpu")
    assert rep["samples"] == 0 and rep["rows"] == [] and rep["audio"]["wavs"] == 1
    latent = torch.load(tmp_path / "out" / ".precomputed" / "audio_latents" / "voice.pt", weights_only=True)
    t = latent["latents"].shape[1]
    assert t == 26  # 1.0 s at 16 kHz: 16000 samples -> 101 mel frames -> 26 latent steps
    assert _wav(tmp_path / "dec" / "voice.wav") == (2, 24000, 2, _expected_frames(audio_vae, t))
    assert sorted(p.name for p in (tmp_path / "dec").iterdir()) == [".decode_files", ".shardsmith",
                                                                    "decode_report.json", "voice.wav"]


def test_an_audio_vae_without_a_vocoder_is_refused_before_anything_is_written(av_build, tmp_path):
    """A build whose recorded audio VAE has no vocoder (a dict config with ``vocoder: null``; a pretrained
    folder without ``vocoder/``) cannot make sound: refused, naming the fix, with nothing written."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(av_build, out)
    m = json.loads((out / "manifest.json").read_text())
    m["recipe"]["models"]["audio_vae"]["config"] = {"base_channels": 32, "ch_mult": [1, 1, 1], "num_res_blocks": 1,
                                                    "latent_channels": 2, "vocoder": None}
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DecodeError, match=r"has no vocoder.*put the vocoder in vocoder/ beside the audio VAE"):
        decode(out, tmp_path / "dec", device="cpu")
    assert not (tmp_path / "dec").exists() or not any((tmp_path / "dec").iterdir())
