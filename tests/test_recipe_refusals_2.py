"""Recipe mistakes that passed validation and then failed late or silently are one message naming the key,
the value and the fix, exit 2, before the plan, with nothing written: a ``models.text.max_length`` past the
text encoder's positions or past :data:`~shardsmith.recipe.MAX_TEXT_LENGTH` (was: OOM-killed in the warm-up); an
output whose ``dir`` is the build folder itself (``.``, empty: its files lay among the build's own and the other
outputs'); ``audio.skip`` while every source item is audio-only (was: exit 0, nothing written); a boolean where a number goes
(``split.holdout: true`` was a holdout of one item)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from test_cli_mistakes import assert_message, invoke


def _recipe(tmp: Path, **over) -> Path:
    """A latent_wds recipe over one real image (the scan has an item), CPU models, with ``over`` merged in."""
    from PIL import Image

    (tmp / "src").mkdir(exist_ok=True)
    Image.new("RGB", (64, 64), (200, 10, 10)).save(tmp / "src" / "a.jpg")
    r = {"sources": [{"path": "src"}], "geometry": {"buckets": ["64x64x1"]},
         "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "device": "cpu"},
         "outputs": [{"format": "latent_wds"}]}
    for k, v in over.items():
        r[k] = {**r.get(k, {}), **v} if isinstance(v, dict) else v
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


def _refused(tmp: Path, recipe: Path, *texts: str) -> None:
    """``shardsmith build`` of ``recipe`` exits 2 with each of ``texts``, and writes no dataset folder."""
    code, output = invoke("build", recipe, "--out", tmp / "out")
    assert_message(code, output, *texts)
    assert not (tmp / "out").exists()  # no folder, so no ledger, no shard


# ---------------------------------------------------------------- 1. models.text.max_length

def _text(**text) -> dict:
    return {"models": {"vae": {"family": "sd"}, "text": text, "device": "cpu"}}


@pytest.mark.parametrize("text, texts", [
    # t5 has no position table (relative buckets): the cap is what stops it (was: the build OOM-killed)
    ({"family": "t5", "max_length": 100_000_000}, ["models.text.max_length", "100000000", "65536", "leave max_length out"]),
    ({"family": "minilm", "max_length": 600}, ["models.text.max_length", "600", "512 token positions", "at most 512"]),
    ({"family": "clip", "config": "published", "max_length": 78}, ["models.text.max_length", "78", "77 token positions",
                                                                   "at most 77"]),
    ({"family": "gemma", "max_length": 3000}, ["models.text.max_length", "3000", "2048 token positions", "at most 2048"]),
    ({"family": "ltx2", "max_length": 4096}, ["models.text.max_length", "4096", "2048 token positions", "at most 2048"]),
])
def test_a_max_length_past_the_text_encoder_is_refused_before_the_plan(tmp_path, text, texts):
    _refused(tmp_path, _recipe(tmp_path, **_text(**text)), *texts)


def test_a_max_length_past_a_pretrained_configs_positions_is_refused(tmp_path):
    """The positions of a pretrained text encoder come from its config.json on disk (no model is loaded)."""
    model = tmp_path / "bert"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 128}))
    _refused(tmp_path, _recipe(tmp_path, **_text(family="minilm", pretrained=str(model), max_length=200)),
             "models.text.max_length", "200", f"models.text.pretrained ({model})", "128 token positions",
             "at most 128")


@pytest.mark.parametrize("text", [
    {"family": "minilm", "max_length": 512}, {"family": "clip", "max_length": 77}, {"family": "t5", "max_length": 65536},
    {"family": "ltx2", "max_length": 2048}, {"family": "gemma", "config": "published", "max_length": 65536},
    {"family": "minilm"},
])
def test_a_max_length_the_encoder_has_passes_the_precheck(tmp_path, text):
    from shardsmith.precheck import check_text_max_length
    from shardsmith.recipe import load_recipe

    check_text_max_length(load_recipe(_recipe(tmp_path, **_text(**text))))


@pytest.mark.slow  # (builds a model)
def test_the_text_loader_refuses_past_its_positions_with_the_same_message():
    """A model whose config was not on disk at the precheck (a hub id) says it as it loads, as a user's error."""
    from shardsmith.encode.text import load_text_encoder
    from shardsmith.errors import UserError

    with pytest.raises(UserError, match=r"models.text.max_length: 100 tokens .* 77 token positions"):
        load_text_encoder("clip", max_length=100)


