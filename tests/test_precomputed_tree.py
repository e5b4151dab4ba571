""".precomputed/ as a first-class dataset (issue 16): ``register`` prints the LTX-2 trainer's data
section, ``inspect`` and ``repair`` read the tree, on a real build (tiny random-weight SD VAE and
MiniLM) that is then damaged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from media_factory import real_photos
from shardsmith import formats
from shardsmith.build import build
from shardsmith.recipe import recipe_from_dict


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    src = tmp_path_factory.mktemp("pre_src")
    real_photos(src, 8, seed=16, min_side=60, max_side=140)
    for i, p in enumerate(sorted(src.glob("*.jpg"))):
        p.with_suffix(".txt").write_text(f"photo {i}", encoding="utf-8")
    out = tmp_path_factory.mktemp("pre") / "out"
    build(recipe_from_dict({
        "sources": [{"path": str(src)}],
        "geometry": {"buckets": ["64x64x1", "64x48x1"]}, "images": {"upscale": True},
        "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 4},
        "outputs": [{"format": "precomputed", "latent_dtype": "float32"}]}), out, quiet=True)
    return out


def _all_pt(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.pt"))


@pytest.mark.slow
def test_register_inspect_and_repair_a_precomputed_tree(tree, tmp_path):
    pre = tree / ".precomputed"
    n = len(list((pre / "latents").rglob("*.pt")))
    assert n == 8

    # inspect: per folder counts, shapes; clean -> exit 0, with the batch-size warning for two shapes
    r = cli("inspect", pre, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["kind"] == "precomputed" and rep["ok"] and rep["samples"] == 8
    assert {d: e["files"] for d, e in rep["dirs"].items()} == {"latents": 8, "conditions": 8}
    shapes = rep["dirs"]["latents"]["shapes"]
    assert len(shapes) == 2 and sum(shapes.values()) == 8, shapes  # the 64x64 and 64x48 buckets
    assert any("the LTX trainer needs batch_size: 1 for this tree" in w for w in rep["warnings"])

    # register: the LTX trainer's data section (no WDS datatag, no neg_prompt_emb.npy)
    cfg = tmp_path / "data.yaml"
    env = {"DATA_ROOT_DIR": str(tree)}
    r = cli("register", pre, "--name", "ltx", "--config", cfg, env=env)
    assert r.returncode == 0, r.stderr
    assert "WDS:" not in r.stdout and "neg_prompt_emb" not in r.stdout and "files_map" not in r.stdout
    snippet = yaml.safe_load(r.stdout.split("\n# Python:", 1)[1].split("\n", 1)[1])
    assert snippet["data"] == {"preprocessed_data_root": str(pre.resolve()), "num_dataloader_workers": 2}
    assert snippet["training_strategy"] == {"name": "flexible",
                                            "video": {"is_generated": True, "latents_dir": "latents"}}
    assert snippet["optimization"] == {"batch_size": 1}
    assert yaml.safe_load(cfg.read_text())["ltx"] == {"kind": "precomputed", "path": "${DATA_ROOT_DIR}/.precomputed",
                                                      "dirs": ["latents", "conditions"]}
    from shardsmith.loaders import from_config

    os.environ["DATA_ROOT_DIR"] = str(tree)
    try:
        assert len(from_config("ltx", cfg)) == 8
    finally:
        del os.environ["DATA_ROOT_DIR"]
    r = cli("register", pre, "--preset", "image_latent", "--name", "x", "--config", cfg, env=env)
    assert r.returncode == 2 and "no FastGen preset reads" in r.stderr and "Traceback" not in r.stderr

    # damage it: a truncated latent, a condition deleted
    lat = sorted((pre / "latents").rglob("*.pt"))
    trunc, orphan = lat[0], lat[1]
    trunc.write_bytes(trunc.read_bytes()[:100])
    rel_orphan = orphan.relative_to(pre / "latents")
    (pre / "conditions" / rel_orphan).unlink()
    before = _all_pt(tree)
    r = cli("inspect", pre, "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 1 and not rep["ok"]
    t_rel = trunc.relative_to(pre).as_posix()
    assert [u["file"] for u in rep["dirs"]["latents"]["unreadable"]] == [t_rel]
    assert rep["unpaired"] == [{"file": rel_orphan.as_posix(), "in": ["latents"], "missing": ["conditions"]}]
    assert rep["samples"] == 6
    r = cli("inspect", pre)
    assert "unpaired: latents/" in r.stdout and "unreadable: latents/" in r.stdout and "PROBLEMS" in r.stdout

    # repair --dry-run moves nothing; repair moves the bad files into the build's quarantine
    r = cli("repair", pre, "--dry-run", "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and len(rep["moved"]) == 3 and _all_pt(tree) == before  # its partner condition too
    r = cli("repair", pre)
    assert r.returncode == 0, r.stdout + r.stderr
    quarantine = tree / formats.STATE_DIR / "quarantine" / ".precomputed"
    assert f"to {quarantine}" in r.stdout and "nothing is deleted" in r.stdout
    (run,) = quarantine.iterdir()
    moved = _all_pt(run)
    assert moved == sorted([t_rel, f"conditions/{t_rel.split('/', 1)[1]}", f"latents/{rel_orphan.as_posix()}"])
    assert len((run / t_rel).read_bytes()) == 100  # the very file, moved
    log = json.loads((run / "repair.json").read_text())
    assert {m["file"] for m in log["moved"]} == set(moved)
    # nothing deleted: every .pt is in the tree or the quarantine
    after = [p for p in _all_pt(tree) if not p.startswith(formats.STATE_DIR)]
    assert len(after) + len(moved) == len(before)
    r = cli("inspect", pre, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["samples"] == 6
    r = cli("repair", pre, "--from-source")
    assert r.returncode == 2 and "--from-source" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_verify_says_when_the_tree_stamp_cannot_be_read(tree, tmp_path):
    """Before: a ``.precomputed/shardsmith.json`` that is not valid JSON was ignored without a word (the mode
    and the checks that depend on the stamp were inferred from the folders)."""
    import shutil

    pre = tmp_path / "out"
    shutil.copytree(tree, pre)
    (pre / ".precomputed" / formats.PRECOMPUTED_STAMP).write_text("{not json")
    r = cli("verify", pre / ".precomputed", "--json")
    rep = json.loads(r.stdout)
    assert any("shardsmith.json is not a JSON object shardsmith can read, so it is ignored" in w
               for w in rep.get("warnings", [])), rep.get("warnings")
