"""Fault injection for the build (issue 14, items 1, 2, 9, 10, 11, 12): nothing a user owns is
lost, one build at a time per folder, disk full is a message, a failed first run does not block
its corrected retry, workers die with their parent, and a holdout cannot take all the data."""

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from rich.console import Console

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.errors import UserError
from shardsmith.recipe import recipe_from_dict
from shardsmith.safety.outdir import retire as outdir_retire
from test_build import tree_bytes

PY = sys.executable


def _cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True, **kw)


def _hashes(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root`` (symlinks not followed)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _recipe(src: Path, **split) -> dict:
    return {"sources": [{"path": str(src)}], "split": {"holdout": 0.25, "seed": 1, **split},
            "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 5, "image": {"max_side": 64}},
                        {"format": "zip", "path": "c.zip", "resolution": 16, "upscale": True}]}


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("safety") / "photos"
    real_photos(d, 16, seed=5, min_side=40, max_side=90)
    return d


# ---------------------------------------------------------------- 1. --out vs sources, --overwrite


@pytest.mark.parametrize("overwrite", [False, True])
def test_out_equal_to_around_or_inside_a_source_is_refused_and_sources_stay_identical(tmp_path, overwrite):
    home = tmp_path / "home"
    src = home / "photos"
    real_photos(src, 6, seed=2, min_side=40, max_side=80)
    (home / "NOTES.txt").write_text("my notes")
    (src / "sub").mkdir()
    (src / "sub" / "NOTES.txt").write_text("more notes")
    (tmp_path / "link").symlink_to(src, target_is_directory=True)
    before = _hashes(tmp_path)
    rec = recipe_from_dict(_recipe(src))
    for out in (src, home, src / "sub", src / "new_out", tmp_path / "link", tmp_path / "link" / "x"):
        with pytest.raises(UserError) as e:
            build(rec, out, quiet=True, workers=1, overwrite=overwrite)
        msg = str(e.value)
        assert str(out.resolve()) in msg and str(src.resolve()) in msg, msg
        assert _hashes(tmp_path) == before
    assert not (src / "new_out").exists() and not list(tmp_path.rglob(".shardsmith*"))
    # a source given through a symlink is resolved too
    rec_link = recipe_from_dict(_recipe(tmp_path / "link"))
    with pytest.raises(UserError, match="inside"):
        build(rec_link, src / "o", quiet=True, workers=1, overwrite=overwrite)
    assert _hashes(tmp_path) == before


@pytest.mark.slow
def test_overwrite_replaces_only_what_the_old_build_recorded_and_keeps_the_users_files(photos, tmp_path):
    out = tmp_path / "out"
    build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1)
    (out / "NOTES.txt").write_text("hours of notes")
    (out / "wds" / "README.md").write_text("how I made this")
    changed = _recipe(photos)
    changed["outputs"][0]["samples_per_shard"] = 3
    changed["outputs"][1]["path"] = "other.zip"
    con = io.StringIO()
    m = build(recipe_from_dict(changed), out, quiet=False, workers=1, overwrite=True,
              console=Console(file=con, width=200))
    assert m["recipe"]["outputs"][0]["samples_per_shard"] == 3
    assert (out / "NOTES.txt").read_text() == "hours of notes"
    assert (out / "wds" / "README.md").read_text() == "how I made this"
    assert not (out / "c.zip").exists() and (out / "other.zip").exists()  # the old build's zip is gone
    assert json.loads((out / "wds" / "shard_count.json").read_text())["00000.tar"] == 3
    said = con.getvalue()
    assert "NOTES.txt" in said and "wds/README.md" in said and "kept" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no sibling left behind
    r = _cli("verify", out / "wds")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("exchange", [True, False])
