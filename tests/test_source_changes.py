"""A re-run of a complete build (or a resume) whose sources changed since the plan says so: new,
changed and gone files, counted and named, and what to do. Before, a complete build said "nothing to
do" of a folder that no longer matched it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict
from shardsmith.safety.source_changes import source_changes
from shardsmith.sources import open_sources
from test_build import tree_bytes


def _recipe(tmp_path: Path) -> Path:
    rec = tmp_path / "recipe.yaml"
    rec.write_text(yaml.safe_dump({"sources": [{"path": str(tmp_path / "p")}], "split": {"holdout": 0},
                                   "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 3}]}))
    return rec


def _cli(rec: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardsmith", "build", str(rec), "--out", str(out), "-q",
                           "--workers", "1"], capture_output=True, text=True)


@pytest.mark.slow
def test_a_complete_build_rerun_on_changed_sources_warns_and_keeps_the_build(tmp_path):
    real_photos(tmp_path / "p", 8, seed=3, min_side=40, max_side=90)
    rec, out = _recipe(tmp_path), tmp_path / "out"
    assert _cli(rec, out).returncode == 0
    before = tree_bytes(out)
    r = _cli(rec, out)
    assert r.returncode == 0 and "changed" not in r.stderr  # unchanged sources: no warning
    p = tmp_path / "p"
    (p / "photo_00000.jpg").write_bytes((p / "photo_00001.jpg").read_bytes())  # other bytes, other size
    same_size = p / "photo_00002.jpg"
    data = bytearray(same_size.read_bytes())
    data[-3] ^= 0xFF  # same size, other bytes, written after the build started
    same_size.write_bytes(bytes(data))
    (p / "photo_00003.jpg").unlink()
    (p / "zz_new.jpg").write_bytes((p / "photo_00004.jpg").read_bytes())
    os.utime(p / "photo_00005.jpg")  # touched only: the same bytes are not a change
    r = _cli(rec, out)
    assert r.returncode == 0
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert "the sources changed since this build was planned: 1 new (p/zz_new.jpg), " in line
    assert "2 changed (p/photo_00000.jpg, p/photo_00002.jpg), 1 gone (p/photo_00003.jpg)" in line
    assert "pass --overwrite to rebuild from them as they are now" in line
    assert tree_bytes(out) == before  # nothing rewritten


def test_a_resume_on_changed_sources_says_it_goes_on_with_the_planned_files(tmp_path, disk_full_at, capfd):
    real_photos(tmp_path / "p", 9, seed=4, min_side=40, max_side=90)
    spec = yaml.safe_load(_recipe(tmp_path).read_text())
    disk_full_at(1)
    with pytest.raises(OSError, match="No space left"):
        build(recipe_from_dict(spec), tmp_path / "out", quiet=True, workers=1)
    disk_full_at(None)
    (tmp_path / "p" / "zz_new.jpg").write_bytes((tmp_path / "p" / "photo_00004.jpg").read_bytes())
    capfd.readouterr()
    m = build(recipe_from_dict(spec), tmp_path / "out", quiet=True, workers=1)
    err = capfd.readouterr().err
    assert "warning: the sources changed since this build was planned: 1 new (p/zz_new.jpg); this build goes on " \
           "with the files as planned" in err
    assert m["counts"]["written"] == 9  # the planned files, the new one not among them


def test_only_files_modified_after_the_build_started_are_hashed(tmp_path, monkeypatch):
    from shardsmith.safety import source_changes as sc

    real_photos(tmp_path / "p", 4, seed=5, min_side=40, max_side=90)
    spec = yaml.safe_load(_recipe(tmp_path).read_text())
    build(recipe_from_dict(spec), tmp_path / "out", quiet=True, workers=1)
    hashed = []
    real = sc._sha256
    monkeypatch.setattr(sc, "_sha256", lambda p: hashed.append(Path(p).name) or real(p))
    ledger = tmp_path / "out" / ".shardsmith" / "ledger.sqlite"
    opened = open_sources(recipe_from_dict(spec))
    assert not source_changes(ledger, opened, since=time.time() + 60) and hashed == []
    later = time.time() + 120
    os.utime(tmp_path / "p" / "photo_00001.jpg", (later, later))
    assert not source_changes(ledger, opened, since=time.time() + 60)
    assert hashed == ["photo_00001.jpg"]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]["written"] == 4
