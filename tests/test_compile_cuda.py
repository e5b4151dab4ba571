"""A compiled encoder (``models.compile: on``) writes the same bytes in every process: a build, its resume, a
second build and each GPU worker compile their kernels in separate processes.

A build keeps what it decided (``auto``) in its ledger, and a resume follows it.

Before, max-autotune timed its candidate kernels on the device and kept the fastest, so each fresh process could
pick others (on an H100 three processes gave three different SHA-256s of one batch: BENCHMARKS.md §10). Runs only
where CUDA is present (the GPU machine: ``python3 -m pytest tests/test_compile_cuda.py``), about a minute a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SCRIPT = r"""
import hashlib, json, numpy as np, torch
from shardsmith.encode.stage import EncodeStage
from shardsmith.encode.vae import load_vae
torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True  # the build's cuDNN mode
vae = load_vae("sd", config="published", dtype="bfloat16", device="cuda")  # random weights, seeded
st = EncodeStage(vae, None, batch_size=8, device="cuda", compile="on")
rng = np.random.default_rng(0)
host = torch.from_numpy(rng.integers(0, 256, (8, 1, 64, 64, 3), dtype=np.uint8))
h = hashlib.sha256()
for z in st.encode_staged(st.stage(list(host.numpy())), 8):
    h.update(z.float().numpy().tobytes())
print(json.dumps({"sha": h.hexdigest(), "compile": st.describe()["compile"]}))
"""


def _compiled_sha(tmp_path, name: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name)}  # a fresh cache: a cold compile each
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])


@pytest.mark.slow
def test_two_processes_compile_the_same_kernels_and_write_the_same_bytes(tmp_path):
    a, b = _compiled_sha(tmp_path, "a"), _compiled_sha(tmp_path, "b")
    assert a["compile"]["compiled"] is True and a["compile"]["deterministic"] is True
    assert a["compile"]["warm_cache"] is False and b["compile"]["warm_cache"] is False
    assert a["sha"] == b["sha"]


@pytest.mark.slow
def test_a_resume_with_compile_auto_writes_the_bytes_of_the_compiled_build_it_resumes(tmp_path, monkeypatch,
                                                                                      disk_full_at):
    # auto decided afresh on a resume (fewer items: eager) and wrote the rest eager, other last bits than compiled
    from media_factory import real_photos
    from shardsmith.build import build
    from test_build import tree_bytes
    from test_compile_resume import _recipe

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    real_photos(tmp_path / "p", 9, seed=12, min_side=40, max_side=90)
    build(_recipe(tmp_path / "p", "on"), tmp_path / "ref", quiet=True, workers=1)
    eager = build(_recipe(tmp_path / "p", "off"), tmp_path / "eager", quiet=True, workers=1)
    assert eager["models"]["compile"]["compiled"] is False
    disk_full_at(2)
    with pytest.raises(OSError, match="No space left"):
        build(_recipe(tmp_path / "p", "on"), tmp_path / "o", quiet=True, workers=1)
    disk_full_at(None)
    m = build(_recipe(tmp_path / "p", "auto"), tmp_path / "o", quiet=True, workers=1)
    assert m["models"]["compile"]["compiled"] is True and m["models"]["compile"]["reason"].startswith("auto: as this")
    assert tree_bytes(tmp_path / "o") == tree_bytes(tmp_path / "ref")
    # with a cold cache it decides in the warm-up, beside the plan: 9 items do not repay a compile ...
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cold"))
    m = build(_recipe(tmp_path / "p", "auto"), tmp_path / "a", quiet=True, workers=1)
    c = m["models"]["compile"]
    assert c["compiled"] is False and c["reason"].startswith("auto: 9 items left") and c["eager_items_per_s"] > 0
    assert c["decided_in"] == "warm-up" and tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "eager")
    # ... and where they do, every batch is compiled: the bytes of an `on` build
    from shardsmith.encode import compile as cc

    monkeypatch.setitem(cc.COST_S, "warm", 0.0)
    monkeypatch.setitem(cc.COST_S, "cold", 0.0)
    m = build(_recipe(tmp_path / "p", "auto"), tmp_path / "c", quiet=True, workers=1)
    c = m["models"]["compile"]
    assert c["compiled"] is True and c["decided_in"] == "warm-up" and c["compiled_at_batch"] == 0
    assert c["built"] == ["3x3x32x32"]  # (compiled afresh into the cold cache: the same kernels)
    assert tree_bytes(tmp_path / "c") == tree_bytes(tmp_path / "ref")
    # a fresh auto build with this encoder's package (or, where packages do not load here, its exported program) in
    # the cache compiles from the warm-up on, without an eager batch to time and without building the model
    unusable = bool(c.get("unusable"))
    m = build(_recipe(tmp_path / "p", "auto"), tmp_path / "w", quiet=True, workers=1)
    c = m["models"]["compile"]
    assert c["compiled"] is True and c["decided_in"] == "warm-up" and "eager_items_per_s" not in c
    what = "exported program (its package does not load here)" if unusable else "package"
    assert c["reason"].startswith(f"auto: the compile cache holds this encoder's {what} for 3x32x32 at batch 3")
    assert c["loaded"] == ([] if unusable else ["3x3x32x32"]) and c["model_built"] is False
    assert tree_bytes(tmp_path / "w") == tree_bytes(tmp_path / "ref")
    if unusable:
        pytest.skip(f"AOTInductor packages do not load on this torch and GPU: {c['unusable']}")


@pytest.mark.slow
def test_a_second_compiled_build_on_the_gpu_loads_its_package_and_writes_the_same_bytes(tmp_path):
    from media_factory import real_photos
    from test_build import tree_bytes
    from test_packaged_encoder import _build, _recipe

    real_photos(tmp_path / "p", 11, seed=4, min_side=40, max_side=90)
    first = _build(_recipe(tmp_path / "p", device="cuda"), tmp_path / "a", tmp_path / "cache")
    assert first["compile"]["built"] == ["3x3x32x32"] and first["compile"]["backend"] == "aot_inductor"
    second = _build(_recipe(tmp_path / "p", device="cuda"), tmp_path / "b", tmp_path / "cache")
    if first["compile"].get("unusable"):  # this torch cannot load the package here: the first build compiles the
        # package's exported program into an Inductor artifact instead (the verdict kept), which the second loads
        # without the model and without a trace, and writes the same bytes
        c = second["compile"]
        assert c["unusable"] == first["compile"]["unusable"] and c["built"] == [] and c["from_program"] == ["3x3x32x32"]
        assert first["compile"]["artifacts_built"] == ["3x3x32x32"] and c["artifacts_built"] == []
        assert c["program_compiled_by"] == {"3x3x32x32": "inductor-artifact"}
        assert (c["model_built"], second["diffusers"], second["traces"]) == (False, False, 0)
        assert tree_bytes(tmp_path / "b") == tree_bytes(tmp_path / "a")
        pytest.skip(f"AOTInductor packages do not load on this torch and GPU: {first['compile']['unusable']}")
    c = second["compile"]
    assert (c["loaded"], c["built"], c["model_built"], second["diffusers"], second["dynamo"]) == (
        ["3x3x32x32"], [], False, False, False)
    assert tree_bytes(tmp_path / "b") == tree_bytes(tmp_path / "a")
    # another process compiling the package afresh (an empty cache) compiles the same kernels
    other = _build(_recipe(tmp_path / "p", device="cuda"), tmp_path / "c", tmp_path / "cache2")
    assert other["compile"]["built"] == ["3x3x32x32"] and tree_bytes(tmp_path / "c") == tree_bytes(tmp_path / "a")
