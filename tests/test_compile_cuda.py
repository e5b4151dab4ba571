"""A compiled encoder (``models.compile: on``) writes the same bytes in every process: a build, its resume, a
second build and each GPU worker compile their kernels in separate processes.

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
