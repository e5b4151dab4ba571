"""verify and inspect compare each shard of a shardsmith build with the sha256 the build recorded (check
``integrity``, verify/integrity.py): a shard whose member bytes were overwritten but still decode used to pass
every check (exit 0) while ``repair --from-source --dry-run`` knew it was damaged."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

import shardsmith
from tests.media_factory import real_photos
from tests.test_cli_mistakes import invoke


def photo_wds_build(base: Path, photos: int = 6, per_shard: int = 2) -> Path:
    """A finished build (its folder, ``base/out``) of ``photos`` real photos: ``wds/`` in shards of ``per_shard``."""
    real_photos(base / "src", photos, max_side=200)
    shardsmith.build({"sources": [{"path": str(base / "src")}],
                      "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": per_shard}]}, base / "out",
                     quiet=True)
    return base / "out"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A finished build of 6 photos: ``wds/`` in 3 shards of 2."""
    return photo_wds_build(tmp_path_factory.mktemp("integrity"))


@pytest.fixture
def copy(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "b")
    return tmp_path / "b"


def overwrite_jpeg_middle(shard: Path, n: int = 200) -> None:
    """Overwrite ``n`` bytes in the middle of the shard's first JPEG member (it still decodes)."""
    with tarfile.open(shard) as t:
        m = next(m for m in t.getmembers() if m.name.endswith(".jpg"))
    b = bytearray(shard.read_bytes())
    mid = m.offset_data + m.size // 2
    b[mid:mid + n] = b"\x55" * n
    shard.write_bytes(bytes(b))


def check(rep: dict, name: str) -> dict:
    got = [c for c in rep["checks"] if c["name"] == name]
    assert len(got) == 1, rep["checks"]
    return got[0]


def test_a_pristine_build_passes_integrity(built):
    rep = shardsmith.verify(built / "wds", world=1, workers=0).report
    assert rep["ok"] and check(rep, "integrity")["ok"], rep["checks"]
    assert "3 shard(s)" in check(rep, "integrity")["detail"]


def test_overwritten_member_bytes_fail_verify_and_inspect(copy):
    ds = copy / "wds"
    overwrite_jpeg_middle(ds / "00001.tar")
    rep = shardsmith.verify(ds, world=1, workers=0).report
    integ = check(rep, "integrity")
    assert not rep["ok"] and not integ["ok"]
    assert "00001.tar" in integ["detail"] and "00000.tar" not in integ["detail"]
    assert "sha256" in integ["detail"] and "shardsmith repair --from-source" in integ["detail"]
    code, out = invoke("verify", ds, "--world", "1", "--workers", "0", "-q")
    assert code == 1 and "[FAIL] integrity" in out and "Traceback" not in out, out
    code, out = invoke("inspect", ds)
    assert code == 1 and "00001.tar" in out and "--from-source" in out and "Traceback" not in out, out
    # the fix it names works: restored byte-identical, verify passes again
    code, out = invoke("repair", ds, "--from-source")
    assert code == 0, out
    rep = shardsmith.verify(ds, world=1, workers=0).report
    assert rep["ok"] and check(rep, "integrity")["ok"], rep["checks"]


def test_a_shard_rewritten_by_repair_is_checked_against_what_the_repair_wrote(copy):
    ds = copy / "wds"
    shard = ds / "00002.tar"
    with tarfile.open(shard) as t:
        last = [m for m in t.getmembers() if m.name.endswith(".jpg")][-1]
    shard.write_bytes(shard.read_bytes()[:last.offset_data + last.size // 2])  # cut: repair keeps the intact sample
    code, out = invoke("repair", ds)
    assert code == 0, out
    rep = shardsmith.verify(ds, world=1, workers=0).report
    assert rep["ok"] and check(rep, "integrity")["ok"], [c for c in rep["checks"] if not c["ok"]]  # no false alarm for the repaired shard
    overwrite_jpeg_middle(shard, 50)
    integ = check(shardsmith.verify(ds, world=1, workers=0).report, "integrity")
    assert not integ["ok"] and "00002.tar" in integ["detail"] and "repair" in integ["detail"], integ
