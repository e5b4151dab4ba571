"""``buckets.json`` entries are checked by its one reader (``formats.wds.read_buckets_index``) before any bucket
folder is read. Before, an entry without ``dir`` made verify stop with ``error: dir`` (exit 2) while inspect took
the bucket's name, and ``"dir": "../../outside"`` made verify and inspect read the shards of a folder outside the
dataset as the bucket's (verify even advised running repair there). Now a missing ``dir`` is the bucket's name
for both, and a damaged entry is one failed check / problem naming buckets.json, the entry and the fix, with no
bucket folder read."""

from __future__ import annotations

import json
import shutil

import pytest

import shardsmith
from shardsmith.formats.wds import read_buckets_index
from tests.test_cli_mistakes import invoke
from tests.test_verify_bucket_integrity import built, copy  # noqa: F401 - fixtures: a 2-bucket latent_wds build
from tests.test_verify_integrity_sha import check

GOOD = {"64x64x1": {"dir": "64x64x1", "samples": 4, "shards": 1}, "audio_2000ms": {"samples": 2}}


def _write(tmp_path, index) -> None:
    (tmp_path / "buckets.json").write_text(index if isinstance(index, str) else json.dumps(index))


def test_entries_are_checked_and_dir_defaults_to_the_bucket(tmp_path):
    assert read_buckets_index(tmp_path) is None
    _write(tmp_path, GOOD)
    got = read_buckets_index(tmp_path)
    assert got["64x64x1"] == GOOD["64x64x1"] and got["audio_2000ms"] == {"dir": "audio_2000ms", "samples": 2}
    _write(tmp_path, {"64x64x1": {"dir": "64x64x1"}})  # (no samples: an empty bucket, as every reader took it)
    assert read_buckets_index(tmp_path)["64x64x1"]["samples"] == 0


@pytest.mark.parametrize("index, said", [
    ("{not json", "not valid JSON"),
    ([1, 2], "not an object of buckets"),
    ({"64x64x1": [4]}, "the entry of bucket 64x64x1 is a JSON list"),
    ({"64x64x1": {"samples": "4"}}, "samples is '4'"),
    ({"64x64x1": {"samples": -1}}, "samples is -1"),
    ({"64x64x1": {"samples": True}}, "samples is True"),
    ({"64x64x1": {"samples": 4, "dir": "../../../outside"}}, "dir '../../../outside' is not the name of a folder"),
    ({"64x64x1": {"samples": 4, "dir": "/tmp/elsewhere"}}, "dir '/tmp/elsewhere'"),
    ({"64x64x1": {"samples": 4, "dir": "a/b"}}, "dir 'a/b'"),
    ({"64x64x1": {"samples": 4, "dir": ".."}}, "dir '..'"),
    ({"64x64x1": {"samples": 4, "dir": ""}}, "dir ''"),
    ({"64x64x1": {"samples": 4, "dir": 7}}, "dir 7"),
    ({"../x": {"samples": 4}}, "'../x' is not a bucket"),
    ({"64x64x1": {"samples": 4}, "64x48x1": {"samples": 2, "dir": "64x64x1"}}, "both name the folder '64x64x1'"),
])
def test_a_damaged_entry_is_one_message_naming_the_file_and_the_fix(tmp_path, index, said):
    from shardsmith.formats.wds import BucketsIndexError

    _write(tmp_path, index)
    with pytest.raises(BucketsIndexError) as exc:
        read_buckets_index(tmp_path)
    msg = str(exc.value)
    assert str(tmp_path / "buckets.json") in msg and said in msg and "restore it from a copy" in msg, msg


def _set_entry(out, bucket, **change) -> None:
    path = out / "lat" / "buckets.json"
    index = json.loads(path.read_text())
    for k, v in change.items():
        if v is None:
            del index[bucket][k]
        else:
            index[bucket][k] = v
    path.write_text(json.dumps(index))


@pytest.mark.slow
def test_an_entry_without_dir_is_the_buckets_folder_for_verify_and_inspect(copy):  # noqa: F811
    _set_entry(copy, "64x64x1", dir=None)
    code, out = invoke("verify", copy / "lat", "--world", "1", "--workers", "0", "-q")
    assert code == 0 and "[PASS] bucket 64x64x1: 4 sample(s) in 64x64x1/" in out and "error" not in out, out
    code, out = invoke("inspect", copy / "lat")
    assert code == 0 and "64x64x1/00000.tar" in out, out


@pytest.mark.slow
def test_a_dir_outside_the_dataset_fails_and_nothing_outside_is_read(copy, tmp_path):  # noqa: F811
    outside = tmp_path / "outside"  # a folder of shards beside the dataset, as a bucket's
    shutil.copytree(copy / "lat" / "64x64x1", outside)
    (outside / "shard_count.json").unlink()  # (verify of it would advise 'shardsmith repair' to write it)
    _set_entry(copy, "64x64x1", dir="../../outside")
    rep = shardsmith.verify(copy / "lat", world=1, workers=0).report
    assert not rep["ok"] and rep["buckets"] == {}, rep  # no bucket verified: the outside folder is not read
    buckets = check(rep, "buckets")
    assert "buckets.json is damaged: bucket 64x64x1: dir '../../outside'" in buckets["detail"], buckets
    code, out = invoke("verify", copy / "lat", "--world", "1", "--workers", "0", "-q")
    assert code == 1 and "[FAIL] buckets:" in out and "repair" not in out and "Traceback" not in out, out
    code, out = invoke("inspect", copy / "lat")
    assert code == 1 and "buckets.json is damaged" in out and "outside/" not in out.split("is damaged")[0], out
    assert "../../outside/00000.tar" not in out and "Traceback" not in out, out
