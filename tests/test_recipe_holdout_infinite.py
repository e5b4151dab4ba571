"""``split.holdout`` of infinity (``--holdout inf``, ``1e999``, YAML ``.inf``) or a ``nan%`` / ``inf%`` percentage
was an OverflowError (``int(inf)``) or ``decimal.InvalidOperation`` traceback, exit 1, in build and scan. It is now
the recipe error for split.holdout with its fix, exit 2, before any output folder is made."""

from __future__ import annotations

import pytest

from test_cli_mistakes import assert_message, folder, invoke, write_recipe  # noqa: F401 (folder: a fixture)


@pytest.mark.parametrize("given, text", [("inf", "holdout inf is infinite"), ("1e999", "holdout inf is infinite"),
                                         ("-inf", "greater than or equal to 0"),
                                         ("nan%", "'nan%': a percentage must be at least 0% and below 100%"),
                                         ("inf%", "'inf%': a percentage must be at least 0% and below 100%")])
def test_an_infinite_holdout_flag_is_a_recipe_error(folder, tmp_path, given, text):
    code, output = invoke("build", "--source", folder, "--to", "wds", "--holdout", given, "--out", tmp_path / "o")
    assert_message(code, output, "split.holdout", text, "a percentage such as 5%")
    assert not (tmp_path / "o").exists()


def test_an_infinite_holdout_in_a_recipe_file_is_refused_by_build_and_scan(folder, tmp_path):
    r = write_recipe(tmp_path / "r.yaml", f"sources: [{{path: {folder}}}]\nsplit: {{holdout: .inf}}\n"
                                          "outputs: [{format: wds}]\n")
    code, output = invoke("build", r, "--out", tmp_path / "o")
    assert_message(code, output, f"recipe {r} is not valid", "split.holdout: holdout inf is infinite",
                   "a whole count such as 100")
    assert not (tmp_path / "o").exists()
    code, output = invoke("scan", "--recipe", r)
    assert_message(code, output, "split.holdout: holdout inf is infinite")