def test_an_overwrite_cut_short_after_the_swap_is_completed_by_the_next_run(photos, tmp_path, monkeypatch, exchange):
    """Killed between putting the new build in place and retiring the old one (with the atomic
    exchange, or the two renames where the filesystem has none): the next run carries the user's
    file over and removes the old build's files; nothing is lost, no sibling is left."""
    from shardsmith.safety import swap

    if not exchange:
        monkeypatch.setattr(swap, "exchange", lambda a, b: False)
    out = tmp_path / "out"
    build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1)
    (out / "NOTES.txt").write_text("notes")
    changed = _recipe(photos)
    changed["outputs"][0]["samples_per_shard"] = 3

    def killed(old, into):
        raise KeyboardInterrupt("killed during the swap")

    monkeypatch.setattr(swap, "retire", killed)
    with pytest.raises(KeyboardInterrupt):
        build(recipe_from_dict(changed), out, quiet=True, workers=1, overwrite=True)
    assert len(list(tmp_path.iterdir())) == 2  # the new build in place, the old one beside it
    monkeypatch.setattr(swap, "retire", outdir_retire)
    m = build(recipe_from_dict(changed), out, quiet=True, workers=1)  # the new recipe: done, nothing to do
    assert m["recipe"]["outputs"][0]["samples_per_shard"] == 3
    assert (out / "NOTES.txt").read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert not (out / "c.zip.orig").exists() and (out / "c.zip").exists()
    ref = tmp_path / "ref"
    build(recipe_from_dict(changed), ref, quiet=True, workers=1)
    got = tree_bytes(out)
    assert got.pop("NOTES.txt") == b"notes" and got == tree_bytes(ref)


def test_a_builds_own_files_are_told_from_the_users(photos, tmp_path):
    """What ``--overwrite`` may remove: the recorded files and their repair backups and temporary
    names, shards a kill left unrecorded; never a file of another name, even in the shard folder."""
    from shardsmith.safety.outdir import foreign_files, owned_files

    out = tmp_path / "o"
    build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1)
    built = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    extra_owned = ["wds/00000.tar.orig", "wds/00099.tar", "wds/00100.tar.tmp-4242", "c.zip.tmp-77",
                   "holdout/wds/shard_count.json.tmp-1", "manifest.json.tmp-9"]
    users = ["NOTES.txt", "wds/my.tar", "wds/00000.tar.bak", "wds/sub/00001.tar", "holdout/notes.md",
             "c.zip.old", "00000.tar"]
    for rel in extra_owned + users:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(b"x")
    assert owned_files(out) == built | set(extra_owned)
    assert foreign_files(out) == sorted(users)


def test_overwrite_refuses_a_folder_that_is_not_a_shardsmith_build(photos, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years")
    (out / "wds").mkdir()
    (out / "wds" / "00000.tar").write_bytes(b"my own tar")
    before = _hashes(out)
    with pytest.raises(UserError, match="not a shardsmith build"):
        build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1, overwrite=True)
    assert _hashes(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    f = tmp_path / "file.bin"
    f.write_bytes(b"data")
    with pytest.raises(UserError, match="not a shardsmith build"):
        build(recipe_from_dict(_recipe(photos)), f, quiet=True, workers=1, overwrite=True)
    assert f.read_bytes() == b"data"


# ---------------------------------------------------------------- 2. one build per folder


def _slow_recipe(tmp_path: Path, n: int = 120) -> Path:
    src = tmp_path / "big"
    real_photos(src, n, seed=8, min_side=300, max_side=700)
    recipe = tmp_path / "slow.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": str(src)}], "split": {"holdout": 0.1, "seed": 3},
        "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 4,
                     "image": {"format": "png", "max_side": 512}}]}))
    return recipe


def _wait(cond, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.slow
def test_a_second_build_into_the_same_folder_is_refused_naming_the_holder(tmp_path):
    recipe = _slow_recipe(tmp_path)
    out = tmp_path / "out"
    first = subprocess.Popen([PY, "-m", "shardsmith", "build", str(recipe), "--out", str(out), "--quiet",
                              "--workers", "2"], stderr=subprocess.PIPE, text=True)
    try:
        assert _wait(lambda: (out / ".shardsmith" / "ledger.sqlite").exists())
        second = _cli("build", recipe, "--out", out, "--quiet", "--workers", "1")
        assert first.poll() is None, "the first build ended before the second started; the test proves nothing"
        assert second.returncode == 2, second.stderr
        assert "Traceback" not in second.stderr and f"pid={first.pid}" in second.stderr
        third = _cli("build", recipe, "--out", out, "--quiet", "--overwrite")
        assert third.returncode == 2 and f"pid={first.pid}" in third.stderr
        assert first.wait(timeout=300) == 0, first.stderr.read()
    finally:
        if first.poll() is None:
            first.kill()
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["written"] == m["counts"]["inputs"] == 120
    for folder in (out / "wds", out / "holdout" / "wds"):  # verify checks the count against the manifest
        r = _cli("verify", folder)
        assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), r.stdout + r.stderr


