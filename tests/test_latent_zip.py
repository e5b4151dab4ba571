"""``format: latent_zip`` (issue 15): the EDM2 / FastGen latent ZIP (``imagenet_256_sd.zip``), read
back with ``zipfile`` + ``numpy`` alone, its latents recomputed with the VAE directly, and verified
through the CLI with the ``class_zip`` preset."""

from __future__ import annotations

import io
import json
import os
import random
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from media_factory import digits_folder, real_photos
from shardsmith import formats
from shardsmith.build import build
from shardsmith.distribute import local
from shardsmith.encode.vae import load_vae
from shardsmith.encode.vae_config import geometry
from shardsmith.recipe import RecipeError, recipe_from_dict
from shardsmith.sinks.zip import LatentZipSink
from test_build import tree_bytes

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PY = sys.executable
SIDE = 32  # the digits below are 32x32: center-crop-dhariwal at 32 keeps every pixel as it is
C = geometry("sd", "tiny")["latent_channels"]  # the tiny random-weight SD VAE's latent channels
MEMBER = re.compile(r"^(\d{5})/img-mean-std-(\d{8})\.npy$")


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("digits")
    digits_folder(d, per_class=2, scale=4)  # 20 real handwritten digits, 32x32, classes 0..9
    return d


def _recipe(src: Path, **output) -> dict:
    return {"sources": [{"path": str(src)}],
            "models": {"vae": {"family": "sd", "store": "mean_std"}, "batch_size": 3},
            "outputs": [{"format": "latent_zip", "resolution": SIDE, "unit": 6, **output}]}


def _read_zip(path: Path) -> tuple[list[str], dict[str, np.ndarray], list | None]:
    """(member names in archive order, name -> array, dataset.json labels) with zipfile + numpy."""
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        assert {i.compress_type for i in infos} == {zipfile.ZIP_STORED}
        names = [i.filename for i in infos if i.filename != "dataset.json"]
        arrays = {n: np.load(io.BytesIO(zf.read(n)), allow_pickle=False) for n in names}
        labels = json.loads(zf.read("dataset.json"))["labels"]
    return names, arrays, labels


def _direct_means(paths: list[Path]) -> dict[Path, np.ndarray]:
    """Each image's posterior mean from the VAE itself (no shardsmith transform: the 32x32 digit,
    RGB, scaled to [-1, 1] as every SD VAE takes it)."""
    vae = load_vae("sd", config="tiny", store="mean_std", device="cpu")
    out = {}
    for p in paths:
        rgb = np.asarray(Image.open(p).convert("RGB"), dtype=np.float32)
        x = torch.from_numpy(rgb).permute(2, 0, 1)[None] / 127.5 - 1
        out[p] = vae.posterior(x).mean[0].float().numpy()
    return out


