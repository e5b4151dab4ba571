"""A latent sample's inpainting mask (``mask.pth``) is 0/1 on its ``latent.pth``'s grid ``[F', H', W']``,
the very rule ``verify`` applies to a ``.precomputed/`` tree's ``video_masks/`` (``formats.mask_grid``).
The WebDataset loader drops a sample that breaks it as ``mask_grid:<key>``, naming the shard, the key and
both shapes, so ``verify`` of a latent_wds dataset fails and says which sample and why (issue 18)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import torch

from shardsmith.formats.mask_grid import mask_grid_problem
from shardsmith.loaders.wds import WdsLoader
from shardsmith.loaders.wds_config import WdsLoaderConfig
from shardsmith.verify.runner import verify

GRID = (3, 2, 2)


def _pth(t: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _shards(folder: Path, masks: dict[str, torch.Tensor], per_shard: int = 2) -> None:
    """Latent samples ``k`` (``latent.pth`` [4, 3, 2, 2], its ``mask.pth`` from ``masks``), ``per_shard`` a shard."""
    folder.mkdir(parents=True)
    keys, counts = list(masks), {}
    for s in range(0, len(keys), per_shard):
        name = f"{s // per_shard:05d}.tar"
        with tarfile.open(folder / name, "w", format=tarfile.USTAR_FORMAT) as tf:
            for key in keys[s:s + per_shard]:
                lat = torch.full((4, *GRID), float(keys.index(key)))
                for suffix, data in (("latent.pth", _pth(lat)), ("mask.pth", _pth(masks[key]))):
                    info = tarfile.TarInfo(f"{key}.{suffix}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        counts[name] = len(keys[s:s + per_shard])
    (folder / "shard_count.json").write_text(json.dumps(counts))


def _on_grid(i: int) -> torch.Tensor:
    m = torch.zeros(GRID)
    m[i % 3, i % 2, 0] = 1
    return m


def test_the_rule_names_the_two_shapes():
    assert mask_grid_problem(_on_grid(0), torch.zeros(4, *GRID)) is None
    assert mask_grid_problem(torch.zeros(3, 4, 4), torch.zeros(4, *GRID)) == "mask [3, 4, 4] vs latent grid [3, 2, 2]"
    assert mask_grid_problem(torch.zeros(4, 4), None) == "mask is [4, 4], not [F', H', W']"
    assert mask_grid_problem(None, None) == "mask is NoneType, not [F', H', W']"
    assert mask_grid_problem(torch.full(GRID, 0.5), torch.zeros(4, *GRID)) == "mask holds values other than 0 and 1"


def test_the_loader_drops_a_mask_off_its_latents_grid_naming_the_sample(tmp_path):
    masks = {f"s{i}": _on_grid(i) for i in range(5)}
    masks["s3"] = torch.zeros(3, 4, 4)  # the pixel grid's quarter, not the latent's
    _shards(tmp_path / "lat", masks)
    cfg = WdsLoaderConfig(shards=tmp_path / "lat", key_map={"real": "latent.pth", "mask": "mask.pth"},
                          deterministic=True, partial=True, batch_size=2)
    loader = WdsLoader(cfg)
    seen = {}
    for batch in loader:
        for j, key in enumerate(batch["__key__"]):
            seen[key] = batch["mask"][j]
    assert sorted(seen) == ["s0", "s1", "s2", "s4"]
    assert all(torch.equal(seen[k], masks[k]) for k in seen)
    assert loader.stats["dropped"] == {"mask_grid:mask": 1}
    assert loader.stats["examples"]["mask_grid:mask"] == ["00001.tar/s3: mask [3, 4, 4] vs latent grid [3, 2, 2]"]
    # without a latent in the key_map the mask is still checked for [F', H', W'] and 0/1
    loader = WdsLoader(cfg.model_copy(update={"key_map": {"mask": "mask.pth"}}))
    assert sum(len(b["__key__"]) for b in loader) == 5 and not loader.stats["dropped"]


@pytest.mark.parametrize("wrong", [torch.zeros(3, 4, 4), torch.zeros(2, 2, 2)])
def test_verify_fails_a_latent_wds_set_with_one_mask_off_the_grid(tmp_path, wrong):
    masks = {f"s{i}": _on_grid(i) for i in range(4)}
    _shards(tmp_path / "lat", masks)
    rep = verify(tmp_path / "lat", world=2, workers=1)
    assert rep["ok"], rep["checks"]
    masks["s2"] = wrong
    _shards(tmp_path / "bad", masks)
    rep = verify(tmp_path / "bad", world=2, workers=1)
    c = {ch["name"]: ch for ch in rep["checks"]}
    assert not rep["ok"]
    shape = "x".join(map(str, wrong.shape))
    assert f"00001.tar/s2: mask [{shape.replace('x', ', ')}] vs latent grid [3, 2, 2]" in c["no_drops"]["detail"]
    assert not c["coverage"]["ok"] and "00001.tar/s2" in c["coverage"]["detail"]


def test_verify_fails_a_set_whose_every_mask_is_off_the_grid(tmp_path):
    """One shape for every mask, all wrong: no shape check can see it, only the rule."""
    _shards(tmp_path / "lat", {f"s{i}": torch.zeros(3, 4, 4) for i in range(2)})
    rep = verify(tmp_path / "lat", world=1, workers=1)
    c = {ch["name"]: ch for ch in rep["checks"]}
    assert not rep["ok"] and "shape:mask" not in c
    assert "loader dropped 2 (mask_grid:mask, e.g. 00000.tar/s0: mask [3, 4, 4] vs latent grid [3, 2, 2])" == \
        c["no_drops"]["detail"]


def test_the_loader_drops_an_audio_mask_off_its_audio_latents_steps(tmp_path):
    """``audio_mask.pth`` beside ``audio_latent.pth`` ``[C, T, F]``: 0/1 ``[T]`` (``formats.mask_grid``)."""
    folder = tmp_path / "aud"
    folder.mkdir()
    with tarfile.open(folder / "00000.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(3):
            mask = torch.ones(40 if i == 1 else 51)  # s1: a mask on the wrong number of steps
            for suffix, t in (("audio_latent.pth", torch.zeros(8, 51, 16)), ("audio_mask.pth", mask)):
                data = _pth(t)
                info = tarfile.TarInfo(f"s{i}.{suffix}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    (folder / "shard_count.json").write_text(json.dumps({"00000.tar": 3}))
    cfg = WdsLoaderConfig(shards=folder, key_map={"real": "audio_latent.pth", "mask": "audio_mask.pth"},
                          deterministic=True, partial=True, batch_size=1)
    loader = WdsLoader(cfg)
    assert sorted(k for b in loader for k in b["__key__"]) == ["s0", "s2"]
    assert loader.stats["examples"]["mask_grid:mask"] == ["00000.tar/s1: audio mask [40] vs audio latent steps [51]"]
