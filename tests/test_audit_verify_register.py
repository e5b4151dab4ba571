"""Audit B (verify, report, repair, register): damaged inputs and user mistakes end in one clear message
(exit 2) or, for ``verify``, a failed check naming what is broken; never a traceback; nothing the user did
not ask to write is written or overwritten."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

import shardsmith
from shardsmith.errors import UserError
from tests.media_factory import real_photos
from tests.test_cli_mistakes import assert_message, invoke

PY = sys.executable




@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A finished build of 12 real photos: ``wds/`` in 3 shards of 4, and ``photos.zip`` (EDM, 32 px)."""
    base = tmp_path_factory.mktemp("auditB")
    real_photos(base / "src", 12, max_side=240)
    recipe = {"sources": [{"path": str(base / "src"), "license": "CC0"}],
              "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 4, "image": {"size": 64}},
                          {"format": "zip", "path": "photos.zip", "resolution": 32, "upscale": True}]}
    shardsmith.build(recipe, base / "out", quiet=True)
    return base / "out"


@pytest.fixture
def build_copy(built, tmp_path) -> Path:
    dest = tmp_path / "b"
    shutil.copytree(built, dest)
    return dest


def _failed(rep: dict, name: str) -> str:
    got = [c for c in rep["checks"] if c["name"] == name]
    assert got and not got[0]["ok"], rep["checks"]
    assert rep["ok"] is False
    return got[0]["detail"]


# -- #1: report --output never overwrites what is not a report ------------------------------------------------

def test_report_output_refuses_build_files_and_other_files(build_copy, tmp_path):
    from shardsmith.report_html import ReportError, write_report

    b = build_copy
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    victims = [b / "manifest.json", b / "wds" / "00000.tar", b / ".shardsmith" / "ledger.sqlite", notes]
    before = {p: p.read_bytes() for p in victims}
    for target, says in ((b / "manifest.json", "inside the shardsmith build"),
                         (b / "wds" / "00000.tar", "inside the shardsmith build"),
                         (b / ".shardsmith" / "ledger.sqlite", "inside the shardsmith build"),
                         (b / "wds" / "new.html", "inside the shardsmith build"),
                         (notes, "is not a shardsmith report"),
                         (tmp_path / "nope" / "r.html", "does not exist")):
        with pytest.raises(ReportError, match=says):
            write_report(b, target, previews=False)
    assert {p: p.read_bytes() for p in victims} == before
    assert not (tmp_path / "nope").exists() and not (b / "wds" / "new.html").exists()
    # a report written before is rewritten; the build's own report.html too
    page = write_report(b, tmp_path / "r.html", previews=False)
    assert write_report(b, page, previews=False) == page
    assert write_report(b, b / "report.html", previews=False) == b / "report.html"
    code, out = invoke("report", b, "--output", b / "manifest.json", "--no-previews")
    assert_message(code, out, "manifest.json", "pick a new file name")
    assert (b / "manifest.json").read_bytes() == before[b / "manifest.json"]


# -- #3: a shard tarfile cannot read ------------------------------------------------------------------------

def test_shard_reader_names_an_unreadable_shard(tmp_path):
    from shardsmith.formats.tar import ShardUnreadable
    from shardsmith.loaders.shard_reader import shard_samples

    for name, data in (("empty.tar", b""), ("junk.tar", b"junk\n" * 10), ("rand.tar", os.urandom(3000))):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ShardUnreadable) as got:
            shard_samples(tmp_path / name)
        exc = got.value
        assert isinstance(exc, UserError) and isinstance(exc, tarfile.ReadError)
        assert name in str(exc) and "shardsmith repair" in str(exc)
        assert str(pickle.loads(pickle.dumps(exc))) == str(exc)  # crosses from a DataLoader worker


