"""A fresh process loads the image VAE's Inductor artifact from a warm compile cache and times its first calls, with
what Inductor's autotune cache did (a diagnostic, BENCHMARKS.md §10, twenty-eighth session).

``on``: ``encode/coordesc_cache.keep()`` applied, as a build does; ``off``: torch as installed. Printed as JSON: the
seconds to torch and CUDA, to the artifact loaded, and of four calls on a resident batch of zeros (channels-last, as
the build feeds it); ``coordesc_cache.counts()``; Inductor's ``coordesc_tuning_bench`` counter (the compile-time
tuning replayed from the cached graph included); how often the recheck ran; and the artifact's autotune entries as
they were written (marked or not, against the file's entry before).

On a GPU machine, after a compiled build filled the cache (``bench/cli_gpu_build.py --compile on``):
    PYTHONPATH=src:/tmp/site python3 bench/coordesc_probe.py on
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from pathlib import Path

T0 = time.perf_counter()


def _entry(path: str) -> dict | None:
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, ValueError):
        return None


def _watch(ac, th, seen: dict) -> None:
    """Wrap (outermost) the artifact's autotune entries' writes and the recheck, to count them."""
    populate = ac.AutotuneCacheArtifact.populate_cache

    def logged_populate(self):
        kept, new = _entry(os.path.join(ac.cache_dir(), self.key)), json.loads(self.content)
        seen["populate"].append({"kept_marked": bool(kept and kept.get("found_by_coordesc")),
                                 "new_marked": bool(new.get("found_by_coordesc")),
                                 "same_configs": bool(kept) and kept.get("configs_hash") == new.get("configs_hash")})
        return populate(self)

    recheck = th.CachingAutotuner.recheck_autotune_cache

    def counted_recheck(self, *args, **kwargs):
        seen["recheck_calls"] += 1
        return recheck(self, *args, **kwargs)

    ac.AutotuneCacheArtifact.populate_cache = logged_populate
    th.CachingAutotuner.recheck_autotune_cache = counted_recheck


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["on", "off"])
    ap.add_argument("--shape", default="64,3,256,256")
    args = ap.parse_args()
    import torch

    from shardsmith.encode import aot_package, coordesc_cache
    from shardsmith.encode import compile as cc

    cc.use_cache_dir()
    if args.mode == "off":
        coordesc_cache.keep = lambda: False  # (load_artifact calls it)
    else:
        coordesc_cache.keep()  # (first: the counting below wraps the mends)
    from torch._dynamo.utils import counters
    from torch._inductor.runtime import autotune_cache as ac
    from torch._inductor.runtime import triton_heuristics as th

    seen: dict = {"populate": [], "recheck_calls": 0}
    _watch(ac, th, seen)
    artifact = sorted(glob.glob(str(aot_package.package_dir(cc.cache_dir()) / "*.cuda0.inductor.bin")))[0]
    device = torch.device("cuda:0")
    torch.zeros(1, device=device)
    t1 = time.perf_counter()
    run = aot_package.load_artifact(Path(artifact), device, {})
    t2 = time.perf_counter()
    shape = [int(v) for v in args.shape.split(",")]
    x = torch.zeros(shape, dtype=torch.bfloat16, device=device).contiguous(memory_format=torch.channels_last)
    calls = []
    for _ in range(4):
        t = time.perf_counter()
        run(x)
        torch.cuda.synchronize()
        calls.append(round(time.perf_counter() - t, 4))
    entries = seen["populate"]
    print(json.dumps({"mode": args.mode, "import_init_s": round(t1 - T0, 2), "load_s": round(t2 - t1, 2),
                      "calls": calls, "coordesc_tuning_bench": counters["inductor"]["coordesc_tuning_bench"],
                      "counts": coordesc_cache.counts(), "recheck_calls": seen["recheck_calls"],
                      "populate": {"n": len(entries), **{k: sum(e[k] for e in entries)
                                                         for k in ("new_marked", "kept_marked", "same_configs")}}}))


if __name__ == "__main__":
    main()
