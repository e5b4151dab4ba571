"""Recipes that would write nothing are one message naming the output and the fix, exit 2, before the plan: an
output that takes no audio file over sources of audio files only, without ``audio.skip`` (was: exit 0 with every
item skipped:unsupported_kind_audio), told from the sources' file names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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
