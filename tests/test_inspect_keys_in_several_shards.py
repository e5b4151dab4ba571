"""inspect agrees with verify's ``no_duplicates`` about a key several shards hold. Before, inspect listed every
such key as a problem ('key 000000 occurs in several shards: [...]', PROBLEMS, exit 1), so a pristine dataset
whose keys restart at 000000 in each shard (distinct samples, which the loader keys by shard and key) failed
inspect while verify passed it. Now only the same sample (same members, sizes and bytes) under one key in several
shards is a problem, with verify's advice, naming the shards that hold the copies; keys each shard uses for a
sample of its own are a note, and the keys are compared on disk (verify's ``CrossShardKeys``)."""

from __future__ import annotations

import json
import tarfile

from tests.test_cli_mistakes import invoke
from tests.test_verify_keys_in_several_shards import _doubled, _samples, built, write_shards  # noqa: F401 - fixture

from shardsmith.verify.inspect import inspect_wds


def test_keys_numbered_from_0_in_each_shard_are_a_note_and_inspect_passes(built, tmp_path):  # noqa: F811
    six = _samples(built)
    ds = write_shards(tmp_path / "per_shard", [six[:3], six[3:]])
    rep = inspect_wds(ds)
    assert rep["ok"] and rep["problems"] == [], rep["problems"]
    note = next(n for n in rep["notes"] if "several shards" in n)
    assert note.startswith("3 key(s) occur in several shards with different content in each (e.g. "
                           "000000 in 00000.tar, 00001.tar;"), note
    assert "nothing to fix" in note and "ignore_index" not in note, note
    code, out = invoke("inspect", ds)
    assert code == 0 and "Traceback" not in out, out
    assert "distinct samples, which the loader keys by shard and key, so each trains once" in out, out
    assert "PROBLEMS" not in out and "occurs in several shards" not in out and "ignore_index" not in out, out


def test_a_copied_shard_is_still_a_problem_naming_the_shards_that_hold_the_copies(built, tmp_path):  # noqa: F811
    ds = _doubled(built, tmp_path)
    (ds / "shard_count.json").write_text(json.dumps({"00000.tar": 2, "00001.tar": 2}))
    with tarfile.open(ds / "00000.tar") as t:
        keys = sorted({name.split(".")[0] for name in t.getnames()})
    rep = inspect_wds(ds)
    assert not rep["ok"], rep
    dup = [p for p in rep["problems"] if "several shards" in p]
    assert len(dup) == 1, rep["problems"]
    assert dup[0].startswith(f"{len(keys)} key(s) hold the same sample (same members, same bytes) in several shards, "
                             f"each trained once per shard that holds it: {keys[0]} in 00000.tar, 00001.tar;"), dup
    assert f"move it out of {ds}" in dup[0] and "ignore_index.json" in dup[0], dup
    code, out = invoke("inspect", ds)
    assert code == 1 and "hold the same sample" in out and "Traceback" not in out, out
    # the fix it names, as verify's: the repeated keys ignored in one of the shards
    (ds / "ignore_index.json").write_text(json.dumps({"00001.tar": keys}))
    rep = inspect_wds(ds)
    assert rep["ok"], rep["problems"]

    # a copy beside shards whose keys restart: only the copy and its original are named
    six = _samples(built)
    ds = write_shards(tmp_path / "copied", [six[:3], six[3:], six[:3]])
    rep = inspect_wds(ds)
    dup = [p for p in rep["problems"] if "several shards" in p]
    assert not rep["ok"] and len(dup) == 1, rep["problems"]
    assert "3 key(s) hold the same sample" in dup[0] and "000000 in 00000.tar, 00002.tar;" in dup[0], dup
    assert "00001.tar" not in dup[0], dup
