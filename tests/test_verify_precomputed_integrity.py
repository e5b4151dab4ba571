"""verify and inspect of a ``.precomputed/`` tree a shardsmith build wrote compare its files with the sha256
the build's ledger committed for each unit (check ``integrity``: the sink's hash over every file's path and
bytes, recomputed; no new record, so trees built before this check are checked too). Before, two latents
swapped between samples (each caption then trains on another image's latent) passed every check, exit 0."""

from __future__ import annotations

import pytest

import shardsmith
from tests.test_cli_mistakes import invoke
from tests.test_verify_bucket_integrity import built, copy  # noqa: F401 - fixtures: a build with a .precomputed/ tree
from tests.test_verify_integrity_sha import check


def _latents(tree):
    return sorted(p for p in (tree / "latents").rglob("*.pt"))


@pytest.mark.slow
def test_a_pristine_tree_passes_integrity(built):  # noqa: F811
    rep = shardsmith.verify(built / ".precomputed").report
    assert rep["ok"], rep["checks"]
    assert "hash to the sha256 it committed" in check(rep, "integrity")["detail"]
    code, out = invoke("inspect", built / ".precomputed")
    assert code == 0 and "problem:" not in out, out


@pytest.mark.slow
def test_latents_swapped_between_samples_fail_integrity(copy):  # noqa: F811
    tree = copy / ".precomputed"
    a, b = _latents(tree)[:2]
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    rep = shardsmith.verify(tree).report
    integ = check(rep, "integrity")
    assert not rep["ok"] and not integ["ok"], rep["checks"]
    assert "unit00000" in integ["detail"] and "swapped" in integ["detail"] and "--overwrite" in integ["detail"]
    assert all(c["ok"] for c in rep["checks"] if c["name"] != "integrity"), rep["checks"]  # nothing else sees it
    code, out = invoke("verify", tree, "-q")
    assert code == 1 and "[FAIL] integrity" in out and "Traceback" not in out, out
    code, out = invoke("inspect", tree)
    assert code == 1 and "integrity: 1 unit(s) whose files no longer hash" in out and "Traceback" not in out, out


@pytest.mark.slow
def test_a_file_the_build_did_not_write_is_named(copy):  # noqa: F811
    tree = copy / ".precomputed"
    a = _latents(tree)[0]
    rel = a.relative_to(tree / "latents")
    for d in ("latents", "conditions"):
        (tree / d / rel).rename(tree / d / "renamed.pt")
    integ = check(shardsmith.verify(tree).report, "integrity")
    assert not integ["ok"] and "latents/renamed.pt" in integ["detail"], integ
    assert "sample(s) with no file left" in integ["detail"] and rel.as_posix() in integ["detail"], integ


@pytest.mark.slow
def test_a_repaired_tree_is_no_false_alarm(copy):  # noqa: F811
    tree = copy / ".precomputed"
    a = _latents(tree)[0]
    a.write_bytes(a.read_bytes()[:50])  # unreadable: repair moves it and its partner into the quarantine
    assert not check(shardsmith.verify(tree).report, "integrity")["ok"]
    code, out = invoke("repair", tree)
    assert code == 0, out
    integ = check(shardsmith.verify(tree).report, "integrity")
    assert integ["ok"] and "not compared: unit00000" in integ["detail"], integ