@pytest.mark.slow  # (imports transformers)
def test_published_positions_are_the_config_classes_defaults():
    import transformers as tf

    from shardsmith.encode.text import PUBLISHED_POSITIONS

    assert PUBLISHED_POSITIONS == {"clip": tf.CLIPTextConfig().max_position_embeddings,
                                   "gemma": tf.Gemma3TextConfig().max_position_embeddings}


# ---------------------------------------------------------------- 2. an output's dir is the build folder itself

@pytest.mark.parametrize("dir_", [".", "", "./", "shards/.."])
def test_an_output_dir_that_is_the_build_folder_is_refused_when_the_recipe_is_read(tmp_path, dir_):
    recipe = _recipe(tmp_path, outputs=[{"format": "wds", "dir": "shards"}, {"format": "wds", "dir": dir_}])
    _refused(tmp_path, recipe, "outputs[1].dir", f"{dir_!r} is the build folder (--out) itself",
             "give it a folder of its own", "leave dir out")


def test_the_dir_flag_of_the_build_folder_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    code, output = invoke("build", "--source", tmp_path / "src", "--to", "wds", "--dir", ".", "--out", tmp_path / "out")
    assert_message(code, output, "outputs[0].dir", "'.' is the build folder (--out) itself")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["wds", "latent_wds", "precomputed", "video_wds", "prompt_wds"])
def test_every_folder_output_refuses_the_build_folder(fmt):
    from shardsmith.recipe import RecipeError, recipe_from_dict

    data = {"sources": [{"path": "."}], "geometry": {"buckets": ["64x64x17"]},
            "models": {"vae": {"family": "ltx2"}, "text": {"family": "minilm"}}, "outputs": [{"format": fmt, "dir": "."}]}
    with pytest.raises(RecipeError, match=r"outputs\[0\]\.dir: '\.' is the build folder"):
        recipe_from_dict(data)


# ---------------------------------------------------------------- 3. audio.skip with audio-only sources

def _wav(path: Path, seconds: float = 0.5, rate: int = 16000, tone: int = 440) -> Path:
    """A small mono 16-bit WAV (the standard library's writer: no FFmpeg needed)."""
    import math
    import struct
    import wave

    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * tone * i / rate)))
                               for i in range(int(seconds * rate))))
    return path


def _audio_recipe(tmp: Path, sources: list[dict], outputs: list[dict], **models) -> Path:
    r = {"sources": sources, "audio": {"skip": True, "durations": [0.25]}, "outputs": outputs,
         "models": {"device": "cpu", **models}}
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


AUDIO_ONLY = ["audio.skip is true", "every source item is audio-only", "nothing would be written",
              "remove audio.skip", "add image or video sources"]


@pytest.mark.parametrize("outputs, models", [
    ([{"format": "precomputed"}], {"text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"}}),
    ([{"format": "wds"}], {}),
])
def test_audio_skip_with_only_audio_files_is_refused_before_the_plan(tmp_path, outputs, models):
    for name, tone in (("a.wav", 440), ("b.wav", 660)):
        _wav(tmp_path / "sounds" / name, tone=tone).with_suffix(".txt").write_text(f"a tone {name}")
    _refused(tmp_path, _audio_recipe(tmp_path, [{"path": "sounds"}], outputs, **models),
             *AUDIO_ONLY, "source 'sounds' holds only audio files")


def test_audio_skip_with_a_table_of_audio_files_is_refused(tmp_path):
    _wav(tmp_path / "a.wav")
    (tmp_path / "rows.csv").write_text("file,caption\na.wav,a tone\n")
    _refused(tmp_path, _audio_recipe(tmp_path, [{"path": "rows.csv"}], [{"format": "wds"}]), *AUDIO_ONLY)


def test_audio_skip_names_the_output_whose_sources_are_all_audio(tmp_path):
    from PIL import Image

    _wav(tmp_path / "sounds" / "a.wav")
    (tmp_path / "photos").mkdir()
    Image.new("RGB", (32, 32)).save(tmp_path / "photos" / "p.jpg")
    recipe = _audio_recipe(tmp_path, [{"path": "sounds"}, {"path": "photos"}],
                           [{"format": "wds", "dir": "all"}, {"format": "wds", "dir": "heard", "sources": ["sounds"]}])
    _refused(tmp_path, recipe, "audio.skip is true", "output 'wds1' (outputs[1]) takes is audio-only",
             "nothing would be written")


