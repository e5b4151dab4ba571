"""Video members through the real WebDataset loader (``video`` preset), on real clips.

Clips pan across real photographs (tests/video_factory.py), are encoded with libx264 and
written into shards with ``webdataset.ShardWriter`` (members ``mp4`` and ``txt``), the way
FastGen's dataset README suggests. Expected pixels come from a direct PyAV decode of the
same bytes.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

import video_factory as vf
from shardsmith.formats import SHARD_COUNT_FILE
from shardsmith.loaders import PRESETS, WdsLoader, WdsLoaderConfig, preset_config
from shardsmith.loaders import decoders as dec

FRAMES = 8  # num_frames used by the loader tests (the preset's 81 only in the verify test)
SIZE = (32, 48)  # (H, W)

# (key, frames, (W, H), photo): different aspects, so crops go both ways
GOOD = [("c000", 12, (64, 48), "astronaut"), ("c001", 12, (48, 64), "chelsea"), ("c002", 10, (80, 48), "coffee"),
        ("c003", 9, (64, 64), "rocket"), ("c004", 12, (96, 72), "camera")]


def write_wds(folder: Path, samples: list[tuple[str, bytes, str]], maxcount: int) -> Path:
    folder.mkdir(parents=True)
    with wds.ShardWriter(str(folder / "%05d.tar"), maxcount=maxcount, verbose=0) as sink:
        for key, mp4, caption in samples:
            sink.write({"__key__": key, "mp4": mp4, "txt": caption})
    counts = {}
    for i, start in enumerate(range(0, len(samples), maxcount)):
        counts[f"{i:05d}.tar"] = len(samples[start:start + maxcount])
    (folder / SHARD_COUNT_FILE).write_text(json.dumps(counts))
    return folder


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    d = tmp_path_factory.mktemp("vclips")
    clips = {key: vf.pan_video(d / f"{key}.mp4", frames=n, fps=24, size=size, photo=photo).read_bytes()
             for key, n, size, photo in GOOD}
    short = vf.pan_video(d / "short.mp4", frames=5, fps=24, size=(64, 48), photo="coffee").read_bytes()
    trunc = vf.truncated_video(d / "c000.mp4", d / "trunc.mp4", 0.5).read_bytes()
    good = write_wds(d / "good", [(k, b, f"a clip panning across {k}") for k, b in clips.items()], maxcount=3)
    mixed = [("c000", clips["c000"]), ("c001", clips["c001"]), ("short", short), ("c002", clips["c002"]),
             ("trunc", trunc), ("c003", clips["c003"]), ("c004", clips["c004"])]
    mixed = write_wds(d / "mixed", [(k, b, f"caption {k}") for k, b in mixed], maxcount=4)
    return {"dir": d, "clips": clips, "good": good, "mixed": mixed}


def video_cfg(folder, **kw) -> WdsLoaderConfig:
    return preset_config("video", folder, **{"num_frames": FRAMES, "video_size": SIZE, "deterministic": True,
                                             "partial": True, "batch_size": 2, "num_workers": 0, **kw})


def pyav_frames(data: bytes, n: int) -> np.ndarray:
    """First ``n`` frames as uint8 [n, H, W, 3], straight from PyAV."""
    out = []
    with av.open(io.BytesIO(data)) as c:
        for fr in c.decode(video=0):
            out.append(fr.to_ndarray(format="rgb24"))
            if len(out) == n:
                break
    return np.stack(out)


def reference(frames: np.ndarray, h: int, w: int) -> torch.Tensor:
    """Cover-resize (PIL bicubic), centre crop, /127.5 - 1, as [3, T, H, W] (arithmetic written out here)."""
    sh, sw = frames.shape[1:3]
    s = max(h / sh, w / sw)
    rw, rh = max(w, round(sw * s)), max(h, round(sh * s))
    x0, y0 = (rw - w) // 2, (rh - h) // 2
    out = []
    for f in frames:
        im = Image.fromarray(f)
        if (rw, rh) != (sw, sh):
            im = im.resize((rw, rh), Image.BICUBIC)
        out.append(np.asarray(im)[y0:y0 + h, x0:x0 + w])
    return torch.from_numpy(np.stack(out)).permute(3, 0, 1, 2).float() / 127.5 - 1


# ----------------------------------------------------------------------------- config / preset

def test_video_preset_follows_fastgen_and_validates_its_fields(media):
    cfg = preset_config("video", media["good"])
    assert cfg.key_map == {"real": "mp4", "condition": "txt"} and cfg.presets_map == {"neg_condition": "neg_prompt_wan"}
    assert (cfg.num_frames, tuple(cfg.video_size), cfg.batch_size, cfg.num_workers) == (81, (480, 832), 2, 2)
    WdsLoader(cfg)  # builds: no refusal any more
    with pytest.raises(ValueError, match="num_frames"):
        WdsLoaderConfig(shards=media["good"], key_map={"real": "mp4"})
    with pytest.raises(ValueError, match="num_frames"):
        video_cfg(media["good"], num_frames=0)
    for bad in ((0, 64), (32, -1), 0):
        with pytest.raises(ValueError, match="video_size"):
            video_cfg(media["good"], video_size=bad)
    with pytest.raises(ValueError, match="cropping_params"):
        video_cfg(media["good"], presets_map={"cropping_params": "empty_string"})


# ----------------------------------------------------------------------------- batches

@pytest.mark.parametrize("workers", [0, 2])
def test_loader_yields_fastgen_video_batches(media, workers):
    loader = WdsLoader(video_cfg(media["good"], num_workers=workers))
    keys = []
    for b in loader:
        x = b["real"]
        n = len(b["__key__"])
        assert x.dtype == torch.float32 and x.shape == (n, 3, FRAMES, *SIZE)  # [B, C, T, H, W]
        assert x.min() >= -1 and x.max() <= 1 and x.min() < -0.5 and x.max() > 0.5
        assert b["condition"] == [f"a clip panning across {k}" for k in b["__key__"]]
        assert b["neg_condition"] == [PRESETS["neg_prompt_wan"]] * n
        cp = b["cropping_params"]
        assert set(cp) == {"resize_w", "resize_h", "crop_x0", "crop_y0", "crop_w", "crop_h"}
        assert all(v.dtype == torch.int64 and v.shape == (n,) for v in cp.values())
        assert cp["crop_w"].tolist() == [SIZE[1]] * n and cp["crop_h"].tolist() == [SIZE[0]] * n
        keys += b["__key__"]
    assert sorted(keys) == [k for k, *_ in GOOD]
    assert loader.stats["dropped"] == {} and loader.stats["samples"] == len(GOOD)


def test_decoded_pixels_match_a_direct_pyav_decode(media):
    for key, n, (w, h), photo in GOOD:
        data = media["clips"][key]
        ref = pyav_frames(data, FRAMES)
        raw = dec.decode_member("mp4", data, num_frames=FRAMES)  # no size: untouched uint8 frames
        assert raw.dtype == torch.uint8 and raw.shape == (FRAMES, h, w, 3)
        assert np.array_equal(raw.numpy(), ref)
        # the FIRST frames, in order: frame i is closest to the i-th source frame of the pan
        src = vf.pan_frames(n, (w, h), photo)[:FRAMES].astype(np.float32)
        err = np.abs(ref[:, None].astype(np.float32) - src[None]).mean(axis=(2, 3, 4))  # [decoded, source]
        assert (err.argmin(axis=1) == np.arange(FRAMES)).all() and err.diagonal().max() < 15
        clip = dec.decode_video(data, FRAMES, SIZE)
        assert clip.fps == 24 and clip.source_size == (w, h)
        assert clip.frames.shape == (3, FRAMES, *SIZE) and clip.frames.is_contiguous()
        assert torch.allclose(clip.frames, reference(ref, *SIZE), atol=1e-6)
        assert (clip.frames - reference(ref, *SIZE)).abs().mean() < 1e-6
    # all frames when num_frames is None; a square size as an int
    assert dec.decode_member("mp4", media["clips"]["c003"]).shape == (9, 64, 64, 3)
    assert dec.decode_member("mp4", media["clips"]["c003"], num_frames=9, video_size=16).shape == (3, 9, 16, 16)


@pytest.mark.parametrize("workers", [0, 2])
def test_short_and_truncated_clips_are_dropped_and_counted(media, workers):
    loader = WdsLoader(video_cfg(media["mixed"], num_workers=workers))
    keys = [k for b in loader for k in b["__key__"]]
    assert sorted(keys) == ["c000", "c001", "c002", "c003", "c004"]
    st = loader.stats
    assert st["dropped"] == {"too_short:real": 1, "decode:real": 1}
    assert st["read"] == st["samples"] + 2 == 7
    (short,) = st["examples"]["too_short:real"]
    assert short.startswith("00000.tar/short:") and "5 frame(s)" in short and f"asks for {FRAMES}" in short
    (trunc,) = st["examples"]["decode:real"]
    assert trunc.startswith("00001.tar/trunc:") and "cannot open the video" in trunc
    # strict mode raises instead, naming the member
    with pytest.raises(dec.TooFewFramesError, match="00000.tar/short.mp4: clip has 5 frame"):
        for _ in WdsLoader(video_cfg(media["mixed"], strict=True)):
            pass


def test_corrupt_or_wrong_video_bytes_are_decode_errors(media):
    good = media["clips"]["c000"]
    for bad in (b"", b"not a video at all " * 20, good[: len(good) // 2]):
        with pytest.raises(dec.MemberDecodeError) as ei:
            dec.decode_member("mp4", bad, num_frames=4)
        assert ei.value.reason == "decode"
    with pytest.raises(dec.TooFewFramesError, match="clip has 12 frame\\(s\\) but num_frames asks for 13"):
        dec.decode_member("mp4", good, num_frames=13)


# ----------------------------------------------------------------------------- verify

@pytest.mark.slow
def test_verify_cli_passes_with_the_video_preset(media):
    d = media["dir"]
    # the preset's own geometry (81 frames, 480x832: ~400 MB of float32 per clip, ~2 s to resize on
    # a CPU), so one clip; several workers and drops are covered by the in-process tests above
    clip = vf.pan_video(d / "v0.mp4", frames=81, fps=30, size=(208, 120), photo="astronaut").read_bytes()
    folder = write_wds(d / "verify", [("v0", clip, "a clip")], maxcount=1)
    r = subprocess.run([sys.executable, "-m", "shardsmith", "verify", str(folder), "--preset", "video",
                        "--world", "1", "--workers", "1", "--json"], capture_output=True, text=True,
                       env={**os.environ})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["coverage"]["unique"] == 1
    assert {c["name"] for c in rep["checks"]} >= {"loader_runs", "coverage", "shard_count", "no_drops"}
    real = rep["contract"]["keys"]["real"]
    assert real["shape"] == [3, 81, 480, 832] and real["dtype"] == "float32"
    assert -1 <= real["min"] < 0 < real["max"] <= 1 and real["nan"] == 0
    assert rep["key_map"] == {"real": "mp4", "condition": "txt"}


def test_inspect_checks_video_members_frame_by_frame(media):
    """inspect decodes a video member to the last frame without keeping frames: it counts the
    frames of a good clip and names the truncated one."""
    from shardsmith.loaders.video_decode import count_decodable_frames
    from shardsmith.verify.inspect import inspect_wds

    assert count_decodable_frames(media["clips"]["c000"]) == 12
    with pytest.raises(dec.MemberDecodeError, match="empty video member"):
        count_decodable_frames(b"")
    rep = inspect_wds(media["mixed"])
    corrupt = [c for s in rep["shards"] for c in s["corrupt"]]
    assert [c["key"] for c in corrupt] == ["trunc"] and corrupt[0]["suffix"] == "mp4"
    assert rep["totals"]["corrupt_members"] == 1

