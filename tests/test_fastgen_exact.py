"""FastGen-exact semantics (issue 16): the ``presets_map`` constants, the ``files_map`` path rule
and the partial last batch FastGen drops.

Reference: FastGen v0.1.0 = juliusberner/FastGen commit 123e6a2 ("Remove one-logger-utils (#16)",
the v0.1.0 release); its ``fastgen/datasets/wds_dataloaders.py`` and ``wds_utils.py`` are
byte-identical to NVlabs/FastGen 34f30e8 and 4d0268a. The values below were copied from that
source and checked by running FastGen's own ``WDSLoader`` (its ``_load_file`` and a deterministic
``train=False`` pass) on the same folders, outside this repository: FastGen is not a dependency,
so when it is importable the tests also run its function, otherwise they test the contract.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from shardsmith.loaders.presets import preset_config
from shardsmith.loaders.wds_config import PRESETS, WdsLoaderConfig, files_ref

try:  # FastGen's own loader, when it is installed (never in CI)
    from fastgen.datasets.wds_dataloaders import PRESET_CONSTANTS as FASTGEN_PRESET_CONSTANTS
    from fastgen.datasets.wds_dataloaders import WDSLoader as FastGenWDSLoader
except Exception:  # noqa: BLE001 - absent, or its own dependencies are
    FASTGEN_PRESET_CONSTANTS = FastGenWDSLoader = None

# copied from FastGen v0.1.0 (juliusberner/FastGen 123e6a2), fastgen/datasets/wds_dataloaders.py,
# PRESET_CONSTANTS, lines 91-108
FASTGEN_V010_PRESET_CONSTANTS = {
    "neg_prompt_wan": (
        "Bright tones, overexposed, static, blurred details, subtitles, style, works, paintings, images, "
        "static, overall gray, worst quality, low quality, JPEG compression residue, ugly, incomplete, "
        "extra fingers, poorly drawn hands, poorly drawn faces, deformed, disfigured, misshapen limbs, "
        "fused fingers, still picture, messy background, three legs, many people in the background, "
        "walking backwards"
    ),
    "neg_prompt_cosmos": (
        "The video captures a series of frames showing ugly scenes, static with no motion, motion blur, "
        "over-saturation, shaky footage, low resolution, grainy texture, pixelated images, poorly lit areas, "
        "underexposed and overexposed scenes, poor color balance, washed out colors, choppy sequences, "
        "jerky movements, low frame rate, artifacting, color banding, unnatural transitions, "
        "outdated special effects, fake elements, unconvincing visuals, poorly edited content, jump cuts, "
        "visual noise, and flickering. Overall, the video is of poor quality."
    ),
    "empty_string": "",
}


def test_presets_map_constants_are_byte_identical_to_fastgen_v010():
    assert set(PRESETS) == set(FASTGEN_V010_PRESET_CONSTANTS)
    for name, text in FASTGEN_V010_PRESET_CONSTANTS.items():
        assert PRESETS[name].encode("utf-8") == text.encode("utf-8"), name
    if FASTGEN_PRESET_CONSTANTS is not None:
        assert PRESETS == FASTGEN_PRESET_CONSTANTS


def _fastgen_rule(path: str, tag_path: str) -> str:
    """FastGen v0.1.0's WDSLoader._load_file, the path part (copied, S3 branch left out)."""
    if not path.startswith("s3://") and not os.path.isabs(path):
        path = os.path.join(os.path.dirname(tag_path), path)
    return path


@pytest.fixture
def two_outputs(tmp_path):
    """Two shard folders of one build, each with its own constant (never overwritten by the other)."""
    for name, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / "out" / name).mkdir(parents=True)
        np.save(tmp_path / "out" / name / "neg_prompt_emb.npy", np.full((2, 3), value, np.float32))
    return tmp_path / "out"


@pytest.mark.parametrize("trailing", ["", "/"])
@pytest.mark.parametrize("ref", ["neg_prompt_emb.npy", "a/neg_prompt_emb.npy", "ABS", "../neg_prompt_emb.npy"])
def test_files_map_paths_resolve_as_fastgen_resolves_them(two_outputs, trailing, ref):
    shards = str(two_outputs / "a") + trailing
    ref = str(two_outputs / "a" / "neg_prompt_emb.npy") if ref == "ABS" else ref
    cfg = WdsLoaderConfig(shards=shards, key_map={"real": "latent.pth"}, files_map={"neg": ref}, rank=0, world_size=1)
    # the contract, checked against FastGen v0.1.0 run locally: a relative path joins the dirname of
    # the datatag's path, the shard folder's PARENT unless it ends in "/"; an absolute one is as is
    expected = {("neg_prompt_emb.npy", ""): two_outputs / "neg_prompt_emb.npy",
                ("a/neg_prompt_emb.npy", ""): two_outputs / "a" / "neg_prompt_emb.npy",
                ("../neg_prompt_emb.npy", ""): two_outputs / ".." / "neg_prompt_emb.npy",
                ("neg_prompt_emb.npy", "/"): two_outputs / "a" / "neg_prompt_emb.npy",
                ("a/neg_prompt_emb.npy", "/"): two_outputs / "a" / "a" / "neg_prompt_emb.npy",
                ("../neg_prompt_emb.npy", "/"): two_outputs / "a" / ".." / "neg_prompt_emb.npy"}
    want = two_outputs / "a" / "neg_prompt_emb.npy" if os.path.isabs(ref) else expected[(ref, trailing)]
    assert cfg.constant_path(ref) == want
    assert str(cfg.constant_path(ref)) == _fastgen_rule(ref, shards)
    if FastGenWDSLoader is not None:  # FastGen's own function: it loads exactly what we open
        got = FastGenWDSLoader._load_file(ref, ["WDS:" + shards])
        assert (got is not None) == want.is_file()
    # the loader opens that file, or fails on the path FastGen would have found nothing at
    if want.is_file():
        assert torch.equal(_constants(cfg)["neg"], torch.full((2, 3), 1.0))
    else:
        with pytest.raises(FileNotFoundError, match="resolve as FastGen resolves them"):
            _constants(cfg)


