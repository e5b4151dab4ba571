"""``repair`` of a build's dataset whose shard was deleted: it used to exit 0, silently drop the shard from
shard_count.json, record nothing in repair.json and never mention --from-source. Now it says the shard the build
wrote is missing, with its lost samples (keys from the ledger), records them in repair.json (so verify accounts
for them), exits 1 on the run that finds it, and names `shardsmith repair --from-source`, which restores it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import shardsmith
from tests.test_cli_mistakes import invoke
from tests.test_verify_integrity_sha import photo_wds_build


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return photo_wds_build(tmp_path_factory.mktemp("missing"))


@pytest.fixture
def deleted(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "b")
    ds = tmp_path / "b" / "wds"
    (ds / "00001.tar").unlink()
    return ds


def _keys_of(build: Path, shard: str) -> list[str]:
    import sqlite3

    db = sqlite3.connect(build / ".shardsmith" / "ledger.sqlite")
    try:
        return [k for (k,) in db.execute("SELECT i.key FROM results r JOIN items i ON i.idx=r.idx "
                                          "WHERE r.shard=? AND r.status='written' ORDER BY r.idx", (shard,))]
    finally:
        db.close()


def test_repair_says_the_shard_is_missing_records_the_loss_and_names_from_source(built, deleted):
    ds = deleted
    keys = _keys_of(ds.parent, "00001.tar")
    assert len(keys) == 2
    code, out = invoke("repair", ds, "--dry-run")
    assert code == 1 and "00001.tar" in out and "is missing" in out and "--from-source" in out, out
    assert not (ds / "repair.json").exists()  # a dry run writes nothing
    code, out = invoke("repair", ds)
    assert code == 1 and "Traceback" not in out, out
    assert "00001.tar, written by the build" in out and "2 sample(s) lost" in out, out
    assert f"shardsmith repair --from-source {ds}" in out and all(k in out for k in keys), out
    events = json.loads((ds / "repair.json").read_text())["repairs"]
    assert [(e["shard"], e["action"]) for e in events] == [("00001.tar", "missing_shard")]
    assert sorted(d["key"] for d in events[0]["dropped"]) == sorted(keys)
    # verify accounts for the recorded loss
    rep = shardsmith.verify(ds, world=1, workers=0).report
    assert rep["ok"], [c for c in rep["checks"] if not c["ok"]]
    assert rep["repairs"]["removed"] == 2
    # a second repair records nothing more and exits 0, still saying it and the way back
    code, out = invoke("repair", ds)
    assert code == 0 and "--from-source" in out and "recorded in repair.json by the repair of" in out, out
    assert len(json.loads((ds / "repair.json").read_text())["repairs"]) == 1
    # the way back works: restored byte-identical, the loss no longer counted
    code, out = invoke("repair", ds, "--from-source")
    assert code == 0, out
    assert (ds / "00001.tar").read_bytes() == (built / "wds" / "00001.tar").read_bytes()
    rep = shardsmith.verify(ds, world=1, workers=0).report
    assert rep["ok"] and not rep.get("repairs"), rep["checks"]


def test_verify_fails_a_missing_shard_no_repair_recorded(deleted):
    rep = shardsmith.verify(deleted, world=1, workers=0).report
    integ = next(c for c in rep["checks"] if c["name"] == "integrity")
    assert not integ["ok"] and "00001.tar" in integ["detail"] and "--from-source" in integ["detail"], integ


def test_a_renamed_shard_is_not_recorded_as_lost(built, tmp_path):
    shutil.copytree(built, tmp_path / "b")
    ds = tmp_path / "b" / "wds"
    (ds / "00001.tar").rename(ds / "00007.tar")
    code, out = invoke("repair", ds, "--dry-run")
    assert code == 1 and "00007.tar" in out and "rename it back" in out and "Traceback" not in out, out


def test_a_renamed_shard_leaves_shard_count_as_it_was_so_renaming_it_back_is_the_whole_fix(built, tmp_path):
    """The real run (not --dry-run) said 'rename it back' yet rewrote shard_count.json with the new name, so after
    renaming it back the dataset needed another repair."""
    shutil.copytree(built, tmp_path / "b")
    ds = tmp_path / "b" / "wds"
    count = (ds / "shard_count.json").read_bytes()
    (ds / "00001.tar").rename(ds / "00007.tar")
    code, out = invoke("repair", ds)
    assert code == 1 and "rename it back" in out, out
    assert (ds / "shard_count.json").read_bytes() == count
    (ds / "00007.tar").rename(ds / "00001.tar")
    code, out = invoke("verify", ds)
    assert code == 0, out


def test_a_renamed_shard_beside_a_truncated_one_renaming_back_is_still_the_whole_fix(built, tmp_path):
    """The repair rewrites the truncated shard and the count file, with the renamed shard under its own name: the
    count file was left unwritten while the report showed it changed, and after the advised mv verify failed."""
    shutil.copytree(built, tmp_path / "b")
    ds = tmp_path / "b" / "wds"
    first = ds / "00000.tar"
    import tarfile

    with tarfile.open(first) as tf:
        last = tf.getmembers()[-1]
    first.write_bytes(first.read_bytes()[:last.offset_data + 10])  # the second sample's last member cut short
    (ds / "00001.tar").rename(ds / "00007.tar")
    code, out = invoke("repair", ds)
    assert code == 1 and "rename it back" in out, out
    counts = json.loads((ds / "shard_count.json").read_text())
    assert counts["00000.tar"] == 1 and counts["00001.tar"] == 2 and "00007.tar" not in counts, counts
    (ds / "00007.tar").rename(ds / "00001.tar")
    code, out = invoke("verify", ds)
    assert code == 0, out
