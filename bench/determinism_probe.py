"""Are latents the same bytes in two processes, whatever the batch neighbours, with cuDNN's autotuner on and off?
And what does turning it off cost the encoder? (issue 22: byte-identical output across ``--gpus N``)

For each model (SD-VAE 256², batch 64; LTX-2 VAE ``--video`` frames, batch 1; published configs, random
weights from one seed, bf16) and each setting (``benchmark``: ``cudnn.benchmark = True``; ``deterministic``:
``benchmark = False, cudnn.deterministic = True``), two fresh processes encode the same seeded inputs; the
second puts each batch's rows in another order. Reported: whether every row's latent is the same bytes in both
processes, and the median encoder time per batch (10 after 3 warm-up batches) of each process.

Usage (GPU machine): PYTHONPATH=src python3 bench/determinism_probe.py --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import hashlib, json, statistics, sys, time
import torch
setting, family, shape, batch, shuffle = sys.argv[1], sys.argv[2], [int(v) for v in sys.argv[3].split("x")], int(sys.argv[4]), sys.argv[5] == "1"
torch.backends.cudnn.benchmark = setting == "benchmark"
torch.backends.cudnn.deterministic = setting == "deterministic"
from shardsmith.encode.vae import load_vae
torch.manual_seed(0)
vae = load_vae(family, config="published", dtype="bfloat16", device="cuda")
g = torch.Generator().manual_seed(1)
n = 2 * batch if batch > 1 else 4
x = torch.rand((n, *shape), generator=g).mul(2).sub(1).to(torch.bfloat16)
digests = [None] * n
order = list(range(n))
if shuffle:
    order = order[::-1]
times = []
with torch.inference_mode():
    for rep in range(13):
        for lo in range(0, n, batch):
            idx = order[lo:lo + batch]
            xb = x[idx].cuda()
            torch.cuda.synchronize(); t = time.perf_counter()
            lat = vae.encode(xb)
            torch.cuda.synchronize(); times.append(time.perf_counter() - t)
            if rep == 0:
                for k, i in enumerate(idx):
                    digests[i] = hashlib.sha256(lat[k].float().cpu().numpy().tobytes()).hexdigest()
print(json.dumps({"digests": digests, "median_batch_s": statistics.median(times[3 * (n // batch):])}))
"""


def child(setting: str, family: str, shape: str, batch: int, shuffle: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", CHILD, setting, family, shape, str(batch), "1" if shuffle else "0"],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        return {"error": r.stderr[-2500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--video", default="121x512x768", help="FxHxW of the LTX-2 input")
    args = ap.parse_args()
    f, h, w = args.video.split("x")
    models = [("sd", "3x256x256", 64), ("ltx2", f"3x{f}x{h}x{w}", 1)]
    res = []
    for family, shape, batch in models:
        for setting in ("benchmark", "deterministic"):
            a, b = child(setting, family, shape, batch, False), child(setting, family, shape, batch, True)
            row = {"family": family, "shape": shape, "batch": batch, "setting": setting,
                   "a_median_batch_s": a.get("median_batch_s"), "b_median_batch_s": b.get("median_batch_s"),
                   "same_bytes": a.get("digests") == b.get("digests") if "digests" in a and "digests" in b else None,
                   "errors": [x["error"] for x in (a, b) if "error" in x]}
            if row["same_bytes"] is False:
                row["rows_differing"] = sum(p != q for p, q in zip(a["digests"], b["digests"]))
            res.append(row)
            print(json.dumps(row), flush=True)
            args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
