"""Partners of latent samples (issue 18): an IC-LoRA reference, an edit's source and the first frame are
cut with their target's one geometry, encoded by the same VAE and written beside the target's latents
(``reference_latents/``, ``ref_latent.pth``, ``src_latent.pth``, ``first_frame.jpg`` /
``first_frame_latent.pth``); a partner that cannot line up fails the item, naming it."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

from media_factory import source_photo
from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict
from shardsmith.records import MediaRef, PlannedItem
from shardsmith.transform.buckets import parse_buckets
from shardsmith.transform.geometry import decide
from shardsmith.transform.partners import PartnerCutter
from shardsmith.transform.video import decode_frames, resize_crop_frames
from video_factory import pan_video

pytestmark = pytest.mark.slow
FPS = 24


def _item(target, **partners) -> PlannedItem:
    media = {"target": MediaRef(str(target), target.name, "video")}
    for role, p in partners.items():
        media[role] = MediaRef(str(p), p.name, "video" if p.suffix == ".mp4" else "image")
    return PlannedItem(0, "s/t", "t", 0, str(target), target.name, "c", None, None, {}, None, None, "video", None,
                       None, None, None, "train", "ok", media=media)


def test_a_reference_at_another_resolution_lands_on_the_targets_pixels(tmp_path):
    target = pan_video(tmp_path / "t.mp4", frames=30, fps=FPS, size=(192, 128), photo="coffee")
    ref = pan_video(tmp_path / "r.mp4", frames=30, fps=FPS, size=(96, 64), photo="coffee")
    geom = decide(192, 128, parse_buckets(["64x64x17"])[0], frame_indices=list(range(3, 20)), fps=FPS)
    pixels = resize_crop_frames(decode_frames(str(target), list(geom.frame_indices), "t"), geom)
    got = PartnerCutter(("reference", "first_frame")).cut(_item(target, reference=ref), geom, pixels)
    assert got["reference"].shape == pixels.shape == (17, 64, 64, 3)
    # the same pan at half the resolution: after the same crop the pictures agree (to the codecs' and the
    # resizes' loss), far better than the same frames 4 px to the side or 3 frames later would
    ref_px, tgt = got["reference"].astype(int), pixels.astype(int)
    aligned = np.abs(ref_px - tgt).mean()
    shifted = np.abs(ref_px[:, :, 4:] - tgt[:, :, :-4]).mean()
    later = np.abs(ref_px[:-3] - tgt[3:]).mean()
    assert aligned < 8 and aligned < 0.6 * min(shifted, later), (aligned, shifted, later)
    assert np.array_equal(got["first_frame"], pixels[:1])  # the first frame after the crop, never re-decoded


def test_a_reference_of_another_shape_or_length_is_refused(tmp_path):
    from shardsmith.records import ItemError

    target = pan_video(tmp_path / "t.mp4", frames=30, fps=FPS, size=(192, 128))
    wide = pan_video(tmp_path / "w.mp4", frames=30, fps=FPS, size=(192, 96))
    short = pan_video(tmp_path / "s.mp4", frames=10, fps=FPS, size=(96, 64))
    geom = decide(192, 128, parse_buckets(["64x64x17"])[0], frame_indices=list(range(17)), fps=FPS)
    px = np.zeros((17, 64, 64, 3), np.uint8)
    with pytest.raises(ItemError) as e:
        PartnerCutter(("reference",)).cut(_item(target, reference=wide), geom, px)
    assert e.value.reason == "reference_geometry_mismatch" and "192x96" in e.value.detail
    with pytest.raises(ItemError) as e:
        PartnerCutter(("reference",)).cut(_item(target, reference=short), geom, px)
    assert e.value.reason == "reference_too_short"


def _ic_table(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rows = ["clip,ref,caption"]
    for i, photo in enumerate(("astronaut", "coffee")):
        pan_video(src / f"c{i}.mp4", frames=30, fps=FPS, size=(128, 128), photo=photo)
        pan_video(src / f"r{i}.mp4", frames=30, fps=FPS, size=(64, 64), photo=photo)
        rows.append(f"c{i}.mp4,r{i}.mp4,clip {i}")
    pan_video(src / "c2.mp4", frames=30, fps=FPS, size=(128, 128), photo="chelsea")
    rows.append("c2.mp4,,a clip without its reference")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")
    return {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "clip", "reference": "ref",
                                                                   "caption": "caption"}}],
            "mode": "v2v-ic", "geometry": {"buckets": ["64x64x17"]},
            "models": {"vae": {"family": "ltx2"}, "text": {"family": "ltx2"}, "batch_size": 2}}


def test_ic_lora_references_in_both_latent_outputs(tmp_path):
    rec = _ic_table(tmp_path)
    rec["outputs"] = [{"format": "precomputed"}, {"format": "latent_wds", "dir": "lat"}]
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["outputs"]["precomputed"]["counts"]["failed"] == {"missing_reference": 1}
    tree = tmp_path / "out" / ".precomputed"
    assert sorted(p.name for p in (tree / "reference_latents").rglob("*.pt")) == ["c0.pt", "c1.pt"]
    for name in ("c0.pt", "c1.pt"):
        v = torch.load(tree / "latents" / name, weights_only=True)
        r = torch.load(tree / "reference_latents" / name, weights_only=True)
        assert r["latents"].shape == v["latents"].shape and r["fps"] == v["fps"]
        assert not torch.equal(r["latents"], v["latents"])  # the reference's own pixels
    with tarfile.open(tmp_path / "out" / "lat" / "00000.tar") as tf:
        members = {x.name: tf.extractfile(x).read() for x in tf.getmembers()}
    pre = torch.load(tree / "reference_latents" / "c0.pt", weights_only=True)["latents"]
    wds = torch.load(io.BytesIO(members["c0.ref_latent.pth"]), weights_only=True)
    assert torch.equal(wds.to(pre.dtype), pre)
    assert {k.split(".", 1)[0] for k in members if k.endswith("ref_latent.pth")} == {"c0", "c1"}
    from shardsmith.verify.runner import verify

    rep = verify(tree)
    assert rep["mode"] == "v2v-ic" and rep["mode_from"] == "stamp" and rep["ok"], rep["checks"]


def test_i2v_first_frames(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i, photo in enumerate(("astronaut", "rocket")):
        pan_video(src / f"c{i}.mp4", frames=30, fps=FPS, size=(96, 64), photo=photo)
    rec = {"sources": [{"path": str(src)}], "mode": "i2v", "geometry": {"buckets": ["64x64x17"]},
           "models": {"vae": {"family": "ltx2"}}, "outputs": [{"format": "latent_wds", "dir": "lat"}]}
    build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    with tarfile.open(tmp_path / "out" / "lat" / "00000.tar") as tf:
        members = {x.name: tf.extractfile(x).read() for x in tf.getmembers()}
    for key in ("c0", "c1"):
        img = np.asarray(Image.open(io.BytesIO(members[f"{key}.first_frame.jpg"])))
        lat = torch.load(io.BytesIO(members[f"{key}.latent.pth"]), weights_only=True)
        ff = torch.load(io.BytesIO(members[f"{key}.first_frame_latent.pth"]), weights_only=True)
        assert img.shape == (64, 64, 3) and ff.shape == (lat.shape[0], 1, *lat.shape[2:])
        geom = decide(96, 64, parse_buckets(["64x64x17"])[0], frame_indices=[0], fps=FPS)
        first = resize_crop_frames(decode_frames(str(src / f"{key}.mp4"), [0], key), geom)[0]
        assert np.abs(img.astype(int) - first.astype(int)).mean() < 2.0  # JPEG q95 of the very frame


def test_image_edit_source_latents(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    photo = source_photo("astronaut").convert("RGB").resize((96, 96))
    photo.save(src / "before.png")
    edited = np.asarray(photo).copy()
    edited[20:40, 30:60] = 255
    Image.fromarray(edited).save(src / "after.png")
    photo.resize((48, 48)).save(src / "before_small.png")
    (src / "rows.csv").write_text("target,before,instruction\nafter.png,before.png,paint a white box\n"
                                  "after.png,before_small.png,the same edit from a smaller source\n")
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "target", "source": "before",
                                                                  "caption": "instruction"}}],
           "mode": "image-edit", "split": {"dedup": False}, "geometry": {"buckets": ["64x64x1"]},
           "images": {"upscale": True}, "models": {"vae": {"family": "sd"}},
           "outputs": [{"format": "latent_wds", "dir": "lat"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 2
    with tarfile.open(tmp_path / "out" / "lat" / "00000.tar") as tf:
        members = {x.name: tf.extractfile(x).read() for x in tf.getmembers()}
    keys = sorted(k.rsplit(".", 2)[0] for k in members if k.endswith(".src_latent.pth"))
    assert len(keys) == 2
    for k in keys:
        lat = torch.load(io.BytesIO(members[f"{k}.latent.pth"]), weights_only=True)
        srcl = torch.load(io.BytesIO(members[f"{k}.src_latent.pth"]), weights_only=True)
        assert srcl.shape == lat.shape and not torch.equal(srcl, lat)


def test_reference_scale_factors(tmp_path):
    """LTX's --reference-downscale-factor / --reference-temporal-scale-factor: the reference keeps the
    target's view at 1/k the size, and the target's first frame then every k-th, at fps / k."""
    cutter = PartnerCutter(("reference",), downscale=2, temporal_scale=2)
    assert cutter.reference_frames(17) == [0, 1, 3, 5, 7, 9, 11, 13, 15]
    assert PartnerCutter(("reference",)).reference_frames(5) == [0, 1, 2, 3, 4]
    rec = _ic_table(tmp_path)
    rec["geometry"] = {"buckets": ["128x128x17"], "reference_downscale_factor": 2,
                       "reference_temporal_scale_factor": 2}
    rec["outputs"] = [{"format": "precomputed"}]
    build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    tree = tmp_path / "out" / ".precomputed"
    v = torch.load(tree / "latents" / "c0.pt", weights_only=True)
    r = torch.load(tree / "reference_latents" / "c0.pt", weights_only=True)
    assert list(v["latents"].shape[1:]) == [3, 4, 4] and list(r["latents"].shape[1:]) == [2, 2, 2]  # 9 frames, 64 px
    assert r["fps"] == v["fps"] / 2


def test_reference_scale_factors_the_vae_cannot_encode_are_refused(tmp_path):
    from shardsmith.precheck import precheck
    from shardsmith.recipe import RecipeError

    rec = _ic_table(tmp_path)
    rec["outputs"] = [{"format": "precomputed"}]
    rec["geometry"] = {"buckets": ["64x64x17"], "reference_downscale_factor": 4}
    with pytest.raises(RecipeError, match="gives references of 16x16, not multiples of the VAE's spatial factor 32"):
        precheck(recipe_from_dict(rec))
    rec["geometry"] = {"buckets": ["64x64x17"], "reference_temporal_scale_factor": 4}
    with pytest.raises(RecipeError, match="leave 1 \\+ 8n frames \\(gives 5\\)"):
        precheck(recipe_from_dict(rec))


def _units(out) -> int:
    """The units a build's ledger records (rows of its ``shards`` table)."""
    import sqlite3

    db = sqlite3.connect(out / ".shardsmith" / "ledger.sqlite")
    try:
        return db.execute("SELECT COUNT(*) FROM shards").fetchone()[0]
    finally:
        db.close()


