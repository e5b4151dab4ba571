"""Multi-bucket latent datasets that batch (issue 16): a latent output with several buckets is one
WebDataset folder per bucket plus ``buckets.json``; the bucket-aware loader gives batches of one
shape, each sample at most once per pass over ranks x workers, and resumes exactly."""

from __future__ import annotations

import json
import os

import pytest
import torch

from shardsmith.build import build
from shardsmith.formats.wds import BUCKETS_INDEX_FILE, SHARD_COUNT_FILE
from shardsmith.loaders.buckets import BucketedWdsLoader
from shardsmith.loaders.presets import build_loader, preset_config
from shardsmith.recipe import recipe_from_dict
from video_factory import pan_video

os.environ.setdefault("HF_HUB_OFFLINE", "1")

COUNTS = {(64, 64): 40, (96, 64): 34, (64, 96): 20}  # clips per shape -> buckets 64x64x9, 96x64x9, 64x96x9
BUCKETS = ["64x64x9", "96x64x9", "64x96x9"]


@pytest.fixture(scope="module")
def lat(tmp_path_factory):
    root = tmp_path_factory.mktemp("buckets")
    clips = root / "clips"
    clips.mkdir()
    photos = ["astronaut", "coffee", "chelsea"]
    i = 0
    for size, n in COUNTS.items():
        for k in range(n):
            pan_video(clips / f"c{i:03d}.mp4", frames=9 + k % 3, fps=24, size=size, photo=photos[k % 3])
            i += 1
    recipe = recipe_from_dict({
        "sources": [{"path": str(clips)}], "split": {"dedup": False},
        "geometry": {"buckets": BUCKETS}, "models": {"vae": {"family": "ltx"}, "batch_size": 8},
        "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 16}]})
    build(recipe, root / "out", quiet=True, workers=2)
    return root / "out" / "lat"


def _cfg(lat, **kw):
    base = {"key_map": {"real": "latent.pth"}, "files_map": {}, "deterministic": True, "batch_size": 4}
    return preset_config("video_latent", lat, **{**base, **kw})


def _pass(lat, world=2, workers=2, start=0):
    """Every rank's batches: [(bucket shape, keys)] in order."""
    out = []
    for r in range(world):
        ld = build_loader(_cfg(lat, world_size=world, rank=r, num_workers=workers, start_index=start))
        assert isinstance(ld, BucketedWdsLoader)
        got = []
        for b in ld:
            assert isinstance(b["real"], torch.Tensor) and b["real"].shape[0] == 4  # stacked: one shape
            got.append((tuple(b["real"].shape[1:]), list(b["__key__"])))
        assert len(got) == len(ld)
        out.append((ld, got))
    return out


@pytest.mark.slow
def test_a_multi_bucket_output_is_one_folder_per_bucket_with_an_index(lat):
    index = json.loads((lat / BUCKETS_INDEX_FILE).read_text())
    assert sorted(index) == sorted(BUCKETS)
    for (w, h), n in COUNTS.items():
        b = index[f"{w}x{h}x9"]
        assert b["samples"] == n and b["latent_shape"] == [128, 2, h // 32, w // 32]
        counts = json.loads((lat / b["dir"] / SHARD_COUNT_FILE).read_text())
        assert sum(counts.values()) == n and sorted(counts) == sorted(p.name for p in (lat / b["dir"]).glob("*.tar"))
    assert not list(lat.glob("*.tar"))  # nothing of mixed shape at the top


@pytest.mark.slow
def test_every_batch_has_one_shape_and_each_sample_comes_once_over_ranks_and_workers(lat):
    ranks = _pass(lat)
    (ld0, got0), (ld1, got1) = ranks
    # rounds of 4 x 2 ranks x 2 workers = 16 samples: 2 + 2 + 1 rounds, 10 batches per rank
    assert len(got0) == len(got1) == 10
    assert [s for s, _ in got0] == [s for s, _ in got1]  # the same bucket at every step on every rank
    keys = [k for _, got in ranks for _, ks in got for k in ks]
    assert len(keys) == len(set(keys)) == 80
    assert ld0.remainders() == {"64x64x9": 8, "96x64x9": 2, "64x96x9": 4}
    assert ld0.stats["dropped"]["bucket_remainder"] == 14
    shapes = {s for s, _ in got0}
    assert len(shapes) == 3


@pytest.mark.slow
def test_a_pass_resumed_from_a_round_gives_the_rest_of_the_uninterrupted_pass(lat):
    full = _pass(lat)
    resumed = _pass(lat, start=2 * 16)  # two rounds consumed by the whole world
    for (_, a), (_, b) in zip(full, resumed):
        assert b == a[2 * 2:]  # two rounds = 2 batches from each of the 2 workers
    with pytest.raises(ValueError, match="not a round boundary.*resume from 32 or 48"):
        build_loader(_cfg(lat, world_size=2, rank=0, num_workers=2, start_index=40))
    # another seed interleaves the buckets in another order, with the same samples
    other = _pass(lat, world=1, workers=1)
    other_seed = [build_loader(_cfg(lat, world_size=1, rank=0, num_workers=1, seed=5))]
    a = [s for s, _ in other[0][1]]
    b = [tuple(x["real"].shape[1:]) for x in other_seed[0]]
    assert sorted(a) == sorted(b) and a != b


@pytest.mark.slow
def test_the_build_summarises_each_bucket_and_warns_about_a_multi_shape_precomputed_tree(tmp_path):
    from rich.console import Console
    import io

    from video_factory import captioned_clips_table

    table, _ = captioned_clips_table(tmp_path, photos=2)
    recipe = recipe_from_dict({
        "sources": [{"path": str(table)}], "geometry": {"buckets": ["64x64x1", "64x64x9", "96x64x17"]},
        "models": {"vae": {"family": "ltx"}, "text": {"family": "minilm"}}, "outputs": [{"format": "precomputed"}]})
    buf = io.StringIO()
    m = build(recipe, tmp_path / "out", console=Console(file=buf, width=300), workers=2)
    b = m["outputs"]["precomputed"]["files"]["train"]["buckets"]
    # pan_long (20 frames) -> 96x64x17, pan_mid (12) -> 64x64x9, two photos -> 64x64x1; pan_short too short
    assert {k: (v["samples"], v["frames_used"], v["frames_available"]) for k, v in b.items()} == \
        {"64x64x1": (2, 2, 2), "64x64x9": (1, 9, 12), "96x64x17": (1, 17, 20)}
    assert b["96x64x17"]["latent_shape"] == [128, 3, 2, 3] and 0 < b["64x64x1"]["mean_area_kept"] <= 1
    assert any("needs batch_size: 1" in w for w in m["warnings"])
    out = buf.getvalue()
    assert "train bucket 96x64x17: 1 sample(s), latent 128x3x2x3, 17/20 frames used" in out
    assert "the LTX trainer needs batch_size: 1" in out


@pytest.mark.slow
def test_register_gives_fastgen_one_config_per_bucket_and_shardsmith_the_bucket_aware_loader(lat, tmp_path,
                                                                                          monkeypatch):
    import subprocess
    import sys

    from shardsmith.loaders.presets import from_config

    cfg = tmp_path / "data.yaml"
    monkeypatch.setenv("DATA_ROOT_DIR", str(lat.parent.parent))
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "shardsmith", "register", str(lat), "--preset", "video_latent",
                        "--name", "clips", "--config", str(cfg)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "FastGen v0.1.0 has no multi-bucket" in out
    for b in BUCKETS:
        assert f"CLIPS_{b.upper()}_Loader_Config.datatags" in out and f"'out/lat/{b}')]" in out
        assert f"'out/lat/{b}', 'shard_count.json')" in out
    assert out.count("from fastgen.configs.data import") == 1
    ld = from_config("clips", cfg, key_map={"real": "latent.pth"}, files_map={}, deterministic=True, batch_size=4,
                     world_size=1, rank=0, num_workers=0)
    assert isinstance(ld, BucketedWdsLoader) and sorted(ld.buckets) == sorted(BUCKETS)
