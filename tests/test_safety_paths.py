"""Sources read nothing outside their own folder, and a bad path is one item's failure, not the build's.

Issue 14, items 5-7: absolute and symlinked table paths follow the ``..`` rule; folder links that
leave the source folder are skipped unread (``follow_symlinks`` opts in); no detail quotes a refused
file's bytes; a symlink loop, an unlistable sub-folder and a file that vanishes after the listing
are per-item failures, the build goes on and reconciles, and its resume is byte-identical.
"""

import errno
import json
import os
import sqlite3
import zipfile
from pathlib import Path

import pytest

from media_factory import real_photos, write_table
from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict
from shardsmith.scan import scan
from shardsmith.sources import paths
from shardsmith.sources.base import SourceError
from shardsmith.sources.folder import FolderSource
from test_build import balanced, read_wds, tree_bytes

SECRET = "TOPSECRET-do-not-read root:x:0:0"
OUTPUTS = [{"format": "wds", "samples_per_shard": 4},
           {"format": "zip", "resolution": 32, "transform": "center-crop"}]


def _recipe(source: dict) -> object:
    return recipe_from_dict({"sources": [source], "outputs": OUTPUTS})


def _plan_rows(out: Path) -> dict[str, tuple]:
    """item_id -> (key, plan_status, detail, sha256) from the build's ledger."""
    db = sqlite3.connect(out / ".shardsmith" / "ledger.sqlite")
    try:
        return {r[0]: r[1:] for r in db.execute(
            "SELECT item_id, key, plan_status, detail, sha256 FROM items ORDER BY idx")}
    finally:
        db.close()


def _ledger_text(out: Path) -> str:
    db = sqlite3.connect(out / ".shardsmith" / "ledger.sqlite")
    try:
        return "\n".join(db.iterdump())
    finally:
        db.close()


def _written_paths(out: Path) -> set[str]:
    return {s["json"]["path"] for shard in read_wds(out / "wds").values() for s in shard}


def _zip_count(out: Path) -> int:
    with zipfile.ZipFile(out / "dataset.zip") as z:
        return sum(n.endswith(".png") for n in z.namelist())


def _assert_nothing_quoted(out: Path, report: dict) -> None:
    """No byte of a refused file shows in the manifest, the ledger, the outputs or the scan."""
    texts = {"manifest": (out / "manifest.json").read_text(), "ledger": _ledger_text(out),
             "scan": json.dumps(report)}
    for f in out.rglob("*"):
        if f.is_file() and ".shardsmith" not in f.parts and f.name != "manifest.json":
            texts[str(f)] = f.read_bytes().decode("latin-1")
    for where, text in texts.items():
        assert "TOPSECRET" not in text and "root:x:" not in text, where


def _scan_status(report: dict) -> dict[str, str]:
    return {p["id"]: p["status"] for p in report["problems"]}


# --------------------------------------------------------------------------- the pure rules


def test_within_is_by_component_and_exact():
    assert paths.within("/a/b", "/a/b") and paths.within("/a/b/c.jpg", "/a/b")
    assert not paths.within("/a/bc.jpg", "/a/b") and not paths.within("/a", "/a/b")
    assert paths.within("/etc/passwd", "/")


def test_table_target_and_statuses():
    assert paths.table_target("/etc/passwd", "/t") == "/etc/passwd"
    assert paths.table_target("media/x.jpg", "/t/") == "/t/media/x.jpg"
    assert paths.table_target("../x.jpg", "/t") == "/t/../x.jpg"
    assert paths.status_of("symlink_outside_source") == "skipped:symlink_outside_source"
    assert paths.status_of("symlink_loop") == "failed:symlink_loop"
    assert paths.read_error_reason(errno.ENOENT) == "vanished"
    assert paths.read_error_reason(errno.ELOOP) == "symlink_loop"
    assert paths.read_error_reason(errno.EACCES) == "unreadable"
    assert paths.is_loop("/s/a", {"/s", "/s/a"}) and not paths.is_loop("/s/b", {"/s", "/s/a"})
    assert {"path_outside_table_dir", "symlink_outside_source", "symlink_loop"} <= paths.NO_BYTES


# --------------------------------------------------------------------------- item 5: tables


