"""verify and inspect of a multi-bucket latent output (one WebDataset folder per bucket beside
``buckets.json``) compare each bucket's shards with the sha256 the build's ledger recorded (check
``integrity``) and its sample count with the manifest (check ``manifest``), and a bucket that is gone
fails. Before, every bucket passed (exit 0) with two latents swapped inside a shard, or a whole bucket
deleted, and verifying a bucket folder alone ran neither check."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

import shardsmith
from media_factory import real_photos
from tests.test_cli_mistakes import invoke
from tests.test_verify_integrity_sha import check

BUCKETS = ["64x64x1", "64x48x1"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A finished build of 6 photos in two image buckets: ``lat/`` (latent_wds, one folder per bucket) and
    ``.precomputed/`` (tiny random-weight SD VAE, MiniLM)."""
    base = tmp_path_factory.mktemp("bucket_integrity")
    real_photos(base / "src", 6, seed=3, min_side=60, max_side=140)
    for i, p in enumerate(sorted((base / "src").glob("*.jpg"))):
        p.with_suffix(".txt").write_text(f"photo {i}", encoding="utf-8")
    shardsmith.build({"sources": [{"path": str(base / "src")}], "geometry": {"buckets": BUCKETS},
                      "images": {"upscale": True},
                      "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 4},
                      "outputs": [{"format": "latent_wds", "dir": "lat"}, {"format": "precomputed"}]},
                     base / "out", quiet=True)
    index = json.loads((base / "out" / "lat" / "buckets.json").read_text())
    assert sorted(index) == sorted(BUCKETS) and all(e["samples"] >= 2 for e in index.values()), index
    return base / "out"


@pytest.fixture
def copy(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "b")
    return tmp_path / "b"


def swap_members(shard: Path, suffix: str) -> None:
    """Swap the bytes of the first two members ending in ``suffix`` (same size): each key now holds the
    other sample's member, and the tar still reads."""
    with tarfile.open(shard) as t:
        a, b = [m for m in t.getmembers() if m.name.endswith(suffix)][:2]
    assert a.size == b.size
    d = bytearray(shard.read_bytes())
    A, B = bytes(d[a.offset_data:a.offset_data + a.size]), bytes(d[b.offset_data:b.offset_data + b.size])
    assert A != B
    d[a.offset_data:a.offset_data + a.size], d[b.offset_data:b.offset_data + b.size] = B, A
    shard.write_bytes(bytes(d))


def _bucket_dir(out: Path, bucket: str) -> str:
    return json.loads((out / "lat" / "buckets.json").read_text())[bucket]["dir"]


@pytest.mark.slow
def test_a_pristine_bucket_output_checks_each_bucket_against_the_build(built):
    rep = shardsmith.verify(built / "lat", world=1, workers=0).report
    assert rep["ok"], rep["checks"]
    assert check(rep, "buckets")["ok"] and check(rep, "manifest")["ok"]
    assert "written=6; the buckets hold 6" in check(rep, "manifest")["detail"]
    for bucket, brep in rep["buckets"].items():
        assert check(brep, "integrity")["ok"] and check(brep, "manifest")["ok"], brep["checks"]
        assert f"bucket {bucket}" in check(brep, "manifest")["detail"]


@pytest.mark.slow
def test_latents_swapped_inside_a_bucket_shard_fail_integrity(copy):
    d = _bucket_dir(copy, "64x64x1")
    swap_members(copy / "lat" / d / "00000.tar", ".latent.pth")
    rep = shardsmith.verify(copy / "lat", world=1, workers=0).report
    assert not rep["ok"]
    bucket = check(rep, "bucket 64x64x1")
    assert not bucket["ok"] and "integrity" in bucket["detail"], bucket
    assert check(rep, "bucket 64x48x1")["ok"]
    # the bucket folder alone: its integrity check, naming the shard and a fix that applies to latent_wds
    integ = check(shardsmith.verify(copy / "lat" / d, world=1, workers=0).report, "integrity")
    assert not integ["ok"] and "00000.tar" in integ["detail"] and "sha256" in integ["detail"], integ
    assert "--overwrite" in integ["detail"] and "repair --from-source rebuilds image WebDataset shards only" \
        in integ["detail"], integ
    code, out = invoke("verify", copy / "lat", "--world", "1", "--workers", "0", "-q")
    assert code == 1 and "[FAIL] bucket 64x64x1" in out and "Traceback" not in out, out
    assert "[FAIL] integrity: 1 shard(s) whose bytes differ" in out, out  # what failed in the bucket, said
    code, out = invoke("inspect", copy / "lat" / d)
    assert code == 1 and "integrity" in out and "00000.tar" in out and "Traceback" not in out, out


@pytest.mark.slow
def test_a_lost_bucket_fails_against_the_manifest(copy):
    lat = copy / "lat"
    d = _bucket_dir(copy, "64x48x1")
    shutil.rmtree(lat / d)
    # the folder gone, buckets.json untouched: a failed check (exit 1), not a path mistake (exit 2)
    rep = shardsmith.verify(lat, world=1, workers=0).report
    gone = check(rep, "bucket 64x48x1")
    assert not rep["ok"] and not gone["ok"] and "the folder is gone" in gone["detail"], gone
    assert not check(rep, "manifest")["ok"] and "written=6; the buckets hold 4" in check(rep, "manifest")["detail"]
    code, out = invoke("verify", lat, "--world", "1", "--workers", "0", "-q")
    assert code == 1 and "[FAIL] bucket 64x48x1" in out and "does not exist" not in out, out
    # and its buckets.json entry gone too: the manifest still records the bucket
    index = json.loads((lat / "buckets.json").read_text())
    del index["64x48x1"]
    (lat / "buckets.json").write_text(json.dumps(index))
    rep = shardsmith.verify(lat, world=1, workers=0).report
    assert not rep["ok"]
    buckets = check(rep, "buckets")
    assert not buckets["ok"] and "64x48x1" in buckets["detail"] and "does not list" in buckets["detail"], buckets
    assert not check(rep, "manifest")["ok"]


@pytest.mark.slow
def test_inspect_of_a_multi_bucket_output_inspects_each_bucket(built, copy):
    """inspect of the output folder (lat/, which verify takes) was a ValueError traceback (no .tar directly in it)."""
    code, out = invoke("inspect", built / "lat")
    assert code == 0 and "Traceback" not in out, out
    for bucket in BUCKETS:
        assert f"{_bucket_dir(built, bucket)}/00000.tar" in out, out
    rep = shardsmith.inspect(built / "lat").report
    assert rep["ok"] and rep["kind"] == "wds_buckets" and sorted(rep["buckets"]) == sorted(BUCKETS)
    assert rep["totals"]["samples"] == 6 and rep["totals"]["shards"] == 2
    # damage inside a bucket and a lost bucket are problems (exit 1), named by bucket
    lat = copy / "lat"
    swap_members(lat / _bucket_dir(copy, "64x64x1") / "00000.tar", ".latent.pth")
    shutil.rmtree(lat / _bucket_dir(copy, "64x48x1"))
    code, out = invoke("inspect", lat)
    assert code == 1 and "Traceback" not in out, out
    assert "bucket 64x64x1 (64x64x1/): integrity: 1 shard(s) whose bytes differ" in out, out
    assert "bucket 64x48x1 (64x48x1/): 2 sample(s) in buckets.json, but the folder is gone" in out, out
