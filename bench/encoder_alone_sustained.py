"""Whether the encoder alone keeps its pace over a whole build's worth of batches (a diagnostic for BENCHMARKS.md
§10, thirtieth session): ``bench/cli_gpu_build.py`` times the alone baseline over a few batches, the build runs
for minutes, and a GPU that lowers its clocks under sustained load would make the baseline unfairly fast.

Runs the LTX-2 VAE (published config, random weights, bf16, cuDNN as the build sets it) on one resident batch
``--batches`` times back to back after 3 untimed, CUDA events per batch, with ``nvidia-smi``'s clocks, power,
temperature and throttle reasons at the start and three times during; prints one JSON line: the medians of the
first 5, all and the last 40 batches, the mean and the wall time.

On a GPU machine:
    PYTHONPATH=src:/tmp/site python3 bench/encoder_alone_sustained.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

from shardsmith.encode.vae import load_vae


def clocks() -> str:
    q = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=240)
    ap.add_argument("--shape", default="121x512x768", help="FxHxW of the clip")
    args = ap.parse_args()
    f, h, w = (int(v) for v in args.shape.split("x"))
    vae = load_vae("ltx2", config="published", dtype="bfloat16", device="cuda")
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True  # the build's modes
    x = torch.rand(1, 3, f, h, w, device="cuda", dtype=torch.bfloat16) * 2 - 1
    seen, times = [clocks()], []
    marks = {args.batches // 4, args.batches // 2, 5 * args.batches // 6}
    with torch.no_grad():
        for _ in range(3):
            vae.encode(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(args.batches):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            vae.encode(x)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
            if i in marks:
                seen.append(clocks())
        wall = time.perf_counter() - t0
    print(json.dumps({"clocks": seen, "first5": statistics.median(times[:5]), "all": statistics.median(times),
                      "last40": statistics.median(times[-40:]), "mean": sum(times) / len(times), "wall": wall}))


if __name__ == "__main__":
    main()
