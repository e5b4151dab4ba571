"""Golden bytes: the sha256 of every output file of three reference builds.

Written before the architecture redesign (issue 15) so that the redesign can prove it changed
no byte: the quickstart (WebDataset + EDM ZIP), a latent build (tiny random-weight LTX VAE +
the real MiniLM, three buckets, both latent outputs from clips and photos) and a precomputed
build of a photo folder (tiny random-weight SD VAE, ``store: mean_std``). The manifests are
compared on what they say of the data (counts, outputs, sources, models), without times and paths.

The hashes live in ``tests/golden/hashes.json``. They hold on the project's machines (CPU
torch, the pinned packages); a deliberate change of output bytes regenerates them with
``SHARDSMITH_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`` and says why in its commit.

A model's float output is not the same to the last bit on every CPU: MKL and oneDNN pick their kernels
by instruction set (an Intel AVX-512 machine and an AMD one round differently). A file whose bytes differ
but which holds tensors (``.pt``, ``.npy``, a shard's ``.pth`` / ``.npy`` members) is then compared by
its values: every non-tensor part and every tensor's shape and dtype exactly, each tensor's sum and sum of
absolute values within 1e-4 of its sum of absolute values. ``SHARDSMITH_UPDATE_GOLDEN=values`` adds those fingerprints and keeps the hashes.
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
UPDATE = os.environ.get("SHARDSMITH_UPDATE_GOLDEN")
TENSOR_SUFFIXES = (".pt", ".pth", ".npy")
RTOL = 1e-4


def _summary(x) -> object:
    """A tensor or array as (shape, dtype, sum, sum of |x|); anything else as it is (nested)."""
    import numpy as np
    import torch

    if isinstance(x, torch.Tensor):
        x = x.detach().float().numpy() if x.dtype == torch.bfloat16 else x.detach().numpy()
    if isinstance(x, np.ndarray):
        a = x.astype(np.float64)
        return {"shape": list(x.shape), "dtype": str(x.dtype), "sum": float(a.sum()), "abs": float(np.abs(a).sum())}
    if isinstance(x, dict):
        return {str(k): _summary(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_summary(v) for v in x]
    return x


def _load(name: str, data: bytes) -> object:
    import io

    import numpy as np
    import torch

    if name.endswith(".npy"):
        return np.load(io.BytesIO(data), allow_pickle=False)
    return torch.load(io.BytesIO(data), weights_only=True)


def _values(path: Path) -> object | None:
    """The value fingerprint of a file holding tensors (see the module), else None."""
    import tarfile

    if path.suffix in TENSOR_SUFFIXES:
        return _summary(_load(path.name, path.read_bytes()))
    if path.suffix == ".tar":
        out = {}
        with tarfile.open(path) as tf:
            for m in tf.getmembers():
                data = tf.extractfile(m).read()
                out[m.name] = (_summary(_load(m.name, data)) if m.name.endswith(TENSOR_SUFFIXES)
                               else hashlib.sha256(data).hexdigest())
        return out
    return None


def _close(got: object, want: object) -> bool:
    """``got`` equals ``want`` but for the sums of tensors, which may differ by RTOL (relative)."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return False
        if set(want) == {"shape", "dtype", "sum", "abs"}:
            scale = RTOL * max(1.0, want["abs"])  # (a sum cancels: its error is the size of the values')
            return (got["shape"] == want["shape"] and got["dtype"] == want["dtype"]
                    and all(abs(got[k] - want[k]) <= scale for k in ("sum", "abs")))
        return all(_close(got[k], want[k]) for k in want)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_close(g, w) for g, w in zip(got, want))
    return got == want


def _hashes(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root`` but the ledger folder, the manifest and the HTML report
    (a view of the build, with its timings)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".shardsmith" not in p.parts
            and p.name not in ("manifest.json", "report.html")}


def _without_hashes(x: object) -> object:
    """``x`` without its ``sha256`` entries (a shard's, recorded in the manifest: its bytes are checked
    with the files, by value where they hold tensors)."""
    if isinstance(x, dict):
        return {k: _without_hashes(v) for k, v in x.items() if k != "sha256"}
    if isinstance(x, list):
        return [_without_hashes(v) for v in x]
    return x


def _stable_manifest(root: Path) -> dict:
    """What the manifest says of the data (counts, splits, outputs, sources, models), without
    what differs between runs or machines (times, paths, the shards' hashes) and without the recipe echo (a new
    recipe key with a default adds to it without changing a byte)."""
    m = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    for s in m["sources"]:
        s.pop("path", None)
    models = m.get("models") or {}
    return {"counts": m["counts"], "splits": m["splits"], "outputs": _without_hashes(m["outputs"]), "sources": m["sources"],
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
    values = {k: v for k in got["files"] if (v := _values(root / k)) is not None}
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if UPDATE == "1":
        golden[case] = {**got, "values": values}
    elif UPDATE == "values":
        golden[case]["values"] = values
    if UPDATE:
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        return
    assert case in golden, f"no golden hashes for {case}: run with SHARDSMITH_UPDATE_GOLDEN=1"
    want = golden[case]
    assert sorted(got["files"]) == sorted(want["files"]), "the set of output files changed"
    changed = [k for k in want["files"] if got["files"][k] != want["files"][k]]
    other = [k for k in changed if k not in want.get("values", {}) or not _close(values.get(k), want["values"][k])]
    assert not other, f"output bytes changed: {other} (of {changed}: tensors compared by value)"
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
