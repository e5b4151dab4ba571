"""Encoders are held by name behind one protocol (issue 15): the manifest block, the random-weights
warning and the cache stamp come from ``stage.encoders``, whatever encoders a recipe loads."""

from __future__ import annotations

from types import SimpleNamespace

from shardsmith.encode.encoders import ENCODER_NAMES, held, missing
from shardsmith.encode.stage import EncodeStage


def _enc(family: str, kind: str, weights: str):
    spec = SimpleNamespace(kind=kind, to_dict=lambda: {"family": family, "kind": kind})
    prov = SimpleNamespace(to_dict=lambda: {"weights": weights, "path_or_repo": f"{family}-repo", "config": {}})
    return SimpleNamespace(spec=spec, provenance=prov)


def test_the_stage_describes_and_stamps_its_encoders_by_name():
    vae, text = _enc("sd", "image_vae", "random-weights"), _enc("minilm", "text", "pretrained")
    both = EncodeStage(vae, text, batch_size=2, device="cpu")
    assert list(both.encoders) == ["vae", "text"] == list(ENCODER_NAMES)[:2]
    d = both.describe()
    assert d["vae"]["spec"] == {"family": "sd", "kind": "image_vae"} and d["text"]["provenance"]["weights"] == "pretrained"
    assert d["random_weights"] == ["vae"]
    recipe = SimpleNamespace(geometry=SimpleNamespace(buckets=["64x64x1"], fps=None), lora_trigger=None,
                             audio=SimpleNamespace(skip=False, durations=None, resampler="sinc"))
    stamp = both.stamp(recipe)
    assert list(stamp) == ["vae", "text", "buckets", "fps"] and stamp["text"] is not None  # no audio: as before

    audio = _enc("ltx2_audio", "audio_vae", "random-weights")
    av = EncodeStage(vae, text, batch_size=2, device="cpu", audio_vae=audio)
    assert list(av.encoders) == list(ENCODER_NAMES)[:3] == ["vae", "text", "audio_vae"]
    assert av.describe()["random_weights"] == ["audio_vae", "vae"]
    assert list(av.stamp(recipe)) == ["vae", "text", "audio_vae", "buckets", "fps", "audio_resampler"]
    assert av.stamp(recipe)["audio_resampler"] == "sinc"  # cut at the source's rate, resampled by the encoder
    ffmpeg = SimpleNamespace(**{**vars(recipe), "audio": SimpleNamespace(skip=False, durations=None, resampler="ffmpeg")})
    assert list(av.stamp(ffmpeg)) == ["vae", "text", "audio_vae", "buckets", "fps"]  # as trees before the setting
    skipped = SimpleNamespace(**{**vars(recipe), "audio": SimpleNamespace(skip=True, durations=None, resampler="sinc")})
    assert both.stamp(skipped)["audio"] == "skipped"  # a tree built with --skip-audio is another cache

    teacher = _enc("sana", "teacher", "random-weights")  # shardsmith distill: the text encoder and the teacher
    kd = EncodeStage(None, text, batch_size=2, device="cpu", teacher=teacher)
    assert list(kd.encoders) == ["text", "teacher"] and ENCODER_NAMES[-1] == "teacher"
    assert kd.describe()["random_weights"] == ["teacher"]
    assert list(kd.stamp(recipe)) == ["vae", "text", "teacher", "buckets", "fps"]
    assert list(both.stamp(recipe)) == ["vae", "text", "buckets", "fps"]  # no teacher: as before

    text_only = EncodeStage(None, text, batch_size=2, device="cpu")  # a prompt_wds recipe loads no VAE
    assert list(text_only.encoders) == ["text"] and "vae" not in text_only.describe()
    assert text_only.stamp(recipe)["vae"] is None and text_only.describe()["random_weights"] == []


def test_missing_names_what_an_output_needs_and_the_stage_lacks():
    enc = held(_enc("sd", "image_vae", "pretrained"), None)
    assert missing(enc, ("vae", "text")) == ["text"] and missing(enc, ("vae",)) == []
