"""Golden bytes: the sha256 of every output file of three reference builds.

Written before the architecture redesign (issue 15) so that the redesign can prove it changed
no byte: the quickstart (WebDataset + EDM ZIP), a latent build (tiny random-weight LTX VAE +
the real MiniLM, three buckets, both latent outputs from clips and photos) and a precomputed
build of a photo folder (tiny random-weight SD VAE, ``store: mean_std``). The manifests are
compared on what they say of the data (counts, outputs, sources, models), without times and paths.

The hashes live in ``tests/golden/hashes.json``. They hold on the project's machines (CPU
torch, the pinned packages); a deliberate change of output bytes regenerates them with
``SHARDSMITH_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`` and says why in its commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from media_factory import real_photos
from video_factory import captioned_clips_table

GOLDEN = Path(__file__).parent / "golden" / "hashes.json"
UPDATE = os.environ.get("SHARDSMITH_UPDATE_GOLDEN") == "1"


def _hashes(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root`` but the ledger folder, the manifest and the HTML report
    (a view of the build, with its timings)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".shardsmith" not in p.parts
            and p.name not in ("manifest.json", "report.html")}


def _stable_manifest(root: Path) -> dict:
    """What the manifest says of the data (counts, splits, outputs, sources, models), without
    what differs between runs or machines (times, paths) and without the recipe echo (a new
    recipe key with a default adds to it without changing a byte)."""
    m = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    for s in m["sources"]:
        s.pop("path", None)
    models = m.get("models") or {}
    return {"counts": m["counts"], "splits": m["splits"], "outputs": m["outputs"], "sources": m["sources"],
            "split": m["split"], "warnings": m["warnings"],
            "models": {k: v for k, v in models.items() if k in ("vae", "text", "random_weights")}}


def _build(recipe: Path | dict, out: Path, tmp_path: Path) -> None:
    """Build as a user does, through the CLI in a process of its own (no state left by other tests)."""
    if isinstance(recipe, dict):
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
        recipe = path
    r = subprocess.run([sys.executable, "-m", "shardsmith", "build", str(recipe), "--out", str(out), "--quiet",
                        "--workers", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr


def _check(case: str, root: Path) -> None:
    got = {"files": _hashes(root), "manifest": _stable_manifest(root)}
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if UPDATE:
        golden[case] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        return
    assert case in golden, f"no golden hashes for {case}: run with SHARDSMITH_UPDATE_GOLDEN=1"
    want = golden[case]
    assert sorted(got["files"]) == sorted(want["files"]), "the set of output files changed"
    changed = [k for k in want["files"] if got["files"][k] != want["files"][k]]
    assert not changed, f"output bytes changed: {changed}"
    assert got["manifest"] == want["manifest"], "the manifest (counts, recipe, models) changed"


@pytest.mark.slow
def test_quickstart_bytes_are_golden(example_recipe, tmp_path):
    out = tmp_path / "qs"
    _build(example_recipe, out, tmp_path)
    _check("quickstart", out)


@pytest.mark.slow
def test_latent_build_with_both_latent_outputs_is_golden(tmp_path):
    table, _ = captioned_clips_table(tmp_path, photos=3)
    recipe = {
        "sources": [{"path": str(table)}],
        "split": {"holdout": 1, "seed": 3},
        "geometry": {"buckets": ["64x64x1", "64x64x9", "96x64x17"]},
        "models": {"vae": {"family": "ltx"}, "text": {"family": "minilm"}},
        "outputs": [{"format": "precomputed"},
                    {"format": "latent_wds", "dir": "lat", "samples_per_shard": 2, "negative_prompt": "blurry"}]}
    out = tmp_path / "out"
    _build(recipe, out, tmp_path)
    _check("latent_both_outputs", out)


@pytest.mark.slow
def test_precomputed_build_of_photos_is_golden(tmp_path):
    real_photos(tmp_path / "photos", 6, seed=21, min_side=60, max_side=120)
    for i, p in enumerate(sorted((tmp_path / "photos").glob("*.jpg"))):
        p.with_suffix(".txt").write_text(f"photo number {i}", encoding="utf-8")
    recipe = {
        "sources": [{"path": str(tmp_path / "photos")}],
        "geometry": {"buckets": ["64x64x1", "64x48x1"]},
        "models": {"vae": {"family": "sd", "store": "mean_std"}, "text": {"family": "minilm"}},
        "outputs": [{"format": "precomputed", "unit": 4}]}
    out = tmp_path / "out"
    _build(recipe, out, tmp_path)
    _check("precomputed_photos", out)
