"""Small distill refusals that were wrong or late:

- ``distill.guidance: .nan`` said "Input should be greater than or equal to 0" (pydantic's ``ge``); ``inf`` got
  the finite-number message. Now NaN and negative scales get that message too.
- a ``callable`` teacher whose signature cannot take ``(x, t, cond)`` (``os:getcwd``) ended in a traceback at the
  first batch (``TypeError: posix.getcwd() takes no arguments (3 given)``, exit 1); now one message naming the entry
  point and its signature, exit 2, before anything is planned or written.
- ``distill.preview``'s description said ``preview/``; the pictures go to ``.shardsmith/preview/`` (README, code).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_cli_mistakes import assert_message, invoke

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "distill" / "recipe.yaml"


@pytest.mark.parametrize("value", ["nan", ".nan", "-1", "-inf"])
def test_a_nan_or_negative_guidance_gets_the_finite_number_message(tmp_path, value):
    code, output = invoke("distill", RECIPE, "--out", tmp_path / "out", "--set", f"distill.guidance={value}")
    assert_message(code, output, "distill.guidance", "--guidance", "must be a finite number from 0 to 1000")
    assert "greater than or equal" not in output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("entry_point, shown", [("os:getcwd", "()"), ("operator:add", "(a, b, /)"),
                                               ("shardsmith.distill.gaussian:cond_mean", "(cond: 'torch.Tensor')")])
def test_a_teacher_entry_point_that_cannot_take_x_t_cond_is_refused_before_the_plan(tmp_path, entry_point, shown):
    code, output = invoke("distill", RECIPE, "--out", tmp_path / "out", "--set",
                          f"models.teacher.entry_point={entry_point}", "--set", "models.device=cpu")
    assert_message(code, output, f"models.teacher.entry_point {entry_point!r}", f"signature {shown}",
                   "velocity(x, t, cond)", "shardsmith.distill.gaussian:velocity")
    assert not (tmp_path / "out").exists()  # refused before any folder, plan or model


def test_a_teacher_entry_point_that_takes_x_t_cond_passes_the_precheck():
    from shardsmith.precheck import check_teacher
    from shardsmith.recipe import load_recipe

    check_teacher(load_recipe(RECIPE))  # shardsmith.distill.gaussian:velocity(x, t, cond): no error


def test_the_preview_description_names_the_folder_the_pictures_go_to():
    from shardsmith.distill.preview import PREVIEW_DIR
    from shardsmith.recipe import DistillSpec

    description = DistillSpec.model_fields["preview"].description
    assert f"{PREVIEW_DIR}/" in description and PREVIEW_DIR == ".shardsmith/preview"
    assert f"`{PREVIEW_DIR}/NN.png`" in (ROOT / "README.md").read_text()
