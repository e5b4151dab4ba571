"""Masks and camera data through a whole build (issue 18): ``video-inpaint`` writes each clip's mask cut
with its target and pooled onto the VAE's latent grid (``video_masks/`` ``{"mask": [F', H', W']}``,
``mask.pth``); ``camera-video`` writes the camera track at the frames the clip takes, intrinsics moved
onto the output pixels (``cameras/``, ``camera.npy``). ``verify`` fails a tree whose mask has the wrong
grid or lost its partner, naming the sample."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict
from shardsmith.transform.buckets import parse_buckets
from shardsmith.transform.geometry import decide
from shardsmith.transform.masks import latent_mask, target_mask
from shardsmith.verify.runner import verify
from video_factory import pan_video

pytestmark = pytest.mark.slow
FPS = 24
BUCKET = "64x64x17"


def _inpaint_table(tmp_path, n=2):
    src = tmp_path / "src"
    src.mkdir()
    rows = ["clip,mask,caption"]
    for i in range(n):
        pan_video(src / f"c{i}.mp4", frames=30, fps=FPS, size=(192, 128), photo=("coffee", "rocket")[i % 2])
        m = np.zeros((64, 96), np.uint8)  # half the clip's resolution, same aspect ratio
        if i == 0:
            m[5:20, 20:40] = 255  # inside the top-left latent cell (the crop keeps columns 16..80)
        else:
            m[40:60, 55:75] = 255  # inside the bottom-right one
        Image.fromarray(m).save(src / f"m{i}.png")
        rows.append(f"c{i}.mp4,m{i}.png,clip {i}")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")
    return src, {"sources": [{"path": str(src / "rows.csv"),
                              "columns": {"media": "clip", "mask": "mask", "caption": "caption"}}],
                 "mode": "video-inpaint", "geometry": {"buckets": [BUCKET]},
                 "models": {"vae": {"family": "ltx2"}, "text": {"family": "ltx2"}, "batch_size": 2}}


def test_inpainting_masks_land_on_the_latent_grid_and_verify_checks_them(tmp_path):
    src, rec = _inpaint_table(tmp_path)
    rec["outputs"] = [{"format": "precomputed"}, {"format": "latent_wds", "dir": "lat"}]
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 2
    tree = tmp_path / "out" / ".precomputed"
    bucket = parse_buckets([BUCKET])[0]
    with tarfile.open(tmp_path / "out" / "lat" / "00000.tar") as tf:
        members = {x.name: tf.extractfile(x).read() for x in tf.getmembers()}
    for i in range(2):
        got = torch.load(tree / "video_masks" / f"c{i}.pt", weights_only=True)["mask"]
        lat = torch.load(tree / "latents" / f"c{i}.pt", weights_only=True)["latents"]
        assert tuple(got.shape) == tuple(lat.shape[1:]) == (3, 2, 2)
        # by hand: the same geometry decision, the mask cut with it, pooled with the VAE's grouping
        geom = decide(192, 128, bucket, frame_indices=list(range(17)), fps=FPS)
        want = latent_mask(target_mask(str(src / f"m{i}.png"), geom, f"c{i}"), 32, 8)
        assert np.array_equal(got.numpy(), want) and set(np.unique(want)) == {0.0, 1.0}
        wds = torch.load(io.BytesIO(members[f"c{i}.mask.pth"]), weights_only=True)
        assert torch.equal(wds, got)
    rep = verify(tree)
    checks = {c["name"]: c for c in rep["checks"]}
    assert rep["mode"] == "video-inpaint" and rep["ok"], rep["checks"]
    assert checks["mask_grid"]["ok"] and checks["folders:video-inpaint"]["ok"]

    torch.save({"mask": torch.zeros(3, 4, 4)}, tree / "video_masks" / "c1.pt")  # the wrong grid
    checks = {c["name"]: c for c in verify(tree)["checks"]}
    assert not checks["mask_grid"]["ok"] and "c1.pt (mask [3, 4, 4] vs latent grid [3, 2, 2])" in \
        checks["mask_grid"]["detail"]
    (tree / "video_masks" / "c1.pt").unlink()  # a lost partner
    checks = {c["name"]: c for c in verify(tree)["checks"]}
    assert not checks["folders:video-inpaint"]["ok"]
    assert "latents/c1.pt has no video_masks/c1.pt" in checks["folders:video-inpaint"]["detail"]


def test_a_mask_of_another_shape_fails_its_item(tmp_path):
    src, rec = _inpaint_table(tmp_path, n=1)
    Image.fromarray(np.zeros((64, 64), np.uint8)).save(src / "m0.png")  # square: the clip is 3:2
    rec["outputs"] = [{"format": "latent_wds", "dir": "lat"}]
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["failed"] == {"mask_geometry_mismatch": 1}


def _camera_json(path, n, size=(192, 128)):
    frames = []
    for k in range(n):
        ext = np.eye(4)
        ext[0, 3] = 0.1 * k  # the camera slides along x
        frames.append({"extrinsic": ext.tolist()})
    path.write_text(json.dumps({"width": size[0], "height": size[1], "intrinsic": [200.0, 200.0, 96.0, 64.0],
                                "frames": frames}))


def test_camera_rows_follow_the_frames_and_the_crop(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pan_video(src / "c0.mp4", frames=30, fps=FPS, size=(192, 128))
    pan_video(src / "c1.mp4", frames=30, fps=FPS, size=(192, 128), photo="coffee")
    _camera_json(src / "cam0.json", 30)
    _camera_json(src / "cam1.json", 25)  # one camera short of a camera per frame
    (src / "rows.csv").write_text("clip,cam,caption\nc0.mp4,cam0.json,a slide\nc1.mp4,cam1.json,a short track\n")
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "clip", "camera": "cam",
                                                                  "caption": "caption"}}],
           "mode": "camera-video", "geometry": {"buckets": [BUCKET]},
           "models": {"vae": {"family": "ltx2"}, "text": {"family": "ltx2"}},
           "outputs": [{"format": "latent_wds", "dir": "lat"}, {"format": "precomputed"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["outputs"]["latent_wds"]["counts"]["failed"] == {"camera_length_mismatch": 1}
    with tarfile.open(tmp_path / "out" / "lat" / "00000.tar") as tf:
        members = {x.name: tf.extractfile(x).read() for x in tf.getmembers()}
    cam = np.load(io.BytesIO(members["c0.camera.npy"]), allow_pickle=False)
    assert cam.shape == (17, 20) and cam.dtype == np.float32
    # frames 0..16 at the clip's own 24 fps; 192x128 -> resize 96x64 -> centre crop 64x64 (x0 = 16)
    assert np.allclose(cam[:, 3], 0.1 * np.arange(17))
    assert np.allclose(cam[0, 16:], [100.0, 100.0, 48.0 - 16.0, 32.0])
    pre = torch.load(tmp_path / "out" / ".precomputed" / "cameras" / "c0.pt", weights_only=True)["camera"]
    assert torch.equal(pre, torch.from_numpy(cam))


def test_audio_inpainting_masks_on_the_audio_latent_steps(tmp_path):
    """audio-inpaint: each audio file's mask (an array over the file, or an audio file's envelope) lands
    on its audio latent's steps, ``audio_masks/`` ``{"mask": [T]}`` as LTX's trainer reads it."""
    from video_factory import audio_file

    src = tmp_path / "src"
    src.mkdir()
    rows = ["audio,mask,caption"]
    for i in range(2):
        audio_file(src / f"a{i}.wav", kind="speech", duration=2.5, rate=22050, layout="mono")
        m = np.zeros(250, np.float32)
        m[: 100 + 50 * i] = 1.0  # the first 1.0 s / 1.5 s is kept (conditioning), the rest generated
        np.save(src / f"m{i}.npy", m)
        rows.append(f"a{i}.wav,m{i}.npy,speech {i}")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "audio", "mask": "mask",
                                                                  "caption": "caption"}}],
           "mode": "audio-inpaint", "audio": {"durations": [2.0]}, "split": {"dedup": False},
           "models": {"text": {"family": "ltx2"}, "audio_vae": {"family": "ltx2_audio"}},
           "outputs": [{"format": "precomputed"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 2
    tree = tmp_path / "out" / ".precomputed"
    for i in range(2):
        a = torch.load(tree / "audio_latents" / f"a{i}.pt", weights_only=True)
        mask = torch.load(tree / "audio_masks" / f"a{i}.pt", weights_only=True)["mask"]
        assert mask.shape == (a["num_time_steps"],) == (51,)  # 2.0 s: 32000 // 640 + 1 steps
        # nearest resampling of the 250-sample array (2.5 s) onto 51 steps: step j takes sample j*250//51
        want = np.array([1.0 if j * 250 // 51 < 100 + 50 * i else 0.0 for j in range(51)], np.float32)
        assert np.array_equal(mask.numpy(), want)
    rep = verify(tree)
    assert rep["mode"] == "audio-inpaint" and rep["ok"], [c for c in rep["checks"] if not c["ok"]]
    assert any(c["name"] == "audio_mask_grid" and c["ok"] for c in rep["checks"])
    # one mask off its audio latent's steps: verify names it (LTX would misplace the generated steps)
    bad = tree / "audio_masks" / "a1.pt"
    torch.save({"mask": torch.ones(40)}, bad)
    rep = verify(tree)
    check = next(c for c in rep["checks"] if c["name"] == "audio_mask_grid")
    assert not check["ok"] and "a1" in check["detail"] and "[40] vs audio latent steps [51]" in check["detail"]


def test_an_audio_mask_pth_off_its_latents_steps_is_dropped_by_the_loader_and_named():
    """``audio_mask.pth`` follows the same rule in a latent WebDataset sample (``formats.mask_grid``)."""
    from shardsmith.formats.mask_grid import audio_mask_problem

    lat = torch.zeros(8, 51, 16)
    assert audio_mask_problem(torch.ones(51), lat) is None
    assert audio_mask_problem(torch.ones(50), lat) == "audio mask [50] vs audio latent steps [51]"
    assert audio_mask_problem(torch.full((51,), 0.5), lat) == "audio mask holds values other than 0 and 1"
    assert audio_mask_problem(torch.ones(3, 51), lat).startswith("audio mask is [3, 51]")
    from shardsmith.formats.wds import AUDIO_LATENT, AUDIO_MASK, TEXT_EMB
    from shardsmith.loaders.wds_dataset import mask_grid_keys

    assert mask_grid_keys({"real": AUDIO_LATENT, "condition": TEXT_EMB, "mask": AUDIO_MASK}) == [("mask", "real")]
