"""verify's check ``shard_count`` compares the shards shard_count.json lists with the shards in the folder, not
only the totals: after ``mv 00001.tar 00007.tar`` it passed (6 = 6, exit 0) although FastGen's deterministic
resume raises KeyError on a shard the count file lacks (reference/fastgen.md §2.7)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import shardsmith
from tests.test_cli_mistakes import invoke
from tests.test_verify_integrity_sha import photo_wds_build


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return photo_wds_build(tmp_path_factory.mktemp("shardcount"))


def _check(rep: dict, name: str) -> dict:
    return next(c for c in rep["checks"] if c["name"] == name)


def test_a_renamed_shard_fails_shard_count_naming_both_shards_and_the_fix(built, tmp_path):
    ds = tmp_path / "b" / "wds"
    shutil.copytree(built, tmp_path / "b")
    (ds / "00001.tar").rename(ds / "00007.tar")
    rep = shardsmith.verify(ds, world=1, workers=0).report
    sc = _check(rep, "shard_count")
    assert not rep["ok"] and not sc["ok"], rep["checks"]
    assert "00001.tar" in sc["detail"] and "00007.tar" in sc["detail"], sc
    assert "KeyError" in sc["detail"] and f"shardsmith repair {ds}" in sc["detail"], sc
    code, out = invoke("verify", ds, "--world", "1", "--workers", "0", "-q")
    assert code == 1 and "[FAIL] shard_count" in out and "Traceback" not in out, out


def test_a_count_file_of_a_dataset_not_built_by_shardsmith_is_compared_too(built, tmp_path):
    ds = tmp_path / "plain"
    shutil.copytree(built / "wds", ds)  # no build above it: no integrity check, shard_count still says it
    (ds / "00002.tar").rename(ds / "00003.tar")
    sc = _check(shardsmith.verify(ds, world=1, workers=0).report, "shard_count")
    assert not sc["ok"] and "00002.tar" in sc["detail"] and "00003.tar" in sc["detail"], sc


def test_matching_count_file_passes(built):
    assert _check(shardsmith.verify(built / "wds", world=1, workers=0).report, "shard_count")["ok"]