@pytest.fixture
def table_case(tmp_path):
    """A table whose rows name: two files inside (one by absolute path), an outside photo by
    absolute path, /etc/passwd, a link inside the table folder to an outside photo, ``..`` and
    a link loop."""
    tdir = tmp_path / "tbl"
    inside = real_photos(tdir / "media", 2, seed=21, min_side=40, max_side=80)
    outside = real_photos(tmp_path / "elsewhere", 2, seed=22, min_side=40, max_side=80)
    (tdir / "media" / "link.jpg").symlink_to(outside[1])
    (tdir / "media" / "loop.jpg").symlink_to(tdir / "media" / "loop.jpg")
    rows = [{"file": "media/photo_00000.jpg", "text": "in, relative"},
            {"file": str(inside[1]), "text": "in, absolute"},
            {"file": str(outside[0]), "text": "out, absolute"},
            {"file": "/etc/passwd", "text": "system file"},
            {"file": "media/link.jpg", "text": "out, through a link"},
            {"file": "../elsewhere/photo_00000.jpg", "text": "out, dot-dot"},
            {"file": "media/loop.jpg", "text": "a link loop"}]
    return tdir, write_table(tdir, rows, "csv"), inside, outside


def test_table_absolute_and_linked_paths_outside_fail_unread(table_case, tmp_path):
    tdir, table, inside, outside = table_case
    src = {"path": str(table), "columns": {"media": "file", "caption": "text"}}
    m = build(_recipe(src), tmp_path / "o", quiet=True, workers=1)
    assert m["counts"]["inputs"] == 7 and m["counts"]["written"] == 2
    assert m["counts"]["failed"] == {"path_outside_table_dir": 4, "symlink_loop": 1} and balanced(m["counts"])
    for o in ("wds", "zip"):
        assert m["outputs"][o]["counts"]["written"] == 2
    assert _zip_count(tmp_path / "o") == 2
    # an absolute path inside the table's folder is named as the folder source names it
    assert _written_paths(tmp_path / "o") == {"media/photo_00000.jpg", "media/photo_00001.jpg"}
    rows = _plan_rows(tmp_path / "o")
    refused = {i: r for i, r in rows.items() if r[1] == "failed:path_outside_table_dir"}
    assert {i.split("/", 1)[1] for i in refused} == {
        str(outside[0]), "/etc/passwd", "media/link.jpg", "../elsewhere/photo_00000.jpg"}
    assert all(r[3] is None for r in refused.values())  # never opened, so never hashed
    assert all("allow_outside_paths" in r[2] for r in refused.values())
    report = scan(_recipe(src), size_sample=0)
    assert _scan_status(report) == {**{i: "failed:path_outside_table_dir" for i in refused},
                                    "metadata/media/loop.jpg": "failed:symlink_loop"}
    _assert_nothing_quoted(tmp_path / "o", report)


def test_table_allow_outside_paths_reads_them(table_case, tmp_path):
    tdir, table, inside, outside = table_case
    src = {"path": str(table), "columns": {"media": "file", "caption": "text"}, "allow_outside_paths": True}
    m = build(recipe_from_dict({"sources": [src], "outputs": OUTPUTS[:1]}), tmp_path / "o", quiet=True, workers=1)
    # the outside photo is named twice (absolute and ../), the link lands on the second outside photo
    assert m["counts"]["written"] == 4 and m["counts"]["skipped"] == {"duplicate": 1, "unsupported_kind_other": 1}
    assert str(outside[0]) in _written_paths(tmp_path / "o")


# --------------------------------------------------------------------------- item 6: folder links


@pytest.fixture
def linked_folder(tmp_path):
    """A source folder with links that stay inside (fine) and links that leave it (refused)."""
    src = tmp_path / "src"
    real_photos(src, 3, seed=31, min_side=40, max_side=80)
    real_photos(src / "sub", 1, seed=32, min_side=40, max_side=80)
    outside = real_photos(tmp_path / "outside", 2, seed=33, min_side=40, max_side=80)
    secret = tmp_path / "secret.jpg"
    secret.write_text(SECRET + "\n" * 50)
    (src / "inside_link.jpg").symlink_to(src / "sub" / "photo_00000.jpg")
    (src / "inside_dir").symlink_to(src / "sub")
    (src / "out_file.jpg").symlink_to(outside[0])
    (src / "out_dir").symlink_to(tmp_path / "outside")
    (src / "x.jpg").symlink_to("/etc/passwd")
    (src / "y.jpg").symlink_to(secret)
    (src / "photo_00002.txt").symlink_to(secret)  # a sidecar caption that leaves the folder
    return src


