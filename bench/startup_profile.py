"""Diagnostics for the image build's fixed costs and GPU decode (harness-internal figures).

1. Startup, in a fresh process, step by step: import torch, CUDA init, import diffusers' VAE class,
   build the published SD-VAE with random weights (CPU, or on the GPU directly), move it, first
   batch (cuDNN autotuning), second batch.
2. nvJPEG through torchvision: host and GPU time of one batch with the GPU idle, and host time while
   a 200 ms GPU job is queued ahead of it (does the decode wait for the device?).

Usage: PYTHONPATH=src:tests python3 bench/startup_profile.py --photos DIR --out r.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

STEPS = r"""
import time, json, sys
T = {}
t = time.perf_counter()
import torch
T["import_torch"] = time.perf_counter() - t; t = time.perf_counter()
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
T["cuda_init"] = time.perf_counter() - t; t = time.perf_counter()
from diffusers import AutoencoderKL
T["import_diffusers_vae"] = time.perf_counter() - t; t = time.perf_counter()
import torchvision.io
T["import_torchvision_io"] = time.perf_counter() - t; t = time.perf_counter()
from shardsmith.encode.vae import load_vae
T["import_shardsmith_vae"] = time.perf_counter() - t; t = time.perf_counter()
v = load_vae("sd", config="published", dtype="bfloat16", device="cuda")
T["load_vae_published_random"] = time.perf_counter() - t; t = time.perf_counter()
torch.backends.cudnn.benchmark = True
x = torch.zeros(64, 3, 256, 256, device="cuda", dtype=torch.bfloat16)
v.encode(x); torch.cuda.synchronize()
T["first_batch_autotune"] = time.perf_counter() - t; t = time.perf_counter()
v.encode(x); torch.cuda.synchronize()
T["second_batch"] = time.perf_counter() - t
print(json.dumps(T))
"""

CLI = r"""
import time; t = time.perf_counter()
import shardsmith.cli
print(time.perf_counter() - t)
"""


def decode_probe(photos: Path, n: int) -> dict:
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    out = {}
    for name, files in (("small", sorted(photos.glob("small/**/*.jpg"))[:n]), ("big", sorted(photos.glob("big/**/*.jpg"))[:n])):
        if not files:
            continue
        datas = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
        for _ in range(2):
            decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda")
        torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda")
            host = time.perf_counter() - t
            torch.cuda.synchronize()
            ts.append((host, time.perf_counter() - t))
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            a @ a  # ~0.3 s queued
        queued = time.perf_counter() - t
        t = time.perf_counter()
        decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda")
        host_busy = time.perf_counter() - t
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        for _ in range(200):
            a @ a
        t = time.perf_counter()
        with torch.cuda.stream(s):
            decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda")
        host_busy_side = time.perf_counter() - t
        torch.cuda.synchronize()
        out[name] = {"images": len(files), "mean_bytes": sum(len(d) for d in datas) / len(datas),
                     "idle_host_s": sorted(ts)[2][0], "idle_total_s": sorted(ts)[2][1],
                     "matmuls_queue_s": queued, "host_s_behind_busy_gpu": host_busy,
                     "host_s_behind_busy_gpu_side_stream": host_busy_side}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--photos", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    res = {}
    r = subprocess.run([sys.executable, "-c", STEPS], capture_output=True, text=True)
    res["startup"] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-c", CLI], capture_output=True, text=True)
    res["import_cli_s"] = r.stdout.strip()
    res["decode"] = decode_probe(args.photos, 64)
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
