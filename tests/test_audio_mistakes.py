"""Audio mistakes end in one message naming the key and the fix, exit 2, before any plan or model
(issue 17): a bad ``--audio-durations``, ``audio.skip`` with ``audio.required``, an audio VAE config or
an ``ltx2`` text config that does not exist, ``audio.required`` without an audio encoder, and an audio
encoder with no output that writes audio."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml


def cli(*args):
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _recipe(tmp_path, **over):
    (tmp_path / "src").mkdir(exist_ok=True)
    r = {"sources": [{"path": "src"}], "geometry": {"buckets": ["64x64x17"]},
         "models": {"vae": {"family": "ltx2"}, "text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"}},
         "outputs": [{"format": "precomputed"}]}
    for k, v in over.items():
        r[k] = {**r.get(k, {}), **v} if isinstance(v, dict) else v
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


@pytest.mark.parametrize("flag, says", [
    ("2.0;;8.0", "part 2"), ("2.0;abc", "'abc'"), ("0;4.0", "> 0"), ("4.0;4.0", "repeat")])
def test_bad_audio_durations_flag(tmp_path, flag, says):
    r = cli("build", _recipe(tmp_path), "--out", tmp_path / "out", "--audio-durations", flag)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--audio-durations" in r.stderr and says in r.stderr and "2.0;4.0;8.0" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("over, says", [
    ({"audio": {"skip": True, "required": True}}, "audio.skip and audio.required are both true"),
    ({"models": {"audio_vae": {"family": "ltx2_audio", "config": "huge"}}}, "models.audio_vae"),
    pytest.param({"models": {"text": {"family": "ltx2", "config": "giant"}}},
                 "models.text.config: unknown ltx2 text config", marks=pytest.mark.slow),
    ({"audio": {"durations": [2.0, -1.0]}}, "every duration must be > 0"),
    ({"outputs": [{"format": "wds"}]}, "models.audio_vae is set but no output writes audio latents"),
])
def test_recipe_mistakes(tmp_path, over, says):
    r = cli("build", _recipe(tmp_path, **over), "--out", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_required_audio_without_an_audio_encoder(tmp_path):
    path = _recipe(tmp_path, audio={"required": True})
    data = yaml.safe_load(path.read_text())
    del data["models"]["audio_vae"]
    path.write_text(yaml.safe_dump(data))
    r = cli("build", path, "--out", tmp_path / "out")
    assert r.returncode == 2 and "audio.required is true but nothing encodes audio" in r.stderr
    assert "models.audio_vae" in r.stderr
