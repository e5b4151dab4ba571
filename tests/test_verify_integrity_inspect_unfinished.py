"""`inspect` of a dataset whose build is not finished (killed, or still running) said OK, exit 0; now it says
the build is not finished (a problem, exit 1) and how to finish it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shardsmith.verify.inspect import inspect_wds
from tests.test_cli_mistakes import invoke
from tests.test_verify_integrity_sha import photo_wds_build


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return photo_wds_build(tmp_path_factory.mktemp("unfinished"), 4)


def test_inspect_says_the_build_is_not_finished(built, tmp_path):
    out = tmp_path / "b"
    shutil.copytree(built, out)
    (out / "manifest.json").unlink()  # a ledger without a manifest: a build stopped before its end
    rep = inspect_wds(out / "wds")
    assert not rep["ok"] and rep["build"]["unfinished"], rep["problems"]
    code, said = invoke("inspect", out / "wds")
    assert code == 1 and "build not finished" in said and f"--out {out}" in said, said
    assert "Traceback" not in said


def test_inspect_of_a_finished_build_is_ok(built):
    rep = inspect_wds(built / "wds")
    assert rep["ok"] and rep["build"]["unfinished"] is None and rep["integrity"]["ok"], rep["problems"]
    code, said = invoke("inspect", built / "wds")
    assert code == 0, said
