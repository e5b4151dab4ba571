"""Loader presets of the recipe's modes (issue 18): one key_map table (``loaders.mode_presets``), a preset per
mode that ``verify`` picks by itself from the build's manifest, a ``members`` check that names a sample whose
partner member is lost, ``register`` printing the mode's key_map (FastGen v0.1.0 has no config for most
modes: a comment says so) and, for a ``.precomputed/`` tree, the LTX trainer's section of the stamp's mode."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image, ImageOps

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.formats import precomputed as layout
from shardsmith.formats.wds import (AUDIO_LATENT, AUDIO_MASK, CAMERA, FIRST_FRAME_LATENT, LATENT, MASK, NEG_PROMPT_FILE,
                                    PARTNER_LATENTS, REF_AUDIO_LATENT, REF_LATENT, SRC_JPG, SRC_LATENT, TEXT_EMB)
from shardsmith.loaders.ltx import ltx_mode_section
from shardsmith.loaders.mode_presets import (MODE_KEY_MAPS, RAW_MODE_KEY_MAPS, build_facts, mode_key_map,
                                             mode_preset_for, preset_name)
from shardsmith.loaders.presets import PRESETS, preset_config
from shardsmith.recipe import MODE_ROLES, recipe_from_dict
from shardsmith.verify.runner import verify
from video_factory import pan_video

PY = sys.executable
FPS = 24
BUCKET = "64x64x17"
TEXT = {"family": "minilm"}  # real weights offline: [77, 384] embeddings


def _cli(*args, env=None, cwd=None):
    import os

    return subprocess.run([PY, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})})


def _checks(rep):
    return {c["name"]: c for c in rep["checks"]}


def _drop_member(shard: Path, member: str) -> None:
    """Rewrite ``shard`` without ``member``, every other member kept in order with its bytes."""
    with tarfile.open(shard) as tf:
        kept = [(m, tf.extractfile(m).read()) for m in tf.getmembers() if m.name != member]
        assert len(kept) < len(tf.getmembers()), f"{member} not in {shard}"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as out:
        for m, data in kept:
            out.addfile(m, io.BytesIO(data))


def _shard_of(folder: Path, member: str) -> Path:
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tf:
            if member in tf.getnames():
                return shard
    raise AssertionError(f"no shard of {folder} holds {member}")


# ------------------------------------------------------------------ the table (fast)


def test_the_key_map_table_covers_every_mode_and_names_each_partner_member():
    assert set(MODE_KEY_MAPS) == set(MODE_ROLES)  # one key_map per recipe mode
    assert MODE_KEY_MAPS["v2v-ic"] == {"real": LATENT, "condition": TEXT_EMB, "reference": REF_LATENT}
    assert MODE_KEY_MAPS["image-edit"] == {"real": LATENT, "condition": TEXT_EMB, "source": SRC_LATENT}
    assert MODE_KEY_MAPS["i2v"] == {"real": LATENT, "condition": TEXT_EMB, "first_frame": FIRST_FRAME_LATENT}
    assert MODE_KEY_MAPS["video-inpaint"] == {"real": LATENT, "condition": TEXT_EMB, "mask": MASK}
    assert MODE_KEY_MAPS["camera-video"] == {"real": LATENT, "condition": TEXT_EMB, "camera": CAMERA}
    assert MODE_KEY_MAPS["av2av-ic"] == {"real": LATENT, "condition": TEXT_EMB, "reference": REF_LATENT,
                                         "audio": AUDIO_LATENT, "reference_audio": REF_AUDIO_LATENT}
    assert MODE_KEY_MAPS["a2a-ic"] == {"real": AUDIO_LATENT, "condition": TEXT_EMB, "reference": REF_AUDIO_LATENT}
    assert MODE_KEY_MAPS["t2a"] == {"real": AUDIO_LATENT, "condition": TEXT_EMB}  # audio-only: real is the audio
    assert MODE_KEY_MAPS["audio-inpaint"] == {"real": AUDIO_LATENT, "condition": TEXT_EMB, "mask": AUDIO_MASK}
    assert RAW_MODE_KEY_MAPS["image-edit"] == {"real": "jpg", "source": SRC_JPG, "condition": "txt"}
    # what the build writes, in one place: every partner latent and condition array a mode's samples carry
    from shardsmith.transform.partners import MODE_CONDITIONS, MODE_PARTNERS

    for mode, names in MODE_PARTNERS.items():
        assert {PARTNER_LATENTS[n] for n in names} <= set(MODE_KEY_MAPS[mode].values()), mode
    for mode, names in MODE_CONDITIONS.items():
        assert {{"mask": MASK, "camera": CAMERA, "audio_mask": AUDIO_MASK}[n] for n in names} <= set(MODE_KEY_MAPS[mode].values()), mode
    # without a text encoder no condition; audio beside the video when every sample has it
    assert mode_key_map("v2v-ic", text=False) == {"real": LATENT, "reference": REF_LATENT}
    assert mode_key_map("camera-video", audio=True) == {**MODE_KEY_MAPS["camera-video"], "audio": AUDIO_LATENT}
    assert mode_key_map("t2a", audio=True) == mode_key_map("t2a", audio=False) == MODE_KEY_MAPS["t2a"]
    assert mode_key_map("av2av-ic", audio=False) == {"real": LATENT, "condition": TEXT_EMB, "reference": REF_LATENT}
    assert mode_key_map("image-edit", "wds", image_ext="png") == {"real": "png", "source": "src.png",
                                                                  "condition": "txt"}
    # a preset per mode, that verify --preset and register take
    assert preset_name("v2v-ic") == "latent_v2v_ic" and preset_name("image-edit", "wds") == "image_edit"
    assert preset_name("t2i", "wds") == "image" and preset_name("v2v-ic", "wds") is None
    for mode in MODE_KEY_MAPS:
        p = PRESETS[preset_name(mode)]
        assert p.kind == "wds" and p.mode == mode and p.defaults["key_map"] == MODE_KEY_MAPS[mode]
        assert p.fastgen == ("ImageLatentLoaderConfig" if mode in ("t2i", "image-edit") else "VideoLatentLoaderConfig")
    assert PRESETS["latent_t2v"].gap is None and "depth_latent" in PRESETS["latent_v2v_ic"].gap


def _fake_build(root: Path, recipe: dict, dirs: dict[str, str]) -> None:
    """A finished build's manifest naming output folders (``{output name: dir}``) with ``recipe``."""
    outputs = {name: {"format": next(o["format"] for o in recipe["outputs"] if o["name"] == name),
                      "files": {"train": {"dir": d, "shards": []}}, "splits": {"train": {"written": 0}}}
               for name, d in dirs.items()}
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps({"recipe": recipe, "outputs": outputs}))
    for d in dirs.values():
        (root / d).mkdir(parents=True, exist_ok=True)


