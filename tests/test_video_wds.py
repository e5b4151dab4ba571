"""``format: video_wds`` (issue 15): real clips in, shards read back by ``webdataset`` and PyAV,
``shardsmith verify --preset video`` through the CLI, byte-identical rebuilds, passthrough."""

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import webdataset as wds

from media_factory import real_photos, write_table
from shardsmith.build import build
from shardsmith.recipe import RecipeError, recipe_from_dict
from shardsmith.transform.video_samples import encode_mp4
from video_factory import captioned_clips_table, pan_frames, pan_video

PY = sys.executable
BUCKETS = ["128x128x9", "256x160x17"]


def cli(*args):
    return subprocess.run([PY, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ})


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """A captioned table of real clips and photos: ``long`` (256x160, 20 frames: cut to 17),
    ``short`` (5 frames: too short), ``mid`` (12 frames: cut to 9), ``exact`` (an H.264 mp4 of
    exactly the 128x128x9 bucket at 24 fps, with an AAC track), ``fast`` (48 fps with audio:
    resampled to 24 fps), ``turned`` (128x128x9 with a display rotation), ``bare`` (no caption)
    and two photos. (Sizes of 128 and more: x264 is not reproducible on tiny frames such as 96x64.)"""
    root = tmp_path_factory.mktemp("vclips")
    media = root / "media"
    media.mkdir()
    pan_video(media / "long.mp4", frames=20, fps=24, size=(256, 160))
    pan_video(media / "short.mp4", frames=5, fps=24, size=(128, 128), photo="chelsea")
    pan_video(media / "mid.mp4", frames=12, fps=24, size=(128, 128), photo="coffee")
    pan_video(media / "exact.mp4", frames=9, fps=24, size=(128, 128), photo="rocket", audio="tone")
    pan_video(media / "fast.mp4", frames=18, fps=48, size=(128, 128), photo="camera", audio="tone")
    pan_video(media / "turned.mp4", frames=9, fps=24, size=(128, 128), photo="chelsea", rotation=90)
    pan_video(media / "bare.mp4", frames=9, fps=24, size=(128, 128), photo="coffee")
    shots = real_photos(media, 2, seed=5, min_side=70, max_side=100)
    rows = [{"media": "media/long.mp4", "caption": "a slow pan across an astronaut"},
            {"media": "media/short.mp4", "caption": "a cat, far too short"},
            {"media": "media/mid.mp4", "caption": "a cup of coffee seen from above"},
            {"media": "media/exact.mp4", "caption": "a rocket, already in its bucket"},
            {"media": "media/fast.mp4", "caption": "a camera man at 48 fps"},
            {"media": "media/turned.mp4", "caption": "a cat, turned on its side"},
            {"media": "media/bare.mp4"},
            *({"media": f"media/{p.name}", "caption": f"still photo {p.stem}"} for p in shots)]
    return write_table(root, rows, "jsonl"), rows, root


def _spec(table):
    return {"sources": [{"path": str(table)}], "geometry": {"buckets": BUCKETS, "fps": 24},
            "outputs": [{"format": "video_wds", "samples_per_shard": 3},
                        {"format": "video_wds", "name": "again", "dir": "reenc", "passthrough": False,
                         "require_caption": False, "crf": 30, "preset": "veryfast"}]}


@pytest.fixture(scope="module")
def built(clips, tmp_path_factory):
    table, rows, root = clips
    out = tmp_path_factory.mktemp("vbuild") / "out"
    m = build(recipe_from_dict(_spec(table)), out, quiet=True, workers=2)
    return out, m, rows, root


def _read(folder: Path) -> dict[str, dict]:
    """Every sample of ``folder``'s shards as the ``webdataset`` package reads them, by key."""
    shards = sorted(str(p) for p in folder.glob("*.tar"))
    return {s["__key__"]: s for s in wds.WebDataset(shards, shardshuffle=False)}


def _clip(data: bytes) -> tuple[np.ndarray, float, list[str]]:
    """PyAV: (every decoded frame uint8 [F, H, W, 3], average fps, stream types) of an mp4's bytes."""
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(s)])
        return frames, float(s.average_rate), sorted(x.type for x in c.streams)


