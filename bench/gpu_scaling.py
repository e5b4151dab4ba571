"""Scaling over GPUs through the CLI (issue 22): ``shardsmith build recipe.yaml --out DIR --gpus N`` for each N,
in one lease, on the GPU-speed issue's workloads; wall time from the command to the manifest.

Workloads (generated on the leased machine):
- **images**: ``--images`` random crops of scikit-image photos, 288-640 px a side, each ``--copies`` times with
  bytes after the end-of-image marker (40,960 files by default) -> SD-VAE (published config, random weights,
  bf16) 256² ``latent_wds``.
- **video**: ``--clips`` pans across real photos, 121-137 frames at ``--video`` (768x512) with a caption each
  -> ``.precomputed/`` with the LTX-2 VAE (published config, random weights, bf16) at 121 frames and the tiny T5,
  ``unit: --video-unit``.

For each workload and each N of ``--gpus`` (in that order), one build; reported: wall to the manifest,
items/s, speedup over the lease's one-GPU build and its ratio to N (goal >= 0.9), whether every output file has
the bytes of the one-GPU build's, and each worker's units, items, items/s and GPU idle (from the manifest's
``distribute`` block; the one-GPU build's own steady state for N = 1).

Usage (on a machine with N GPUs):
  PYTHONPATH=src:tests:bench python3 bench/gpu_scaling.py --work /tmp/gs --out r.json --gpus 1,2 [--compile on]
  (``--compile on``: the untimed warm-up build fills the persistent compile cache; the timed builds start warm.)
  (``SHARDSMITH_WORKER_DEVICES=cpu,cpu`` and ``--cpu`` run the same code on CPU "devices" with tiny models.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from _cli import output_digests, subset_build, timed_build
from _media import make_clips
import cli_gpu_build
from cli_gpu_build import add_copies, make_photos


def image_recipe(src: Path, cpu: bool, compile_: str = "off") -> dict:
    """The GPU-speed issue's image recipe (``cli_gpu_build.image_recipe``); ``cpu``: the tiny VAE."""
    r = cli_gpu_build.image_recipe(src, 256, "auto", 64, compile_)
    if cpu:
        r["models"]["vae"]["config"] = "tiny"
    return r


def video_recipe(src: Path, h: int, w: int, unit: int, cpu: bool) -> dict:
    """The GPU-speed issue's LTX-2 recipe (``cli_gpu_build.video_recipe``) with ``unit`` clips a unit; ``cpu``:
    the tiny VAE at 9 frames."""
    r = cli_gpu_build.video_recipe(src, h, w, 9 if cpu else 121, "off")
    r["outputs"][0]["unit"] = unit
    if cpu:
        r["models"]["vae"]["config"] = "tiny"
    return r


def _workers(manifest: dict) -> list[dict]:
    """Each GPU worker's figures from the manifest's ``distribute`` blocks (every output, every split)."""
    out = []
    for block in (manifest.get("outputs") or {}).values():
        for split, d in (block.get("distribute") or {}).items():
            for w in d.get("workers", []):
                ss = w.get("steady_state") or {}
                out.append({"split": split, "rank": w.get("rank"), "device": w.get("device"), "units": w.get("units"),
                            "samples": w.get("samples"), "seconds": w.get("seconds"),
                            "samples_per_s": w.get("samples_per_s"), "steady_items_per_s": ss.get("items_per_s"),
                            "first_batch_done_s": ss.get("first_batch_done_s"), "gpu_idle": ss.get("gpu_idle"),
                            "load_s": w.get("load_s"), "ready_s": w.get("ready_s"), "setup_s": w.get("setup_s"),
                            "exit_code": w.get("exit_code"), "error": w.get("error")})
    return out


def run_workload(name: str, recipe: dict, work: Path, gpus: list[int]) -> dict:
    rp = work / f"{name}.json"
    rp.write_text(json.dumps(recipe))
    # untimed: the libraries' files in the page cache (and a warm compile cache), as after an earlier build
    res: dict = {"name": name, "builds": [], "warm_up_s": subset_build(recipe, Path(recipe["sources"][0]["path"]), work,
                                                                       256 if name == "images" else 16,
                                                                       ["--gpus", str(max(gpus))])}
    base = None
    for n in gpus:
        out = work / f"out_{name}_{n}"
        r = timed_build([str(rp), "--gpus", str(n), "--no-report"], out)
        b: dict = {"gpus": n, "rc": r.rc, "wall_s": r.wall_s, "exit_s": r.exit_s}
        if r.rc:
            b["stderr"] = r.stderr_tail
            res["builds"].append(b)
            print(json.dumps(b), flush=True)
            continue
        m = r.manifest
        b["written"] = m["counts"]["written"]
        b["failed"], b["skipped"] = m["counts"]["failed"], m["counts"]["skipped"]
        b["items_per_s"] = b["written"] / r.wall_s
        b["timings"] = m.get("timings")
        b["steady_state"] = (m.get("models") or {}).get("steady_state")
        b["workers"] = _workers(m)
        if any(w["exit_code"] for w in b["workers"]):
            b["stderr"] = r.stderr_tail
        digests = output_digests(out)
        b["files"] = len(digests)
        if base is None:
            base = (r.wall_s, digests)
        else:
            b["speedup"] = base[0] / r.wall_s
            b["speedup_per_gpu"] = b["speedup"] / n
            b["same_bytes_as_first"] = digests == base[1]
            b["files_differing"] = sorted(k for k in set(digests) | set(base[1]) if digests.get(k) != base[1].get(k))[:10]
        res["builds"].append(b)
        print(json.dumps({k: v for k, v in b.items() if k not in ("timings", "steady_state")}), flush=True)
        if n != gpus[0]:
            os.system(f"rm -rf {out}")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpus", default="1,2")
    ap.add_argument("--images", type=int, default=10240)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--clips", type=int, default=240)
    ap.add_argument("--video", default="512x768", help="HxW of the clips")
    ap.add_argument("--video-unit", type=int, default=8)
    ap.add_argument("--skip", default="", help="workloads to leave out: images,video")
    ap.add_argument("--compile", default="off", help="models.compile of the image builds (on: the warm-up build "
                    "fills the persistent compile cache, so the timed builds start warm, as the issue asks)")
    ap.add_argument("--cpu", action="store_true", help="tiny models and small clips (a dry run on CPU devices)")
    args = ap.parse_args()
    procs = os.cpu_count() or 4
    gpus = [int(g) for g in args.gpus.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    res: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "cpus": procs, "workloads": []}
    if "images" not in args.skip:
        src = args.work / "src_images"
        gen = make_photos(src, args.images, 288, 640, procs)
        files = add_copies(src, args.copies) if args.copies > 1 else args.images
        w = run_workload("images", image_recipe(src, args.cpu, args.compile), args.work, gpus)
        w.update(gen_s=gen, files=files)
        res["workloads"].append(w)
        args.out.write_text(json.dumps(res, indent=1))
    if "video" not in args.skip:
        h, w_ = (int(v) for v in args.video.split("x"))
        src = args.work / "src_video"
        import time

        t = time.perf_counter()
        make_clips(src, args.clips, h, w_, procs)
        w = run_workload("video", video_recipe(src, h, w_, args.video_unit, args.cpu), args.work, gpus)
        w.update(gen_s=time.perf_counter() - t, files=args.clips)
        res["workloads"].append(w)
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
