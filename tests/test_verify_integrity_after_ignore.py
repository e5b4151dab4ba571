"""A shard whose damaged sample a plain ``repair`` only ignored (its bytes left as they are, the key in
ignore_index.json, the loss in repair.json) passes verify's check ``integrity`` afterwards: the repair records the
shard's sha256 and the check compares with it. Before, verify failed it every time after, naming
``shardsmith repair`` as the fix, which did not help."""

from __future__ import annotations

import tarfile

import pytest

import shardsmith
from tests.media_factory import real_photos
from tests.test_cli_mistakes import invoke


@pytest.mark.slow  # a build, two verifies, a repair: 5-15 s
def test_a_repair_that_ignores_a_damaged_sample_leaves_a_dataset_verify_passes(tmp_path):
    real_photos(tmp_path / "src", 6, max_side=200)
    shardsmith.build({"sources": [{"path": str(tmp_path / "src")}],
                      "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 2}]}, tmp_path / "out", quiet=True)
    ds = tmp_path / "out" / "wds"
    shard = ds / "00001.tar"
    with tarfile.open(shard) as t:
        m = next(m for m in t.getmembers() if m.name.endswith(".jpg"))
    data = bytearray(shard.read_bytes())
    data[m.offset_data:m.offset_data + 64] = b"\0" * 64  # the JPEG's header gone: a corrupt member
    shard.write_bytes(bytes(data))

    code, out = invoke("verify", ds, "--world", "1", "--workers", "0")
    assert code == 1 and "integrity" in out, out  # the damage is found
    code, out = invoke("repair", ds)
    assert code == 0 and "ignored" in out, out
    code, out = invoke("verify", ds, "--world", "1", "--workers", "0")
    assert code == 0, out
    data[m.offset_data + 100] ^= 0xFF  # damaged again after the repair: found again
    shard.write_bytes(bytes(data))
    code, out = invoke("verify", ds, "--world", "1", "--workers", "0")
    assert code == 1 and "00001.tar" in out, out


@pytest.mark.slow  # a build and a verify: 2-5 s
def test_verify_with_batches_spot_checks_the_loader_and_says_it_hashed_nothing(tmp_path):
    """--batches M stops each rank after M batches (no coverage check): it hashed every shard all the same and
    waited for it; now it says integrity was not checked."""
    real_photos(tmp_path / "src", 4, min_side=60, max_side=120)
    shardsmith.build({"sources": [{"path": str(tmp_path / "src")}],
                      "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 2}]}, tmp_path / "out", quiet=True)
    code, out = invoke("verify", tmp_path / "out" / "wds", "--world", "1", "--workers", "0", "--batches", "1")
    said = " ".join(out.split())
    assert code == 0 and "integrity not checked: --batches 1" in said and "[PASS] integrity" not in said, out