@pytest.mark.slow
def test_shards_read_back_with_webdataset_and_pyav(built):
    out, m, rows, root = built
    samples = _read(out / "videos")
    captions = {r["media"]: r.get("caption") for r in rows}
    assert len(samples) == 5  # long, mid, exact, fast, turned (short: too short; bare: no caption)
    for key, s in samples.items():
        assert set(k for k in s if not k.startswith("__")) == {"mp4", "txt", "json"}, key
        meta = json.loads(s["json"])
        assert s["txt"].decode() == captions[meta["path"]] == meta["caption"]
        w, h, f = (int(v) for v in meta["bucket"].split("x"))
        frames, fps, _ = _clip(s["mp4"])
        assert frames.shape == (f, h, w, 3), (key, frames.shape)
        assert fps == 24 and meta["fps"] == 24 and meta["frames"] == f and meta["size"] == [w, h]
        assert meta["sha256"] == hashlib.sha256((root / meta["path"]).read_bytes()).hexdigest()
    by_path = {json.loads(s["json"])["path"]: s for s in samples.values()}
    # the clip that already matches its bucket: the file's bytes, audio and all
    exact = by_path["media/exact.mp4"]
    assert exact["mp4"] == (root / "media/exact.mp4").read_bytes()
    meta = json.loads(exact["json"])
    assert meta["passthrough"] is True and meta["audio"] == "kept" and _clip(exact["mp4"])[2] == ["audio", "video"]
    # 48 fps with audio: every other frame at 24 fps, re-encoded, audio dropped
    fast = json.loads(by_path["media/fast.mp4"]["json"])
    assert fast["passthrough"] is False and fast["audio"] == "dropped" and fast["original_fps"] == 48
    assert fast["frame_indices"] == list(range(0, 18, 2)) and _clip(by_path["media/fast.mp4"]["mp4"])[2] == ["video"]
    # a display rotation is applied (video loaders ignore it): upright, re-encoded
    assert json.loads(by_path["media/turned.mp4"]["json"])["passthrough"] is False
    long = json.loads(by_path["media/long.mp4"]["json"])
    assert long["bucket"] == "256x160x17" and long["original_frames"] == 20 and long["passthrough"] is False
    assert long["crop"] == {"resize_w": 256, "resize_h": 160, "crop_x0": 0, "crop_y0": 0, "crop_w": 256, "crop_h": 160}
    # the re-encoded pixels are the source's frames (lossy, but close)
    src, _, _ = _clip((root / "media/long.mp4").read_bytes())
    got, _, _ = _clip(by_path["media/long.mp4"]["mp4"])
    assert np.abs(got.astype(int) - src[:17].astype(int)).mean() < 6


@pytest.mark.slow
def test_skips_and_counts_reconcile(built):
    out, m, rows, root = built
    c = m["outputs"]["video_wds"]["counts"]
    assert c["inputs"] == len(rows) == 9
    assert c["written"] == 5 and c["failed"] == {}
    assert c["skipped"] == {"too_short": 1, "unsupported_kind_image": 2, "no_caption": 1}
    assert c["inputs"] == c["written"] + sum(c["skipped"].values()) + sum(c["failed"].values())
    img = c["examples"]["skipped:unsupported_kind_image"]["detail"]
    assert "video_wds" in img and "image media" in img
    assert "condition is the txt member" in c["examples"]["skipped:no_caption"]["detail"]
    counts = json.loads((out / "videos" / "shard_count.json").read_text())
    assert sum(counts.values()) == 5
    # passthrough: false re-encodes the matching clip too; require_caption: false writes an empty txt
    again = m["outputs"]["again"]["counts"]
    assert again["written"] == 6 and again["skipped"] == {"too_short": 1, "unsupported_kind_image": 2}
    re = {json.loads(s["json"])["path"]: s for s in _read(out / "reenc").values()}
    assert re["media/bare.mp4"]["txt"] == b""
    exact = json.loads(re["media/exact.mp4"]["json"])
    assert exact["passthrough"] is False and exact["reencoded_because"] == "passthrough: false"
    assert exact["audio"] == "dropped" and re["media/exact.mp4"]["mp4"] != (root / "media/exact.mp4").read_bytes()
    assert _clip(re["media/exact.mp4"]["mp4"])[0].shape == (9, 128, 128, 3)


