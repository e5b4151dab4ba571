"""``shardsmith distill``: a user's mistake is one message naming the key and the fix, exit code 2, no
traceback, before any model loads or anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from test_cli_mistakes import assert_message, invoke

TEACHER = {"family": "callable", "entry_point": "shardsmith.distill.gaussian:velocity", "parameterisation": "flow"}


def _recipe(tmp: Path, **over) -> Path:
    (tmp / "p.jsonl").write_text("".join(json.dumps({"prompt": f"a photo of thing {i}"}) + "\n" for i in range(4)))
    r = {"sources": [{"path": "p.jsonl", "columns": {"caption": "prompt"}}],
         "outputs": [{"format": "kd_wds"}],
         "models": {"teacher": TEACHER, "text": {"family": "minilm"}, "device": "cpu"},
         "distill": {"shape": [4, 8, 8], "steps": 8}}
    for k, v in over.items():
        if v is None:
            r.pop(k, None)
        else:
            r[k] = {**r[k], **v} if isinstance(v, dict) and isinstance(r.get(k), dict) else v
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


@pytest.mark.parametrize("over, texts", [
    ({"outputs": [{"format": "wds"}], "models": {"teacher": None}, "distill": None},
     ["shardsmith distill writes a kd_wds output", "shardsmith build"]),
    ({"models": {"teacher": {"family": "callable", "entry_point": "no_such_module_xyz:velocity",
                             "parameterisation": "flow"}}},
     ["models.teacher.entry_point", "no_such_module_xyz", "PYTHONPATH"]),
    ({"models": {"teacher": {"family": "callable", "entry_point": "shardsmith.distill.gaussian:velocity"}}},
     ["parameterisation"]),
    ({"models": {"teacher": {"family": "sana", "config": "tiny"}}, "distill": {"shape": [3, 8, 8]}},
     ["distill.shape [3, 8, 8] has 3 channels", "takes 4"]),
    ({"models": {"teacher": {"family": "sana", "config": "published"}}, "distill": {"shape": [32, 16, 16]}},
     ["2304-wide text embeddings", "384-wide"]),
    ({"models": {"teacher": {"family": "sana", "config": "huge"}}}, ["models.teacher.config", "tiny"]),
    ({"models": {"teacher": {"family": "unet", "config": "tiny"}}}, ["distill.t_list", "noise levels sigma"]),
    ({"models": {"teacher": {"family": "unet", "config": "tiny", "parameterisation": "flow"}}},
     ["unet is sampled as edm"]),
    ({"distill": {"steps": 2}}, ["distill.steps"]),
    ({"distill": {"t_list": [0.9, 0.5]}}, ["distill.t_list", "ends at 0.5, not 0.0", "append 0.0"]),
    ({"distill": {"shape": [4, 0, 8]}}, ["distill.shape"]),
    ({"distill": {"preview": 2}}, ["distill.preview", "models.vae"]),
    ({"models": {"text": None}}, ["models.text"]),
    ({"outputs": [{"format": "kd_wds"}, {"format": "wds"}]}, ["recipe of its own"]),
])
def test_distill_mistakes_are_one_message_and_exit_2(tmp_path, over, texts):
    models = over.pop("models", None)
    recipe = _recipe(tmp_path, **over)
    if models is not None:
        data = yaml.safe_load(recipe.read_text())
        for k, v in models.items():
            if v is None:
                data["models"].pop(k, None)
            else:
                data["models"][k] = v
        recipe.write_text(yaml.safe_dump(data))
    code, output = invoke("distill", recipe, "--out", tmp_path / "out")
    assert_message(code, output, *texts)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_teacher_or_distill_section_without_a_kd_output_is_refused(tmp_path):
    recipe = _recipe(tmp_path, outputs=[{"format": "prompt_wds"}])
    code, output = invoke("build", recipe, "--out", tmp_path / "out")
    assert_message(code, output, "no output is a kd_wds output")