def test_the_build_manifest_says_mode_text_and_audio(tmp_path):
    rec = {"mode": "camera-video", "models": {"vae": {"family": "ltx2"}, "text": None,
                                              "audio_vae": {"family": "ltx2_audio"}},
           "audio": {"required": None, "skip": False},
           "outputs": [{"format": "latent_wds", "name": "latent_wds", "dir": "lat"},
                       {"format": "wds", "name": "wds", "dir": "raw", "image": {"format": "png"}}]}
    _fake_build(tmp_path / "b", rec, {"latent_wds": "lat", "wds": "raw"})
    facts = build_facts(tmp_path / "b" / "lat")
    assert (facts.mode, facts.format, facts.text, facts.audio) == ("camera-video", "latent_wds", False, True)
    assert mode_preset_for(tmp_path / "b" / "lat")[0] == "latent_camera_video"
    assert preset_config("latent_camera_video", tmp_path / "b" / "lat").key_map == {
        "real": LATENT, "camera": CAMERA, "audio": AUDIO_LATENT}
    assert preset_config("latent_camera_video", tmp_path / "b" / "lat").files_map == {}
    assert mode_preset_for(tmp_path / "b" / "raw") is None  # no raw camera-video preset: verify infers, as before
    # audio not required: samples may lack it, so the key_map does not ask for it; with text, condition
    rec["audio"]["required"] = False
    rec["models"]["text"] = TEXT
    _fake_build(tmp_path / "c", rec, {"latent_wds": "lat", "wds": "raw"})
    assert preset_config("latent_camera_video", tmp_path / "c" / "lat").key_map == MODE_KEY_MAPS["camera-video"]
    cfg = preset_config("latent_camera_video", tmp_path / "c" / "lat")
    assert cfg.files_map == {"neg_condition": f"lat/{NEG_PROMPT_FILE}"}
    rec["mode"] = "image-edit"
    _fake_build(tmp_path / "d", rec, {"latent_wds": "lat", "wds": "raw"})
    assert mode_preset_for(tmp_path / "d" / "raw")[0] == "image_edit"
    assert preset_config("image_edit", tmp_path / "d" / "raw").key_map == {"real": "png", "source": "src.png",
                                                                          "condition": "txt"}
    rec["mode"] = None
    _fake_build(tmp_path / "e", rec, {"latent_wds": "lat", "wds": "raw"})
    assert mode_preset_for(tmp_path / "e" / "lat") is None  # no mode: nothing picked


