"""A ``pretrained`` model whose config file is not a JSON object (not JSON, not UTF-8, JSON nested too deeply for
Python's parser, or another JSON value such as an array) is one message naming ``models.<key>.pretrained``, the
file and the fix, exit 2, before the plan. Was: a RecursionError traceback (deep JSON; from the bucket check, the
teacher check or the text check), a JSONDecodeError / AttributeError traceback (the teacher's and ltx2's readers), or
the file taken as "not on disk" and the load failing after the plan."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import pytest

from test_cli_mistakes import assert_message, invoke

BAD = {
    "not_json": (b"{\"latent_channels\": 4,", "is not valid JSON"),
    "too_deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "not_utf8": (b"{\"_class_name\": \"caf\xe9\"}", "is not valid JSON"),
    "an_array": (b"[{\"latent_channels\": 4}]", "holds an array, not a JSON object"),
}
FIX = "save or download the model again"


def _write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _assert_names(exc: BaseException, key: str, path: Path, says: str) -> None:
    text = str(exc)
    for t in (f"{key}.pretrained", str(path), says, FIX):
        assert t in text, f"{t!r} not in {text!r}"


def _sources(tmp: Path) -> list[dict]:
    from PIL import Image

    src = tmp / "src"
    src.mkdir(exist_ok=True)
    Image.new("RGB", (64, 64), (200, 10, 10)).save(src / "a.jpg")
    (src / "a.txt").write_text("a red square")
    with wave.open(str(src / "b.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x01" * 24000)
    (src / "b.txt").write_text("a tone")
    return [{"path": str(src)}]


UNET = {"in_channels": 4, "cross_attention_dim": 384}


def _recipe(tmp: Path, kind: str, content: bytes) -> tuple[dict, str, Path]:
    """(recipe, key, the bad file) of a recipe whose ``kind`` model is a local folder with that bad file."""
    m = tmp / "model"
    latent = {"sources": _sources(tmp), "geometry": {"buckets": ["64x64x1"]}, "outputs": [{"format": "latent_wds"}]}
    if kind == "vae":
        bad = _write(m / "config.json", content)
        return {**latent, "models": {"vae": {"family": "sd", "pretrained": str(m)}, "device": "cpu"}}, "models.vae", bad
    if kind == "audio_vae":
        bad = _write(m / "audio_vae" / "config.json", content)
        return ({"sources": _sources(tmp), "audio": {"durations": "1.0"}, "outputs": [{"format": "precomputed"}],
                 "models": {"text": {"family": "minilm"}, "device": "cpu",
                            "audio_vae": {"family": "ltx2_audio", "pretrained": str(m), "subfolder": "audio_vae"}}},
                "models.audio_vae", bad)
    if kind == "text":
        bad = _write(m / "config.json", content)
        return ({**latent, "models": {"vae": {"family": "sd"}, "text": {"family": "clip", "pretrained": str(m)},
                                      "device": "cpu"}}, "models.text", bad)
    if kind in ("ltx2_text_encoder", "ltx2_connectors"):
        (m / "tokenizer").mkdir(parents=True)
        good = json.dumps({"text_config": {"max_position_embeddings": 1024}}).encode()
        enc = _write(m / "text_encoder" / "config.json", content if kind == "ltx2_text_encoder" else good)
        conn = _write(m / "connectors" / "config.json", content if kind == "ltx2_connectors" else b"{}")
        return ({"sources": _sources(tmp), "geometry": {"buckets": ["64x64x1"]}, "outputs": [{"format": "precomputed"}],
                 "models": {"vae": {"family": "ltx2"}, "text": {"family": "ltx2", "pretrained": str(m)},
                            "device": "cpu"}}, "models.text", enc if kind == "ltx2_text_encoder" else conn)
    # a unet teacher from a pipeline folder: unet/config.json, and scheduler/scheduler_config.json beside it
    (tmp / "p.jsonl").write_text("".join(json.dumps({"prompt": f"thing {i}"}) + "\n" for i in range(3)))
    unet = _write(m / "unet" / "config.json", content if kind == "teacher" else json.dumps(UNET).encode())
    sched = _write(m / "scheduler" / "scheduler_config.json", content if kind == "teacher_scheduler" else b"{}")
    return ({"sources": [{"path": str(tmp / "p.jsonl"), "columns": {"caption": "prompt"}}],
             "outputs": [{"format": "kd_wds"}], "distill": {"shape": [4, 8, 8], "steps": 4, "t_list": [14.6, 1.0, 0.0]},
             "models": {"teacher": {"family": "unet", "pretrained": str(m), "subfolder": "unet"},
                        "text": {"family": "minilm"}, "device": "cpu"}},
            "models.teacher", unet if kind == "teacher" else sched)


KINDS = ["vae", "audio_vae", "text", "ltx2_text_encoder", "ltx2_connectors", "teacher", "teacher_scheduler"]


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("kind", KINDS)
def test_a_pretrained_config_that_is_not_a_json_object_is_refused_by_the_precheck(tmp_path, kind, bad):
    from shardsmith.encode.vae_config import ConfigFileError
    from shardsmith.precheck import precheck
    from shardsmith.recipe import recipe_from_dict

    content, says = BAD[bad]
    rec, key, path = _recipe(tmp_path, kind, content)
    with pytest.raises(ConfigFileError) as got:
        precheck(recipe_from_dict(rec))
    _assert_names(got.value, key, path, says)


# each reader of such a file, called as the build, scan and load call it (after the precheck, or without it)

def _vae_geometry(folder: Path):
    from shardsmith.encode.vae_config import geometry

    return geometry("sd", pretrained=str(folder))


def _audio_settings(folder: Path):
    from shardsmith.encode.audio_vae import audio_vae_settings

    return audio_vae_settings(pretrained=str(folder))


def _teacher_settings(folder: Path):
    from shardsmith.encode.teacher import teacher_settings

    return teacher_settings("unet", pretrained=str(folder))


def _teacher_schedule(folder: Path):
    from shardsmith.encode.teacher import _schedule

    return _schedule(str(folder.parent), "unet")


def _ltx2_feature_dims(folder: Path):
    from shardsmith.encode.ltx2_text import pretrained_feature_dims

    return pretrained_feature_dims(str(folder.parent))


def _text_positions(folder: Path):
    from shardsmith.precheck import text_positions
    from shardsmith.recipe import TextModel

    return text_positions(TextModel(family="clip", pretrained=str(folder)))


READERS = {  # reader, the file it reads under the folder given to it, the key it names
    "vae_config.geometry": (_vae_geometry, "config.json", "models.vae"),
    "audio_vae_settings": (_audio_settings, "config.json", "models.audio_vae"),
    "teacher_settings": (_teacher_settings, "config.json", "models.teacher"),
    "teacher._schedule": (_teacher_schedule, "../scheduler/scheduler_config.json", "models.teacher"),
    "pretrained_feature_dims": (_ltx2_feature_dims, "../connectors/config.json", "models.text"),
    "text_positions": (_text_positions, "config.json", "models.text"),
}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("reader", list(READERS))
def test_each_reader_of_a_pretrained_config_names_the_file(tmp_path, reader, bad):
    from shardsmith.encode.vae_config import ConfigFileError

    fn, name, key = READERS[reader]
    content, says = BAD[bad]
    folder = tmp_path / "pipe" / "unet"
    folder.mkdir(parents=True)
    path = _write((folder / name).resolve(), content)
    with pytest.raises(ConfigFileError) as got:
        fn(folder)
    _assert_names(got.value, key, path, says)


def test_a_bad_config_json_in_the_hugging_face_cache_names_the_cached_file(tmp_path):
    """A hub repo id whose config.json in the local cache is not a JSON object (a broken download): the cached
    file is named, not taken as "not on disk"."""
    from shardsmith.encode.vae_config import ConfigFileError, pretrained_config

    repo = tmp_path / "hub" / "models--org--vae"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    path = _write(repo / "snapshots" / ("0" * 40) / "config.json", BAD["too_deep"][0])
    with pytest.raises(ConfigFileError) as got:
        pretrained_config("org/vae", cache_dir=str(tmp_path / "hub"))
    _assert_names(got.value, "models.vae", path, "nested too deeply")


def test_a_good_pretrained_config_still_reads(tmp_path):
    """No false refusal: a JSON object passes every reader, and files that are not there are still None."""
    from shardsmith.encode.teacher import teacher_settings
    from shardsmith.encode.vae_config import pretrained_config

    folder = tmp_path / "m"
    _write(folder / "config.json", json.dumps({**UNET, "_class_name": "UNet2DConditionModel"}).encode())
    assert pretrained_config(str(folder))["in_channels"] == 4
    assert teacher_settings("unet", pretrained=str(folder)) == {"latent_channels": 4, "text_dim": 384}
    assert pretrained_config(str(tmp_path / "m"), subfolder="nothing") is None


def test_a_vae_folder_with_deep_json_is_one_message_before_the_plan(tmp_path):
    """Through the CLI: exit 2, the file and the fix, no traceback, no output folder (was a RecursionError
    traceback from the bucket check)."""
    import yaml

    rec, key, path = _recipe(tmp_path, "vae", BAD["too_deep"][0])
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(rec))
    out = tmp_path / "out"
    assert_message(*invoke("build", recipe, "--out", out), "models.vae.pretrained", str(path), "nested too deeply",
                   FIX)
    assert not out.exists()


def test_a_vae_folder_with_invalid_json_is_refused_before_the_plan(tmp_path):
    """Was taken as "config not on disk": the plan ran, and the load failed after it."""
    import yaml

    rec, key, path = _recipe(tmp_path, "vae", BAD["not_json"][0])
    rec["geometry"] = {"buckets": ["64x64x1"]}
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(rec))
    out = tmp_path / "out"
    assert_message(*invoke("build", recipe, "--out", out), "models.vae.pretrained", str(path), "not valid JSON")
    assert not out.exists()
