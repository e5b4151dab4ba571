"""The tool commands (register, repair, report, decode, verify, inspect) after review of their refusals:

- a build whose state folder this user may not read (another user's, ``chmod 700``) is registered,
  verified and reported from its manifest; repair says what it cannot do;
- a path this user may not read (``chmod 000`` on a folder above it) is one message naming the folder
  and the fix, exit 2, never a ``PermissionError`` traceback;
- ``register --replace`` fixes a broken entry of a data config; a data config's other broken entry is
  named as such (the file is not "not a data config"); YAML anchor holders are no entries;
- ``report --output`` / ``decode --out`` in the project folder of a table source are written;
- ``repair`` of a read-only dataset gives a fix that works (the copy made writable; a ``.precomputed/``
  tree named in the copy); only what repair writes must be writable (not the build folder above);
- an unfinished build folder names its datasets to pass; the command that resumes a build is the same
  one; an output however deep in a build names the build.

Tests run as root, which permissions do not stop: a user without access is simulated by ``os.stat`` /
``os.lstat`` / ``os.access`` refusing the paths below a folder, as the kernel does for that user.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.test_cli_mistakes import assert_message, invoke
from tests.test_tool_command_refusals import (  # noqa: F401 (built, build_copy: fixtures)
    _truncate, build_copy, built, small_recipe, pictures, tree_bytes)


def _below(path, folder: str) -> bool:
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False  # (a file descriptor)
    p = os.path.abspath(os.fsdecode(os.fspath(path)))
    return p.startswith(folder + os.sep)


def deny(monkeypatch, folder: Path, write_only: tuple[Path, ...] = ()) -> None:
    """This process is a user who may not look into ``folder`` (it is ``chmod 000``, or another user's
    ``chmod 700``): ``os.stat`` / ``os.lstat`` of anything below it raise ``EACCES`` and ``os.access`` says no
    for it and below it. ``write_only``: folders this user may read but not write (``os.access`` W_OK)."""
    base = os.path.abspath(folder)
    ro = {os.path.abspath(p) for p in write_only}
    real_stat, real_lstat, real_access = os.stat, os.lstat, os.access

    def refused(path):
        return PermissionError(errno.EACCES, "Permission denied", os.fsdecode(os.fspath(path)))

    def stat(path, *a, **k):
        if _below(path, base):
            raise refused(path)
        return real_stat(path, *a, **k)

    def lstat(path, *a, **k):
        if _below(path, base):
            raise refused(path)
        return real_lstat(path, *a, **k)

    def access(path, mode, *a, **k):
        if isinstance(path, (str, bytes, os.PathLike)):
            p = os.path.abspath(os.fsdecode(os.fspath(path)))
            if p == base or _below(p, base) or (mode & os.W_OK and p in ro):
                return False
        return real_access(path, mode, *a, **k)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(os, "access", access)


def read_only(monkeypatch, *folders: Path) -> None:
    """This user may read ``folders`` but not write them (``os.access`` W_OK says no)."""
    deny(monkeypatch, Path("/nonexistent-shardsmith-test"), folders)


# -- 1. another user's build (its .shardsmith/ closed): register and report as before ------------------------

def test_register_and_report_a_build_whose_state_folder_this_user_cannot_read(build_copy, tmp_path, monkeypatch):
    cfg = tmp_path / "data.yaml"
    deny(monkeypatch, build_copy / ".shardsmith")
    code, said = invoke("register", build_copy / "wds", "--preset", "image", "--name", "x", "--config", cfg)
    assert code == 0 and "Traceback" not in said, said
    assert f"path: {(build_copy / 'wds').resolve().as_posix()}" in cfg.read_text()  # $DATA_ROOT_DIR unset: absolute
    code, said = invoke("report", build_copy, "--no-previews", "--output", tmp_path / "r.html")
    assert code == 0 and (tmp_path / "r.html").is_file(), said
    assert "state folder cannot be read by this user" in (tmp_path / "r.html").read_text()
    code, said = invoke("repair", build_copy / "wds", "--dry-run")  # reads only: as before
    assert code == 0, said
    # repair writes its lock there: one message and the fix
    assert_message(*invoke("repair", build_copy / "wds"), f"{build_copy.resolve() / '.shardsmith'}",
                   "cannot be written", "repair a writable copy")
    assert_message(*invoke("repair", build_copy / "wds", "--from-source"), "cannot read the ledger",
                   "permission denied", "--from-source needs it")


def test_an_unreadable_ledger_is_not_taken_for_an_unfinished_build(build_copy, monkeypatch):
    from shardsmith.formats.detect import enclosing_build
    from shardsmith.verify.owning_build import find_build, unfinished_build

    deny(monkeypatch, build_copy / ".shardsmith")
    found = enclosing_build(build_copy / "wds")
    assert found.root == build_copy.resolve() and found.has_manifest and not found.has_ledger
    assert found.ledger_unreadable
    assert unfinished_build(build_copy / "wds") is None
    ref = find_build(build_copy / "wds")
    assert ref is not None and ref.complete and ref.output == "wds"


def test_verify_a_build_whose_state_folder_this_user_cannot_read(build_copy, monkeypatch):
    deny(monkeypatch, build_copy / ".shardsmith")
    code, said = invoke("verify", build_copy / "wds", "--world", "1", "--workers", "0")
    assert code == 0 and "Traceback" not in said, said


# -- 2. a path below a folder this user may not read ---------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["verify", "{p}", "--world", "1", "--workers", "0"],
    ["decode", "{p}", "--out", "{tmp}/dec"],
    ["register", "{p}", "--preset", "image", "--name", "x", "--config", "{tmp}/d.yaml"],
    ["repair", "{p}"],
    ["repair", "{p}", "--dry-run"],
    ["report", "{p}"],
    ["inspect", "{p}"],
])
def test_a_path_below_a_folder_this_user_cannot_read_is_one_message(tmp_path, monkeypatch, args):
    locked = tmp_path / "locked"
    (locked / "inner").mkdir(parents=True)
    deny(monkeypatch, locked)
    given = locked / "inner"
    code, said = invoke(*[a.format(p=given, tmp=tmp_path) for a in args])
    assert_message(code, said, f"{given}: permission denied on {locked}", "cannot read", "fix:",
                   f"chmod u+rX {locked}")
    assert not (tmp_path / "dec").exists() and not (tmp_path / "d.yaml").exists()


def test_the_path_itself_unreadable_is_one_message(tmp_path, monkeypatch):
    from shardsmith.report_html.gather import read_manifest
    from shardsmith.user_paths import PathPermissionError, user_path_exists

    locked = tmp_path / "locked"
    locked.mkdir()
    deny(monkeypatch, locked)
    with pytest.raises(PathPermissionError, match=f"cannot read {locked}: permission denied \\(fix: "):
        user_path_exists(locked)
    with pytest.raises(PathPermissionError, match="permission denied on"):
        read_manifest(locked / "inner")  # (the API too)
    assert user_path_exists(tmp_path / "missing") is False


# -- 3. register --replace fixes a broken entry; anchors are no entries --------------------------------------

BROKEN = "# mine\ngood: {preset: image, path: /data/good}\nbroken: {presett: image, path: /data/b}\n"


def test_register_replace_fixes_a_broken_entry(built, tmp_path):
    cfg = tmp_path / "rep.yaml"
    cfg.write_text(BROKEN)
    code, said = invoke("register", built / "wds", "--preset", "image", "--name", "broken", "--replace",
                        "--config", cfg)
    assert code == 0, said
    import yaml

    data = yaml.safe_load(cfg.read_text())
    assert data["good"] == {"preset": "image", "path": "/data/good"}
    assert data["broken"]["preset"] == "image" and cfg.read_text().startswith("# mine\n")


def test_another_broken_entry_of_a_data_config_is_named_not_the_file_called_foreign(built, tmp_path):
    cfg = tmp_path / "rep.yaml"
    cfg.write_text(BROKEN)
    code, said = invoke("register", built / "wds", "--preset", "image", "--name", "new", "--config", cfg)
    assert_message(code, said, f"{cfg} is a data config whose entry 'broken'", "is broken",
                   "--name broken --replace")
    assert "not a shardsmith data config" not in said and cfg.read_text() == BROKEN
    steps = tmp_path / "steps.yaml"  # one entry, then something else: that key named
    steps.write_text("mine:\n  preset: image\n  path: /d\nsteps: 100\n")
    assert_message(*invoke("register", built / "wds", "--preset", "image", "--name", "x", "--config", steps),
                   "whose entry 'steps' (100) is broken")


def test_check_entries_rules(tmp_path):
    from shardsmith.loaders.registry import RegistryError, add_entry, check_config, read_config

    entry = {"preset": "image", "path": "/x"}
    only_broken = tmp_path / "only.yaml"  # the one entry --replace rewrites is broken: fine
    only_broken.write_text("b: {presett: image, path: /b}\n")
    check_config(only_broken, "b")
    add_entry(only_broken, "b", entry, replace=True)
    assert read_config(only_broken) == {"b": entry}
    trainer = tmp_path / "train.yaml"  # another program's file stays foreign, --replace or not
    trainer.write_text("model: {name: dit}\noptimizer: adamw\n")
    with pytest.raises(RegistryError, match="is not a shardsmith data config"):
        check_config(trainer, "model")
    anchors = tmp_path / "anchors.yaml"  # a YAML anchor holder is no entry and no foreign key
    text = "_defaults: &d {preset: image, overrides: {batch_size: 4}}\na:\n  <<: *d\n  path: /a\n"
    anchors.write_text(text)
    check_config(anchors)
    add_entry(anchors, "x", entry)
    assert read_config(anchors)["x"] == entry and anchors.read_text().startswith(text)
    pre = tmp_path / "pre.yaml"  # a precomputed entry from_config could not load (no dirs): broken
    pre.write_text("a: {preset: image, path: /a}\np: {kind: precomputed, path: /p}\n")
    with pytest.raises(RegistryError, match="entry 'p'"):
        check_config(pre)


# -- 4. report --output / decode --out in the project folder of a table source ------------------------------

def test_outputs_beside_a_table_are_fine_and_a_home_table_blocks_nothing_under_home(tmp_path, monkeypatch):
    from shardsmith.safety.outdir import OutAroundSourceError, RecordedSource, recorded_sources, refuse_around_sources

    monkeypatch.setenv("HOME", str(tmp_path))
    manifest = {"recipe": {"sources": [{"path": "~/captions.csv"}, {"path": str(tmp_path / "photos"), "name": "p"}]},
                "sources": [{"name": "captions", "kind": "table"}, {"name": "p", "kind": "folder"}]}
    found = recorded_sources(manifest)
    assert found == [RecordedSource("~/captions.csv", "~/captions.csv"), RecordedSource("p", str(tmp_path / "photos"))]
    assert all(isinstance(s, RecordedSource) for s in found)
    for fine in (tmp_path / "report.html", tmp_path / "proj" / "dec", tmp_path / "out"):
        refuse_around_sources(fine, found, "--output")
    with pytest.raises(OutAroundSourceError, match="is source '~/captions.csv'"):
        refuse_around_sources(tmp_path / "captions.csv", found, "--output")
    with pytest.raises(OutAroundSourceError, match="lies inside source 'p'"):
        refuse_around_sources(tmp_path / "photos" / "dec", found)


# -- 5, 6. repair of a read-only dataset: a fix that works ---------------------------------------------------

def _precomputed_build(root: Path) -> Path:
    """A finished build folder (its manifest) holding a ``.precomputed/`` tree with one unpaired file."""
    pre = root / ".precomputed"
    (pre / "latents").mkdir(parents=True)
    (pre / "conditions").mkdir()
    (pre / "latents" / "a.pt").write_bytes(b"not a tensor")
    (root / "manifest.json").write_text(json.dumps({"counts": {}, "outputs": {}}))
    return pre


def test_repair_of_a_read_only_precomputed_tree_names_the_tree_in_the_copy(tmp_path, monkeypatch):
    root = tmp_path / "out"
    pre = _precomputed_build(root)
    before = tree_bytes(root)
    read_only(monkeypatch, pre / "latents", pre / "conditions")
    code, said = invoke("repair", pre)
    r = root.resolve()
    assert_message(code, said, f"{r / '.precomputed/latents'} and {r / '.precomputed/conditions'} cannot be written",
                   "moves unreadable and unpaired .pt files", "it has no --out",
                   f"chmod -R u+w {r / '.precomputed'}",
                   f"cp -a {r} COPY; chmod -R u+w COPY; then shardsmith repair COPY/.precomputed",
                   f"shardsmith repair --dry-run {pre}")
    assert "damaged shards" not in said and "index files" not in said
    assert tree_bytes(root) == before


def test_the_fixes_a_read_only_precomputed_repair_suggests_work(tmp_path, monkeypatch):
    root = tmp_path / "out"
    pre = _precomputed_build(root)
    read_only(monkeypatch, pre / "latents", pre / "conditions")
    code, said = invoke("repair", pre)
    assert code == 2, said
    code, said = invoke("repair", "--dry-run", pre)  # the dry run it names
    assert code == 0 and "would move 1 file(s)" in said, said
    copy = tmp_path / "COPY"  # the copy it names (cp -a; chmod -R u+w), then repair COPY/.precomputed
    shutil.copytree(root, copy, symlinks=True)
    code, said = invoke("repair", copy / ".precomputed")
    assert code == 0 and "moved 1 file(s)" in said, said
    assert not (copy / ".precomputed" / "latents" / "a.pt").exists() and (pre / "latents" / "a.pt").exists()


# -- 7. only what repair writes must be writable ------------------------------------------------------------

def test_repair_with_only_the_build_folder_read_only_repairs(build_copy, monkeypatch):
    _truncate(build_copy / "wds" / "00000.tar")
    read_only(monkeypatch, build_copy)  # the top folder: repair writes only .shardsmith/lock and wds/
    code, said = invoke("repair", build_copy / "wds")
    assert code == 0, said
    assert (build_copy / "wds" / "00000.tar.orig").is_file() and (build_copy / "wds" / "repair.json").is_file()


# -- 8. messages: the datasets to pass, the same command, a deep output ------------------------------------

def test_an_unfinished_build_with_holdout_names_every_dataset_to_pass(tmp_path, disk_full_at):
    import shardsmith

    recipe = {**small_recipe(pictures(tmp_path / "src", 4)), "split": {"holdout": 1, "seed": 3}}
    out = tmp_path / "out"
    disk_full_at(0)
    with pytest.raises(Exception):
        shardsmith.build(recipe, out, quiet=True)
    code, said = invoke("repair", out)
    assert_message(code, said, f"{out} is an unfinished build",
                   f"re-run the same `shardsmith build ... --out {out}` command (it resumes",
                   f"then repair one of its datasets ({out / 'wds'}, {out / 'holdout' / 'wds'})")
    assert "RECIPE" not in said


def test_report_and_decode_of_a_deeply_nested_output_name_the_build(tmp_path):
    root = tmp_path / "b"
    deep = root / "holdout" / "deep" / "er" / "wds"
    deep.mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({"counts": {}, "outputs": {}}))
    r = root.resolve()
    assert_message(*invoke("report", deep, "--no-previews"), f"inside the shardsmith build at {r}",
                   f"pass {r} instead")
    assert_message(*invoke("decode", deep, "--out", tmp_path / "dec"), f"lies inside the shardsmith build {r}",
                   f"pass {r} instead")


# -- 9. one unfinished-build check per repair --------------------------------------------------------------

def test_repair_checks_for_an_unfinished_build_once(built, monkeypatch):
    from shardsmith.verify import repair

    calls = []
    check = repair.refuse_unfinished_build
    monkeypatch.setattr(repair, "refuse_unfinished_build", lambda *a, **k: calls.append(a) or check(*a, **k))
    code, said = invoke("repair", built / "wds", "--dry-run")
    assert code == 0, said
    assert len(calls) == 1


def test_a_ledger_not_marked_complete_still_refuses_register(build_copy, tmp_path):
    db = sqlite3.connect(build_copy / ".shardsmith" / "ledger.sqlite")
    db.execute("DELETE FROM meta WHERE key='complete'")
    db.commit()
    db.close()
    code, said = invoke("register", build_copy, "--preset", "image", "--name", "x", "--config", tmp_path / "d.yaml")
    assert_message(code, said, "unfinished build", f"then register {build_copy.resolve() / 'wds'}")
