"""inspect and repair read a folder shard by shard (issue 24): no shard's sample runs outlive its
read, keys found in several shards come from the on-disk key table, and repair re-reads only the
shards it rewrites (one that reads differently by then is left as it was)."""

import io
import json
import tarfile
import weakref

import pytest

import shardsmith.verify.inspect as inspect_mod
import shardsmith.verify.repair as repair_mod
from shardsmith.formats import IGNORE_INDEX_FILE, SHARD_COUNT_FILE
from shardsmith.verify.folder_keys import DottedMember, FolderKeys
from shardsmith.verify.inspect import inspect_wds
from shardsmith.verify.repair import repair_wds


def _write_tar(path, members):
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        for name, b in members:
            info = tarfile.TarInfo(name)
            info.size = len(b)
            t.addfile(info, io.BytesIO(b))


def _samples(*keys):
    return [m for i, k in enumerate(keys) for m in ((f"{k}.txt", f"{k} text".encode()), (f"{k}.cls", str(i).encode()))]


@pytest.fixture
def three(tmp_path):
    """Three shards: ``a`` in shards 0 and 2, ``b`` in all three; a count file that agrees."""
    wdir = tmp_path / "wds"
    wdir.mkdir()
    _write_tar(wdir / "00000.tar", _samples("a", "b", "c"))
    _write_tar(wdir / "00001.tar", _samples("b", "d"))
    _write_tar(wdir / "00002.tar", _samples("e", "b", "a"))
    (wdir / SHARD_COUNT_FILE).write_text(json.dumps({"00000.tar": 3, "00001.tar": 2, "00002.tar": 3}))
    return wdir


def test_folder_keys_gives_keys_of_several_shards_in_key_order_and_dotted_members_in_read_order():
    with FolderKeys() as fk:
        fk.add_shard(0, ["z", "b", "a"], [DottedMember("a.v2.jpg", "a", "v2.jpg"), DottedMember("a.v2.txt", "a", "v2.txt")])
        fk.add_shard(1, ["b", "b", "q"])
        fk.add_shard(2, ["a", "z", "b"])
        assert list(fk.cross_shard()) == [("a", [0, 2]), ("b", [0, 1, 2]), ("z", [0, 2])]
        assert [d.name for d in fk.dotted(0)] == ["a.v2.jpg", "a.v2.txt"]
        assert list(fk.dotted(1)) == [] and list(fk.dotted(7)) == []


def test_keys_in_several_shards_are_reported_in_key_order(three):
    """``b`` is the same sample in shards 0 and 2 (another in shard 1): a problem naming those two; ``a`` is a
    different sample in each of its shards (its .cls differs): a note."""
    rep = inspect_wds(three)
    assert rep["keys_in_several_shards"] == {
        "same_sample": 1, "same_sample_examples": [{"key": "b", "shards": ["00000.tar", "00002.tar"]}],
        "distinct_samples": 1, "distinct_examples": [{"key": "a", "shards": ["00000.tar", "00002.tar"]}]}
    assert rep["problems"] == [
        "1 key(s) hold the same sample (same members, same bytes) in several shards, each trained once per shard "
        f"that holds it: b in 00000.tar, 00002.tar; if a shard is a copy of another, move it out of {three}, else "
        f"list each repeated key in {IGNORE_INDEX_FILE} under the shard(s) that should not train it"]
    assert rep["notes"] == ["1 key(s) occur in several shards with different content in each (e.g. a in 00000.tar, "
                            "00002.tar): distinct samples, which the loader keys by shard and key, so each trains "
                            "once; nothing to fix"]
    assert rep["totals"]["samples"] == 8 and [s["count_status"] for s in rep["shards"]] == ["ok"] * 3


def test_ignore_index_is_checked_against_each_shard_while_it_is_read(three):
    (three / IGNORE_INDEX_FILE).write_text(json.dumps({"00002.tar": ["e", "nope"], "00009.tar": ["x"],
                                                       "00001.tar": ["d"]}))
    rep = inspect_wds(three)
    ign = rep["ignore_index"]
    assert ign["valid"] == {"00002.tar": ["e"], "00001.tar": ["d"]} and list(ign["valid"]) == ["00002.tar", "00001.tar"]
    assert ign["unknown_keys"] == {"00002.tar": ["nope"]} and ign["unknown_shards"] == ["00009.tar"]
    assert [s["ignored"] for s in rep["shards"]] == [[], ["d"], ["e"]]
    assert rep["problems"][:2] == [
        f"{IGNORE_INDEX_FILE}: 1 key(s) for 00002.tar are not in it: ['nope']",
        f"{IGNORE_INDEX_FILE} lists 00009.tar, which is not a shard here (FastGen drops it with a warning)"]
    assert rep["totals"]["ignored"] == 2 and rep["totals"]["usable_samples"] == 6


def test_no_shard_scan_outlives_its_shard(three, monkeypatch):
    real = inspect_mod.scan_shard
    alive: list[weakref.ref] = []

    def scan(path, key_map=None):
        assert all(r() is None for r in alive), "an earlier shard's scan (its sample runs) is still held"
        sc = real(path, key_map)
        alive.extend([weakref.ref(sc), *(weakref.ref(run) for run in sc.runs)])
        return sc

    monkeypatch.setattr(inspect_mod, "scan_shard", scan)
    assert inspect_wds(three)["totals"]["shards"] == 3
    assert len(alive) == 3 + 8 and all(r() is None for r in alive)


def _cut(path, at):
    data = path.read_bytes()
    path.write_bytes(data[:at])


def test_repair_reads_again_only_the_shards_it_rewrites(three, monkeypatch):
    _cut(three / "00001.tar", 512 * 5)  # b's two members intact, d's header only
    again: list[str] = []
    real = repair_mod.scan_shard

    def scan(path, key_map=None):
        again.append(path.name)
        return real(path, key_map)

    monkeypatch.setattr(repair_mod, "scan_shard", scan)
    rep = repair_wds(three)
    assert rep["shards"]["00001.tar"]["action"] == "rewritten" and rep["shards"]["00001.tar"]["samples_after"] == 1
    assert [n for n in again if not n.endswith(".repaired")] == ["00001.tar"]
    assert not rep["errors"]


def test_repair_leaves_a_shard_that_changed_since_it_was_inspected(three, monkeypatch):
    _cut(three / "00001.tar", 512 * 5)
    real = repair_mod.scan_folder

    def inspect_then_change(folder, progress=None):
        rep = real(folder, progress=progress)
        _cut(three / "00001.tar", 512 * 3)  # someone else cuts it further meanwhile
        return rep

    monkeypatch.setattr(repair_mod, "scan_folder", inspect_then_change)
    rep = repair_wds(three)
    changed = "00001.tar: changed since it was inspected; nothing replaced"
    assert rep["errors"] == [changed]
    entry = rep["shards"]["00001.tar"]
    assert entry["action"] == "unchanged" and entry["notes"] == [f"rewrite failed, shard left as it was: {changed}"]
    assert (three / "00001.tar").stat().st_size == 512 * 3
    assert not (three / "00001.tar.orig").exists() and not (three / "00001.tar.repaired").exists()
