"""``--overwrite`` on a build of the same recipe that stopped after its plan starts again from the sources as
they are now, as its messages say it does ("re-run with --overwrite to plan again"); without it the build
resumes on the plan it made. Before, --overwrite resumed too: a user who fixed the files that stopped the run
got every one of them as ``failed:changed_since_plan`` and no way on but deleting the folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from video_factory import broken_audio_video, pan_video

pytestmark = pytest.mark.slow  # three CLI builds with the LTX-2 VAEs (tiny): about 20 s


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_overwrite_replans_a_build_that_stopped_after_its_plan(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for i in range(3):
        broken_audio_video(src / f"b{i}.mp4", frames=20).with_suffix(".txt").write_text(f"clip {i}")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": str(src)}], "geometry": {"buckets": ["64x64x17"]}, "split": {"holdout": 0},
        "models": {"vae": {"family": "ltx2"}, "text": {"family": "minilm"},
                   "audio_vae": {"family": "ltx2_audio", "config": "tiny"}, "batch_size": 2},
        "outputs": [{"format": "precomputed"}]}))
    r = _cli("build", recipe, "--out", out, "--no-report", "-q")
    assert r.returncode == 3 and "audio decoder failed on every file tried" in r.stderr, r.stderr
    for i, photo in enumerate(("astronaut", "coffee", "chelsea")):  # the user fixes the files
        (src / f"b{i}.mp4").unlink()
        pan_video(src / f"b{i}.mp4", frames=20, fps=24, size=(80, 64), photo=photo, audio="speech",
                  audio_layout="stereo")

    r = _cli("build", recipe, "--out", out, "--no-report", "-q")  # a resume keeps its plan: the files changed
    assert r.returncode == 3 and "pass --overwrite to start again from the sources" in r.stderr, r.stderr
    r = _cli("build", recipe, "--out", out, "--no-report", "-q", "--overwrite")
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == 3 and m["counts"]["failed"] == {}
    assert m["outputs"]["precomputed"]["audio"]["splits"]["train"]["with_audio"] == 3
    assert sorted(p.name for p in (out / ".precomputed" / "audio_latents").rglob("*.pt")) == ["b0.pt", "b1.pt", "b2.pt"]
    assert not (tmp_path / "out.next").exists() and not any(p.name.startswith("out.") for p in tmp_path.iterdir())