def test_the_ltx_section_of_a_stamped_mode(tmp_path):
    root = tmp_path / ".precomputed"
    for d in (layout.LATENTS, layout.CONDITIONS, layout.REFERENCE_LATENTS, layout.CAMERAS):
        (root / d).mkdir(parents=True)
    present = layout.present_dirs(root)
    snip = yaml.safe_load(ltx_mode_section(root, present, "v2v-ic", "from shardsmith.json", False))
    assert snip["training_strategy"] == {
        "name": "flexible",
        "video": {"is_generated": True, "latents_dir": "latents",
                  "conditions": [{"type": "reference", "latents_dir": "reference_latents"},
                                 {"type": "first_frame", "probability": 0.2}]}}
    text = ltx_mode_section(root, present, "video", "from shardsmith.json", True)
    assert "# not read in mode video: reference_latents/, cameras/" in text
    assert yaml.safe_load(text)["optimization"] == {"batch_size": 1}
    with pytest.raises(ValueError, match="video_masks/ is missing: the LTX trainer refuses to start"):
        ltx_mode_section(root, present, "video-inpaint", "from shardsmith.json", False)
    (root / layout.VIDEO_MASKS).mkdir()
    snip = yaml.safe_load(ltx_mode_section(root, layout.present_dirs(root), "video-inpaint", "x", False))
    assert snip["training_strategy"]["video"]["conditions"] == [{"type": "mask", "mask_dir": "video_masks"}]
    for d in (layout.AUDIO_LATENTS, layout.REFERENCE_AUDIO_LATENTS):
        (root / d).mkdir()
    text = ltx_mode_section(root, layout.present_dirs(root), "av2av-ic", "x", False)
    snip = yaml.safe_load(text)["training_strategy"]
    assert snip["audio"] == {"is_generated": True, "latents_dir": "audio_latents",
                             "conditions": [{"type": "reference", "latents_dir": "reference_audio_latents"}]}
    assert "reference_audio_latents -> reference_audio_latents" in text


# ------------------------------------------------------------------ whole builds (slow)