def _wait_for_units(out, n: int, proc, timeout: float) -> None:
    """Until the running build ``proc`` into ``out`` has recorded ``n`` units, or it ended, or ``timeout``."""
    import sqlite3
    import time

    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if (out / ".shardsmith" / "ledger.sqlite").exists() and _units(out) >= n:
                return
        except sqlite3.Error:  # (being made)
            pass
        time.sleep(0.02)


def test_sigkill_mid_build_resumes_partners_byte_identical(tmp_path):
    """kill -9 of a build with IC-LoRA references and first frames, then a resume: every file equals an
    uninterrupted build's (same keys, same partner latents, same first frames)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from test_build import tree_bytes

    src = tmp_path / "src"
    src.mkdir()
    rows = ["clip,ref,caption"]
    photos = ("astronaut", "coffee", "chelsea", "rocket")
    for i in range(8):
        pan_video(src / f"c{i}.mp4", frames=20 + i, fps=FPS, size=(96, 96), photo=photos[i % 4])
        pan_video(src / f"r{i}.mp4", frames=20 + i, fps=FPS, size=(64, 64), photo=photos[(i + 1) % 4])
        rows.append(f"c{i}.mp4,r{i}.mp4,clip {i}")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": "src/rows.csv", "columns": {"media": "clip", "reference": "ref", "caption": "caption"}}],
        "mode": "v2v-ic", "geometry": {"buckets": ["64x64x17"]},
        "models": {"vae": {"family": "ltx2"}, "text": {"family": "minilm"}, "batch_size": 2},
        "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}, {"format": "precomputed", "unit": 2}]}))

    def start(out):
        return subprocess.Popen([sys.executable, "-m", "shardsmith", "build", str(recipe), "--out", str(out), "-q",
                                 "--workers", "2", "--no-report"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)

    t0 = time.monotonic()
    assert start(tmp_path / "ref").wait(timeout=600) == 0
    full = time.monotonic() - t0
    want = tree_bytes(tmp_path / "ref")
    assert sum(k.endswith("ref_latent.pth") for k in want) == 0  # (members live inside the tars)
    assert len([k for k in want if k.startswith(".precomputed/reference_latents/")]) == 8
    out, kills = tmp_path / "crashy", 0
    step = max(1, _units(tmp_path / "ref") // 4)
    for _ in range(3):  # each run killed once it has recorded a quarter of the units more (not after a time: a
        before = _units(out) if (out / ".shardsmith" / "ledger.sqlite").exists() else 0  # loaded machine may
        p = start(out)  # finish first)
        _wait_for_units(out, before + step, p, timeout=full * 20)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            kills += 1
    assert kills >= 1, "the build finished before it could be killed; the test proves nothing"
    assert start(out).wait(timeout=600) == 0
    got = tree_bytes(out)
    assert got.keys() == want.keys() and got == want


def test_ic_lora_with_audio_writes_the_references_audio_latents(tmp_path):
    """av2av-ic: the reference clip's pixels and its audio, both over the target's window: the four
    folders the LTX-2 trainer reads in that mode, and verify passes the tree."""
    from video_factory import audio_file

    src = tmp_path / "src"
    src.mkdir()
    rows = ["clip,ref,caption"]
    for i, photo in enumerate(("astronaut", "coffee")):
        pan_video(src / f"c{i}.mp4", frames=30 + i, fps=FPS, size=(128, 128), photo=photo, audio="speech")
        pan_video(src / f"r{i}.mp4", frames=30 + i, fps=FPS, size=(64, 64), photo=photo, audio="tone")
        rows.append(f"c{i}.mp4,r{i}.mp4,clip {i}")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "clip", "reference": "ref",
                                                                  "caption": "caption"}}],
           "mode": "av2av-ic", "geometry": {"buckets": ["64x64x17"]},
           "models": {"vae": {"family": "ltx2"}, "text": {"family": "ltx2"}, "audio_vae": {"family": "ltx2_audio"},
                      "batch_size": 2},
           "outputs": [{"format": "precomputed"}, {"format": "latent_wds", "dir": "lat"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 2
    tree = tmp_path / "out" / ".precomputed"
    for name in ("c0.pt", "c1.pt"):
        a = torch.load(tree / "audio_latents" / name, weights_only=True)
        ra = torch.load(tree / "reference_audio_latents" / name, weights_only=True)
        # LTX-2's duration: the 16 kHz tracks' samples over their rate
        assert ra["latents"].shape == a["latents"].shape and ra["duration"] == a["duration"] == int(17 / FPS * 16000) / 16000
        assert not torch.equal(ra["latents"], a["latents"])  # a tone, not the target's speech
    with tarfile.open(tmp_path / "out" / "lat" / "00000.tar") as tf:
        names = {x.name for x in tf.getmembers()}
    assert {"c0.ref_audio_latent.pth", "c0.ref_latent.pth", "c0.audio_latent.pth"} <= names
    from shardsmith.verify.runner import verify

    rep = verify(tree)
    assert rep["mode"] == "av2av-ic" and rep["ok"], [c for c in rep["checks"] if not c["ok"]]

    # a2a-ic: audio files with audio references
    asrc = tmp_path / "asrc"
    asrc.mkdir()
    audio_file(asrc / "t.wav", kind="speech", duration=2.2, rate=16000, layout="mono")
    audio_file(asrc / "r.flac", kind="tone", duration=2.4, rate=44100, layout="stereo")
    (asrc / "rows.csv").write_text("audio,ref,caption\nt.wav,r.flac,a voice\n")
    arec = {"sources": [{"path": str(asrc / "rows.csv"), "columns": {"media": "audio", "reference": "ref",
                                                                    "caption": "caption"}}],
            "mode": "a2a-ic", "audio": {"durations": [2.0]},
            "models": {"text": {"family": "ltx2"}, "audio_vae": {"family": "ltx2_audio"}},
            "outputs": [{"format": "precomputed"}]}
    build(recipe_from_dict(arec), tmp_path / "aout", quiet=True)
    at = tmp_path / "aout" / ".precomputed"
    ra = torch.load(at / "reference_audio_latents" / "t.pt", weights_only=True)
    assert ra["duration"] == 2.0 and ra["num_time_steps"] == 51
    rep = verify(at)
    assert rep["mode"] == "a2a-ic" and rep["ok"], [c for c in rep["checks"] if not c["ok"]]
