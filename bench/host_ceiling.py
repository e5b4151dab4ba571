"""Host ceiling of the latent image build: the real ``build()`` with the VAE's encoder replaced by
a free stand-in (same output shape, no arithmetic), so what is left is the host side: JPEG decode
workers, result transport, batch staging, serialisation, shard writes, the ledger.

If this rate is not well above the compiled encoder alone, the host side is the limit of the
end-to-end image build. ``--profile`` adds a cProfile of the main thread (where the staging,
serialising and writing run; the decode workers are other processes) and prints its top entries.

``--variants new,torch_save,narrow_pipe`` runs each variant ``--repeats`` times, interleaved, and
reports the median steady-state rate of each and its ratio to the first.

Usage: PYTHONPATH=src:tests python3 bench/host_ceiling.py --images 2048 --workers 14 --out r.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch


def null_encoder(vae) -> None:
    """Replace ``vae.encode`` by a stand-in that returns a latent-shaped view of the input."""
    c, s = vae.spec.latent_channels, vae.spec.spatial

    def encode(x, **_):
        return x[:, :1, ::s, ::s].expand(-1, c, -1, -1).to(vae.torch_dtype)

    vae.encode = encode


def apply_variant(name: str):
    """Switch one host-side change back to what it replaced; returns the undo."""
    import shardsmith.sinks.latent_members as lm
    from shardsmith.parallel import Workers

    if name == "new":
        return lambda: None
    if name == "torch_save":
        fast = lm.pt_bytes

        def slow(obj):
            buf = io.BytesIO()
            torch.save(obj, buf)
            return buf.getvalue()

        lm.pt_bytes = slow

        def undo():
            lm.pt_bytes = fast
        return undo
    if name == "thread_plan":  # probing on the planner's thread pool, not the worker processes
        import shardsmith.build as b

        plan = b.make_plan

        def threads_only(*a, **k):
            k["workers"] = None
            return plan(*a, **k)

        b.make_plan = threads_only
        return lambda: setattr(b, "make_plan", plan)
    if name == "narrow_pipe":
        Workers.RESULT_PIPE_BYTES = 0
        return lambda: setattr(Workers, "RESULT_PIPE_BYTES", 1 << 20)
    raise SystemExit(f"unknown variant {name!r}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--variants", default="new",
                    help="comma list, the first is the baseline: new (the code as it is), torch_save (members "
                         "serialised by torch.save), narrow_pipe (the pool's default 64 KiB result pipe), "
                         "thread_plan (items probed on a thread pool instead of the worker processes)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from media_factory import real_photos

    from shardsmith.build import build
    from shardsmith.encode import stage as stage_mod
    from shardsmith.recipe import recipe_from_dict

    work = Path(tempfile.mkdtemp(prefix="hostceil-"))
    real_photos(work / "photos", args.images, seed=0, min_side=256, max_side=480)
    load = stage_mod.load_vae

    def load_null(*a, **k):
        vae = load(*a, **k)
        null_encoder(vae)
        return vae

    stage_mod.load_vae = load_null
    recipe = recipe_from_dict({
        "sources": [{"path": str(work / "photos")}], "geometry": {"buckets": [f"{args.size}x{args.size}x1"]},
        "models": {"vae": {"family": "sd", "config": "tiny", "dtype": "bfloat16"}, "batch_size": args.batch,
                   "compile": "off"},
        "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 1000, "latent_dtype": "bfloat16"}]})
    runs = []
    prof_text = None
    variants = args.variants.split(",")
    for r in range(args.repeats):
        for v in variants:  # interleaved, so drift on a shared machine hits every variant alike
            undo = apply_variant(v)
            out = work / f"out{r}_{v}"
            prof = cProfile.Profile() if args.profile and r == args.repeats - 1 and v == variants[0] else None
            t = time.perf_counter()
            cpu0 = time.thread_time()  # the main thread's CPU (staging, serialising, the ledger...)
            if prof:
                prof.enable()
            m = build(recipe, out, quiet=True, workers=args.workers)
            main_cpu = time.thread_time() - cpu0
            if prof:
                prof.disable()
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
                pstats.Stats(prof, stream=s).sort_stats("cumtime").print_stats(
                    "shardsmith|torch/serialization|pin_memory|multiprocessing|concurrent", 30)
                prof_text = s.getvalue()
            dt = time.perf_counter() - t
            undo()
            steady = (m["models"].get("steady_state") or {})
            runs.append({"variant": v, "repeat": r, "seconds": dt, "items_per_s": m["counts"]["written"] / dt,
                         "steady_items_per_s": steady.get("items_per_s"), "stage_seconds": m["models"]["seconds"],
                         "timings": m.get("timings"), "profiled": prof is not None,
                         "main_thread_cpu_s": round(main_cpu, 3),
                         "main_thread_cpu_us_per_item": round(main_cpu / m["counts"]["written"] * 1e6, 1)})
            print(json.dumps(runs[-1]), flush=True)
            shutil.rmtree(out)
    summary = {}
    for v in variants:
        rates = [x["steady_items_per_s"] for x in runs if x["variant"] == v and not x["profiled"]
                 and x["steady_items_per_s"]]
        plans = [x["timings"]["plan_s"] for x in runs if x["variant"] == v]
        summary[v] = {"median_steady_items_per_s": statistics.median(rates) if rates else None, "runs": len(rates),
                      "median_plan_s": statistics.median(plans),
                      "median_seconds": statistics.median(x["seconds"] for x in runs if x["variant"] == v)}
    base = summary[variants[0]]["median_steady_items_per_s"]
    for v in variants:
        m_ = summary[v]["median_steady_items_per_s"]
        summary[v]["ratio_vs_" + variants[0]] = m_ / base if m_ and base else None
    print(json.dumps(summary, indent=1))
    res = {"cpus": os.cpu_count(), "workers": args.workers, "images": args.images, "batch": args.batch,
           "cuda": torch.cuda.is_available(), "summary": summary, "runs": runs}
    if prof_text:
        print(prof_text)
        res["profile_main_thread"] = prof_text
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
