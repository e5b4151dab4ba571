"""verify of a multi-bucket output after a repair dropped samples from one bucket quoted buckets.json's count,
written by the build and never changed by a repair: '4 sample(s) in 64x64x1/: every check passed', 'the buckets
hold 6' and bucket_rounds from the same numbers, while the folder held 2 (its own manifest check said '2 + 2
removed by repair'). Now each bucket's count is what its folder holds, with what repairs removed beside it. And
the repair's entry for a sample lost past the cut said 'no build ledger records the shard's keys' though the
build's ledger was found (it records each unit's samples, not which went into a bucket's shard)."""

from __future__ import annotations

import json
import tarfile

import pytest

import shardsmith
from tests.test_cli_mistakes import invoke
from tests.test_verify_bucket_integrity import built, copy  # noqa: F401 - fixtures: 2 buckets, 64x64x1 holds 4
from tests.test_verify_integrity_sha import check


def _cut_in_third_sample(shard) -> None:
    """Cut ``shard`` inside the third sample's last member: 2 samples kept, the third dropped, the fourth past
    the cut (no header of it left: its key unknown to the file)."""
    with tarfile.open(shard) as t:
        members = t.getmembers()
    keys = list(dict.fromkeys(m.name.split(".", 1)[0] for m in members))
    assert len(keys) == 4, keys
    last = [m for m in members if m.name.startswith(keys[2] + ".")][-1]
    with open(shard, "r+b") as f:
        f.truncate(last.offset_data + 10)


def _repaired(copy):
    """``copy``'s lat/ after bucket 64x64x1's shard of 4 was cut in its third sample and repaired; repair.json's
    dropped entries."""
    lat = copy / "lat"
    assert json.loads((lat / "64x64x1" / "shard_count.json").read_text()) == {"00000.tar": 4}
    _cut_in_third_sample(lat / "64x64x1" / "00000.tar")
    code, out = invoke("repair", lat / "64x64x1")
    assert code == 1 and "Traceback" not in out, out
    dropped = json.loads((lat / "64x64x1" / "repair.json").read_text())["repairs"][0]["dropped"]
    assert len(dropped) == 2, dropped
    return lat, dropped


@pytest.mark.slow
def test_bucket_counts_after_a_repair_are_what_the_folders_hold(copy):  # noqa: F811
    lat, _ = _repaired(copy)
    rep = shardsmith.verify(lat, world=1, workers=0).report
    assert rep["ok"], rep["checks"]
    assert check(rep, "bucket 64x64x1")["detail"] == \
        "2 sample(s) (+2 removed by repair) in 64x64x1/: every check passed"
    assert check(rep, "bucket 64x48x1")["detail"] == "2 sample(s) in 64x48x1/: every check passed"
    assert "written=6; the buckets hold 4 + 2 removed by repair" in check(rep, "manifest")["detail"]
    rounds = check(rep, "bucket_rounds")["detail"]
    assert rounds.startswith("4 sample(s) per pass") and "per bucket: 64x48x1 2, 64x64x1 2)" in rounds, rounds
    code, out = invoke("verify", lat, "--world", "1", "--workers", "0", "-q")
    assert code == 0 and "[PASS] bucket 64x64x1: 2 sample(s) (+2 removed by repair)" in out, out


@pytest.mark.slow
def test_a_bucket_shards_lost_sample_says_why_its_key_is_unknown(copy):  # noqa: F811
    _, dropped = _repaired(copy)
    unnamed = [d["reason"] for d in dropped if d["key"] is None]
    assert len(unnamed) == 1 and "no build ledger records" not in unnamed[0], unnamed
    assert "not which of them went into bucket 64x64x1's shard" in unnamed[0], unnamed