def _constants(cfg):
    from shardsmith.loaders.wds import _resolve_files

    return _resolve_files(cfg)


def test_a_config_copied_from_a_trailing_slash_keeps_its_folder(two_outputs):
    cfg = WdsLoaderConfig(shards=str(two_outputs / "b") + "/", key_map={"real": "latent.pth"},
                          files_map={"neg": "neg_prompt_emb.npy"}, rank=0, world_size=1)
    again = WdsLoaderConfig(**cfg.model_dump(mode="json"))  # as verify sends it to its ranks
    assert again.constant_path("neg_prompt_emb.npy") == two_outputs / "b" / "neg_prompt_emb.npy"
    assert torch.equal(_constants(again)["neg"], torch.full((2, 3), 2.0))


def test_the_latent_presets_name_the_constant_in_the_shard_folder_for_fastgen_and_us(two_outputs):
    for preset in ("image_latent", "video_latent"):
        for folder, value in (("a", 1.0), ("b", 2.0)):  # each output reads its own constant
            cfg = preset_config(preset, two_outputs / folder)
            assert cfg.files_map == {"neg_condition": f"{folder}/neg_prompt_emb.npy"}
            assert _fastgen_rule(cfg.files_map["neg_condition"], str(two_outputs / folder)) == \
                str(two_outputs / folder / "neg_prompt_emb.npy")
            assert torch.equal(_constants(cfg)["neg_condition"], torch.full((2, 3), value))
        slash = preset_config(preset, str(two_outputs / "a") + "/")
        assert slash.files_map == {"neg_condition": "neg_prompt_emb.npy"}
        assert torch.equal(_constants(slash)["neg_condition"], torch.full((2, 3), 1.0))
    assert files_ref("train", "x.npy") == os.path.join("train", "x.npy") and files_ref("train/", "x.npy") == "x.npy"


def test_fastgen_partial_drops_per_rank_worker():
    from shardsmith.verify.accounting import fastgen_partial

    # FastGen v0.1.0 run locally (deterministic, train=False, partial=False) on 7 and 16 samples:
    # 6 of 7 at batch 2 x 2 ranks x 2 workers, 15 of 16 at batch 3 on one rank-worker, 12 of 16 at
    # batch 3 x 2 x 2
    r = fastgen_partial(7, 2, 2, 2)
    assert (r["trained"], r["dropped"]) == (6, 1)
    assert [(x["rank"], x["worker"], x["samples"], x["dropped"]) for x in r["per_rank_worker"]] == \
        [(0, 0, 2, 0), (0, 1, 2, 0), (1, 0, 2, 0), (1, 1, 1, 1)]
    assert "1 samples per pass are never trained on at batch 2" in r["line"]
    assert fastgen_partial(16, 1, 1, 3)["trained"] == 15 and fastgen_partial(16, 1, 0, 3)["trained"] == 15
    assert fastgen_partial(16, 2, 2, 3)["trained"] == 12
    assert fastgen_partial(16, 2, 2, 4) == {**fastgen_partial(16, 2, 2, 4), "dropped": 0, "line": ""}


@pytest.fixture(scope="module")
def photo_sets(tmp_path_factory):
    from media_factory import real_photos
    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict

    root = tmp_path_factory.mktemp("partial")
    out = {}
    for n in (7, 16):
        paths = real_photos(root / f"src{n}", n, seed=n, min_side=40, max_side=70)
        for p in paths:
            p.with_suffix(".txt").write_text(f"photo {p.stem}")
        build(recipe_from_dict({"sources": [{"path": str(root / f"src{n}")}],
                                "outputs": [{"format": "wds", "samples_per_shard": 3}]}), root / f"out{n}", quiet=True)
        out[n] = root / f"out{n}" / "wds"
    return out


@pytest.mark.slow
@pytest.mark.parametrize("n, world, workers, batch, trained", [(7, 2, 2, 2, 6), (16, 1, 1, 3, 15)])
def test_verify_reports_what_fastgen_drops_at_the_batch_size(photo_sets, n, world, workers, batch, trained):
    from shardsmith.verify.runner import format_verify, verify

    rep = verify(photo_sets[n], world=world, workers=workers, batch_size=batch)
    checks = {c["name"]: c for c in rep["checks"]}
    assert rep["coverage"]["unique"] == n  # this loader, partial batches kept, saw every sample
    fp = rep["fastgen_partial"]
    assert fp["trained"] == trained and fp["dropped"] == n - trained
    assert sum(x["dropped"] for x in fp["per_rank_worker"]) == n - trained
    line = f"{n - trained} samples per pass are never trained on at batch {batch}"
    assert line in checks["coverage"]["detail"] and line in format_verify(rep)
