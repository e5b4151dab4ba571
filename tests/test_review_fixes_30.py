"""Review fixes: decode's lock cleanup, the image-bucket precheck's folder walk, a non-UTF-8 source folder's fix.

- A decode refused because another holds the folder's lock (``FolderLockedError``) unlinked the other holder's
  lock file (and removed the folder it had seen absent): a third decode could then take the folder while the
  first still ran. Only a decode that holds the lock cleans up now, while it still holds it.
- ``check_image_buckets`` listed a source's folders following every link, also those the folder source never
  reads (``skipped:symlink_outside_source``): a link to ``/`` listed the whole disk. It now walks what the
  source's walk reads, and gives up (refusing nothing) after a bounded number of entries.
- A source folder whose path is not UTF-8 was told to "give it through a symbolic link with a UTF-8 name", which
  cannot work (the recipe resolves the link): the message now says to rename the folder.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

import shardsmith.verify.decode as D
from shardsmith import cli
from shardsmith.errors import UserError
from shardsmith.recipe import recipe_from_dict
from shardsmith.safety.lock import FolderLockedError, hold, holder

LATENT = {"models": {"vae": {"family": "ltx", "config": "tiny"}, "device": "cpu"},
          "outputs": [{"format": "latent_wds"}], "geometry": {"buckets": ["64x64x9"]}}


def _jpg(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8)).save(path)


# ------------------------------------------------------------------------------------------- decode's lock

def test_a_decode_refused_by_anothers_lock_leaves_that_lock_and_folder(tmp_path, monkeypatch):
    out = tmp_path / "dec"  # absent: the refused decode saw it absent, then another decode made it
    other = contextlib.ExitStack()

    def racing_hold(folder, what, **kw):
        other.enter_context(hold(folder, "decode"))  # another decode takes the lock first
        return hold(folder, what, **kw)

    monkeypatch.setattr(D, "hold", racing_hold)
    with other:
        with pytest.raises(FolderLockedError):
            with D._locked(out):
                pytest.fail("the lock is held by another decode")
        assert (out / ".shardsmith" / "lock").is_file()  # the other decode's lock file is left alone
        assert holder(out) is not None  # and still locks the folder: a third decode is refused
        with pytest.raises(FolderLockedError):
            with hold(out, "decode"):
                pass
    assert out.is_dir()


def test_a_failed_decode_that_held_the_lock_still_removes_what_it_made(tmp_path):
    out = tmp_path / "dec"
    with pytest.raises(RuntimeError):
        with D._locked(out):
            assert holder(out) is not None
            raise RuntimeError("the decode failed")
    assert not out.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("x")
    with pytest.raises(RuntimeError):
        with D._locked(kept):
            raise RuntimeError("the decode failed")
    assert sorted(p.name for p in kept.iterdir()) == ["mine.txt"]


# ------------------------------------------------------------------------ the image-bucket precheck's walk

def _check(source: dict) -> None:
    from shardsmith.precheck import check_image_buckets

    check_image_buckets(recipe_from_dict({**LATENT, "sources": [source]}))


def _outside(tmp_path: Path) -> Path:
    """A folder beside the source: 50 sub-folders, one holding a clip."""
    other = tmp_path / "other"
    for i in range(50):
        (other / f"d{i:02d}").mkdir(parents=True)
    (other / "d37" / "clip.mp4").write_bytes(b"\0")
    return other


def _listed(monkeypatch) -> list[str]:
    seen: list[str] = []
    real = os.scandir

    def scandir(path="."):
        seen.append(os.path.realpath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    return seen


def test_a_link_outside_the_source_is_not_walked(tmp_path, monkeypatch):
    src = tmp_path / "src"
    _jpg(src / "a.jpg")
    _jpg(src / "imgs" / "b.jpg")
    other = _outside(tmp_path)
    (src / "imgs" / "everything").symlink_to(other)  # skipped:symlink_outside_source by the build
    (src / "imgs" / "clip.mp4").symlink_to(other / "d37" / "clip.mp4")  # so is this one
    listed = _listed(monkeypatch)
    with pytest.raises(UserError, match="every input it takes is an image"):
        _check({"path": str(src)})
    assert listed and not [p for p in listed if Path(p).is_relative_to(other.resolve())]


def test_follow_symlinks_walks_the_outside_folder(tmp_path):
    src = tmp_path / "src"
    _jpg(src / "a.jpg")
    (src / "everything").symlink_to(_outside(tmp_path))
    _check({"path": str(src), "follow_symlinks": True})  # the clip is read: not image-only


def test_a_link_inside_the_source_is_walked(tmp_path):
    src = tmp_path / "src"
    _jpg(src / "a.jpg")
    (src / "clips" / "x").mkdir(parents=True)
    (src / "clips" / "x" / "c.mp4").write_bytes(b"\0")
    (src / "a_link").symlink_to(src / "clips")  # inside: read (and "clips" itself is too)
    _check({"path": str(src)})
    src2 = tmp_path / "src2"
    _jpg(src2 / "a.jpg")
    (src2 / ".clips").mkdir()
    (src2 / ".clips" / "c.mp4").write_bytes(b"\0")
    (src2 / "clips").symlink_to(src2 / ".clips")  # a visible link to a hidden folder inside: read
    _check({"path": str(src2)})
    os.remove(src2 / "clips")
    with pytest.raises(UserError, match="every input it takes is an image"):
        _check({"path": str(src2)})  # only the hidden clip is left: not read


def test_the_walk_gives_up_without_refusing(tmp_path, monkeypatch):
    import shardsmith.precheck as P

    src = tmp_path / "src"
    for i in range(30):
        _jpg(src / f"d{i % 3}" / f"{i:02d}.jpg")
    with pytest.raises(UserError, match="every input it takes is an image"):
        _check({"path": str(src)})
    monkeypatch.setattr(P, "FOLDER_WALK_LIMIT", 10, raising=False)
    listed = _listed(monkeypatch)
    _check({"path": str(src)})  # past the bound: not certain, so not refused
    assert len(listed) <= 3


# ------------------------------------------------------------------- a source folder whose path is not UTF-8

def test_a_non_utf8_source_folder_given_through_a_link_is_told_to_rename_it(tmp_path, monkeypatch):
    folder = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9")
    os.mkdir(folder)
    _jpg(Path(folder) / "a.jpg")
    (tmp_path / "cafe_link").symlink_to(folder)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli.app, ["build", "--source", "cafe_link", "--to", "wds", "--out", "o", "-q"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert "caf\\xe9 is not valid UTF-8" in r.output and "rename the folder to a UTF-8 name" in r.output
    assert "through a symbolic link with a UTF-8 name" not in r.output
    assert not (tmp_path / "o").exists()