REFUSED_LINKS = {"out_file.jpg", "out_dir", "x.jpg", "y.jpg", "photo_00002.jpg"}


def test_folder_links_outside_are_skipped_unread(linked_folder, tmp_path):
    rec = recipe_from_dict({"sources": [{"path": str(linked_folder), "labels": "none"}], "split": {"dedup": False},
                            "outputs": OUTPUTS})
    m = build(rec, tmp_path / "o", quiet=True, workers=1)
    rows = {i.split("/", 1)[1]: r for i, r in _plan_rows(tmp_path / "o").items()}
    skipped = {i for i, r in rows.items() if r[1] == "skipped:symlink_outside_source"}
    assert skipped == REFUSED_LINKS
    assert all(rows[i][3] is None for i in skipped)  # never opened
    assert "follow_symlinks: true" in rows["x.jpg"][2] and "photo_00002.txt" in rows["photo_00002.jpg"][2]
    written = _written_paths(tmp_path / "o")
    assert written == {"photo_00000.jpg", "photo_00001.jpg", "sub/photo_00000.jpg", "inside_link.jpg",
                       "inside_dir/photo_00000.jpg"}
    assert m["counts"]["skipped"] == {"symlink_outside_source": 5} and balanced(m["counts"])
    assert m["outputs"]["zip"]["counts"]["written"] == 5 and _zip_count(tmp_path / "o") == 5
    report = scan(rec, size_sample=0)
    assert {i.split("/", 1)[1] for i, s in _scan_status(report).items()
            if s == "skipped:symlink_outside_source"} == REFUSED_LINKS
    _assert_nothing_quoted(tmp_path / "o", report)


def test_follow_symlinks_opts_in_and_still_quotes_no_bytes(linked_folder, tmp_path):
    rec = recipe_from_dict({"sources": [{"path": str(linked_folder), "follow_symlinks": True, "captions": "none",
                                         "labels": "none"}],
                            "split": {"dedup": False}, "outputs": OUTPUTS[:1]})
    m = build(rec, tmp_path / "o", quiet=True, workers=1)
    written = _written_paths(tmp_path / "o")
    assert {"out_file.jpg", "out_dir/photo_00000.jpg", "out_dir/photo_00001.jpg"} <= written
    rows = {i.split("/", 1)[1]: r for i, r in _plan_rows(tmp_path / "o").items()}
    assert rows["x.jpg"][1] == rows["y.jpg"][1] == "failed:not_an_image"  # read (opted in), refused as media
    assert balanced(m["counts"])
    _assert_nothing_quoted(tmp_path / "o", scan(rec, size_sample=0))


# --------------------------------------------------------------------------- item 7: loops, unreadable, vanished


@pytest.fixture
def troubled_folder(tmp_path):
    """Photos plus: a self-loop link, a link back to an ancestor folder, a dangling link, a
    sub-folder that will not list (``locked``) and a file that vanishes after the listing
    (``gone.jpg``)."""
    src = tmp_path / "src"
    real_photos(src, 4, seed=41, min_side=40, max_side=80)
    real_photos(src / "deep", 1, seed=42, min_side=40, max_side=80)
    real_photos(src / "locked", 2, seed=43, min_side=40, max_side=80)
    real_photos(src / "tmp", 1, seed=44, min_side=40, max_side=80)[0].rename(src / "gone.jpg")
    (src / "loop.jpg").symlink_to(src / "loop.jpg")
    (src / "deep" / "up").symlink_to(src)
    (src / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    return src


def _break_folder_and_vanish(monkeypatch, src: Path) -> None:
    """``locked`` cannot be listed (as chmod 000 does for a non-root user); ``gone.jpg`` is deleted
    as soon as the walk yields it, i.e. between the listing and the probe's read."""
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path) == str(src / "locked"):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_scandir(path)

    items = FolderSource.items

    def vanishing(self):
        for item in items(self):
            if item.relpath == "gone.jpg" and os.path.exists(item.path):
                os.unlink(item.path)
            yield item

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(FolderSource, "items", vanishing)


