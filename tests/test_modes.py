"""``mode`` (issue 18): what a dataset is for decides the roles every item needs and the media it takes,
is refused before any plan when a source cannot give a role, and is recorded in the ``.precomputed/``
stamp that ``verify`` reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.plan.ledger import Ledger
from shardsmith import formats
from shardsmith.recipe import MODE_ROLES, MODE_TARGETS, RecipeError, recipe_from_dict


def cli(*args):
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_every_mode_has_its_roles_and_targets():
    assert set(MODE_ROLES) == set(MODE_TARGETS) == {
        "t2i", "t2v", "i2v", "v2v-ic", "a2v", "v2a", "t2a", "video-inpaint", "audio-inpaint", "av2av-ic", "a2a-ic",
        "image-edit", "camera-video"}
    assert MODE_ROLES["v2v-ic"] == ("reference",) and MODE_ROLES["image-edit"] == ("source",)
    assert MODE_ROLES["video-inpaint"] == ("mask",) and MODE_ROLES["camera-video"] == ("camera",)


@pytest.mark.parametrize("mode, role", [("v2v-ic", "reference"), ("image-edit", "source"),
                                        ("video-inpaint", "mask"), ("camera-video", "camera")])
def test_a_mode_whose_role_no_column_gives_is_refused(tmp_path, mode, role):
    with pytest.raises(RecipeError, match=f"mode {mode} needs a {role} for every item.*columns.{role}"):
        recipe_from_dict({"sources": [{"path": str(tmp_path)}], "mode": mode, "outputs": [{"format": "wds"}]})


def test_an_audio_mode_without_an_audio_encoder_is_refused_by_the_cli(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"sources": [{"path": "src"}], "mode": "a2v",
                                                      "outputs": [{"format": "wds"}]}))
    r = cli("build", tmp_path / "r.yaml", "--out", tmp_path / "out")
    assert r.returncode == 2 and "mode a2v encodes audio, but models.audio_vae is not set" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_t2i_skips_clips_and_captions_at_plan_time(tmp_path):
    import sys as _sys

    _sys.path.insert(0, os.path.dirname(__file__))
    from video_factory import pan_video

    real_photos(tmp_path / "src", 3, seed=4, min_side=64, max_side=96)
    pan_video(tmp_path / "src" / "clip.mp4", frames=9, size=(64, 64))
    m = build(recipe_from_dict({"sources": [{"path": str(tmp_path / "src")}], "mode": "t2i",
                                "outputs": [{"format": "wds"}]}), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 3 and m["counts"]["skipped"] == {"unsupported_kind_video": 1}
    led = Ledger(tmp_path / "out" / formats.LEDGER_FILE)
    [clip] = [it for it in led.items() if it.kind == "video"]
    assert "mode t2i takes image targets" in clip.detail and clip.sha256 is None  # never opened


def test_an_edit_row_without_its_source_fails_missing_source(tmp_path):
    src = tmp_path / "src"
    real_photos(src, 2, seed=5, min_side=64, max_side=96)
    a, b = sorted(p.name for p in src.glob("*.jpg"))
    (src / "rows.csv").write_text(f"target,before,instruction\n{a},{a},make it brighter\n{b},,make it darker\n"
                                  f"{b},{a},a source of another shape\n")
    m = build(recipe_from_dict({"sources": [{"path": str(src / "rows.csv"),
                                             "columns": {"media": "target", "source": "before",
                                                         "caption": "instruction"}}],
                                "mode": "image-edit", "split": {"dedup": False},
                                "outputs": [{"format": "wds"}]}), tmp_path / "out", quiet=True)
    assert m["counts"]["written"] == 1
    assert m["counts"]["failed"] == {"missing_source": 1, "source_geometry_mismatch": 1}


@pytest.mark.slow
def test_the_precomputed_stamp_records_the_ltx_mode_and_verify_reads_it(tmp_path):
    real_photos(tmp_path / "src", 2, seed=6, min_side=64, max_side=96)
    for i, p in enumerate(sorted((tmp_path / "src").glob("*.jpg"))):
        p.with_suffix(".txt").write_text(f"photo {i}")
    build(recipe_from_dict({"sources": [{"path": str(tmp_path / "src")}], "mode": "t2i",
                            "geometry": {"buckets": ["64x64x1"]}, "images": {"upscale": True},
                            "models": {"vae": {"family": "ltx"}, "text": {"family": "minilm"}},
                            "outputs": [{"format": "precomputed"}]}), tmp_path / "out", quiet=True)
    tree = tmp_path / "out" / ".precomputed"
    assert json.loads((tree / "shardsmith.json").read_text())["mode"] == "image"
    r = cli("verify", tree, "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["mode"] == "image" and rep["mode_from"] == "stamp"