def test_a_build_killed_with_sigkill_leaves_no_stale_lock(photos, tmp_path):
    """The lock is an flock: the OS drops it with the process, so the same command resumes."""
    out = tmp_path / "o"
    script = tmp_path / "hold.py"
    script.write_text(f"""
import sys, time
from shardsmith.safety.lock import hold
with hold({str(out)!r}, "build"):
    print("held", flush=True)
    time.sleep(60)
""")
    p = subprocess.Popen([PY, str(script)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(UserError, match=f"pid={p.pid}"):
        build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1)
    p.send_signal(signal.SIGKILL)
    p.wait()
    m = build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1)
    assert m["counts"]["written"] == 16


# ---------------------------------------------------------------- 9. disk full / file too large


@pytest.mark.slow
def test_a_file_size_limit_is_one_message_and_the_resume_is_byte_identical(tmp_path):
    src = tmp_path / "src"
    real_photos(src, 40, seed=4, min_side=200, max_side=400)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": str(src)}],
        "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 10,
                     "image": {"format": "png", "max_side": 256}}]}))
    ref = tmp_path / "ref"
    assert _cli("build", recipe, "--out", ref, "--quiet", "--workers", "1").returncode == 0
    shard_kib = max(p.stat().st_size for p in (ref / "wds").glob("*.tar")) // 1024
    out = tmp_path / "out"
    limit = shard_kib // 2  # every shard is over the limit; the ledger stays below it
    r = subprocess.run(["bash", "-c", f'ulimit -f {limit}; exec "$0" -m shardsmith build "$1" --out "$2" '
                        '--quiet --workers 1', PY, str(recipe), str(out)], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "00000.tar" in r.stderr, r.stderr
    assert "re-run the same command to resume" in r.stderr
    assert not list(out.rglob("*.tmp-*"))  # the failed write removed its temporary file
    r2 = _cli("build", recipe, "--out", out, "--quiet", "--workers", "1")
    assert r2.returncode == 0, r2.stderr
    assert tree_bytes(out) == tree_bytes(ref)
    mo, mr = (json.loads((d / "manifest.json").read_text()) for d in (out, ref))
    for m in (mo, mr):
        m.pop("created"), m.pop("timings")
    assert mo == mr


def test_disk_full_during_a_write_names_the_file_and_how_to_resume(photos, tmp_path, monkeypatch):
    import errno

    from shardsmith.sinks import tar as tar_mod

    out = tmp_path / "o"
    real_write = tar_mod.DeterministicTar.add
    calls = [0]

    def full(self, name, data):
        calls[0] += 1
        if calls[0] > 7:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, name, data)

    monkeypatch.setattr(tar_mod.DeterministicTar, "add", full)
    with pytest.raises(UserError) as e:
        build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1)
    msg = str(e.value)
    assert "No space left" in msg and ".tar" in msg and "free" in msg
    assert "re-run the same command to resume" in msg
    monkeypatch.setattr(tar_mod.DeterministicTar, "add", real_write)
    build(recipe_from_dict(_recipe(photos)), tmp_path / "ref", quiet=True, workers=1)
    build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1)
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")


def test_a_build_that_cannot_fit_is_refused_before_writing_with_a_du_summary(photos, tmp_path, monkeypatch):
    from shardsmith.safety import space

    out = tmp_path / "o"
    monkeypatch.setattr(space, "free_bytes", lambda path: 1000)
    with pytest.raises(UserError) as e:
        build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1)
    msg = str(e.value)
    assert "needs about" in msg and "1000 B free" in msg and "re-run the same command" in msg
    assert not list(out.rglob("*.tar")) and not (out / "c.zip").exists()
    assert ".shardsmith" in msg  # the du-style summary of what --out holds
    monkeypatch.undo()
    m = build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1)  # the same command then resumes
    assert m["counts"]["written"] == 16


# ---------------------------------------------------------------- 10. a failed first run


def test_a_build_that_failed_before_any_unit_does_not_block_the_corrected_command(photos, tmp_path, monkeypatch):
    out = tmp_path / "o"
    bad = _recipe(photos)
    bad["sources"].append({"path": str(tmp_path / "no_such_folder")})
    with pytest.raises(UserError, match="does not exist"):
        build(recipe_from_dict(bad), out, quiet=True, workers=1)
    m = build(recipe_from_dict(_recipe(photos)), out, quiet=True, workers=1)
    assert m["counts"]["written"] == 16

    # a plan that completed, then a failure before the first unit: also a fresh start
    out2 = tmp_path / "o2"
    import shardsmith.build as build_mod

    def boom(*a, **kw):
        raise UserError("the first output failed")

    monkeypatch.setattr(build_mod, "_run_output", boom)
    with pytest.raises(UserError, match="first output failed"):
        build(recipe_from_dict(_recipe(photos, seed=2)), out2, quiet=True, workers=1)
    monkeypatch.undo()
    m = build(recipe_from_dict(_recipe(photos)), out2, quiet=True, workers=1)
    assert m["counts"]["written"] == 16
    assert tree_bytes(out2) == tree_bytes(out)


