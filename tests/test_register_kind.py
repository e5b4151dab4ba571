"""``register`` tells what kind of WebDataset a folder is: a knowledge-distillation (kd_wds) or latent folder
registered without --preset was told "e.g. --preset image", which it accepted, and ``from_config`` then
loaded 0 samples (``missing:jpg``); ``--preset image_latent`` on an image folder was accepted and failed at
load time. Now the KD preset is picked as verify picks it, the suggestion is a preset that fits the
samples' members, and a preset whose members the samples lack is refused naming the one that fits."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import shardsmith
from tests.media_factory import real_photos
from tests.test_cli_mistakes import assert_message, invoke


def _pth(t: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _folder(ds: Path, samples: dict[str, dict[str, bytes]]) -> Path:
    """A WebDataset folder ``ds``: one shard of ``samples`` ({key: {suffix: bytes}}) and its shard_count.json."""
    ds.mkdir(parents=True)
    with tarfile.open(ds / "00000.tar", "w") as tf:
        for key, members in samples.items():
            for suffix, data in members.items():
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    (ds / "shard_count.json").write_text(json.dumps({"00000.tar": len(samples)}))
    return ds


@pytest.fixture
def kd(tmp_path) -> Path:
    """A knowledge-distillation folder (what ``distill`` writes, no build manifest): index.json says
    format shardsmith-kd; samples hold latent, noise, path, txt_emb, txt."""
    ds = _folder(tmp_path / "kd", {f"s{i}": {
        "latent.pth": _pth(torch.zeros(4, 8, 8)), "noise.pth": _pth(torch.ones(4, 8, 8)),
        "path.pth": _pth(torch.zeros(3, 4, 8, 8)), "txt_emb.pth": _pth(torch.zeros(5, 16)),
        "txt": f"prompt {i}".encode(), "json": b"{}"} for i in range(3)})
    (ds / "index.json").write_text(json.dumps({"format": "shardsmith-kd", "version": 1, "has_path": True}))
    return ds


@pytest.fixture
def latents(tmp_path) -> Path:
    """A latent_wds folder: latent.pth and txt_emb.pth per sample, neg_prompt_emb.npy beside the shards."""
    ds = _folder(tmp_path / "lat", {f"s{i}": {"latent.pth": _pth(torch.zeros(4, 8, 8)),
                                             "txt_emb.pth": _pth(torch.zeros(5, 16)), "json": b"{}"}
                                    for i in range(3)})
    np.save(ds / "neg_prompt_emb.npy", np.zeros((5, 16), np.float32))
    return ds


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """A finished ``wds`` output of 2 captioned photos."""
    base = tmp_path_factory.mktemp("regkind")
    for p in real_photos(base / "src", 2, min_side=40, max_side=64):
        p.with_suffix(".txt").write_text(f"a photo {p.stem}")
    shardsmith.build({"sources": [{"path": str(base / "src")}], "outputs": [{"format": "wds", "dir": "wds"}]},
                     base / "out", quiet=True)
    return base / "out" / "wds"


def _loaded(cfg: Path, name: str) -> tuple[int, dict]:
    from shardsmith.loaders import from_config

    loader = from_config(name, config_file=cfg, deterministic=True, batch_size=1, num_workers=0)
    return sum(len(b["__key__"]) for b in loader), loader.stats["dropped"]


def test_kd_folder_without_preset_gets_kd_path_and_loads(kd, tmp_path):
    cfg = tmp_path / "d.yaml"
    code, out = invoke("register", kd, "--name", "kd1", "--config", cfg)
    assert code == 0, out
    assert "preset kd_path" in out and "shardsmith-kd" in out, out
    assert yaml.safe_load(cfg.read_text())["kd1"]["preset"] == "kd_path"
    assert _loaded(cfg, "kd1") == (3, {})


def test_kd_folder_with_the_image_preset_is_refused_naming_kd_path(kd, tmp_path):
    cfg = tmp_path / "d.yaml"
    code, out = invoke("register", kd, "--name", "kd1", "--preset", "image", "--config", cfg)
    assert_message(code, out, "preset image does not fit", "jpg (real)", "--preset kd_path")
    assert not cfg.exists()


def test_latent_folder_without_preset_suggests_image_latent_and_it_loads(latents, tmp_path):
    cfg = tmp_path / "d.yaml"
    code, out = invoke("register", latents, "--name", "lat", "--config", cfg)
    assert_message(code, out, "--preset is required", "--preset image_latent")
    assert "--preset image " not in out and "--preset image\n" not in out
    code, out = invoke("register", latents, "--name", "lat", "--preset", "image", "--config", cfg)
    assert_message(code, out, "preset image does not fit", "--preset image_latent")
    assert not cfg.exists()
    code, out = invoke("register", latents, "--name", "lat", "--preset", "image_latent", "--config", cfg)  # the advice
    assert code == 0, out
    assert _loaded(cfg, "lat") == (3, {})


def test_image_latent_on_an_image_folder_is_refused_naming_image(photos, tmp_path):
    cfg = tmp_path / "d.yaml"
    code, out = invoke("register", photos, "--name", "p", "--preset", "image_latent", "--config", cfg)
    assert_message(code, out, "preset image_latent does not fit", "latent.pth (real)", "neg_prompt_emb.npy",
                   "--preset image")
    assert not cfg.exists()
    code, out = invoke("register", photos, "--name", "p", "--config", cfg)
    assert_message(code, out, "--preset is required", "its samples fit --preset image")
    code, out = invoke("register", photos, "--name", "p", "--preset", "image", "--config", cfg)
    assert code == 0, out
    assert _loaded(cfg, "p") == (2, {})


def test_images_without_captions_get_a_key_map_that_loads_them(tmp_path):
    """Samples with only jpg: the image preset's condition (txt) is missing. register says so, with the
    --set key_map that reads them; following it loads every sample."""
    real_photos(tmp_path / "src", 2, min_side=40, max_side=64)
    shardsmith.build({"sources": [{"path": str(tmp_path / "src")}], "outputs": [{"format": "wds", "dir": "wds"}]},
                     tmp_path / "b", quiet=True)
    ds = tmp_path / "b" / "wds"
    cfg = tmp_path / "d.yaml"
    code, out = invoke("register", ds, "--name", "n", "--config", cfg)
    assert_message(code, out, "--preset is required", "--preset image --set 'key_map={real: jpg}'")
    code, out = invoke("register", ds, "--name", "n", "--preset", "image", "--config", cfg)
    assert code == 0 and "warning: preset image reads txt (condition)" in out and "key_map={real: jpg}" in out, out
    code, out = invoke("register", ds, "--name", "n", "--preset", "image", "--set", "key_map={real: jpg}",
                       "--replace", "--config", cfg)
    assert code == 0 and "warning" not in out, out
    assert _loaded(cfg, "n") == (2, {})


def test_latents_without_text_get_the_overrides_that_load_them(tmp_path):
    """A latent folder built without models.text (latent.pth only, no neg_prompt_emb.npy): image_latent would
    fail at start; register says so with the --set flags that read the samples, and following them loads."""
    ds = _folder(tmp_path / "lat", {f"s{i}": {"latent.pth": _pth(torch.zeros(4, 8, 8)), "json": b"{}"}
                                    for i in range(2)})
    cfg = tmp_path / "d.yaml"
    code, out = invoke("register", ds, "--name", "l", "--preset", "image_latent", "--config", cfg)
    fix = "--set 'key_map={real: latent.pth}' --set 'files_map={}'"
    assert code == 0 and "warning: preset image_latent reads txt_emb.pth (condition)" in out and fix in out, out
    code, out = invoke("register", ds, "--name", "l", "--preset", "image_latent", "--set", "key_map={real: latent.pth}",
                       "--set", "files_map={}", "--replace", "--config", cfg)
    assert code == 0 and "warning" not in out, out
    assert _loaded(cfg, "l") == (2, {})