def _ic_build(tmp_path: Path) -> Path:
    """v2v-ic: 4 clips with a reference each (half the resolution), 2 samples a shard; latent_wds and precomputed."""
    src = tmp_path / "src"
    src.mkdir()
    rows = ["clip,ref,caption"]
    for i, photo in enumerate(("astronaut", "coffee", "rocket", "chelsea")):
        pan_video(src / f"c{i}.mp4", frames=20, fps=FPS, size=(128, 128), photo=photo)
        pan_video(src / f"r{i}.mp4", frames=20, fps=FPS, size=(64, 64), photo=photo)
        rows.append(f"c{i}.mp4,r{i}.mp4,clip {i} in the style of its reference")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")
    rec = {"sources": [{"path": str(src / "rows.csv"),
                        "columns": {"media": "clip", "reference": "ref", "caption": "caption"}}],
           "mode": "v2v-ic", "geometry": {"buckets": [BUCKET]},
           "models": {"vae": {"family": "ltx2"}, "text": TEXT, "batch_size": 4},
           "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}, {"format": "precomputed"}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["outputs"]["latent_wds"]["counts"]["written"] == 4
    return tmp_path / "out"


@pytest.mark.slow
def test_v2v_ic_verify_picks_the_mode_preset_and_names_a_lost_reference(tmp_path):
    out = _ic_build(tmp_path)
    lat = out / "lat"
    rep = verify(lat, world=2, workers=2)
    c = _checks(rep)
    assert rep["ok"], rep["checks"]
    assert rep["preset"] == "latent_v2v_ic" and "mode v2v-ic of the build" in rep["preset_from"]
    assert str(out / "manifest.json") in rep["preset_from"]
    assert rep["key_map"] == {"real": LATENT, "condition": TEXT_EMB, "reference": REF_LATENT}
    keys = rep["contract"]["keys"]
    assert keys["real"]["shape"] == keys["reference"]["shape"] == [128, 3, 2, 2]
    assert keys["condition"]["shape"] == [77, 384] and keys["neg_condition"]["shape"] == [77, 384]
    assert rep["contract"]["samples"] == 4 and rep["coverage"]["unique"] == 4
    assert c["members"]["ok"] and "each of the 4 sample(s) has every member of the mode v2v-ic's key_map" in \
        c["members"]["detail"]
    # an explicit preset or key_map still wins
    assert verify(lat, world=1, workers=1, preset="video_latent")["key_map"] == {"real": LATENT,
                                                                              "condition": TEXT_EMB}

    # a shard rewritten without one ref_latent.pth: verify fails, naming the sample and the member
    shard = _shard_of(lat, f"c2.{REF_LATENT}")
    _drop_member(shard, f"c2.{REF_LATENT}")
    rep = verify(lat, world=2, workers=2)
    c = _checks(rep)
    assert not rep["ok"] and not c["members"]["ok"]
    assert "1 of 4 sample(s) lack a member of the mode v2v-ic's key_map" in c["members"]["detail"]
    assert f"{shard.name}/c2 has no {REF_LATENT} (reference)" in c["members"]["detail"]
    assert not c["no_drops"]["ok"] and f"missing:{REF_LATENT}, e.g. {shard.name}/c2" in c["no_drops"]["detail"]
    assert not c["coverage"]["ok"] and f"{shard.name}/c2" in c["coverage"]["detail"]
    r = _cli("verify", lat, "--world", "2", "--workers", "2", "--quiet")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "preset: latent_v2v_ic (mode v2v-ic of the build" in r.stdout
    assert "[FAIL] members: 1 of 4 sample(s)" in r.stdout and f"{shard.name}/c2 has no {REF_LATENT}" in r.stdout


@pytest.mark.slow
def test_v2v_ic_register_prints_the_mode_key_map_and_the_ltx_mode_section(tmp_path):
    out = _ic_build(tmp_path)
    cfg = tmp_path / "data.yaml"
    env = {"DATA_ROOT_DIR": str(out)}
    r = _cli("register", out / "lat", "--name", "ic", "--config", cfg, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "registered 'ic'" in r.stdout and "preset latent_v2v_ic" in r.stdout
    snippet = r.stdout.split("# FastGen (configs/data.py) override to paste:\n", 1)[1]
    assert "from fastgen.configs.data import VideoLatentLoaderConfig" in snippet
    assert "# FastGen v0.1.0 has no config for mode v2v-ic: its V2V reads depth_latent.pth" in snippet
    assert ("IC_Loader_Config.key_map = {'real': 'latent.pth', 'condition': 'txt_emb.pth', "
            "'reference': 'ref_latent.pth'}") in snippet
    assert 'IC_Loader_Config.files_map = {"neg_condition": os.path.join(os.environ["DATA_ROOT_DIR"], ' \
           "'lat', 'neg_prompt_emb.npy')}" in snippet
    assert yaml.safe_load(cfg.read_text())["ic"] == {"preset": "latent_v2v_ic", "path": "${DATA_ROOT_DIR}/lat"}
    import os

    from shardsmith.loaders import from_config

    os.environ["DATA_ROOT_DIR"] = str(out)
    try:
        batch = next(iter(from_config("ic", cfg, batch_size=2, deterministic=True, num_workers=0)))
    finally:
        del os.environ["DATA_ROOT_DIR"]
    assert tuple(batch["reference"].shape) == tuple(batch["real"].shape) == (2, 128, 3, 2, 2)

    # the .precomputed/ tree: the LTX trainer's section of the stamp's mode
    pre = out / ".precomputed"
    assert json.loads((pre / layout.PRECOMPUTED_STAMP).read_text())["mode"] == "v2v-ic"
    r = _cli("register", pre, "--name", "ltx", "--config", cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    text = r.stdout.split("\n# Python:", 1)[1].split("\n", 1)[1]
    assert "for mode v2v-ic (from shardsmith.json)" in text
    snip = yaml.safe_load(text)
    assert snip["training_strategy"]["video"]["conditions"] == [
        {"type": "reference", "latents_dir": "reference_latents"}, {"type": "first_frame", "probability": 0.2}]
    assert "reference_latents -> reference_latents" in text
    assert yaml.safe_load(cfg.read_text())["ltx"]["dirs"] == ["latents", "conditions", "reference_latents"]


def _clips(src: Path, n: int = 4) -> None:
    for i, photo in enumerate(("astronaut", "coffee", "rocket", "chelsea")[:n]):
        pan_video(src / f"c{i}.mp4", frames=20, fps=FPS, size=(96, 64), photo=photo)


@pytest.mark.slow
def test_i2v_first_frames_verify_and_a_lost_first_frame(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _clips(src)
    for i in range(4):
        (src / f"c{i}.txt").write_text(f"clip {i}")
    rec = {"sources": [{"path": str(src)}], "mode": "i2v", "geometry": {"buckets": [BUCKET]},
           "models": {"vae": {"family": "ltx2"}, "text": TEXT, "batch_size": 4},
           "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}]}
    build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    lat = tmp_path / "out" / "lat"
    rep = verify(lat, world=2, workers=2)
    assert rep["ok"], rep["checks"]
    assert rep["preset"] == "latent_i2v"
    assert rep["key_map"] == {"real": LATENT, "condition": TEXT_EMB, "first_frame": FIRST_FRAME_LATENT}
    keys = rep["contract"]["keys"]
    assert keys["real"]["shape"] == [128, 3, 2, 2] and keys["first_frame"]["shape"] == [128, 1, 2, 2]
    shard = _shard_of(lat, f"c1.{FIRST_FRAME_LATENT}")
    _drop_member(shard, f"c1.{FIRST_FRAME_LATENT}")
    c = _checks(verify(lat, world=2, workers=2))
    assert not c["members"]["ok"] and f"{shard.name}/c1 has no {FIRST_FRAME_LATENT} (first_frame)" in \
        c["members"]["detail"]


@pytest.mark.slow
def test_video_inpaint_and_camera_members_reach_the_batch(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _clips(src)
    rows = ["clip,mask,cam,caption"]
    for i in range(4):
        m = np.zeros((32, 48), np.uint8)  # half the clip's resolution, same aspect ratio
        m[4 + 4 * i: 12 + 4 * i, 10:30] = 255
        Image.fromarray(m).save(src / f"m{i}.png")
        frames = []
        for k in range(20):  # the camera slides along x
            ext = np.eye(4)
            ext[0, 3] = 0.1 * k
            frames.append({"extrinsic": ext.tolist()})
        (src / f"cam{i}.json").write_text(json.dumps({"width": 96, "height": 64, "intrinsic": [80.0, 80.0, 48.0, 32.0],
                                                      "frames": frames}))
        rows.append(f"c{i}.mp4,m{i}.png,cam{i}.json,clip {i}")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")
    out = {}
    for mode, col in (("video-inpaint", "mask"), ("camera-video", "cam")):
        role = "mask" if col == "mask" else "camera"
        rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "clip", role: col,
                                                                      "caption": "caption"}}],
               "mode": mode, "geometry": {"buckets": [BUCKET]},
               "models": {"vae": {"family": "ltx2"}, "text": TEXT, "batch_size": 4},
               "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}]}
        build(recipe_from_dict(rec), tmp_path / mode, quiet=True)
        out[mode] = tmp_path / mode / "lat"
    rep = verify(out["video-inpaint"], world=2, workers=2)
    assert rep["ok"], rep["checks"]
    assert rep["preset"] == "latent_video_inpaint" and rep["key_map"]["mask"] == MASK
    assert rep["contract"]["keys"]["mask"]["shape"] == [3, 2, 2]  # the latent grid [F', H', W']
    assert rep["contract"]["keys"]["mask"]["max"] == 1.0
    rep = verify(out["camera-video"], world=2, workers=2)
    assert rep["ok"], rep["checks"]
    assert rep["preset"] == "latent_camera_video" and rep["contract"]["keys"]["camera"]["shape"] == [17, 20]
    r = _cli("register", out["camera-video"], "--name", "cam", "--config", tmp_path / "d.yaml",
             env={"DATA_ROOT_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "# FastGen v0.1.0 has no config for mode camera-video: v0.2.0's CameraVideoLoaderConfig" in r.stdout
    assert "CAM_Loader_Config.key_map = {'real': 'latent.pth', 'condition': 'txt_emb.pth', 'camera': 'camera.npy'}" \
        in r.stdout
    shard = _shard_of(out["video-inpaint"], f"c3.{MASK}")
    _drop_member(shard, f"c3.{MASK}")
    c = _checks(verify(out["video-inpaint"], world=2, workers=2))
    assert not c["members"]["ok"] and f"{shard.name}/c3 has no {MASK} (mask)" in c["members"]["detail"]


def edit_pairs_recipe(tmp_path: Path, n: int, seed: int, min_side: int, max_side: int, models: dict) -> dict:
    """An image-edit recipe over ``n`` real photos (``before/``) and their inverted copies (``after/``):
    raw ``wds`` pairs at 64 px and ``latent_wds`` latents, two samples a shard."""
    photos = real_photos(tmp_path / "src" / "before", n, seed=seed, min_side=min_side, max_side=max_side)
    (tmp_path / "src" / "after").mkdir()
    rows = ["target,before,instruction"]
    for i, p in enumerate(photos):
        ImageOps.invert(Image.open(p).convert("RGB")).save(tmp_path / "src" / "after" / p.name, quality=90)
        rows.append(f"after/{p.name},before/{p.name},invert photo {i}")
    (tmp_path / "src" / "edits.csv").write_text("\n".join(rows) + "\n")
    return {"sources": [{"path": str(tmp_path / "src" / "edits.csv"),
                         "columns": {"media": "target", "source": "before", "caption": "instruction"}}],
            "mode": "image-edit", "split": {"dedup": False}, "geometry": {"buckets": ["64x64x1"]},
            "models": models,
            "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 2,
                         "image": {"size": 64, "resize_mode": "center_crop"}},
                        {"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}]}


@pytest.mark.slow
def test_image_edit_raw_pairs_and_latents(tmp_path):
    rec = edit_pairs_recipe(tmp_path, 4, 5, 96, 160, {"vae": {"family": "sd"}, "text": TEXT})
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["outputs"]["wds"]["counts"]["written"] == 4 and m["outputs"]["latent_wds"]["counts"]["written"] == 4
    raw, lat = tmp_path / "out" / "wds", tmp_path / "out" / "lat"
    rep = verify(raw, world=2, workers=2, image_size=64)
    assert rep["ok"], rep["checks"]
    assert rep["preset"] == "image_edit" and rep["key_map"] == {"real": "jpg", "source": SRC_JPG, "condition": "txt"}
    keys = rep["contract"]["keys"]
    assert keys["real"]["shape"] == keys["source"]["shape"] == [3, 64, 64]
    assert keys["condition"]["type"] == "str" and keys["condition"]["empty"] == 0
    rep = verify(lat, world=2, workers=2)
    assert rep["ok"], rep["checks"]
    assert rep["preset"] == "latent_image_edit"
    assert rep["contract"]["keys"]["real"]["shape"] == rep["contract"]["keys"]["source"]["shape"] == [4, 8, 8]
    r = _cli("register", raw, "--name", "edits", "--config", tmp_path / "d.yaml", env={"DATA_ROOT_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "from fastgen.configs.data import ImageLoaderConfig" in r.stdout
    assert "# FastGen v0.1.0 has no config for mode image-edit" in r.stdout
    assert "EDITS_Loader_Config.key_map = {'real': 'jpg', 'source': 'src.jpg', 'condition': 'txt'}" in r.stdout
    shard = sorted(raw.glob("*.tar"))[1]
    with tarfile.open(shard) as tf:
        victim = next(n for n in tf.getnames() if n.endswith("." + SRC_JPG))
    _drop_member(shard, victim)
    rep = verify(raw, world=2, workers=2, image_size=64)
    c = _checks(rep)
    assert not rep["ok"] and f"{shard.name}/{victim.split('.', 1)[0]} has no {SRC_JPG} (source)" in \
        c["members"]["detail"]


@pytest.mark.slow
def test_a_multi_bucket_mode_set_verifies_each_bucket_with_the_mode_preset(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i, photo in enumerate(("astronaut", "coffee", "rocket", "chelsea")):
        pan_video(src / f"c{i}.mp4", frames=20, fps=FPS, size=(96, 64) if i % 2 else (64, 96), photo=photo)
        (src / f"c{i}.txt").write_text(f"clip {i}")
    rec = {"sources": [{"path": str(src)}], "mode": "i2v", "geometry": {"buckets": ["64x32x17", "32x64x17"]},
           "models": {"vae": {"family": "ltx2"}, "text": TEXT},
           "outputs": [{"format": "latent_wds", "dir": "lat"}]}
    build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    lat = tmp_path / "out" / "lat"
    rep = verify(lat, world=1, workers=2)
    assert rep["ok"], {b: r["checks"] for b, r in rep["buckets"].items()}
    assert rep["kind"] == "wds_buckets" and rep["preset"] == "latent_i2v"
    shapes = {b: r["contract"]["keys"]["first_frame"]["shape"] for b, r in rep["buckets"].items()}
    assert shapes == {"64x32x17": [128, 1, 1, 2], "32x64x17": [128, 1, 2, 1]}
    # the negative prompt beside the buckets reaches each bucket's batches
    assert all(r["contract"]["keys"]["neg_condition"]["shape"] == [77, 384] for r in rep["buckets"].values())
    shard = _shard_of(lat / "32x64x17", f"c0.{FIRST_FRAME_LATENT}")
    _drop_member(shard, f"c0.{FIRST_FRAME_LATENT}")
    rep = verify(lat, world=1, workers=2)
    c = _checks(rep["buckets"]["32x64x17"])
    assert not rep["ok"] and f"{shard.name}/c0 has no {FIRST_FRAME_LATENT} (first_frame)" in c["members"]["detail"]
    assert _checks(rep)["bucket 32x64x17"]["detail"].endswith("failed members, integrity, coverage, no_drops")


@pytest.mark.slow
def test_av2av_ic_audio_and_reference_audio_in_the_key_map(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rows = ["clip,ref,caption"]
    for i, photo in enumerate(("astronaut", "coffee", "rocket", "chelsea")):
        pan_video(src / f"c{i}.mp4", frames=20, fps=FPS, size=(128, 128), photo=photo, audio="speech")
        pan_video(src / f"r{i}.mp4", frames=20, fps=FPS, size=(64, 64), photo=photo, audio="tone")
        rows.append(f"c{i}.mp4,r{i}.mp4,clip {i}")
    (src / "rows.csv").write_text("\n".join(rows) + "\n")
    rec = {"sources": [{"path": str(src / "rows.csv"), "columns": {"media": "clip", "reference": "ref",
                                                                  "caption": "caption"}}],
           "mode": "av2av-ic", "geometry": {"buckets": [BUCKET]},
           "models": {"vae": {"family": "ltx2"}, "text": TEXT, "audio_vae": {"family": "ltx2_audio"},
                      "batch_size": 4},
           "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 2}]}
    m = build(recipe_from_dict(rec), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 4
    lat = tmp_path / "out" / "lat"
    rep = verify(lat, world=2, workers=2)
    assert rep["ok"], rep["checks"]
    assert rep["preset"] == "latent_av2av_ic"
    assert rep["key_map"] == {"real": LATENT, "condition": TEXT_EMB, "reference": REF_LATENT, "audio": AUDIO_LATENT,
                              "reference_audio": REF_AUDIO_LATENT}
    keys = rep["contract"]["keys"]
    assert keys["reference"]["shape"] == keys["real"]["shape"] == [128, 3, 2, 2]
    # the tiny audio VAE's [C, T, 16]: T = 25 steps a second over the 17 frames both clips were cut to
    assert keys["audio"]["shape"] == keys["reference_audio"]["shape"] == [2, 18, 16]
    shard = _shard_of(lat, f"c0.{REF_AUDIO_LATENT}")
    _drop_member(shard, f"c0.{REF_AUDIO_LATENT}")
    c = _checks(verify(lat, world=2, workers=2))
    assert not c["members"]["ok"] and f"{shard.name}/c0 has no {REF_AUDIO_LATENT} (reference_audio)" in \
        c["members"]["detail"]
