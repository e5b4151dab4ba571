"""register's FastGen snippet is valid Python for every accepted name, and two entries never share its variable.

Before: ``--name 2024-photos`` printed ``2024_PHOTOS_Loader_Config = ImageLoaderConfig.copy()`` (exit 0), a
SyntaxError once pasted into configs/data.py; ``my-data`` and ``my_data`` both printed ``MY_DATA_Loader_Config``, so
the second paste silently redefined the first. Now a name starting with a digit is prefixed ``DS_``, and a second
name of one data config whose variable an entry already has is refused (exit 2, naming both, nothing written).
"""

from __future__ import annotations

import ast

import pytest

from test_cli_mistakes import assert_message, invoke
from test_source_names_and_tables import _jpg


@pytest.fixture
def wds(tmp_path):
    _jpg(tmp_path / "src" / "a.jpg")
    _jpg(tmp_path / "src" / "b.jpg", (10, 200, 30))
    code, out = invoke("build", "--source", tmp_path / "src", "--to", "wds", "--out", tmp_path / "b", "--quiet")
    assert code == 0, out
    return tmp_path / "b" / "wds"


def _snippet(out: str) -> str:
    return out[out.index("import os"):]


def test_a_name_starting_with_a_digit_gives_valid_python(wds, tmp_path):
    for name, var in (("2024-photos", "DS_2024_PHOTOS_Loader_Config"), ("1e3", "DS_1E3_Loader_Config")):
        code, out = invoke("register", wds, "--preset", "image", "--name", name, "--config", tmp_path / "d.yaml")
        assert code == 0, out
        snippet = _snippet(out)
        ast.parse(snippet)  # pastes as Python
        assert f"{var} = ImageLoaderConfig.copy()" in snippet
        assert f"# in the experiment: config.dataloader_train = {var}" in snippet


def test_config_variables():
    from shardsmith.loaders.registry import config_var

    assert config_var("my-data") == config_var("my_data") == "MY_DATA_Loader_Config"  # hence the refusal below
    assert config_var("photos") == "PHOTOS_Loader_Config"  # plain names as before
    for name in ("2024-photos", "x\u00b2", "_a", "-a", "donn\u00e9es"):
        assert config_var(name).isidentifier(), name


def test_a_second_name_with_the_same_variable_is_refused(wds, tmp_path):
    cfg = tmp_path / "d.yaml"
    code, out = invoke("register", wds, "--preset", "image", "--name", "my-data", "--config", cfg)
    assert code == 0 and "MY_DATA_Loader_Config = ImageLoaderConfig.copy()" in out, out
    before = cfg.read_bytes()
    for other in ("my_data", "MY-DATA"):
        code, out = invoke("register", wds, "--preset", "image", "--name", other, "--config", cfg)
        assert_message(code, out, f"dataset name {other!r} gives the FastGen config variable MY_DATA_Loader_Config, "
                                  f"which the entry 'my-data' in {cfg} already has (names that differ only in "
                                  "'-' / '_' or letter case share one)", "choose another --name")
        assert cfg.read_bytes() == before
    code, out = invoke("register", wds, "--preset", "image", "--name", "my-data", "--config", cfg)  # the same again
    assert code == 0 and cfg.read_bytes() == before, out