@pytest.mark.slow
def test_verify_fails_a_check_naming_an_unreadable_shard(build_copy):
    wds = build_copy / "wds"
    size = (wds / "00001.tar").stat().st_size
    os.truncate(wds / "00001.tar", size // 2)
    (wds / "00002.tar").write_bytes(b"")
    rep = shardsmith.verify(wds, world=1, workers=1).report
    detail = _failed(rep, "shards")
    assert "00001.tar" in detail and "00002.tar" in detail and "shardsmith repair" in detail
    code, out = invoke("scan", wds)
    assert_message(code, out, "00001.tar", "not a readable tar shard")


# -- #4 / #8: damaged ledger, read-only build, broken manifest ---------------------------------------------------

def test_damaged_ledger_is_a_failed_check_and_one_message(build_copy):
    from shardsmith.report_html import ReportError, write_report

    (build_copy / ".shardsmith" / "ledger.sqlite").write_text("junk\n")
    rep = shardsmith.verify(build_copy / "wds", world=1, workers=1).report
    assert "ledger.sqlite" in _failed(rep, "ledger")
    with pytest.raises(ReportError, match="ledger.sqlite cannot be read"):
        write_report(build_copy, previews=False)
    code, out = invoke("repair", build_copy / "wds", "--dry-run")  # the shards are still repairable
    assert code == 0 and "Traceback" not in out, out


@pytest.mark.parametrize("text, says", [
    ('{"counts": ', "not valid JSON"),
    ("[]", "JSON list"),
    ('{"outputs": []}', "outputs is not an object"),
    ('{"outputs": {"wds": {"files": {"train": {"dir": "wds"}}}}}', "splits.train.written"),
])
def test_broken_manifest_is_a_failed_manifest_check(build_copy, text, says):
    (build_copy / "manifest.json").write_text(text)
    rep = shardsmith.verify(build_copy / "wds", world=1, workers=1).report
    detail = _failed(rep, "manifest")
    assert "manifest.json" in detail and says in detail


def test_manifest_of_a_newer_shardsmith_is_refused(build_copy):
    m = json.loads((build_copy / "manifest.json").read_text())
    m["shardsmith_version"] = "9.0.0"
    (build_copy / "manifest.json").write_text(json.dumps(m))
    assert "9.0.0" in _failed(shardsmith.verify(build_copy / "wds", world=1, workers=1).report, "manifest")


def _read_only(folder: Path, script: str) -> subprocess.CompletedProcess:
    """``script`` (bash) with ``folder`` bind-mounted read-only (a private mount namespace), or a skip."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a read-only bind mount")
    cmd = f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && {script}"
    r = subprocess.run(["unshare", "-m", "bash", "-c", cmd], capture_output=True, text=True)
    if "mount" in r.stderr and r.returncode != 0 and "shardsmith" not in r.stderr:
        pytest.skip(f"no read-only bind mount here: {r.stderr.strip()[:200]}")
    return r


@pytest.mark.slow
def test_read_only_build_verifies_and_reports(build_copy, tmp_path):
    listing = sorted(p.relative_to(build_copy) for p in build_copy.rglob("*"))
    r = _read_only(build_copy, f"{PY} -m shardsmith verify {build_copy / 'wds'} -q --world 1 --workers 1 && "
                               f"{PY} -m shardsmith verify {build_copy / 'photos.zip'} -q --world 1 --workers 1 && "
                               f"{PY} -m shardsmith report {build_copy} --no-previews --output {tmp_path / 'r.html'}"
                               f" && {PY} -m shardsmith repair {build_copy / 'wds'} --dry-run")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert (tmp_path / "r.html").is_file()
    assert sorted(p.relative_to(build_copy) for p in build_copy.rglob("*")) == listing


# -- #10: EDM zips that cannot be read ----------------------------------------------------------------------

def test_unreadable_zip_is_one_message(built, tmp_path):
    from shardsmith.loaders.zip import ZipImageDataset, ZipUnreadable

    good = built / "photos.zip"
    (tmp_path / "rand.zip").write_bytes(os.urandom(4000))
    trunc = tmp_path / "trunc.zip"
    trunc.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    bad = tmp_path / "badjson.zip"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info, b"{not json" if info.filename == "dataset.json" else src.read(info))
        if "dataset.json" not in src.namelist():
            dst.writestr("dataset.json", b"{not json")
    for path, says in ((tmp_path / "rand.zip", "is not a readable ZIP"), (trunc, "is not a readable ZIP"),
                       (bad, "dataset.json is not a labels table")):
        with pytest.raises(ZipUnreadable) as got:
            ZipImageDataset(path)
        assert str(path) in str(got.value) and says in str(got.value)
    assert "(line 1, column 2" in str(got.value)
    code, out = invoke("verify", trunc, "-q", "--world", "1", "--workers", "1")
    assert_message(code, out, "trunc.zip", "not a readable ZIP")


# -- #11: a .precomputed/ tree with a corrupt or empty .pt ---------------------------------------------------

def _tree(root: Path, n: int = 3) -> Path:
    import torch

    for d in ("latents", "conditions"):
        (root / d).mkdir(parents=True)
    for i in range(n):
        torch.save({"latents": torch.zeros(4, 1, 8, 8), "num_frames": 1, "height": 8, "width": 8, "fps": 1.0},
                   root / "latents" / f"s{i}.pt")
        torch.save({"video_prompt_embeds": torch.zeros(7, 16), "prompt_attention_mask": torch.ones(7, dtype=torch.int64)},
                   root / "conditions" / f"s{i}.pt")
    return root


def test_verify_precomputed_names_an_unreadable_pt(tmp_path):
    root = _tree(tmp_path / ".precomputed")
    (root / "latents" / "s1.pt").write_text("garbage\n")
    (root / "conditions" / "s2.pt").write_bytes(b"")
    rep = shardsmith.verify(root).report
    detail = _failed(rep, "readable")
    assert "latents/s1.pt" in detail and "conditions/s2.pt" in detail and "shardsmith repair" in detail
    code, out = invoke("verify", root, "-q")
    assert code == 1 and "Aborted" not in out and "Traceback" not in out and "conditions/s2.pt" in out, out


# -- #12 / #13: register --config ----------------------------------------------------------------------------

ENTRY = {"preset": "image", "path": "${DATA_ROOT_DIR}/wds"}


def test_register_config_mistakes_are_one_message(tmp_path, monkeypatch):
    from shardsmith.loaders import registry
    from shardsmith.loaders.registry import RegistryError, add_entry

    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n  b: {")
    with pytest.raises(RegistryError, match=r"bad.yaml is not valid YAML \(line 2, column 4\)"):
        add_entry(bad, "x", ENTRY)
    with pytest.raises(RegistryError, match="is a folder"):
        add_entry(tmp_path, "x", ENTRY)

    def read_only(path, data):
        raise OSError(errno.EROFS, "Read-only file system", f"{path}.tmp-1")
    monkeypatch.setattr(registry, "atomic_write_bytes", read_only)
    with pytest.raises(RegistryError, match="cannot write data config .*ro.yaml: Read-only file system"):
        add_entry(tmp_path / "ro.yaml", "x", ENTRY)
    assert isinstance(RegistryError("x"), UserError)


def test_register_cli_bad_config_exits_2(built, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n  b: {")
    code, out = invoke("register", built / "wds", "--preset", "image", "--name", "x", "--config", bad)
    assert_message(code, out, "bad.yaml is not valid YAML (line 2, column 4)")
    assert bad.read_text() == "a: [1, 2\n  b: {"


def test_register_keeps_comments_and_writes_through_a_symlink(tmp_path):
    from shardsmith.loaders.registry import RegistryError, add_entry, read_config

    text = ("# my datasets\nimagenet:  # big\n  preset: image\n  path: /data/imagenet\n"
            "# the old one\nold:\n  preset: image\n  path: /data/old  # moved\n# end\n")
    cfg = tmp_path / "target.yaml"
    cfg.write_text(text)
    link = tmp_path / "link.yaml"
    link.symlink_to(cfg.name)
    add_entry(link, "x", ENTRY)
    assert link.is_symlink() and os.readlink(link) == cfg.name
    assert cfg.read_text().startswith(text) and read_config(cfg)["x"] == ENTRY
    mtime = cfg.stat().st_mtime_ns
    add_entry(link, "x", ENTRY)  # already there as given: the file is not touched
    assert cfg.stat().st_mtime_ns == mtime
    add_entry(link, "old", ENTRY, replace=True)  # replaced in place; every other comment stays
    new = cfg.read_text()
    for keep in ("# my datasets", "imagenet:  # big", "# the old one", "# end"):
        assert keep in new
    assert read_config(cfg) == {"imagenet": {"preset": "image", "path": "/data/imagenet"}, "old": ENTRY, "x": ENTRY}
    # a layout the text edit cannot handle: rewritten without comments, refused (untouched) with them
    flow = tmp_path / "flow.yaml"
    flow.write_text("{a: {preset: image, path: /p}}\n")
    add_entry(flow, "x", ENTRY)
    assert read_config(flow) == {"a": {"preset": "image", "path": "/p"}, "x": ENTRY}
    flow.write_text("# mine\n{a: {preset: image, path: /p}}\n")
    with pytest.raises(RegistryError, match="add this entry by hand"):
        add_entry(flow, "x", ENTRY)
    assert flow.read_text() == "# mine\n{a: {preset: image, path: /p}}\n"
    assert yaml.safe_load(flow.read_text()) == {"a": {"preset": "image", "path": "/p"}}