@pytest.mark.slow
def test_two_builds_are_byte_identical(built, clips, tmp_path):
    out, _, _, _ = built
    table, _, _ = clips
    build(recipe_from_dict(_spec(table)), tmp_path / "out", quiet=True, workers=1)
    for d in ("videos", "reenc"):
        files = sorted(p.name for p in (out / d).iterdir())
        assert files == sorted(p.name for p in (tmp_path / "out" / d).iterdir())
        for name in files:
            assert (out / d / name).read_bytes() == (tmp_path / "out" / d / name).read_bytes(), (d, name)


@pytest.mark.slow
def test_verify_video_preset_through_the_cli(built):
    out, _, _, _ = built
    r = cli("verify", out / "videos", "--preset", "video", "--set", "num_frames=9", "--set", "video_size=[128,128]",
            "--world", "1", "--workers", "1", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["key_map"] == {"real": "mp4", "condition": "txt"}
    checks = {c["name"]: c for c in rep["checks"]}
    assert checks["coverage"]["ok"] and "5 of 5" in checks["coverage"]["detail"]
    assert checks["manifest"]["ok"] and "written=5" in checks["manifest"]["detail"]
    real = rep["contract"]["keys"]["real"]
    assert real["shape"] == [3, 9, 128, 128] and real["samples"] == rep["contract"]["samples"] == 5


@pytest.mark.slow
def test_verify_set_names_a_bad_loader_key(tmp_path):
    r = cli("verify", tmp_path, "--preset", "video", "--set", "num_frame=9")
    assert r.returncode == 2 and "--set num_frame" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("geometry, says", [
    ({}, "there is none"),
    ({"buckets": ["64x64x1"]}, "more than 1 frame"),
    ({"buckets": ["65x64x9"]}, "odd width"),
])
def test_recipe_without_clip_buckets_is_refused(tmp_path, geometry, says):
    with pytest.raises(RecipeError, match=says):
        recipe_from_dict({"sources": [{"path": str(tmp_path)}], "geometry": geometry,
                          "outputs": [{"format": "video_wds"}]})


def test_encode_mp4_is_deterministic():
    frames = pan_frames(9, (128, 96), "coffee")
    a, b = encode_mp4(frames, 24.0), encode_mp4(frames, 24.0)
    assert a == b and b"Lavf" not in a  # bit-exact muxer: no version string, no creation time
    got, fps, kinds = _clip(a)
    assert got.shape == (9, 96, 128, 3) and fps == 24 and kinds == ["video"]
    # tiny frames at crf 23: with x264's macroblock-tree rate control this FFmpeg build gave 5 different
    # byte strings in 12 runs; without it, one
    small = pan_frames(24, (96, 64), "astronaut")
    assert len({encode_mp4(small, 24.0, crf=23) for _ in range(8)}) == 1


@pytest.mark.slow
def test_latent_wds_include_media_writes_the_caption(tmp_path):
    """``include_media`` stores the clip and, now, its caption: FastGen's raw video key_map
    ``{real: mp4, condition: txt}`` finds both."""
    table, rows = captioned_clips_table(tmp_path / "src", photos=0)
    build(recipe_from_dict({"sources": [{"path": str(table)}], "geometry": {"buckets": ["64x64x9"]},
                            "models": {"vae": {"family": "ltx"}},
                            "outputs": [{"format": "latent_wds", "dir": "lat", "include_media": True}]}),
          tmp_path / "out", quiet=True, workers=1)
    samples = _read(tmp_path / "out" / "lat")
    captions = {r["media"]: r["caption"] for r in rows}
    assert len(samples) == 2  # pan_long (96x64, closest bucket 64x64x9) and pan_mid; pan_short is too short
    for s in samples.values():
        assert "mp4" in s and s["txt"].decode() == captions[json.loads(s["json"])["path"]]
