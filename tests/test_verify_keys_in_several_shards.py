"""verify's ``no_duplicates`` fails on a sample key that several shards hold (each such sample is trained once
per shard, while the loader, keying samples by shard and key, sees no duplicate). Before, a folder whose every
sample was in two shards passed it ("0 sample(s) seen more than once", exit 1 only for shard_count.json), and
after the repair that check advised, verify said OK; inspect listed every key as a problem all along.

Only the same sample (same members, sizes and bytes) under one key in several shards is a duplicate: keys
numbered from 0 in every shard (distinct samples, which the loader keys by shard and key) used to fail it too,
advising to ignore the repeated keys, which would have dropped half the samples; now they are a note."""

from __future__ import annotations

import io
import json
import shutil
import tarfile

from tests.test_cli_mistakes import invoke
from tests.test_verify_integrity_sha import built, check  # noqa: F401 - fixture: a build of 6 photos, 3 shards of 2

import shardsmith


def _doubled(built, tmp_path):  # noqa: F811
    """A folder no build wrote: one of the build's shards twice, under two names."""
    ds = tmp_path / "big"
    ds.mkdir()
    for name in ("00000.tar", "00001.tar"):
        shutil.copy(built / "wds" / "00000.tar", ds / name)
    return ds


def test_keys_in_two_shards_fail_no_duplicates(built, tmp_path):  # noqa: F811
    ds = _doubled(built, tmp_path)
    keys = [m.name.split(".")[0] for m in tarfile.open(ds / "00000.tar") if m.name.endswith(".jpg")]
    (ds / "shard_count.json").write_text(json.dumps({"00000.tar": 2, "00001.tar": 2}))
    rep = shardsmith.verify(ds, world=1, workers=0).report
    dup = check(rep, "no_duplicates")
    assert not rep["ok"] and not dup["ok"], rep["checks"]
    assert f"{len(keys)} key(s) hold the same sample (same members, same bytes) in several shards" in dup["detail"], dup
    assert f"{keys[0]} in 00000.tar, 00001.tar" in dup["detail"] and "ignore_index.json" in dup["detail"], dup
    code, out = invoke("verify", ds, "--world", "1", "--workers", "0", "-q")
    assert code == 1 and "[FAIL] no_duplicates" in out and "Traceback" not in out, out
    # the fix it names: the repeated keys ignored in one of the shards
    (ds / "ignore_index.json").write_text(json.dumps({"00001.tar": keys}))
    assert check(shardsmith.verify(ds, world=1, workers=0).report, "no_duplicates")["ok"]


def test_the_repair_a_missing_count_entry_advises_leaves_the_duplicates_failing(built, tmp_path):  # noqa: F811
    ds = _doubled(built, tmp_path)
    (ds / "shard_count.json").write_text(json.dumps({"00000.tar": 2}))
    rep = shardsmith.verify(ds, world=1, workers=0).report
    assert not check(rep, "shard_count")["ok"] and not check(rep, "no_duplicates")["ok"]
    code, out = invoke("repair", ds)
    assert code in (0, 1), out
    rep = shardsmith.verify(ds, world=1, workers=0).report
    assert not check(rep, "no_duplicates")["ok"] and not rep["ok"], rep["checks"]


def _samples(built):  # noqa: F811
    """The build's 6 samples, in shard order, as {suffix: bytes}."""
    out = []
    for shard in sorted((built / "wds").glob("*.tar")):
        with tarfile.open(shard) as t:
            for m in t.getmembers():
                key, suffix = m.name.split(".", 1)
                if not out or out[-1][0] != (shard.name, key):
                    out.append(((shard.name, key), {}))
                out[-1][1][suffix] = t.extractfile(m).read()
    return [members for _, members in out]


def write_shards(ds, shards):
    """``shards``: per shard, its samples as {suffix: bytes}, keyed 000000, 000001, ... in every shard; with
    shard_count.json."""
    ds.mkdir()
    for i, samples in enumerate(shards):
        with tarfile.open(ds / f"{i:05d}.tar", "w") as t:
            for j, members in enumerate(samples):
                for suffix, data in members.items():
                    info = tarfile.TarInfo(f"{j:06d}.{suffix}")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
    (ds / "shard_count.json").write_text(json.dumps({f"{i:05d}.tar": len(s) for i, s in enumerate(shards)}))
    return ds


def test_keys_numbered_from_0_in_each_shard_are_distinct_samples_not_duplicates(built, tmp_path):  # noqa: F811
    """Before: [FAIL] no_duplicates '3 key(s) occur in several shards', advising to ignore them (3 of 6 samples)."""
    six = _samples(built)
    ds = write_shards(tmp_path / "per_shard", [six[:3], six[3:]])
    rep = shardsmith.verify(ds, world=1, workers=0).report
    dup = check(rep, "no_duplicates")
    assert dup["ok"] and rep["ok"], rep["checks"]
    assert dup["detail"] == "0 sample(s) seen more than once", dup
    assert check(rep, "coverage")["detail"].startswith("6 of 6 samples seen exactly once"), rep["checks"]
    note = next(n for n in rep["notes"] if "several shards" in n)
    assert note.startswith("3 key(s) occur in several shards with different content") and "nothing to fix" in note
    assert "ignore_index.json" not in json.dumps(rep), rep
    code, out = invoke("verify", ds, "--world", "1", "--workers", "0")
    assert code == 0 and "[PASS] no_duplicates" in out and "ignore_index" not in out, out


def test_equal_sizes_different_bytes_are_not_duplicates_a_copied_shard_among_them_is(built, tmp_path):  # noqa: F811
    """Members of equal sizes are compared by their bytes, past the first 64 KiB too; a copy of a shard beside
    shards whose keys restart is named alone."""
    six = _samples(built)
    big = b"x" * 70_000
    same_sizes = [{**m, "txt": big} for m in six[:3]]
    late_diff = [{**m, "txt": big[:-1] + b"y"} for m in six[:3]]  # same jpg, same txt size, last byte differs
    cat = [{**m, "txt": b"a cat"} for m in six[:3]]
    dog = [{**m, "txt": b"a dog"} for m in six[:3]]  # same image, same sizes, different caption
    ds = write_shards(tmp_path / "sizes", [same_sizes, late_diff, [{**m, "txt": b"x"} for m in six[3:]]])
    ds2 = write_shards(tmp_path / "short", [cat, dog])
    for d in (ds, ds2):
        rep = shardsmith.verify(d, world=1, workers=0).report
        assert check(rep, "no_duplicates")["ok"] and rep["ok"], (d, rep["checks"])
    # now one of them copied: only the copy and its original are named
    shutil.copy(ds / "00001.tar", ds / "00003.tar")
    (ds / "shard_count.json").write_text(json.dumps({f"{i:05d}.tar": 3 for i in range(4)}))
    rep = shardsmith.verify(ds, world=1, workers=0).report
    dup = check(rep, "no_duplicates")
    assert not dup["ok"] and not rep["ok"], rep["checks"]
    assert "3 key(s) hold the same sample" in dup["detail"], dup
    assert "000000 in 00001.tar, 00003.tar;" in dup["detail"] and "00000.tar," not in dup["detail"], dup
