"""Recipe values that validated but crashed with a traceback after slow work (issue 30) are one message
naming the key, the value and the fix, exit 2, before the plan or a model: a non-finite ``geometry.fps``,
``audio.durations`` that are non-finite or shorter than the audio VAE's STFT, a flow teacher's
``distill.t_list`` starting above 1, and a ``models.text.config`` its (non-ltx2) family lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from test_cli_mistakes import assert_message, invoke


def _media_recipe(tmp: Path, **over) -> Path:
    from PIL import Image

    (tmp / "src").mkdir(exist_ok=True)
    Image.new("RGB", (64, 64), (200, 10, 10)).save(tmp / "src" / "a.jpg")  # a real item: HEAD got past the scan
    r = {"sources": [{"path": "src"}], "geometry": {"buckets": ["64x64x17", "64x64x1"]},
         "models": {"vae": {"family": "ltx2"}, "text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio"},
                    "device": "cpu"},
         "outputs": [{"format": "precomputed"}]}
    for k, v in over.items():
        r[k] = {**r.get(k, {}), **v} if isinstance(v, dict) else v
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


def _kd_recipe(tmp: Path, t_list: list[float]) -> Path:
    (tmp / "p.jsonl").write_text("".join(json.dumps({"prompt": f"a photo of thing {i}"}) + "\n" for i in range(4)))
    r = {"sources": [{"path": "p.jsonl", "columns": {"caption": "prompt"}}], "outputs": [{"format": "kd_wds"}],
         "models": {"teacher": {"family": "callable", "entry_point": "shardsmith.distill.gaussian:velocity",
                                "parameterisation": "flow"}, "text": {"family": "minilm"}, "device": "cpu"},
         "distill": {"shape": [4, 8, 8], "steps": 8, "t_list": t_list}}
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


@pytest.mark.parametrize("over, texts", [
    ({"geometry": {"fps": float("inf")}}, ["geometry.fps", "inf", "finite"]),
    ({"audio": {"durations": [float("inf")]}}, ["audio.durations", "inf", "finite"]),
    ({"audio": {"durations": [1.0e-6]}}, ["audio.durations", "1e-06", "n_fft 1024", "513 samples"]),
    ({"models": {"text": {"family": "t5", "config": "huge"}}},
     ["models.text.config", "'huge'", "t5", "'tiny'", "'xxl'"]),
])
def test_build_values_are_refused_before_the_plan(tmp_path, over, texts):
    code, output = invoke("build", _media_recipe(tmp_path, **over), "--out", tmp_path / "out")
    assert_message(code, output, *texts)
    assert not (tmp_path / "out").exists()


def test_a_flow_teachers_t_list_above_one_is_refused(tmp_path):
    code, output = invoke("distill", _kd_recipe(tmp_path, [5.0, 0.0]), "--out", tmp_path / "out")
    assert_message(code, output, "distill.t_list", "5.0", "flow", "(0, 1]")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family, config", [("t5", "tiny"), ("umt5", "xxl"), ("clip", "published")])
def test_known_text_configs_pass_precheck(tmp_path, family, config):
    from shardsmith.precheck import check_text_config
    from shardsmith.recipe import load_recipe

    check_text_config(load_recipe(_media_recipe(tmp_path, models={"text": {"family": family, "config": config}})))
