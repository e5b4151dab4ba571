"""An output that writes no sample while another output writes some is loud: a warning on stderr (with ``--quiet``
too) naming the output and its counts by reason, and the manifest's block of that output says so (``empty``). The
build still exits 0: what the other outputs wrote is usable. (A build of which no output wrote a sample exits 3, as
before, without this warning.) Before: exit 0 and not a word about the empty output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from shardsmith import cli

WARNING = "warning: output 'squares' wrote no sample, while the other output(s) did: all 3 of its inputs failed or " \
          "were skipped (skipped:aspect_ratio 3; e.g. "


def _run(*args):
    r = CliRunner().invoke(cli.app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture
def recipe(tmp_path) -> Path:
    """Three pictures that are not square; output 'all' writes them, output 'squares' (max_aspect 1.0) skips each."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        Image.new("RGB", (48 + 8 * i, 32), (40 * i, 90, 200)).save(src / f"p{i}.png")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"sources": [{"path": str(src)}],
                                    "outputs": [{"format": "wds", "name": "all"},
                                                {"format": "wds", "name": "squares", "dir": "sq",
                                                 "image": {"max_aspect": 1.0}}]}))
    return path


@pytest.mark.parametrize("quiet", [[], ["--quiet"]])
def test_an_output_that_wrote_nothing_beside_one_that_wrote_is_a_warning_and_in_the_manifest(recipe, tmp_path, quiet):
    out = tmp_path / "o"
    code, stdout, stderr = _run("build", recipe, "--out", out, "--no-report", *quiet)
    assert code == 0, stdout + stderr
    said = " ".join(stderr.split())  # (the console wraps long lines)
    assert WARNING in said, stderr
    assert said.count("wrote no sample") == 1, stderr  # once, not again among the summary's warnings
    assert "output 'all' wrote no sample" not in said
    m = json.loads((out / "manifest.json").read_text())
    assert m["outputs"]["squares"]["empty"] == {"inputs": 3, "by_reason": {"skipped:aspect_ratio": 3}}
    assert "empty" not in m["outputs"]["all"]
    assert [w.startswith(WARNING[len("warning: "):]) for w in m["warnings"] if "wrote no sample" in w] == [True]
    # the finished build re-run: nothing to do, exit 0, and the warning again
    code, stdout, stderr = _run("build", recipe, "--out", out, "--no-report", *quiet)
    assert code == 0 and WARNING in " ".join(stderr.split()), stdout + stderr


def test_no_output_wrote_is_exit_3_without_the_per_output_warning(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    Image.new("RGB", (64, 32), (1, 2, 3)).save(src / "wide.png")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"path": str(src)}],
                                      "outputs": [{"format": "wds", "image": {"max_aspect": 1.0}},
                                                  {"format": "wds", "dir": "b", "image": {"max_aspect": 1.5}}]}))
    code, stdout, stderr = _run("build", recipe, "--out", tmp_path / "o", "--no-report")
    assert code == 3 and "no sample was written" in stderr, stdout + stderr
    assert "wrote no sample, while" not in stderr
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert not any("empty" in o for o in m["outputs"].values())


def test_the_done_line_gives_each_output_s_count_where_they_differ(recipe, tmp_path):
    """'done: o (0 of 3 inputs written ...)' read as the whole build writing nothing, while output 'all' wrote 3."""
    code, stdout, stderr = _run("build", recipe, "--out", tmp_path / "o", "--no-report")
    said = " ".join(stdout.split())
    assert code == 0 and "(0 of 3 inputs written to every output; by output: all 3, squares 0;" in said, stdout
