"""``repair`` of a multi-bucket latent output (one WebDataset folder per bucket beside ``buckets.json``).

Before: ``repair lat/64x64x1 --from-source`` said the folder was "not written by a shardsmith build (no ledger in it
or in a folder above it)", though the build's ledger is two folders up (where verify finds it), and ``repair lat``
said "holds no .tar shards" without naming the bucket folders it holds. Now the bucket folder's build is found, and
the refusal says why --from-source cannot rebuild it (a latent output) and what works: repair without it, or the
build's command again with --overwrite; the output's own folder names each bucket folder to repair. The advice is
followed here to show that it works."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.media_factory import real_photos
from tests.test_cli_mistakes import assert_message, invoke
from tests.test_repair_truncated_accounting import cut_in_second_sample

BUCKETS = ["64x64x1", "64x48x1"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(the recipe, the build folder) of a finished build of 8 photos in two image buckets, written by the CLI: the
    command the advice says to run again."""
    base = tmp_path_factory.mktemp("bucket_repair")
    real_photos(base / "src", 8, seed=3, min_side=60, max_side=140)
    recipe = base / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": str(base / "src")}], "geometry": {"buckets": BUCKETS}, "images": {"upscale": True},
        "models": {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"}, "device": "cpu"},
        "outputs": [{"format": "latent_wds", "dir": "lat"}]}))
    code, out = invoke("build", recipe, "--out", base / "out", "--quiet")
    assert code == 0, out
    index = json.loads((base / "out" / "lat" / "buckets.json").read_text())
    assert sorted(index) == sorted(BUCKETS), index
    return recipe, base / "out"


@pytest.fixture
def copy(built, tmp_path) -> Path:
    shutil.copytree(built[1], tmp_path / "b")
    return tmp_path / "b"


def _buckets(lat: Path) -> list[Path]:
    return sorted(lat / e["dir"] for e in json.loads((lat / "buckets.json").read_text()).values())


@pytest.mark.slow
def test_from_source_of_a_bucket_folder_names_its_build_and_what_works(copy):
    lat = copy / "lat"
    bucket = _buckets(lat)[0]
    code, said = invoke("repair", bucket, "--from-source", "--dry-run")
    assert_message(code, said, f"{bucket} is bucket {bucket.name} of output 'latent_wds' of the build {copy.resolve()}",
                   "--from-source rebuilds image WebDataset shards (format wds) only",
                   "output 'latent_wds' is format latent_wds",
                   f"Run `shardsmith repair {bucket}` without --from-source",
                   f"--out {copy.resolve()} --overwrite")
    assert "not written by a shardsmith build" not in said, said
    code, out = invoke("repair", bucket, "--dry-run")  # as it says
    assert code == 0, out


@pytest.mark.slow
def test_the_output_folder_names_each_bucket_folder_to_repair(copy):
    lat = copy / "lat"
    code, said = invoke("repair", lat, "--dry-run")
    assert_message(code, said, "it is a multi-bucket dataset", "repair takes one bucket's folder at a time",
                   *(f"`shardsmith repair {b}`" for b in _buckets(lat)))
    code, said = invoke("repair", lat, "--from-source")
    assert_message(code, said, "output 'latent_wds' is format latent_wds", "Repair each without it",
                   *(f"`shardsmith repair {b}`" for b in _buckets(lat)), f"--out {copy.resolve()} --overwrite")
    for b in _buckets(lat):  # as it says
        code, out = invoke("repair", b)
        assert code == 0, out


@pytest.mark.slow
def test_the_rebuild_advice_puts_a_cut_bucket_shard_back(built, copy):
    recipe, original = built
    lat = copy / "lat"
    bucket = next(b for b in _buckets(lat) if json.loads((b / "shard_count.json").read_text())["00000.tar"] >= 3)
    shard = bucket / "00000.tar"
    want = shard.read_bytes()
    cut_in_second_sample(shard)
    code, out = invoke("repair", bucket)  # keeps every intact sample, records the rest
    warning = next(line for line in out.splitlines() if "WARNING 00000.tar is cut short" in line)
    assert f"--out {copy.resolve()} --overwrite" in warning and "`shardsmith repair --from-source" not in warning, out
    code, out = invoke("build", recipe, "--out", copy, "--overwrite", "--quiet")  # the build's command again
    assert code == 0, out
    assert shard.read_bytes() == want
    code, out = invoke("verify", lat, "--world", 1, "--workers", 0)
    assert code == 0, out