@pytest.mark.parametrize("files, outputs", [
    (["clip.mp4", "a.wav"], [{"format": "wds"}]),  # a clip among the audio: written without its audio
    (["p.jpg", "a.wav"], [{"format": "wds"}]),
    (["a.wav"], [{"format": "prompt_wds"}]),  # captions are what prompt_wds writes: the audio is not needed
])
def test_audio_skip_with_clips_or_images_or_captions_passes_the_precheck(tmp_path, files, outputs):
    from shardsmith.precheck import check_audio_only
    from shardsmith.recipe import load_recipe

    for f in files:
        (tmp_path / "src").mkdir(exist_ok=True)
        (tmp_path / "src" / f).write_bytes(b"")  # (the precheck reads names only)
    check_audio_only(load_recipe(_audio_recipe(tmp_path, [{"path": "src"}], outputs)))


@pytest.mark.slow
def test_audio_skip_with_a_clip_carrying_audio_and_an_audio_file_writes_the_clip(tmp_path):
    """Mixed sources still build with audio.skip: the clip (its audio track dropped, as asked) is written, the
    audio file is skipped:unsupported_kind_audio."""
    from video_factory import pan_video

    src = tmp_path / "src"
    src.mkdir()
    pan_video(src / "clip.mp4", frames=30, fps=24, size=(96, 64), audio="tone").with_suffix(".txt").write_text("c")
    _wav(src / "a.wav").with_suffix(".txt").write_text("a tone")
    r = {"sources": [{"path": "src"}], "geometry": {"buckets": ["64x64x17"]}, "audio": {"skip": True},
         "models": {"vae": {"family": "ltx2"}, "text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"},
                    "device": "cpu"},
         "outputs": [{"format": "precomputed"}]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(r))
    code, output = invoke("build", tmp_path / "r.yaml", "--out", tmp_path / "out", "--no-report", "-q")
    assert code == 0, output
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["counts"]["written"] == 1 and m["counts"]["skipped"] == {"unsupported_kind_audio": 1}
    assert m["outputs"]["precomputed"]["audio"]["skipped"] is True


# ---------------------------------------------------------------- 4. a boolean where a number goes

@pytest.mark.parametrize("value", ["true", "false", "yes", "on"])
def test_a_boolean_holdout_is_refused_with_the_holdout_hint(tmp_path, value):
    (tmp_path / "src").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"sources: [{{path: src}}]\noutputs: [{{format: wds}}]\nsplit: {{holdout: {value}}}\n")
    shown = "true" if value in ("true", "yes", "on") else "false"
    _refused(tmp_path, recipe, f"split.holdout: {shown} is a yes/no value, not a number",
             "use a fraction such as 0.05, a percentage such as 5%, or a whole count such as 100")


def test_the_holdout_flag_given_a_boolean_through_set_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    code, output = invoke("build", "--source", tmp_path / "src", "--to", "wds", "--set", "split.holdout=true",
                          "--out", tmp_path / "out")
    assert_message(code, output, "split.holdout: true is a yes/no value")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("over, key", [
    ({"split": {"seed": True}}, "split.seed"),
    ({"workers": True}, "workers"),
    ({"distribute": {"gpus": True}}, "distribute.gpus"),
    ({"images": {"max_pixels": False}}, "images.max_pixels"),
    ({"outputs": [{"format": "wds", "samples_per_shard": True}]}, "outputs[0].samples_per_shard"),
    ({"outputs": [{"format": "zip", "resolution": True}]}, "outputs[0].resolution"),
    ({"geometry": {"fps": True}}, "geometry.fps"),
    ({"models": {"text": {"family": "t5", "max_length": True}}}, "models.text.max_length"),
])
def test_every_number_refuses_a_boolean(over, key):
    from shardsmith.recipe import RecipeError, recipe_from_dict

    data = {"sources": [{"path": "."}], "outputs": [{"format": "wds"}], **over}
    with pytest.raises(RecipeError) as exc:
        recipe_from_dict(data)
    assert f"  - {key}: " in str(exc.value) and "is a yes/no value, not a number" in str(exc.value), str(exc.value)


def test_booleans_stay_booleans_and_numbers_numbers():
    from shardsmith.recipe import recipe_from_dict

    r = recipe_from_dict({"sources": [{"path": "."}], "outputs": [{"format": "wds", "metadata": False}],
                          "split": {"holdout": 0.05, "seed": 3, "dedup": False}, "images": {"upscale": True},
                          "audio": {"skip": True}, "distribute": {"gpus": 1}})
    assert (r.split.holdout, r.split.seed, r.split.dedup, r.images.upscale, r.audio.skip) == (0.05, 3, False, True, True)
    assert r.outputs[0].metadata is False and r.distribute.gpus == 1
