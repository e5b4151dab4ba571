"""Batches that straddle units: where the encode stage pads short batches (a GPU), a unit's last items
wait for the next unit's first ones instead of going as a padded short batch once per shard. Every
item still lands in its own shard with its own latent, the bytes are those of unit-aligned batches,
and a resumed build gives the bytes of an uninterrupted one. Run on CPU with padding switched on
(``EncodeStage.pad_batches``)."""

from __future__ import annotations

import os

import pytest

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.encode import stage as stage_mod
from shardsmith.encode.stage import EncodeStage
from shardsmith.recipe import recipe_from_dict
from test_build import tree_bytes

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _per_item_encoder(monkeypatch):
    """The VAE's encode replaced by a function of each item alone (subsampled pixels), so the
    bytes cannot depend on how items were grouped into batches, only on which item went where."""
    load = stage_mod.load_vae

    def load_stand_in(*a, **k):
        vae = load(*a, **k)
        c, s = vae.spec.latent_channels, vae.spec.spatial

        def encode(x, **_):
            return (x[:, :, ::s, ::s].mean(1, keepdim=True) + x[:, :1, ::s, ::s] * 0.5).expand(-1, c, -1, -1).contiguous()

        vae.encode = encode
        return vae

    monkeypatch.setattr(stage_mod, "load_vae", load_stand_in)
    # the text encoder too, one caption a pass: on some CPUs the BLAS rounds a caption's embedding
    # differently with other batch-mates, and these tests are about which item goes where
    load_text = stage_mod.load_text_encoder

    def load_text_per_item(*a, **k):
        te = load_text(*a, **k)
        encode = te.encode

        def per_item(prompts, **kw):
            parts = [encode([p], **kw) for p in prompts]
            return type(parts[0])(**{f: _joined([getattr(x, f) for x in parts]) for f in vars(parts[0])})

        te.encode = per_item
        return te

    monkeypatch.setattr(stage_mod, "load_text_encoder", load_text_per_item)


def _joined(values: list):
    import torch

    if isinstance(values[0], torch.Tensor):
        return torch.cat(values)
    if isinstance(values[0], list):
        return [v for part in values for v in part]
    return values[0]


def _launches(monkeypatch) -> list[int]:
    sizes = []
    launch = EncodeStage.launch

    def spy(self, host, n=None, *a, **k):
        sizes.append(host.shape[0] if n is None else n)
        return launch(self, host, n, *a, **k)

    monkeypatch.setattr(EncodeStage, "launch", spy)
    return sizes


def _spec(tmp_path, buckets):
    return {"sources": [{"path": str(tmp_path / "p")}], "split": {"holdout": 0},
            "geometry": {"buckets": buckets}, "images": {"upscale": True},
            "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 4},
            "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 3}]}


@pytest.mark.slow
def test_short_batches_wait_for_the_next_unit_and_every_item_keeps_its_shard(tmp_path, monkeypatch):
    """One bucket, shards of 3, batches of 4, 23 items: unit-aligned batches are 3, 3, ... 2 (one
    short batch per shard); carried across units they are full but for the last, same bytes."""
    _per_item_encoder(monkeypatch)
    sizes = _launches(monkeypatch)
    real_photos(tmp_path / "p", 23, seed=5, min_side=40, max_side=90)
    spec = _spec(tmp_path, ["32x32x1"])
    aligned = build(recipe_from_dict(spec), tmp_path / "aligned", quiet=True, workers=1)
    assert sizes == [3] * 7 + [2]
    sizes.clear()
    monkeypatch.setattr(EncodeStage, "pad_batches", True)
    m = build(recipe_from_dict(spec), tmp_path / "carried", quiet=True, workers=1)
    assert sizes == [4] * 5 + [3]
    assert m["counts"]["written"] == aligned["counts"]["written"] == 23
    assert tree_bytes(tmp_path / "carried") == tree_bytes(tmp_path / "aligned")


@pytest.mark.slow
def test_two_buckets_interleaved_each_item_keeps_its_latent_and_shard(tmp_path, monkeypatch):
    """Two buckets fill their batches at different rates, so a batch of one bucket can hold an older
    unit than a batch of the other submitted before it: every unit still gets all of its members."""
    _per_item_encoder(monkeypatch)
    sizes = _launches(monkeypatch)
    real_photos(tmp_path / "p", 23, seed=5, min_side=40, max_side=90)
    spec = _spec(tmp_path, ["32x32x1", "48x32x1"])
    build(recipe_from_dict(spec), tmp_path / "aligned", quiet=True, workers=1)
    aligned_sizes, sizes[:] = list(sizes), []
    monkeypatch.setattr(EncodeStage, "pad_batches", True)
    m = build(recipe_from_dict(spec), tmp_path / "carried", quiet=True, workers=1)
    assert m["counts"]["written"] == 23 and sum(sizes) == sum(aligned_sizes) == 23
    assert len(sizes) < len(aligned_sizes) and sum(n < 4 for n in sizes) < sum(n < 4 for n in aligned_sizes)
    assert tree_bytes(tmp_path / "carried") == tree_bytes(tmp_path / "aligned")


@pytest.mark.slow  # 3.5-4.5 s: the fast lane keeps under two minutes
@pytest.mark.parametrize("pad", [None, True])
def test_a_failed_shard_write_then_resume_gives_the_uninterrupted_bytes(tmp_path, monkeypatch, disk_full_at, pad):
    """Units are written on a writer thread. With batches straddling units (pad) or not: an error
    there (a full disk) reaches the caller, the units written before it stay recorded, and a resume
    gives the bytes of an uninterrupted build (real tiny VAE)."""
    import sqlite3

    monkeypatch.setattr(EncodeStage, "pad_batches", pad)
    real_photos(tmp_path / "p", 9, seed=12, min_side=40, max_side=90)
    rec = recipe_from_dict({"sources": [{"path": str(tmp_path / "p")}], "geometry": {"buckets": ["32x32x1"]},
                            "images": {"upscale": True}, "split": {"holdout": 0},
                            "models": {"vae": {"family": "sd"}, "batch_size": 3},
                            "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}]})
    build(rec, tmp_path / "ref", quiet=True, workers=1)
    disk_full_at(2)
    with pytest.raises(OSError, match="No space left"):
        build(rec, tmp_path / "o", quiet=True, workers=1)
    db = sqlite3.connect(tmp_path / "o" / ".shardsmith" / "ledger.sqlite")
    assert [r[0] for r in db.execute("SELECT seq FROM shards ORDER BY seq")] == [0, 1]
    db.close()
    disk_full_at(None)
    m = build(rec, tmp_path / "o", quiet=True, workers=1)
    assert m["counts"]["written"] == 9
    assert tree_bytes(tmp_path / "o") == tree_bytes(tmp_path / "ref")
