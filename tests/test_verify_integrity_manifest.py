"""A finished build whose manifest.json is damaged in shape: a re-run of `build` gave a KeyError traceback
(``counts`` without ``written``) or "complete; nothing to do" with advice that fails (``outputs`` deleted), and
verify ran no manifest check on ``outputs: {}`` (OK). Now the re-run is one message naming manifest.json and the
fix (exit 2), and verify fails check ``manifest`` when the manifest does not match the build's recorded recipe."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import shardsmith
from tests.media_factory import real_photos
from tests.test_cli_mistakes import assert_message, invoke

ARGS = ("--to", "wds", "--samples-per-shard", "2")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("manifest")
    real_photos(base / "src", 6, max_side=200)
    code, out = invoke("build", "--source", base / "src", *ARGS, "--out", base / "out", "--quiet", "--no-report")
    assert code == 0, out
    return base / "src", base / "out"


def damaged(built, tmp_path, change) -> Path:
    out = tmp_path / "b"
    shutil.copytree(built[1], out)
    m = json.loads((out / "manifest.json").read_text())
    change(m)
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def no_written(m):
    m["counts"] = {"inputs": m["counts"]["inputs"]}


def no_outputs(m):
    del m["outputs"]


def empty(m):
    for k in list(m):
        del m[k]
    m.update({"shardsmith_version": "0.1.0", "counts": {}, "outputs": {}})


@pytest.mark.parametrize("change, says", [(no_written, "counts.written"), (no_outputs, "outputs is missing"),
                                          (empty, "counts.inputs")])
def test_rerun_of_build_over_a_damaged_manifest_is_one_message(built, tmp_path, change, says):
    out = damaged(built, tmp_path, change)
    code, said = invoke("build", "--source", built[0], *ARGS, "--out", out)
    assert_message(code, said, f"{out / 'manifest.json'}", says, "restore manifest.json from a copy", "--overwrite")
    assert "nothing to do" not in said


def test_rerun_of_build_over_a_manifest_lacking_an_output_is_one_message(built, tmp_path):
    out = damaged(built, tmp_path, lambda m: m.update(outputs={}))
    code, said = invoke("build", "--source", built[0], *ARGS, "--out", out)
    assert_message(code, said, "manifest.json", "no entry for output(s) wds", "--overwrite")


@pytest.mark.parametrize("change, says", [(lambda m: m.update(outputs={}), "no entry for output(s) wds"),
                                          (empty, "counts.inputs"), (no_written, "counts.written")])
def test_verify_fails_the_manifest_check(built, tmp_path, change, says):
    out = damaged(built, tmp_path, change)
    rep = shardsmith.verify(out / "wds", world=1, workers=0).report
    got = [c for c in rep["checks"] if c["name"] == "manifest"]
    assert not rep["ok"] and got and not got[0]["ok"] and says in got[0]["detail"], rep["checks"]
    assert "manifest.json" in got[0]["detail"]


def test_a_sound_manifest_still_reruns_and_verifies(built):
    code, said = invoke("build", "--source", built[0], *ARGS, "--out", built[1])
    assert code == 0 and "nothing to do" in said, said
    assert shardsmith.verify(built[1] / "wds", world=1, workers=0).report["ok"]
