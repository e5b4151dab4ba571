"""verify's ``no_duplicates`` fails on a sample key that several shards hold (each such sample is trained once
per shard, while the loader, keying samples by shard and key, sees no duplicate). Before, a folder whose every
sample was in two shards passed it ("0 sample(s) seen more than once", exit 1 only for shard_count.json), and
after the repair that check advised, verify said OK; inspect listed every key as a problem all along."""

from __future__ import annotations

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
    assert f"{len(keys)} key(s) occur in several shards" in dup["detail"], dup
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