@pytest.fixture(scope="module")
def built(digits, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lz") / "out"
    build(recipe_from_dict(_recipe(digits)), out, quiet=True, workers=2)
    return out


def test_the_zip_holds_mean_and_std_of_each_image_with_its_label(built, digits):
    names, arrays, labels = _read_zip(built / "latents.zip")
    assert len(names) == 20 and names == sorted(names)
    for i, n in enumerate(names):  # EDM2 numbering: {idx // 1000:05d}/img-mean-std-{idx:08d}.npy
        m = MEMBER.match(n)
        assert m and int(m.group(2)) == i and int(m.group(1)) == i // 1000
    for a in arrays.values():
        assert a.dtype == np.float32 and a.shape == (2 * C, SIDE // 8, SIDE // 8)
        assert (a[C:] > 0).all() and np.isfinite(a).all()  # the std half
    # every member is the VAE's mean of exactly one source image, and dataset.json names its class
    images = sorted(digits.glob("*/*.png"))
    direct = _direct_means(images)
    assert [row[0] for row in labels] == names
    matched = set()
    for (name, label) in labels:
        hits = [p for p in images if np.allclose(arrays[name][:C], direct[p], atol=1e-5)]
        assert len(hits) == 1, name
        assert label == int(hits[0].parent.name)
        matched.add(hits[0])
    assert len(matched) == 20
    m = json.loads((built / "manifest.json").read_text())
    blk = m["outputs"]["latent_zip"]["files"]["train"]
    assert blk["images"] == 20 and blk["latent_shape"] == [2 * C, SIDE // 8, SIDE // 8] and blk["labelled"]


@pytest.mark.slow
def test_verify_with_the_class_zip_preset_passes_and_counts_every_image(built):
    r = subprocess.run([PY, "-m", "shardsmith", "verify", str(built / "latents.zip"), "--preset", "class_zip",
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["coverage"]["unique"] == 20 and rep["coverage"]["expected"] == 20
    checks = {c["name"]: c for c in rep["checks"]}
    assert checks["manifest"]["ok"] and "written=20" in checks["manifest"]["detail"]
    assert rep["contract"]["keys"]["real"]["shape"] == [2 * C, SIDE // 8, SIDE // 8]
    assert rep["contract"]["keys"]["real"]["dtype"] == "float32"
    assert rep["contract"]["keys"]["condition"]["shape"] == [10]  # one-hot of max(label)+1


@pytest.mark.slow
def test_builds_in_shuffled_unit_order_and_after_a_crash_give_the_same_bytes(built, digits, tmp_path, monkeypatch):
    want = tree_bytes(built)
    rec = recipe_from_dict(_recipe(digits))
    seen = []

    def order(jobs):
        jobs = list(jobs)
        random.Random(3).shuffle(jobs)
        seen.append([j.seq for j in jobs])
        return jobs

    monkeypatch.setattr(local, "ORDER", order)
    build(rec, tmp_path / "shuffled", quiet=True, workers=2)
    assert any(s != sorted(s) for s in seen), seen
    assert tree_bytes(tmp_path / "shuffled") == want

    # a build that stops after two staged units, then resumes: the same bytes
    write_unit, calls = LatentZipSink.write_unit, []

    class Killed(Exception):
        pass

    def crash(self, seq, samples):
        if len(calls) == 2:
            raise Killed("the build stops here")
        calls.append(seq)
        return write_unit(self, seq, samples)

    monkeypatch.setattr(LatentZipSink, "write_unit", crash)
    with pytest.raises(Killed):
        build(rec, tmp_path / "crashed", quiet=True, workers=2)
    assert not (tmp_path / "crashed" / "latents.zip").exists()
    monkeypatch.setattr(LatentZipSink, "write_unit", write_unit)
    build(rec, tmp_path / "crashed", quiet=True, workers=2)
    assert tree_bytes(tmp_path / "crashed") == want


def test_unlabelled_photos_with_a_holdout(tmp_path):
    src = tmp_path / "photos"
    real_photos(src, 12, seed=4, min_side=40, max_side=120)
    rec = recipe_from_dict({**_recipe(src, transform="center-crop", upscale=True), "split": {"holdout": 3}})
    m = build(rec, tmp_path / "out", quiet=True, workers=2)
    total = 0
    for rel in ("latents.zip", "holdout/latents.zip"):
        names, arrays, labels = _read_zip(tmp_path / "out" / rel)
        assert labels is None  # no class folders: dataset.json says null, as the image ZIP does
        assert all(a.shape == (2 * C, SIDE // 8, SIDE // 8) and (a[C:] > 0).all() for a in arrays.values())
        total += len(names)
    assert total == 12 and m["outputs"]["latent_zip"]["counts"]["written"] == 12
    assert len(_read_zip(tmp_path / "out" / "holdout/latents.zip")[0]) == 3


@pytest.mark.slow
def test_beside_a_latent_wds_each_output_keeps_its_own_geometry(digits, tmp_path):
    """A latent_wds (buckets) and a latent_zip (its resolution) share the VAE: an item encoded for
    one output is not handed to the other, whose pixels were cut differently."""
    both = _recipe(digits)
    both["geometry"] = {"buckets": ["64x48x1"]}
    both["images"] = {"upscale": True}
    both["outputs"] = [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 8}] + both["outputs"]
    build(recipe_from_dict(both), tmp_path / "both", quiet=True, workers=2)
    build(recipe_from_dict(_recipe(digits)), tmp_path / "alone", quiet=True, workers=2)
    assert (tmp_path / "both" / "latents.zip").read_bytes() == (tmp_path / "alone" / "latents.zip").read_bytes()
    assert sorted(p.name for p in (tmp_path / "both" / "lat").glob("*.tar")) == ["00000.tar", "00001.tar",
                                                                                "00002.tar"]


def test_a_recipe_without_store_mean_std_is_refused_naming_the_key_and_the_fix(digits, tmp_path):
    data = _recipe(digits)
    data["models"]["vae"]["store"] = "mean"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(data))
    r = subprocess.run([PY, "-m", "shardsmith", "build", str(recipe), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "models.vae.store" in r.stderr and "set models.vae.store: mean_std" in r.stderr
    assert not (tmp_path / "o").exists()
    # beside an output that needs store: mean, the message says why both cannot share one VAE setting
    data["outputs"].append({"format": "latent_wds"})
    data["geometry"] = {"buckets": ["32x32x1"]}
    with pytest.raises(RecipeError, match="one VAE setting: output 'latent_wds'"):
        recipe_from_dict(data)


def test_recipe_rules(digits):
    # no geometry.buckets needed: the geometry is the resolution
    rec = recipe_from_dict(_recipe(digits))
    assert rec.encode_buckets() == ["32x32x1"]
    with pytest.raises(RecipeError, match="needs? models.vae"):
        recipe_from_dict({**_recipe(digits), "models": {}})
    with pytest.raises(RecipeError, match="square images"):
        recipe_from_dict(_recipe(digits, resolution=[32, 16]))
    with pytest.raises(RecipeError, match=r"\.zip"):
        recipe_from_dict(_recipe(digits, path="latents.tar"))


def test_precheck_refuses_a_side_the_vae_cannot_encode(digits, tmp_path):
    from shardsmith.precheck import precheck

    with pytest.raises(RecipeError, match=r"outputs\[0\]\.resolution: 36 is not a multiple of 8.*use 32 or 40"):
        precheck(recipe_from_dict(_recipe(digits, resolution=36)))
    video = _recipe(digits)
    video["models"]["vae"]["family"] = "wan"
    with pytest.raises(RecipeError, match="video VAE"):
        precheck(recipe_from_dict(video))
    assert not list(tmp_path.iterdir())


def test_member_names_live_in_formats():
    assert formats.zip.latent_zip_member_name(0) == "00000/img-mean-std-00000000.npy"
    assert formats.zip.latent_zip_member_name(12345) == "00012/img-mean-std-00012345.npy"
    assert "latent_zip" in formats.zip.ZIP_FORMATS
