"""``repair`` of a build's shard cut short: it used to record only the sample the cut went through (named by the
tar), not the one wholly past the cut, whose key only the build's ledger holds: repair.json said ``samples_before:
2`` for a shard of 4, exit 0, and verify then failed its manifest count (``written=11; dataset holds 9 + 1 removed by
repair``) without naming a fix, while inspect said OK. Now every sample the shard held is accounted for by key (the
ledger's; counted from shard_count.json without a build), with ``samples_before`` the shard's count, a WARNING naming
them and ``repair --from-source`` (exit 1 on the run that finds samples only the ledger names), and a manifest count
verify still finds short (a repair by an older shardsmith) names the keys and the fix that works."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

import shardsmith
from tests.test_cli_mistakes import invoke
from tests.test_verify_integrity_repair_missing import _keys_of
from tests.test_verify_integrity_sha import check, photo_wds_build


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return photo_wds_build(tmp_path_factory.mktemp("cut"), per_shard=3)


def cut_in_second_sample(shard: Path) -> None:
    """Cut ``shard`` (3 samples or more) 10 bytes into its second sample's first member: the first sample stays
    whole, the second is cut (the tar still names it), the later ones lie wholly past the cut (nothing in the file
    names them)."""
    with tarfile.open(shard) as tf:
        members = tf.getmembers()
    keys = list(dict.fromkeys(m.name.split(".")[0] for m in members))
    assert len(keys) >= 3, keys
    second = next(m for m in members if m.name.startswith(keys[1] + "."))
    shard.write_bytes(shard.read_bytes()[:second.offset_data + 10])


@pytest.fixture
def cut(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "b")
    ds = tmp_path / "b" / "wds"
    cut_in_second_sample(ds / "00001.tar")
    return ds


def _events(ds: Path) -> list[dict]:
    return json.loads((ds / "repair.json").read_text())["repairs"]


@pytest.mark.slow
def test_repair_records_every_sample_of_the_cut_shard_by_key_and_names_from_source(built, cut):
    ds = cut
    keys = _keys_of(ds.parent, "00001.tar")
    code, out = invoke("repair", ds, "--dry-run")
    assert code == 1 and f"2 of its 3 sample(s) lost ({keys[1]}, {keys[2]}), would be recorded" in out, out
    assert not (ds / "repair.json").exists()
    code, out = invoke("repair", ds)
    assert code == 1 and "Traceback" not in out, out
    warning = next(line for line in out.splitlines() if "WARNING 00001.tar" in line)
    assert "cut short" in warning and f"2 of its 3 sample(s) lost ({keys[1]}, {keys[2]}), recorded in repair.json" \
        in warning and f"`shardsmith repair --from-source {ds}`" in warning, warning
    [ev] = _events(ds)
    assert (ev["shard"], ev["action"], ev["samples_before"], ev["samples_after"]) == ("00001.tar", "rewritten", 3, 1)
    assert [d["key"] for d in ev["dropped"]] == keys[1:], ev
    assert "not in the file" in ev["dropped"][1]["reason"] and "ledger" in ev["dropped"][1]["reason"], ev
    # verify accounts for both (it failed its manifest count on the one left out)
    rep = shardsmith.verify(ds, world=1, workers=0).report
    assert rep["ok"], [c for c in rep["checks"] if not c["ok"]]
    assert rep["repairs"]["removed"] == 2
    # a second repair records nothing more and exits 0
    code, out = invoke("repair", ds)
    assert code == 0 and len(_events(ds)) == 1, out
    # the advice works: both samples back, byte-identical
    code, out = invoke("repair", ds, "--from-source")
    assert code == 0, out
    assert (ds / "00001.tar").read_bytes() == (built / "wds" / "00001.tar").read_bytes()
    rep = shardsmith.verify(ds, world=1, workers=0).report
    assert rep["ok"] and not rep.get("repairs"), rep["checks"]


def test_a_copy_outside_the_build_counts_the_sample_past_the_cut_from_shard_count(cut, tmp_path):
    """No ledger to name it: the sample past the cut is recorded without a key (shard_count.json said 3), and
    the exit code stays 0 as for any rewrite outside a build (nothing restores it but a copy)."""
    ds = tmp_path / "plain"
    shutil.copytree(cut, ds)
    code, out = invoke("repair", ds)
    assert code == 0, out
    [ev] = _events(ds)
    assert (ev["samples_before"], ev["samples_after"], len(ev["dropped"])) == (3, 1, 2), ev
    assert ev["dropped"][0]["key"] is not None and ev["dropped"][1]["key"] is None, ev
    assert "shard_count.json said 3 sample(s)" in ev["dropped"][1]["reason"], ev
    assert "2 of its 3 sample(s) lost" in out and "1 whose key is unknown" in out and "00001.tar.orig" in out, out


@pytest.mark.slow
def test_verify_names_a_loss_repair_json_does_not_account_for_and_the_fix_that_works(cut):
    """A repair.json written by a shardsmith that recorded only the sample the tar named."""
    ds = cut
    keys = _keys_of(ds.parent, "00001.tar")
    invoke("repair", ds)
    doc = json.loads((ds / "repair.json").read_text())
    doc["repairs"][0]["dropped"] = doc["repairs"][0]["dropped"][:1]
    (ds / "repair.json").write_text(json.dumps(doc))
    code, out = invoke("verify", ds, "--world", 1, "--workers", 0)
    assert code == 1, out
    detail = check(shardsmith.verify(ds, world=1, workers=0).report, "manifest")["detail"]
    assert f"00001.tar/{keys[2]}" in detail and "neither in the dataset nor accounted in repair.json" in detail, detail
    assert f"`shardsmith repair --from-source {ds}`" in detail, detail
    code, out = invoke("repair", ds, "--from-source")  # as it says
    assert code == 0, out
    code, out = invoke("verify", ds, "--world", 1, "--workers", 0)
    assert code == 0, out


def test_verify_names_keys_ignore_index_lists_without_a_repair_and_the_fix(built, tmp_path):
    shutil.copytree(built, tmp_path / "b")
    ds = tmp_path / "b" / "wds"
    key = _keys_of(ds.parent, "00000.tar")[0]
    (ds / "ignore_index.json").write_text(json.dumps({"00000.tar": [key]}))
    detail = check(shardsmith.verify(ds, world=1, workers=0).report, "manifest")["detail"]
    assert f"ignore_index.json lists 00000.tar/{key} but no repair recorded them" in detail, detail
    assert f"take them out of it, then run `shardsmith repair {ds}`" in detail, detail
    (ds / "ignore_index.json").write_text("{}")  # as it says (the sample is sound: nothing to ignore again)
    code, out = invoke("repair", ds)
    assert code == 0, out
    code, out = invoke("verify", ds, "--world", 1, "--workers", 0)
    assert code == 0, out
