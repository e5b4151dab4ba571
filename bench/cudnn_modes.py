"""What cuDNN's modes cost an encoder's batch (a diagnostic for BENCHMARKS.md §10, not a goal figure).

The build runs cuDNN's heuristics with deterministic kernels (``benchmark=False, deterministic=True``: the same
kernels in every process, so a resumed or a second build writes the same bytes); bench/cli_gpu_build.py's encoder
alone runs the autotuner (``benchmark=True``). On one resident bf16 batch of the published config (random
weights), in one process: the median batch time of each mode (3 warm-ups, then ``--repeats``), then ``--sustained``
batches in the build's mode back to back (does the GPU slow down under a long load?).

    PYTHONPATH=src:bench:tests python3 bench/cudnn_modes.py --family ltx2 --shape 1,3,121,512,768 --out r.json
"""

from __future__ import annotations

import argparse
import json
import statistics


def main() -> None:
    import torch

    from cli_gpu_build import batch_seconds

    from shardsmith.encode.vae import load_vae

    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="ltx2")
    ap.add_argument("--shape", default="1,3,121,512,768")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--sustained", type=int, default=60)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    vae = load_vae(args.family, config="published", dtype="bfloat16", device="cuda")
    x = torch.rand(*[int(v) for v in args.shape.split(",")], device="cuda", dtype=torch.bfloat16) * 2 - 1

    def times(n: int) -> list[float]:
        return batch_seconds(lambda: vae.encode(x), n)

    res: dict = {"family": args.family, "shape": args.shape, "gpu": torch.cuda.get_device_name(), "modes": {}}
    for name, bench, det in (("autotuner", True, False), ("heuristics", False, False),
                             ("heuristics_deterministic", False, True), ("autotuner_again", True, False)):
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = bench, det
        times(3)
        ts = times(args.repeats)
        res["modes"][name] = {"median_s": round(statistics.median(ts), 4), "min_s": round(min(ts), 4)}
        print(name, res["modes"][name], flush=True)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    ts = times(args.sustained)
    k = max(1, len(ts) // 6)
    res["sustained"] = {"batches": len(ts), "first_median_s": round(statistics.median(ts[:k]), 4),
                        "last_median_s": round(statistics.median(ts[-k:]), 4)}
    print("sustained", res["sustained"], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
