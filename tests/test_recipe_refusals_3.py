"""Recipes that wrote nothing, or wrote one output inside another, are one message naming the output and the fix,
exit 2: an output that takes no audio file over sources of audio files only, without ``audio.skip`` (was: exit 0
with every item skipped:unsupported_kind_audio) -- told from the sources' file names before the plan; what the
names cannot tell (a folder past the walk's bound, a WebDataset source) is refused once the plan is complete, with
the same message, nothing written and nothing that blocks the corrected re-run, also where the first output ran
ahead of the plan; and an output's dir or ZIP inside another output's folder (was: accepted)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from shardsmith.plan.ledger import Ledger
from test_cli_mistakes import assert_message, invoke
from test_recipe_refusals_2 import _wav


def _sounds(tmp: Path, n: int = 2) -> Path:
    """A folder of ``n`` small WAV files with sidecar captions."""
    for i in range(n):
        _wav(tmp / "sounds" / f"s{i}.wav", tone=440 + 110 * i).with_suffix(".txt").write_text(f"tone {i}")
    return tmp / "sounds"


def _photos(folder: Path, n: int = 2) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (64, 64), (40 * i, 90, 160)).save(folder / f"p{i}.jpg")
        (folder / f"p{i}.txt").write_text(f"photo {i}")
    return folder


def _write(tmp: Path, sources: list[dict], outputs: list[dict], name: str = "r.yaml", **more) -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump({"sources": sources, "outputs": outputs, **more}))
    return path


def _refused(tmp: Path, recipe: Path, *texts: str) -> None:
    """``shardsmith build`` of ``recipe`` exits 2 with each of ``texts``, and writes no dataset folder."""
    code, output = invoke("build", recipe, "--out", tmp / "out")
    assert_message(code, output, *texts)
    assert not (tmp / "out").exists()


def _left(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))


def _units(out: Path) -> int:
    db = sqlite3.connect(out / ".shardsmith" / "ledger.sqlite")
    try:
        return db.execute("SELECT COUNT(*) FROM shards").fetchone()[0]
    finally:
        db.close()


# ---------------------------------------------------------------- 1. audio-only sources, no output takes audio

LATENT = {"vae": {"family": "sd"}, "device": "cpu"}
BUCKETS = {"buckets": ["64x64x1"]}


@pytest.mark.parametrize("outputs, more, texts", [
    ([{"format": "wds"}], {},
     ["output 'wds' (outputs[0], wds) would write nothing", "a wds output writes images",
      "skipped:unsupported_kind_audio", "add models.audio_vae (e.g. {family: ltx2_audio}) with a precomputed or "
      "latent_wds output", "give outputs[0] image sources", "remove it from the recipe"]),
    ([{"format": "zip", "resolution": 32}], {}, ["(outputs[0], zip) would write nothing", "a zip output writes images"]),
    ([{"format": "video_wds"}], {"geometry": {"buckets": ["64x64x17"]}},
     ["(outputs[0], video_wds) would write nothing", "a video_wds output writes video clips",
      "give outputs[0] video sources"]),
    ([{"format": "latent_wds"}], {"models": LATENT, "geometry": BUCKETS},
     ["output 'latent_wds' (outputs[0], latent_wds) would write nothing", "models.audio_vae is not set",
      "add models.audio_vae (e.g. {family: ltx2_audio}) to write their audio latents into it",
      "give it image or video sources", "remove outputs[0] from the recipe"]),
    # the audio encoder writes the precomputed output; the wds output beside it gets nothing
    ([{"format": "precomputed"}, {"format": "wds"}],
     {"models": {**LATENT, "text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"}},
      "geometry": BUCKETS, "audio": {"durations": [0.25]}},
     ["output 'wds' (outputs[1], wds) would write nothing",
      "models.audio_vae writes audio latents only into precomputed and latent_wds outputs (here 'precomputed')",
      "give outputs[1] image sources, or remove it"]),
])
def test_audio_only_sources_of_an_output_without_audio_are_refused_before_the_plan(tmp_path, outputs, more, texts):
    _sounds(tmp_path)
    _refused(tmp_path, _write(tmp_path, [{"path": "sounds"}], outputs, **more),
             "every item it takes is audio-only (source 'sounds' holds only audio files)", *texts)


def test_a_table_of_audio_files_is_refused(tmp_path):
    _wav(tmp_path / "a.wav")
    (tmp_path / "rows.csv").write_text("file,caption\na.wav,a tone\n")
    _refused(tmp_path, _write(tmp_path, [{"path": "rows.csv"}], [{"format": "wds"}]),
             "output 'wds' (outputs[0], wds) would write nothing", "source 'rows' holds only audio files")


def test_only_the_output_of_the_audio_source_is_named(tmp_path):
    _sounds(tmp_path)
    _photos(tmp_path / "photos")
    recipe = _write(tmp_path, [{"path": "sounds"}, {"path": "photos"}],
                    [{"format": "wds", "dir": "all"}, {"format": "wds", "dir": "heard", "sources": ["sounds"]}])
    _refused(tmp_path, recipe, "output 'wds1' (outputs[1], wds) would write nothing", "give outputs[1] image sources")


@pytest.mark.parametrize("files, outputs, models", [
    (["a.wav"], [{"format": "precomputed"}], {"text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"}}),
    (["a.wav"], [{"format": "latent_wds"}], {"audio_vae": {"family": "ltx2_audio"}}),
    (["a.wav"], [{"format": "prompt_wds"}], {}),  # the captions are what it writes
    (["p.jpg", "a.wav"], [{"format": "wds"}], {}),  # the image is written
    (["clip.mp4", "a.wav"], [{"format": "video_wds"}], {}),
])
def test_outputs_that_write_something_of_audio_sources_pass(tmp_path, files, outputs, models):
    from shardsmith.precheck import check_audio_only
    from shardsmith.recipe import load_recipe

    (tmp_path / "src").mkdir()
    for f in files:
        (tmp_path / "src" / f).write_bytes(b"")  # (the check reads names only)
    recipe = _write(tmp_path, [{"path": "src"}], outputs, models={"device": "cpu", **models},
                    geometry={"buckets": ["64x64x17"]}, audio={"durations": [0.25]})
    check_audio_only(load_recipe(recipe))


# ---------------------------------------------------------------- 2. the same, told by the plan

@pytest.fixture
def no_walk(monkeypatch):
    """The name walk gives up at once (as past 10,000 entries): only the plan can tell."""
    import shardsmith.precheck as precheck

    monkeypatch.setattr(precheck, "FOLDER_WALK_LIMIT", 1)


def test_audio_files_past_the_walk_are_refused_once_planned_and_the_fix_then_builds(tmp_path, no_walk):
    _sounds(tmp_path)
    out = tmp_path / "out"
    code, output = invoke("build", _write(tmp_path, [{"path": "sounds"}], [{"format": "wds"}]), "--out", out)
    assert_message(code, output, "output 'wds' (outputs[0], wds) would write nothing",
                   "(the plan found only audio files in source 'sounds')", "a wds output writes images",
                   "add models.audio_vae")
    assert _left(out) == [".shardsmith", ".shardsmith/ledger.sqlite", ".shardsmith/lock"]  # the plan only
    code, output = invoke("build", _write(tmp_path, [{"path": "sounds"}], [{"format": "prompt_wds"}]), "--out", out,
                          "--no-report", "-q")
    assert code == 0, output
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 2


def test_audio_skip_past_the_walk_is_refused_once_planned(tmp_path, no_walk):
    _sounds(tmp_path)
    out = tmp_path / "out"
    recipe = _write(tmp_path, [{"path": "sounds"}], [{"format": "wds"}], audio={"skip": True})
    code, output = invoke("build", recipe, "--out", out)
    assert_message(code, output, "audio.skip is true", "every source item is audio-only (the plan found only audio "
                   "files in source 'sounds')", "nothing would be written", "remove audio.skip")
    assert not (out / "wds").exists()


def test_a_media_output_over_a_webdataset_source_is_refused_once_planned(tmp_path):
    """A WebDataset source gives captions (kind text), which the name walk does not read."""
    import io
    import tarfile

    (tmp_path / "prompts").mkdir()
    with tarfile.open(tmp_path / "prompts" / "00000.tar", "w") as t:
        for key in ("a", "b"):
            data = f"a prompt {key}".encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    recipe = _write(tmp_path, [{"path": "prompts", "kind": "wds", "name": "captions"}], [{"format": "wds"}])
    code, output = invoke("build", recipe, "--out", out)
    assert_message(code, output, "output 'wds' (outputs[0], wds) would write nothing",
                   "every item planned from source 'captions' is a caption without media, and it takes images",
                   "(captions without media are written by prompt_wds)", "give outputs[0] sources of images",
                   "remove it from the recipe")
    assert not (out / "wds").exists()


def test_images_for_a_video_output_are_refused_once_planned(tmp_path):
    _photos(tmp_path / "photos")
    out = tmp_path / "out"
    recipe = _write(tmp_path, [{"path": "photos"}], [{"format": "video_wds"}], geometry={"buckets": ["64x64x17"]})
    code, output = invoke("build", recipe, "--out", out)
    assert_message(code, output, "output 'video_wds' (outputs[0], video_wds) would write nothing",
                   "every item planned from source 'photos' is an image, and it takes video clips (images are written "
                   "by wds, zip and latent outputs)", "give outputs[0] sources of video clips")
    assert not (out / "videos").exists()


def _ran_ahead(out: Path) -> None:
    """The first output started before the plan completed (what it wrote is what must be gone)."""
    assert Ledger.peek(out / ".shardsmith" / "ledger.sqlite", "written_ahead")[0] == ["latents"]


@pytest.mark.slow  # (loads a VAE)
def test_a_latent_output_that_ran_ahead_of_the_plan_leaves_nothing_that_blocks_the_fix(tmp_path, no_walk):
    """Its units (each item skipped) and index files are removed with the refusal: before, the empty units made the
    folder "a build of a different recipe" for the corrected recipe."""
    _sounds(tmp_path)
    out = tmp_path / "out"
    recipe = _write(tmp_path, [{"path": "sounds"}], [{"format": "latent_wds"}], models=LATENT, geometry=BUCKETS)
    for _ in range(2):  # the same recipe again: refused at once from the plan it left
        code, output = invoke("build", recipe, "--out", out, "--no-report")
        assert_message(code, output, "output 'latent_wds' (outputs[0], latent_wds) would write nothing",
                       "(the plan found only audio files in source 'sounds')", "models.audio_vae is not set")
        assert _left(out) == [".shardsmith", ".shardsmith/ledger.sqlite", ".shardsmith/lock"] and _units(out) == 0
    _ran_ahead(out)
    code, output = invoke("build", _write(tmp_path, [{"path": "sounds"}], [{"format": "prompt_wds"}], "fix.yaml"),
                          "--out", out, "--no-report", "-q")
    assert code == 0, output
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 2


@pytest.mark.slow  # (loads a VAE)
def test_images_without_a_frame_one_bucket_that_ran_ahead_leave_nothing_that_blocks_the_fix(tmp_path, no_walk):
    """The image-bucket refusal from the plan, where the first output ran ahead of it (before: the output's empty
    units, shard_count.json and neg_prompt_emb.npy stayed, and the corrected recipe was refused as "a build of a
    different recipe")."""
    _photos(tmp_path / "photos", 3)
    out = tmp_path / "out"

    def recipe(bucket: str, name: str) -> Path:
        return _write(tmp_path, [{"path": "photos"}], [{"format": "latent_wds", "samples_per_shard": 1}], name,
                      models={**LATENT, "text": {"family": "minilm"}}, geometry={"buckets": [bucket]})

    code, output = invoke("build", recipe("64x64x17", "r.yaml"), "--out", out, "--no-report")
    assert_message(code, output, "every input it takes is an image", "(64x64x17) has no bucket of 1 frame")
    _ran_ahead(out)
    assert _left(out) == [".shardsmith", ".shardsmith/ledger.sqlite", ".shardsmith/lock"] and _units(out) == 0
    code, output = invoke("build", recipe("64x64x1", "fix.yaml"), "--out", out, "--no-report", "-q")
    assert code == 0, output
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 3


# ---------------------------------------------------------------- 3. an output inside another output's folder

@pytest.mark.parametrize("outputs, texts", [
    ([{"format": "wds", "dir": "a"}, {"format": "wds", "dir": "a/b"}],
     ["outputs[1].dir 'a/b' (output 'wds1') lies inside outputs[0].dir 'a' (output 'wds')",
      "e.g. outputs[1].dir: b instead of a/b"]),
    ([{"format": "wds", "dir": "a/b/"}, {"format": "prompt_wds", "dir": "./a"}],
     ["outputs[0].dir 'a/b/' (output 'wds') lies inside outputs[1].dir './a' (output 'prompt_wds')"]),
    ([{"format": "wds", "dir": "a"}, {"format": "zip", "path": "a/d.zip", "resolution": 32}],
     ["outputs[1].path 'a/d.zip' (output 'zip') lies inside outputs[0].dir 'a' (output 'wds')",
      "e.g. outputs[1].path: d.zip instead of a/d.zip"]),
    ([{"format": "prompt_wds", "dir": ".precomputed/prompts"}, {"format": "wds", "dir": ".precomputed"}],
     ["outputs[0].dir '.precomputed/prompts' (output 'prompt_wds') lies inside outputs[1].dir '.precomputed'"]),
    ([{"format": "wds", "dir": "b"}, {"format": "prompt_wds", "dir": "b/b"}],
     ["e.g. outputs[1].dir: b_b instead of b/b"]),  # (b itself is taken)
])
def test_an_output_inside_another_outputs_folder_is_refused_when_the_recipe_is_read(tmp_path, outputs, texts):
    _photos(tmp_path / "photos")
    _refused(tmp_path, _write(tmp_path, [{"path": "photos"}], outputs), *texts,
             "its files would lie in the other output's dataset", "give it a place beside the other, not inside")


def test_outputs_side_by_side_are_accepted():
    """Siblings, whatever their names share, and the held-out split (holdout/<dir>, the same layout again)."""
    from shardsmith.recipe import recipe_from_dict

    recipe_from_dict({"sources": [{"path": "."}], "split": {"holdout": 0.5},
                      "geometry": {"buckets": ["64x64x1"]},
                      "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}},
                      "outputs": [{"format": "precomputed"}, {"format": "latent_wds"}, {"format": "wds"},
                                  {"format": "wds", "dir": "wds2"}, {"format": "wds", "dir": "x/a"},
                                  {"format": "wds", "dir": "x/ab"}, {"format": "zip", "path": "x/a.zip",
                                                                     "resolution": 32},
                                  {"format": "zip", "path": "wds.zip", "resolution": 32}]})
