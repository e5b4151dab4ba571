"""Issue 14, items 3, 4 and 8: repair keeps every intact sample past a damaged tar header and
accounts for what it drops (repair.json, read by verify); ``--from-source`` restores a damaged
shard byte-identical; verify refuses an unfinished build; hostile tar members are reported and
never copied."""

import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.errors import UserError
from shardsmith.formats import IGNORE_INDEX_FILE, LEDGER_FILE, MANIFEST_FILE, REPAIR_FILE, SHARD_COUNT_FILE
from shardsmith.recipe import recipe_from_dict
from shardsmith.safety.lock import FolderLockedError, hold
from shardsmith.verify.inspect import format_inspect, inspect_wds
from shardsmith.verify.repair import format_repair, repair_losses, repair_wds
from shardsmith.verify.runner import format_verify, verify


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as t:
        return [(m.name, t.extractfile(m).read()) for m in t.getmembers() if m.isreg()]


def headers(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as t:
        return t.getmembers()


def flip(path: Path, offset: int, mask: int = 0x20) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def _build(root: Path, n: int, per_shard: int) -> Path:
    paths = real_photos(root / "src", n, seed=14, min_side=48, max_side=120)
    for p in paths:
        p.with_suffix(".txt").write_text(f"a photo called {p.stem}")
    recipe = recipe_from_dict({"sources": [{"path": str(root / "src")}],
                               "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": per_shard,
                                            "image": {"format": "jpg", "quality": 90, "max_side": 64}}]})
    build(recipe, root / "out", quiet=True)
    return root / "out"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A finished build (out/ with ledger and manifest): 24 samples, 00000.tar holds 20 (jpg, txt, json)."""
    out = _build(tmp_path_factory.mktemp("safety_repair"), 24, 20)
    assert json.loads((out / "wds" / SHARD_COUNT_FILE).read_text()) == {"00000.tar": 20, "00001.tar": 4}
    return out


@pytest.fixture
def out(pristine, tmp_path) -> Path:
    """A private copy of the build folder (its ledger still points at the module's sources)."""
    dst = tmp_path / "out"
    shutil.copytree(pristine, dst)
    return dst


def middle_jpg(shard: Path) -> tarfile.TarInfo:
    """The header of the jpg of the shard's middle sample."""
    regs = [m for m in headers(shard) if m.isreg()]
    return regs[len(regs) // 2 // 3 * 3]


# ---------------------------------------------------------------------------------------- item 3


@pytest.mark.parametrize("where", [3, 5, 126, 150], ids=["name-illegible", "name-legible", "size", "checksum"])
def test_flipped_header_byte_keeps_every_intact_sample(out, where):
    shard = out / "wds" / "00000.tar"
    orig = members(shard)
    bad = middle_jpg(shard)
    key = bad.name.split(".")[0]
    flip(shard, bad.offset + where)

    rep = inspect_wds(shard.parent)
    s0 = rep["shards"][0]
    assert s0["truncated"] is None and [d["offset"] for d in s0["damaged_headers"]] == [bad.offset]
    assert [d["key"] for d in s0["damaged_samples"]] == [key]
    assert any("damaged tar header" in p for p in rep["problems"]) and "DAMAGED" in format_inspect(rep)

    fixed = repair_wds(shard.parent)
    e = fixed["shards"]["00000.tar"]
    assert e["action"] == "rewritten" and (e["samples_before"], e["samples_after"]) == (20, 19)
    assert e["dropped_keys"] == [key] and e["dropped"][0]["reason"].startswith("damaged tar header at byte")
    # every intact sample kept, byte for byte, in order; only the damaged sample's members are gone
    assert members(shard) == [(n, b) for n, b in orig if not n.startswith(key + ".")]
    assert json.loads((shard.parent / SHARD_COUNT_FILE).read_text()) == {"00000.tar": 19, "00001.tar": 4}
    log = json.loads((shard.parent / REPAIR_FILE).read_text())["repairs"]
    assert len(log) == 1 and log[0]["shard"] == "00000.tar" and log[0]["action"] == "rewritten"
    assert [d["key"] for d in log[0]["dropped"]] == [key] and log[0]["time"] and log[0]["backup"] == "00000.tar.orig"
    assert f"dropped {key}: damaged tar header" in format_repair(fixed)
    assert inspect_wds(shard.parent)["ok"]


def test_several_damaged_headers_cost_only_their_samples(out):
    """Two adjacent damaged headers of one sample and one of another: each sample listed once."""
    shard = out / "wds" / "00000.tar"
    orig = members(shard)
    regs = [m for m in headers(shard) if m.isreg()]
    for m in (regs[30], regs[31], regs[44]):  # sample 10's jpg and txt, sample 14's json
        flip(shard, m.offset + 140)
    keys = [regs[30].name.split(".")[0], regs[44].name.split(".")[0]]
    fixed = repair_wds(shard.parent)
    e = fixed["shards"]["00000.tar"]
    assert e["dropped_keys"] == keys and e["samples_after"] == 18
    assert members(shard) == [(n, b) for n, b in orig if n.split(".")[0] not in keys]


def test_verify_passes_after_repair_with_the_loss_accounted(out):
    shard = out / "wds" / "00000.tar"
    bad = middle_jpg(shard)
    key = bad.name.split(".")[0]
    flip(shard, bad.offset + 130)
    repair_wds(shard.parent)
    rep = verify(shard.parent, world=1, workers=0)
    checks = {c["name"]: c for c in rep["checks"]}
    assert rep["ok"], format_verify(rep)
    assert checks["manifest"]["detail"].endswith("says written=24; dataset holds 23 + 1 removed by repair "
                                                 f"(accounted in {REPAIR_FILE})")
    assert rep["repairs"]["removed"] == 1 and rep["repairs"]["samples"][0]["key"] == key
    assert f"repairs: 1 sample(s) removed by repair, accounted in {REPAIR_FILE}: 00000.tar/{key}" in format_verify(rep)

    # a loss repair.json does not account for still fails
    (shard.parent / REPAIR_FILE).write_text(json.dumps({"repairs": []}))
    assert not verify(shard.parent, world=1, workers=0)["ok"]


def test_from_source_restores_damaged_shards_byte_identical(out):
    wdir = out / "wds"
    want = {u["name"]: u["sha256"] for u in json.loads((out / MANIFEST_FILE).read_text())
            ["outputs"]["wds"]["files"]["train"]["shards"]}
    bad = middle_jpg(wdir / "00000.tar")
    key0 = bad.name.split(".")[0]
    flip(wdir / "00000.tar", bad.offset + 5)  # a damaged header
    jpg1 = next(m for m in headers(wdir / "00001.tar") if m.name.endswith(".jpg"))
    flip(wdir / "00001.tar", jpg1.offset_data + 1, 0xFF)  # a corrupt member (no JPEG SOI marker)
    damaged0 = (wdir / "00000.tar").read_bytes()

    plain = repair_wds(wdir)  # first a plain repair: one sample dropped, one ignored
    rewritten0 = (wdir / "00000.tar").read_bytes()
    assert plain["shards"]["00001.tar"]["ignored_keys"] == [jpg1.name.split(".")[0]]
    assert "repair --from-source" in format_repair(plain)
    assert len(repair_losses(wdir)) == 2

    dry = repair_wds(wdir, from_source=True, dry_run=True)
    assert {n for n, e in dry["shards"].items() if e["action"] == "restored_from_source"} == {"00000.tar", "00001.tar"}
    assert sha(wdir / "00000.tar") != want["00000.tar"]

    fixed = repair_wds(wdir, from_source=True)
    assert {n: sha(wdir / n) for n in want} == want  # byte-identical to the build
    e0, e1 = fixed["shards"]["00000.tar"], fixed["shards"]["00001.tar"]
    assert e0["action"] == e1["action"] == "restored_from_source"
    assert e0["restored"] == [key0] and e1["restored"] == [jpg1.name.split(".")[0]]
    assert (e0["samples_before"], e0["samples_after"]) == (19, 20)
    assert fixed["ignore_index"]["removed"] == {"00001.tar": [jpg1.name.split(".")[0]]}
    assert json.loads((wdir / IGNORE_INDEX_FILE).read_text()) == {}
    assert json.loads((wdir / SHARD_COUNT_FILE).read_text()) == {"00000.tar": 20, "00001.tar": 4}
    # each repair kept what it replaced
    assert (wdir / "00000.tar.orig").read_bytes() == damaged0
    assert (wdir / "00000.tar.orig.1").read_bytes() == rewritten0
    assert repair_losses(wdir) == []
    log = json.loads((wdir / REPAIR_FILE).read_text())["repairs"]
    assert [x["action"] for x in log] == ["rewritten", "ignored_keys", "restored_from_source", "restored_from_source"]
    rep = verify(wdir, world=1, workers=0)
    assert rep["ok"] and "repairs" not in rep, format_verify(rep)

    # nothing left to restore: a second run changes nothing
    again = repair_wds(wdir, from_source=True)
    assert {e["action"] for e in again["shards"].values()} == {"unchanged"}


def test_from_source_refuses_a_changed_or_missing_source(tmp_path):
    out = _build(tmp_path, 6, 3)
    wdir = out / "wds"
    flip(wdir / "00000.tar", middle_jpg(wdir / "00000.tar").offset + 126)
    damaged = (wdir / "00000.tar").read_bytes()
    src = tmp_path / "src" / "photo_00001.jpg"
    src.write_bytes(src.read_bytes() + b"\0")
    with pytest.raises(UserError, match=r"cannot rebuild 00000\.tar from its sources: item src/photo_00001\.jpg "
                                        r"\(.*photo_00001\.jpg\) changed since the build"):
        repair_wds(wdir, from_source=True)
    src.unlink()
    with pytest.raises(UserError, match=r"item src/photo_00001\.jpg \(.*\) is gone; nothing was changed"):
        repair_wds(wdir, from_source=True)
    assert (wdir / "00000.tar").read_bytes() == damaged and not (wdir / REPAIR_FILE).exists()


def test_from_source_needs_a_build_and_the_folder_lock(out, tmp_path):
    alone = tmp_path / "alone"
    shutil.copytree(out / "wds", alone)
    with pytest.raises(UserError, match=r"not written by a shardsmith build.*Run `shardsmith repair .*` without "
                                        "--from-source"):
        repair_wds(alone, from_source=True)
    with pytest.raises(UserError, match="not a folder"):
        repair_wds(alone / "00000.tar")
    with hold(out, "build"):  # a build in progress on the folder
        with pytest.raises(FolderLockedError, match=f"pid={os.getpid()}"):
            repair_wds(out / "wds")
        with pytest.raises(FolderLockedError):
            repair_wds(out / "wds", dry_run=True)


# ---------------------------------------------------------------------------------------- item 4


def _unset_complete(out: Path) -> None:
    db = sqlite3.connect(out / LEDGER_FILE)
    db.execute("DELETE FROM meta WHERE key='complete'")
    db.commit()
    db.close()


def test_verify_fails_an_unfinished_build(out):
    done = verify(out / "wds", world=1, workers=0)
    assert done["ok"], format_verify(done)
    _unset_complete(out)
    rep = verify(out / "wds", world=1, workers=0)
    assert not rep["ok"] and [c["name"] for c in rep["checks"]] == ["build_finished"]
    assert rep["checks"][0]["detail"].startswith("build not finished: resume it with the same command")
    assert "does not mark it complete" in rep["checks"][0]["detail"]
    assert "[FAIL] build_finished: build not finished" in format_verify(rep)


def test_verify_fails_a_ledger_without_manifest(out):
    (out / MANIFEST_FILE).unlink()
    rep = verify(out / "wds", world=1, workers=0)
    assert not rep["ok"]
    assert rep["checks"][0]["detail"].startswith("build not finished: resume it with the same command")
    assert f"has a ledger ({LEDGER_FILE}) but no {MANIFEST_FILE}" in rep["checks"][0]["detail"]


@pytest.mark.slow
def test_cli_unfinished_verify_and_from_source_refusal(out, tmp_path):
    _unset_complete(out)
    run = [sys.executable, "-m", "shardsmith"]
    r = subprocess.run([*run, "verify", out / "wds", "--world", "1", "--workers", "0"], capture_output=True, text=True)
    assert r.returncode == 1 and "build not finished: resume it with the same command" in r.stdout, r.stderr
    alone = tmp_path / "alone"
    shutil.copytree(out / "wds", alone)
    r = subprocess.run([*run, "repair", "--from-source", alone], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    assert "not written by a shardsmith build" in r.stderr


# ---------------------------------------------------------------------------------------- item 8


def _hostile_tar(path: Path, jpg: bytes) -> None:
    def reg(t, name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))

    def special(t, name, kind, link=""):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        t.addfile(info)

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        reg(t, "good.jpg", jpg)
        reg(t, "good.txt", b"good")
        reg(t, "../x.txt", b"escapes")
        reg(t, "/abs/y.txt", b"absolute")
        special(t, "link.jpg", tarfile.SYMTYPE, "/etc/passwd")
        reg(t, "link.txt", b"has a symlinked jpg")
        special(t, "hard.txt", tarfile.LNKTYPE, "good.txt")
        special(t, "dev.bin", tarfile.CHRTYPE)
        special(t, "pipe.txt", tarfile.FIFOTYPE)
        reg(t, "last.jpg", jpg)
        reg(t, "last.txt", b"last")


def test_hostile_members_are_reported_and_never_copied(tmp_path):
    wdir = tmp_path / "hostile"
    wdir.mkdir()
    jpg = real_photos(tmp_path / "p", 1, seed=3, min_side=32, max_side=48)[0].read_bytes()
    _hostile_tar(wdir / "00000.tar", jpg)
    assert [m.name for m in headers(wdir / "00000.tar")][2:4] == ["../x.txt", "/abs/y.txt"]

    rep = inspect_wds(wdir)
    unsafe = {u["member"]: u["reason"] for u in rep["shards"][0]["unsafe_members"]}
    assert unsafe == {"../x.txt": "path with '..' (outside the folder)", "/abs/y.txt": "absolute path",
                      "link.jpg": "symbolic link to /etc/passwd", "hard.txt": "hard link to good.txt",
                      "dev.bin": "device file", "pipe.txt": "fifo"}
    assert not rep["ok"] and rep["totals"]["unsafe_members"] == 6
    assert any("unsafe member '../x.txt'" in p for p in rep["problems"])

    fixed = repair_wds(wdir)
    e = fixed["shards"]["00000.tar"]
    assert e["action"] == "rewritten"
    assert {d["key"]: d["reason"] for d in e["dropped"]} == {
        "../x": "unsafe member ../x.txt (path with '..' (outside the folder))",
        "/abs/y": "unsafe member /abs/y.txt (absolute path)",
        "link": "unsafe member link.jpg (symbolic link to /etc/passwd)"}
    assert {m.split(":")[0] for m in e["dropped_members"]} == set(unsafe)
    assert members(wdir / "00000.tar") == [("good.jpg", jpg), ("good.txt", b"good"), ("last.jpg", jpg),
                                          ("last.txt", b"last")]
    assert all(m.isreg() for m in headers(wdir / "00000.tar"))
    assert inspect_wds(wdir)["ok"]
    log = json.loads((wdir / REPAIR_FILE).read_text())["repairs"]
    assert {d["key"] for d in log[0]["dropped"]} == {"../x", "/abs/y", "link"}


def test_damaged_pax_header_does_not_leave_a_cut_name(tmp_path):
    """A damaged PAX header: its member (whose own header holds a cut name) goes with it."""
    wdir = tmp_path / "long"
    wdir.mkdir()
    keys = [f"k{i}_" + "x" * 90 for i in range(3)]
    with tarfile.open(wdir / "00000.tar", "w", format=tarfile.PAX_FORMAT) as t:
        for k in keys:
            for suffix in ("first_member_with_a_long_suffix.txt", "txt"):
                info = tarfile.TarInfo(f"{k}.{suffix}")
                info.size = 4
                t.addfile(info, io.BytesIO(b"data"))
    pax = [m for m in headers(wdir / "00000.tar") if m.name.startswith(keys[1])][0].offset  # its PAX header
    flip(wdir / "00000.tar", pax + 130)
    fixed = repair_wds(wdir)
    assert fixed["shards"]["00000.tar"]["dropped_keys"] == [keys[1]]
    assert [n for n, _ in members(wdir / "00000.tar")] == [f"{k}.{s}" for k in (keys[0], keys[2])
                                                          for s in ("first_member_with_a_long_suffix.txt", "txt")]
