"""kill -9 of a build whose samples carry partners made from the target's one geometry: first frames
(i2v), inpainting masks (video-inpaint) and camera tracks (camera-video), into latent_wds and
``.precomputed/`` (issue 18). Each build is killed with SIGKILL at a random point after some of its
units are committed, then re-run: every file equals an uninterrupted build's byte for byte (the tars'
``first_frame.jpg`` / ``first_frame_latent.pth`` / ``mask.pth`` / ``camera.npy`` members, ``video_masks/``,
``cameras/``), and every partner still sits under its target's key. (IC-LoRA references: test_partners.py.)"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from test_build import tree_bytes
from video_factory import pan_video

pytestmark = pytest.mark.slow
FPS = 24
N = 6
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")

# mode -> (table column of its partner, recipe role, members each latent_wds sample carries, .precomputed/ folders)
MODES = {
    "i2v": (None, None, ("first_frame.jpg", "first_frame_latent.pth"), ("latents", "conditions")),
    "video-inpaint": ("mask", "mask", ("mask.pth",), ("latents", "conditions", "video_masks")),
    "camera-video": ("cam", "camera", ("camera.npy",), ("latents", "conditions", "cameras")),
}


def _sources(src: Path) -> None:
    """N clips of 20..25 frames (96x64), each with a mask drawn at half its resolution and a camera track
    of one camera per frame (sliding along x)."""
    src.mkdir()
    rows = ["clip,mask,cam,caption"]
    for i in range(N):
        n = 20 + i
        pan_video(src / f"c{i}.mp4", frames=n, fps=FPS, size=(96, 64), photo=PHOTOS[i % 4])
        m = np.zeros((32, 48), np.uint8)
        m[2 + 3 * i: 10 + 3 * i, 4 + 4 * i: 20 + 4 * i] = 255
        Image.fromarray(m).save(src / f"m{i}.png")
        frames = []
        for k in range(n):
            ext = np.eye(4)
            ext[0, 3], ext[2, 3] = 0.1 * k, 0.02 * i * k
            frames.append({"extrinsic": ext.tolist()})
        (src / f"cam{i}.json").write_text(json.dumps({"width": 96, "height": 64,
                                                      "intrinsic": [80.0 + i, 80.0, 48.0, 32.0], "frames": frames}))
        rows.append(f"c{i}.mp4,m{i}.png,cam{i}.json,clip {i}")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")


def _recipe(tmp_path: Path, mode: str) -> Path:
    col, role = MODES[mode][:2]
    columns = {"media": "clip", "caption": "caption", **({role: col} if role else {})}
    recipe = tmp_path / f"{mode}.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": "src/rows.csv", "columns": columns}], "mode": mode,
        "geometry": {"buckets": ["64x64x17"]},
        "models": {"vae": {"family": "ltx2"}, "text": {"family": "ltx2"}, "batch_size": 2},
        "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2},
                    {"format": "precomputed", "unit": 2}]}))
    return recipe


def _start(recipe: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shardsmith", "build", str(recipe), "--out", str(out), "-q",
                             "--workers", "2", "--no-report"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, cwd=recipe.parent)


def _committed(out: Path) -> int:
    """Units of the build in ``out`` already in place (latent_wds shards and .precomputed/ latents)."""
    return len(list((out / "lat").glob("*.tar"))) + len(list((out / ".precomputed" / "latents").glob("*.pt")))


def _kill_after_some_units(recipe: Path, out: Path, rng: random.Random, most_s: float = 0.4) -> bool:
    """Start a build (or its resume), wait until it has committed a unit more than it had, then SIGKILL its
    process group after a random extra 0-``most_s`` s; True if it was still running then (a real kill)."""
    before = _committed(out)
    p = _start(recipe, out)
    while p.poll() is None and _committed(out) <= before:
        time.sleep(0.02)
    time.sleep(rng.uniform(0, most_s))
    if p.poll() is not None:
        assert p.returncode == 0, p.stderr.read().decode()
        return False
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    return not (out / "manifest.json").exists()


def _members_by_key(lat: Path) -> dict[str, set[str]]:
    got: dict[str, set[str]] = {}
    for shard in sorted(lat.glob("*.tar")):
        with tarfile.open(shard) as tf:
            for name in tf.getnames():
                key, suffix = name.split(".", 1)
                got.setdefault(f"{shard.name}/{key}", set()).add(suffix)
    return got


@pytest.mark.parametrize("mode", list(MODES))
def test_sigkill_mid_build_resumes_first_frames_masks_and_cameras_byte_identical(tmp_path, mode):
    _sources(tmp_path / "src")
    recipe = _recipe(tmp_path, mode)
    p = _start(recipe, tmp_path / "ref")
    assert p.wait(timeout=600) == 0, p.stderr.read().decode()
    want = tree_bytes(tmp_path / "ref")
    members, folders = MODES[mode][2:]
    for d in folders:
        assert len([k for k in want if k.startswith(f".precomputed/{d}/")]) == N, d
    out, kills, rng = tmp_path / "crashy", 0, random.Random(f"{mode}-18")
    for attempt in range(5):
        kills += _kill_after_some_units(recipe, out, rng, most_s=0.4 / 2 ** attempt)
        if (out / "manifest.json").exists():
            if kills:
                break
            shutil.rmtree(out)  # it finished before the kill (a fast machine): again, killed sooner
        elif kills >= 2:
            break
    assert kills >= 1, "the build finished before it could be killed; the test proves nothing"
    p = _start(recipe, out)
    assert p.wait(timeout=600) == 0, p.stderr.read().decode()
    got = tree_bytes(out)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []
    # every sample's partners under its own key, in the tars and in the tree
    by_key = _members_by_key(out / "lat")
    assert len(by_key) == N and all({"latent.pth", *members} <= s for s in by_key.values()), by_key
    names = {d: sorted(k.split("/", 2)[2] for k in got if k.startswith(f".precomputed/{d}/")) for d in folders}
    assert all(v == names["latents"] for v in names.values()), names
