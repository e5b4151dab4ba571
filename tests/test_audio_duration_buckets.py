"""An audio-only dataset cut to several ``audio.durations`` gives one latent shape per duration; a
``latent_wds`` output of it is one WebDataset folder per duration (``audio_<ms>ms/``) with ``buckets.json``,
as geometry buckets are, so every batch stacks (it was one folder mixing the shapes: exit 0, then verify
FAILED and a batch of 2 could not be stacked)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest
import torch

from shardsmith.formats.wds import (BUCKETS_INDEX_FILE, SHARD_COUNT_FILE, audio_bucket, bucket_folder, bucket_frames,
                                    is_bucket_folder)
from video_factory import audio_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# seconds of speech per file: 2.0 s bucket x3, 1.0 s bucket x3, one too short for either
FILES = {"a.wav": 2.6, "b.flac": 2.2, "c.wav": 2.05, "d.flac": 1.3, "e.wav": 1.5, "f.wav": 1.1, "g.wav": 0.4}


def test_audio_bucket_names_are_folders_and_identifiers():
    assert [audio_bucket(d) for d in (4.0, 0.5, 8, 0.0125)] == ["audio_4000ms", "audio_500ms", "audio_8000ms",
                                                                "audio_12p5ms"]
    for d in (4.0, 0.5, 0.0125):
        name = audio_bucket(d)
        assert is_bucket_folder(name) and bucket_folder(name) == name and name.isidentifier()
        assert bucket_frames(name) == 0
    assert bucket_frames("64x64x17") == 17
    assert not is_bucket_folder("audio_4s") and not is_bucket_folder("audio_4000ms.tar")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True)


def _shapes(folder):
    """``audio_latent.pth`` shape of every sample of every shard in ``folder``."""
    out = []
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".audio_latent.pth"):
                    out.append(tuple(torch.load(io.BytesIO(tf.extractfile(m).read()), weights_only=True).shape))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("audio_buckets")
    src = root / "src"
    src.mkdir()
    for name, dur in FILES.items():
        audio_file(src / name, kind="speech", duration=dur, rate=22050, layout="mono")
    recipe = root / "r.yaml"
    recipe.write_text(json.dumps({
        "sources": [{"path": str(src)}], "split": {"dedup": False},
        "models": {"audio_vae": {"family": "ltx2_audio", "config": "tiny"}, "batch_size": 2},
        "audio": {"durations": [1.0, 2.0]},
        "outputs": [{"format": "latent_wds", "dir": "alat", "samples_per_shard": 2}]}))
    r = _cli("build", recipe, "--out", root / "out", "--no-report")
    assert r.returncode == 0, r.stderr
    return root, recipe, r


@pytest.mark.slow
def test_one_folder_per_duration_each_of_one_latent_shape(built):
    root, _, r = built
    lat = root / "out" / "alat"
    index = json.loads((lat / BUCKETS_INDEX_FILE).read_text())
    assert sorted(index) == ["audio_1000ms", "audio_2000ms"]
    assert not list(lat.glob("*.tar"))  # nothing of mixed shape at the top
    for bucket, n in (("audio_1000ms", 3), ("audio_2000ms", 3)):
        entry = index[bucket]
        shapes = _shapes(lat / entry["dir"])
        assert entry["samples"] == n == len(shapes) and set(shapes) == {tuple(entry["latent_shape"])}
        counts = json.loads((lat / entry["dir"] / SHARD_COUNT_FILE).read_text())
        assert sum(counts.values()) == n and sorted(counts) == sorted(p.name for p in (lat / entry["dir"]).glob("*.tar"))
    short, long_ = index["audio_1000ms"]["latent_shape"], index["audio_2000ms"]["latent_shape"]
    assert short[0] == long_[0] and short[2] == long_[2] and short[1] < long_[1]  # [C, T, F]: T by duration
    out = r.stdout + r.stderr
    assert f"bucket audio_1000ms: 3 sample(s), audio latent {'x'.join(map(str, short))}" in " ".join(out.split())
    assert "crop keeps" not in out  # no video geometry for audio


@pytest.mark.slow
def test_every_batch_stacks_and_verify_and_a_rerun_pass(built):
    from shardsmith.loaders.buckets import BucketedWdsLoader
    from shardsmith.loaders.presets import build_loader, preset_config

    root, recipe, _ = built
    lat = root / "out" / "alat"
    cfg = preset_config("video_latent", lat, key_map={"real": "audio_latent.pth"}, files_map={},
                        deterministic=True, batch_size=3, num_workers=0)
    ld = build_loader(cfg)
    assert isinstance(ld, BucketedWdsLoader)
    got = {tuple(b["real"].shape) for b in ld}
    assert len(got) == 2 and {s[0] for s in got} == {3}  # one batch per duration, stacked
    v = _cli("verify", lat, "--world", 1, "--workers", 1, "--batch-size", 1)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "bucket audio_2000ms: 3 sample(s)" in v.stdout
    again = _cli("build", recipe, "--out", root / "out", "--no-report")
    assert again.returncode == 0, again.stderr
    assert json.loads((lat / BUCKETS_INDEX_FILE).read_text())["audio_1000ms"]["samples"] == 3


@pytest.mark.slow
def test_one_duration_stays_one_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.wav", "d.flac"):
        audio_file(src / name, kind="speech", duration=FILES[name], rate=22050, layout="mono")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps({
        "sources": [{"path": str(src)}],
        "models": {"audio_vae": {"family": "ltx2_audio", "config": "tiny"}},
        "audio": {"durations": [1.0]}, "outputs": [{"format": "latent_wds", "dir": "alat"}]}))
    r = _cli("build", recipe, "--out", tmp_path / "out", "--no-report")
    assert r.returncode == 0, r.stderr
    lat = tmp_path / "out" / "alat"
    assert not (lat / BUCKETS_INDEX_FILE).exists() and len(set(_shapes(lat))) == 1 and len(_shapes(lat)) == 2