# ---------------------------------------------------------------- 11. orphaned workers


def _children_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill_the_build_process_alone(p) -> tuple[list, list]:
    """SIGKILL the build process alone (not its group); (its children before, those alive 5 s after)."""
    kids = _children_of(p.pid)
    assert p.poll() is None, "the build ended before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    return kids, psutil.wait_procs(kids, timeout=5)[1]


@pytest.mark.slow
def test_workers_exit_when_the_build_process_is_killed(tmp_path):
    recipe = _slow_recipe(tmp_path, n=160)
    p = subprocess.Popen([PY, "-m", "shardsmith", "build", str(recipe), "--out", str(tmp_path / "o"), "--quiet",
                          "--workers", "2"], stderr=subprocess.DEVNULL)
    try:
        assert _wait(lambda: len(_children_of(p.pid)) >= 2 and
                     (tmp_path / "o" / ".shardsmith" / "ledger.sqlite").exists())
        time.sleep(1.0)
        kids, alive = _kill_the_build_process_alone(p)
        assert len(kids) >= 2
        assert not alive, f"{len(alive)} worker(s) still alive 5 s after their parent was killed"
    finally:
        for k in _children_of(p.pid):
            k.kill()


@pytest.mark.slow
def test_plan_ahead_processes_exit_when_the_build_process_is_killed(tmp_path):
    """The plan process and its probe workers (a latent output plans ahead) die with the build."""
    src = tmp_path / "p"
    real_photos(src, 60, seed=6, min_side=40, max_side=80)
    script = tmp_path / "run.py"
    script.write_text(f"""
import time, shardsmith.plan.planner as planner
from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict
real = planner.probe_item
def slow(item, max_pixels):
    time.sleep(0.2)
    return real(item, max_pixels)
planner.probe_item = slow
build(recipe_from_dict({{"sources": [{{"path": {str(src)!r}}}], "geometry": {{"buckets": ["32x32x1"]}},
      "images": {{"upscale": True}}, "models": {{"vae": {{"family": "sd"}}}},
      "outputs": [{{"format": "latent_wds", "dir": "lat"}}]}}), {str(tmp_path / "o")!r}, quiet=True, workers=8)
""")
    p = subprocess.Popen([PY, str(script)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        # the build's 8 workers, the plan process and its 2 probe workers
        assert _wait(lambda: len(_children_of(p.pid)) >= 11, timeout=120)
        time.sleep(0.5)
        kids, alive = _kill_the_build_process_alone(p)
        assert not alive, f"{[k.pid for k in alive]} still alive 5 s after the build process was killed"
    finally:
        for k in _children_of(p.pid):
            k.kill()


# ---------------------------------------------------------------- 12. holdout vs the data


@pytest.mark.parametrize("holdout", [5000, 16, 0.9999])
def test_a_holdout_that_leaves_no_training_data_is_refused_with_the_counts(photos, tmp_path, holdout):
    out = tmp_path / "o"
    with pytest.raises(UserError) as e:
        build(recipe_from_dict(_recipe(photos, holdout=holdout)), out, quiet=True, workers=1)
    msg = str(e.value)
    assert "holdout" in msg and "16" in msg and "train" in msg, msg
    assert not list(out.rglob("*.tar")) and not list(out.rglob("*.zip"))


def test_the_summary_prints_the_achieved_holdout_per_output(photos, tmp_path):
    con = io.StringIO()
    m = build(recipe_from_dict(_recipe(photos)), tmp_path / "o", workers=1, console=Console(file=con, width=200))
    said = con.getvalue()
    for name in ("wds", "zip"):
        hold = m["outputs"][name]["splits"]["holdout"]["written"]
        total = hold + m["outputs"][name]["splits"]["train"]["written"]
        assert 0 < hold < total
        assert f"holdout {hold} of {total} written ({100 * hold / total:.1f} %)" in said, said
