"""Crash safety: SIGKILL a build at random points, resume, and get byte-identical output."""

import json
import os
import random
import shutil
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


def _crash_recipe(tmp_path: Path) -> Path:
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
    return recipe


def _reference(tmp_path: Path, recipe: Path) -> tuple[float, dict[str, bytes], dict]:
    """One uninterrupted build: (its wall seconds, its files' bytes, its manifest)."""
    ref = tmp_path / "ref"
    t0 = time.monotonic()
    p = _start(recipe, ref)
    assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    want = tree_bytes(ref)
    assert len([k for k in want if k.endswith(".tar")]) >= 20
    return time.monotonic() - t0, want, _manifest(ref)


def _kill_at(recipe: Path, out: Path, seconds: float) -> bool:
    """Start a build (or its resume), SIGKILL its process group after ``seconds``; True if it was
    still running then (a real kill), False if it had finished."""
    p = _start(recipe, out)
    time.sleep(seconds)
    if p.poll() is not None:
        return False
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    return True


def _assert_resumes_identical(recipe: Path, out: Path, want: dict[str, bytes], want_manifest: dict) -> None:
    p = _start(recipe, out)
    assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    got = tree_bytes(out)
    assert got.keys() == want.keys()
    assert got == want
    m = _manifest(out)
    assert m == want_manifest
    assert m["counts"]["failed"] == {"truncated": 1}
    for o in m["outputs"].values():
        assert balanced(o["counts"]) and all(balanced(b) for b in o["splits"].values())
    assert not list(out.rglob("*.tmp-*"))


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_is_byte_identical(tmp_path):
    """Fast lane: one output folder killed again and again, then resumed once."""
    recipe = _crash_recipe(tmp_path)
    full, want, want_manifest = _reference(tmp_path, recipe)
    rng = random.Random(1234)
    out = tmp_path / "crashy"
    kills = 0
    for _ in range(8):
        # resumed runs are shorter: aim the kills at the first part of each run
        kills += _kill_at(recipe, out, rng.uniform(0.4, full * 0.45))
        if (out / "manifest.json").exists():
            break
    assert kills >= 3, "the build finished before it could be killed; the test proves nothing"
    _assert_resumes_identical(recipe, out, want, want_manifest)


KILL_POINTS = 20


@pytest.mark.slow
def test_sigkill_at_20_random_points_each_resume_is_byte_identical(tmp_path):
    """Slow lane: each of 20 kills lands at its own random point of a fresh build (from the start
    of planning to the manifest), a third of them followed by a second kill of the resume; after
    every one the resumed build is byte-identical to the uninterrupted one."""
    recipe = _crash_recipe(tmp_path)
    full, want, want_manifest = _reference(tmp_path, recipe)
    rng = random.Random(20261204)
    kills = trials = 0
    while kills < KILL_POINTS:
        trials += 1
        assert trials <= 3 * KILL_POINTS, f"only {kills} of {trials} kills landed before the build ended"
        out = tmp_path / f"crash{trials}"
        if not _kill_at(recipe, out, rng.uniform(0.1, full)):
            shutil.rmtree(out)
            continue
        kills += 1
        if rng.random() < 1 / 3 and _kill_at(recipe, out, rng.uniform(0.1, full * 0.6)):
            kills += 1
        _assert_resumes_identical(recipe, out, want, want_manifest)
        shutil.rmtree(out)


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
