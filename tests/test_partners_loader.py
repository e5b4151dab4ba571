"""Partners survive the loader (issue 18): shards of each mode with partner members (v2v-ic's
``ref_latent.pth``, image-edit's ``src_latent.pth`` and raw ``src.jpg``, i2v's ``first_frame.jpg`` /
``first_frame_latent.pth``, video-inpaint's ``mask.pth``, camera-video's ``camera.npy``), read through
the project's WebDataset loader with its mode preset by 2 ranks x 2 workers: in a deterministic pass
every sample arrives exactly once, and in training mode (shuffled) too, every row's partner members are
those its own key holds in the tars (a key -> bytes map read straight from them)."""

from __future__ import annotations

import json
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardsmith.build import build
from shardsmith.loaders import decoders as dec
from shardsmith.loaders.mode_presets import preset_name
from shardsmith.loaders.presets import preset_config
from shardsmith.loaders.wds import WdsLoader
from shardsmith.recipe import recipe_from_dict
from video_factory import pan_video

pytestmark = pytest.mark.slow
FPS = 24
N = 5
WORLD, WORKERS = 2, 2
PHOTOS = ("astronaut", "coffee", "rocket", "chelsea", "camera")


def _video_set(tmp_path: Path, mode: str) -> Path:
    """N clips (96x64, 20 frames) with, per clip, its own reference clip, mask and camera track."""
    src = tmp_path / "src"
    src.mkdir()
    rows = ["clip,ref,mask,cam,caption"]
    for i in range(N):
        pan_video(src / f"c{i}.mp4", frames=20, fps=FPS, size=(96, 64), photo=PHOTOS[i])
        pan_video(src / f"r{i}.mp4", frames=20, fps=FPS, size=(48, 32), photo=PHOTOS[(i + 2) % N])
        m = np.zeros((32, 48), np.uint8)  # the crop keeps x 8..40: latent cells of 16x16 mask pixels
        for cell in range(4):  # clip i masks the cells of the bits of i + 1: a latent mask of its own
            if (i + 1) >> cell & 1:
                y, x = 16 * (cell // 2) + 4, 8 + 16 * (cell % 2) + 4
                m[y:y + 8, x:x + 8] = 255
        Image.fromarray(m).save(src / f"m{i}.png")
        frames = [{"extrinsic": [[1, 0, 0, 0.1 * k * (i + 1)], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]}
                  for k in range(20)]
        (src / f"cam{i}.json").write_text(json.dumps({"width": 96, "height": 64,
                                                      "intrinsic": [80.0 + i, 80.0, 48.0, 32.0], "frames": frames}))
        rows.append(f"c{i}.mp4,r{i}.mp4,m{i}.png,cam{i}.json,clip {i}")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")
    role = {"v2v-ic": ("reference", "ref"), "video-inpaint": ("mask", "mask"), "camera-video": ("camera", "cam")}
    columns = {"media": "clip", "caption": "caption"}
    if mode in role:
        columns[role[mode][0]] = role[mode][1]
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": columns}], "mode": mode,
           "geometry": {"buckets": ["64x64x17"]}, "models": {"vae": {"family": "ltx2"}, "batch_size": 4},
           "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == N, m["counts"]
    return tmp_path / "out"


def _edit_set(tmp_path: Path) -> Path:
    from test_mode_loaders import edit_pairs_recipe

    rec = edit_pairs_recipe(tmp_path, N, 7, 80, 140, {"vae": {"family": "sd"}})
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == N, m["counts"]
    return tmp_path / "out"


def _tar_members(folder: Path) -> dict[str, dict[str, bytes]]:
    """``{"<shard>/<key>": {suffix: bytes}}`` read straight from the tars, not through the loader."""
    got: dict[str, dict[str, bytes]] = {}
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                key, suffix = m.name.split(".", 1)
                got.setdefault(f"{shard.name}/{key}", {})[suffix] = tf.extractfile(m).read()
    return got


def _same(a, b) -> bool:
    return torch.equal(torch.as_tensor(a), torch.as_tensor(b)) if torch.is_tensor(b) else a == b


def _check_rows(batch: dict, loader: WdsLoader, truth: dict[str, dict[str, bytes]]) -> list[str]:
    """The ids of the batch's rows, each row's every key_map value checked against its own key's bytes
    (decoded as the loader decodes them)."""
    cfg = loader.config
    ids = [f"{s}/{k}" for s, k in zip(batch["__shard__"], batch["__key__"])]
    for j, sid in enumerate(ids):
        for bkey, suffix in cfg.key_map.items():
            want = dec.decode_member(suffix, truth[sid][suffix], image_size=cfg.image_size)
            assert _same(batch[bkey][j], want), f"{sid}: {bkey} ({suffix}) is not its own key's"
    return ids


def _loaders(folder: Path, key_map: dict[str, str], preset: str, **kw) -> list[WdsLoader]:
    cfg = preset_config(preset, folder).model_copy(update={"key_map": key_map, "num_workers": WORKERS,
                                                           "world_size": WORLD, "batch_size": 2, "image_size": 64,
                                                           **kw})
    return [WdsLoader(cfg.model_copy(update={"rank": r})) for r in range(WORLD)]


# mode -> (output folder, the partner members its samples carry beyond the mode preset's key_map)
CASES = {
    "v2v-ic": ("lat", {}),
    "i2v": ("lat", {"first_frame_jpg": "first_frame.jpg"}),
    "video-inpaint": ("lat", {}),
    "camera-video": ("lat", {}),
    "image-edit": ("lat", {}),
    "image-edit raw": ("wds", {}),
}
PARTNERS = {"v2v-ic": "ref_latent.pth", "i2v": "first_frame_latent.pth", "video-inpaint": "mask.pth",
            "camera-video": "camera.npy", "image-edit": "src_latent.pth", "image-edit raw": "src.jpg"}


@pytest.mark.parametrize("case", list(CASES))
def test_partners_keep_their_key_across_ranks_workers_and_shuffling(tmp_path, case):
    mode = case.split()[0]
    out = _edit_set(tmp_path) if mode == "image-edit" else _video_set(tmp_path, mode)
    sub, extra = CASES[case]
    folder = out / sub
    preset = preset_name(mode, "wds" if sub == "wds" else "latent_wds")
    key_map = {**preset_config(preset, folder).key_map, **extra}
    assert PARTNERS[case] in key_map.values(), key_map
    truth = _tar_members(folder)
    assert len(truth) == N and len({s.split("/")[0] for s in truth}) == 3
    # the test has teeth: every sample's partners differ from every other sample's
    for suffix in key_map.values():
        assert len({m[suffix] for m in truth.values()}) == N, suffix

    # a deterministic pass: every sample exactly once over 2 ranks x 2 workers, each with its own partners
    seen: list[str] = []
    for loader in _loaders(folder, key_map, preset, deterministic=True, partial=True):
        for batch in loader:
            seen += _check_rows(batch, loader, truth)
        assert not loader.stats["dropped"], loader.stats
    assert sorted(seen) == sorted(truth) and len(seen) == N

    # training: shuffled, shards drawn with replacement; every row still carries its own key's partners
    order: list[str] = []
    for loader in _loaders(folder, key_map, preset, deterministic=False, shuffle_size=4, seed=3):
        it = iter(loader)
        for _ in range(6):
            order += _check_rows(next(it), loader, truth)
        del it
    assert Counter(order).keys() == truth.keys()  # every sample came, some more than once
    tar_order = list(truth)
    assert [x for x in order if x in tar_order][:N] != tar_order  # not the tars' order


def test_verify_of_a_built_inpainting_set_names_the_sample_whose_mask_is_off_the_grid(tmp_path):
    """The build's own video-inpaint shards, verified with the mode preset verify picks from the manifest:
    one sample's mask.pth replaced by a mask on another grid fails, naming its shard, its key and both shapes."""
    import io

    from shardsmith.verify.runner import verify

    lat = _video_set(tmp_path, "video-inpaint") / "lat"
    assert verify(lat, world=WORLD, workers=WORKERS)["ok"]
    shard = next(p for p in sorted(lat.glob("*.tar")) if "c3.mask.pth" in tarfile.open(p).getnames())
    with tarfile.open(shard) as tf:
        kept = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    buf = io.BytesIO()
    torch.save(torch.zeros(3, 4, 4), buf)
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as out:
        for m, data in kept:
            data = buf.getvalue() if m.name == "c3.mask.pth" else data
            m.size = len(data)
            out.addfile(m, io.BytesIO(data))
    rep = verify(lat, world=WORLD, workers=WORKERS)
    c = {ch["name"]: ch for ch in rep["checks"]}
    assert not rep["ok"] and rep["preset"] == "latent_video_inpaint"
    assert f"mask_grid:mask, e.g. {shard.name}/c3: mask [3, 4, 4] vs latent grid [3, 2, 2]" in c["no_drops"]["detail"]
    assert not c["coverage"]["ok"] and f"{shard.name}/c3" in c["coverage"]["detail"]
