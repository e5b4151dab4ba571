"""``shardsmith distill`` with ``distill.text: source`` reading a prompt_wds folder and no ``distill.shape``
(hunt 5, F16 item 3). Before: the precheck passed it, the teacher was loaded and the plan made, and then every
prompt failed ``failed:no_latent_shape`` (a prompt_wds sample has no ``latent.pth`` to take the sample's shape
from), exit 3. Now it is a recipe mistake: exit 2 naming ``distill.shape``, before any plan or model."""

from __future__ import annotations

import pytest
import yaml

import shardsmith.build
from test_cli_mistakes import assert_message, invoke
from test_distill_rebuilt_prompt_source import _prompt_wds


def _recipe(tmp, source, **distill) -> str:
    path = tmp / "kd.yaml"
    path.write_text(yaml.safe_dump({
        "sources": [{"path": str(source), "kind": "wds"}], "split": {"holdout": 0},
        "models": {"teacher": {"family": "callable", "entry_point": "shardsmith.distill.gaussian:velocity",
                               "parameterisation": "flow"}, "device": "cpu", "batch_size": 3},
        "distill": {"steps": 4, "solver": "euler", "text": "source", **distill},
        "outputs": [{"format": "kd_wds", "samples_per_shard": 3}]}))
    return str(path)


def test_a_prompt_wds_source_without_distill_shape_is_a_recipe_mistake(tmp_path, monkeypatch):
    source = _prompt_wds(tmp_path / "prompts")

    def no_plan(*a, **k):
        raise AssertionError("the recipe mistake must be told before the plan and the teacher")

    monkeypatch.setattr(shardsmith.build, "make_plan", no_plan)
    code, out = invoke("distill", _recipe(tmp_path, source), "--out", tmp_path / "kd")
    assert_message(code, out, "distill.shape is unset", "holds no latent.pth", "txt, txt_emb.pth",
                   "set distill.shape")
    assert "no_latent_shape" not in out
    assert not (tmp_path / "kd").exists()


@pytest.mark.slow  # the teacher samples every prompt: ~5 s
def test_with_distill_shape_the_same_source_distils(tmp_path):
    source = _prompt_wds(tmp_path / "prompts")
    code, out = invoke("distill", _recipe(tmp_path, source, shape=[2, 4, 4]), "--out", tmp_path / "kd", "-q")
    assert code == 0, out
    assert list((tmp_path / "kd").rglob("00000.tar"))
