"""Crash safety: SIGKILL a build at random points, resume, and get byte-identical output."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from media_factory import digits_folder, real_photos
from test_build import balanced, tree_bytes

PY = sys.executable


def _start(recipe: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "shardsmith", "build", str(recipe), "--out", str(out), "--quiet",
                             "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _manifest(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    m.pop("created")
    assert m.pop("timings")["total_s"] >= 0  # run-specific, like "created"
    return m


def test_sigkill_at_random_points_then_resume_is_byte_identical(tmp_path):
    real_photos(tmp_path / "photos", 150, seed=11, min_side=60, max_side=160)
    digits_folder(tmp_path / "digits", per_class=12)
    (tmp_path / "photos" / "broken.jpg").write_bytes((tmp_path / "photos" / "photo_00003.jpg").read_bytes()[:700])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": "photos"}, {"path": "digits"}],
        "split": {"holdout": 0.2, "seed": 5},
        "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 6, "image": {"max_side": 96}},
                    {"format": "zip", "path": "d.zip", "sources": ["digits"], "resolution": 16, "upscale": True,
                     "unit": 10}]}))

    ref = tmp_path / "ref"
    t0 = time.monotonic()
    p = _start(recipe, ref)
    assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    full = time.monotonic() - t0
    want = tree_bytes(ref)
    assert len([k for k in want if k.endswith(".tar")]) >= 20

    rng = random.Random(1234)
    out = tmp_path / "crashy"
    kills = 0
    for _ in range(8):
        p = _start(recipe, out)
        # resumed runs are shorter: aim the kills at the first part of each run
        time.sleep(rng.uniform(0.4, full * 0.45))
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            kills += 1
        if (out / "manifest.json").exists():
            break
    assert kills >= 3, "the build finished before it could be killed; the test proves nothing"
    p = _start(recipe, out)
    assert p.wait(timeout=300) == 0, p.stderr.read().decode()

    got = tree_bytes(out)
    assert got.keys() == want.keys()
    assert got == want
    m = _manifest(out)
    assert m == _manifest(ref)
    assert m["counts"]["failed"] == {"truncated": 1}
    for o in m["outputs"].values():
        assert balanced(o["counts"]) and all(balanced(b) for b in o["splits"].values())
    assert not list(out.rglob("*.tmp-*"))


def test_a_build_killed_before_it_recorded_its_recipe_is_resumed_not_refused(tmp_path):
    """SIGKILL between creating the state folder or the ledger and writing the recipe into it (seen in
    CI with the test above) leaves a folder with an empty ledger, or none: the next run builds into
    it; a ledger that holds anything stays protected."""
    from shardsmith.build import OutputExistsError, build
    from shardsmith.plan.ledger import Ledger
    from shardsmith.recipe import recipe_from_dict

    real_photos(tmp_path / "photos", 5, seed=12, min_side=40, max_side=80)
    rec = recipe_from_dict({"sources": [{"path": str(tmp_path / "photos")}],
                            "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 2}]})
    build(rec, tmp_path / "ref", quiet=True, workers=1)
    killed = tmp_path / "killed"
    Ledger(killed / ".shardsmith" / "ledger.sqlite").close()  # created, nothing recorded
    m = build(rec, killed, quiet=True, workers=1)
    assert m["counts"]["written"] == 5 and tree_bytes(killed) == tree_bytes(tmp_path / "ref")

    early = tmp_path / "early"
    (early / ".shardsmith").mkdir(parents=True)  # killed even earlier: the state folder, no ledger yet
    build(rec, early, quiet=True, workers=1)
    assert tree_bytes(early) == tree_bytes(tmp_path / "ref")

    other = tmp_path / "other"
    led = Ledger(other / ".shardsmith" / "ledger.sqlite")
    led.set_meta("started", "2026-12-03T00:00:00+00:00")  # something recorded, no fingerprint
    led.close()
    with pytest.raises(OutputExistsError, match="different recipe"):
        build(rec, other, quiet=True, workers=1)