TROUBLE = {"loop.jpg": "failed:symlink_loop", "deep/up": "failed:symlink_loop", "dangling.jpg": "failed:broken_symlink",
           "locked": "failed:unreadable_folder", "gone.jpg": "failed:vanished"}


def _statuses(out: Path) -> dict[str, str]:
    return {i.split("/", 1)[1]: r[1] for i, r in _plan_rows(out).items() if r[1] != "ok"}


def test_loops_unlistable_folders_and_vanished_files_fail_per_item(troubled_folder, tmp_path, monkeypatch):
    _break_folder_and_vanish(monkeypatch, troubled_folder)
    rec = recipe_from_dict({"sources": [{"path": str(troubled_folder)}], "outputs": OUTPUTS[:1]})
    m = build(rec, tmp_path / "o", quiet=True, workers=1)
    assert _statuses(tmp_path / "o") == TROUBLE
    assert m["counts"]["written"] == 5 and m["counts"]["inputs"] == 10 and balanced(m["counts"])
    assert m["counts"]["failed"] == {"symlink_loop": 2, "broken_symlink": 1, "unreadable_folder": 1, "vanished": 1}
    rows = {i.split("/", 1)[1]: r for i, r in _plan_rows(tmp_path / "o").items()}
    assert str(troubled_folder / "locked") in rows["locked"][2] and "gone.jpg" in rows["gone.jpg"][2]
    (troubled_folder / "gone.jpg").write_bytes(b"back again")  # vanishes again during the scan
    assert _scan_status(scan(rec, size_sample=0)) == {f"{troubled_folder.name}/{k}": v for k, v in TROUBLE.items()}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 folder")
def test_a_chmod_000_sub_folder_fails_as_an_item(tmp_path):
    src = tmp_path / "src"
    real_photos(src, 2, seed=45, min_side=40, max_side=80)
    real_photos(src / "locked", 1, seed=46, min_side=40, max_side=80)
    (src / "locked").chmod(0)
    try:
        m = build(_recipe({"path": str(src)}), tmp_path / "o", quiet=True, workers=1)
    finally:
        (src / "locked").chmod(0o755)
    assert _statuses(tmp_path / "o") == {"locked": "failed:unreadable_folder"} and balanced(m["counts"])


def test_an_unlistable_source_folder_is_still_a_source_error(tmp_path, monkeypatch):
    src = tmp_path / "src"
    real_photos(src, 1, seed=47, min_side=40, max_side=80)
    real_scandir = os.scandir

    def scandir(path="."):
        if not isinstance(path, int) and os.fspath(path) == str(src):  # (shutil.rmtree lists by descriptor)
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(SourceError, match="cannot list"):
        build(_recipe({"path": str(src)}), tmp_path / "o", quiet=True, workers=1)


def test_failure_rows_have_stable_keys_and_resume_is_byte_identical(troubled_folder, tmp_path, monkeypatch):
    from shardsmith.sinks.wds import WdsSink

    rec = recipe_from_dict({"sources": [{"path": str(troubled_folder), "labels": "none"}], "outputs": OUTPUTS})
    gone = (troubled_folder / "gone.jpg").read_bytes()
    _break_folder_and_vanish(monkeypatch, troubled_folder)
    build(rec, tmp_path / "ref", quiet=True, workers=1)
    (troubled_folder / "gone.jpg").write_bytes(gone)
    write = WdsSink.write_unit

    def crash(self, seq, samples):
        if seq == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, seq, samples)

    monkeypatch.setattr(WdsSink, "write_unit", crash)
    with pytest.raises(OSError, match="No space left"):
        build(rec, tmp_path / "o", quiet=True, workers=1)
    monkeypatch.setattr(WdsSink, "write_unit", write)
    build(rec, tmp_path / "o", quiet=True, workers=1)
    assert _plan_rows(tmp_path / "o") == _plan_rows(tmp_path / "ref")
    assert _statuses(tmp_path / "o") == TROUBLE
    assert tree_bytes(tmp_path / "o") == tree_bytes(tmp_path / "ref")
