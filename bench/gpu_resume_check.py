"""Is a GPU build killed with -9 and resumed the same bytes as one that ran through? (issues 22/20: cuDNN's
kernels chosen by its deterministic heuristics, not by timing, in every process.)

For each workload (``--clips`` LTX-2 pans -> ``.precomputed/``, ``--images`` JPEGs -> SD-VAE 256² ``latent_wds``;
published configs, random weights, bf16): one build through the CLI that runs through, then one killed with
SIGKILL once ``--kill-after`` output files exist, resumed by the same command; reported: files, whether every
output file has the same bytes, the files written before the kill.

Usage (GPU machine): PYTHONPATH=src:tests:bench python3 bench/gpu_resume_check.py --work /tmp/rc --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _cli import REPO, output_digests, timed_build
from cli_gpu_build import add_copies, make_photos
from gpu_scaling import image_recipe, make_clips, video_recipe


def _files(out: Path) -> int:
    return sum(1 for p in out.rglob("*") if p.is_file() and ".shardsmith" not in p.parts and p.suffix in (".pt", ".tar"))


def killed_then_resumed(rp: Path, out: Path, kill_after: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-m", "shardsmith", "build", str(rp), "--out", str(out), "--no-report", "-q"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while p.poll() is None and _files(out) < kill_after:
        time.sleep(0.05)
    if p.poll() is not None:
        return {"error": "the build ended before it could be killed"}
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    before = _files(out)
    time.sleep(1.0)
    r = subprocess.run([sys.executable, "-m", "shardsmith", "build", str(rp), "--out", str(out), "--no-report", "-q"],
                       env=env, capture_output=True, text=True)
    return {"files_before_kill": before, "resume_rc": r.returncode, "stderr": r.stderr[-1500:] if r.returncode else ""}


def check(name: str, recipe: dict, work: Path, kill_after: int) -> dict:
    rp = work / f"{name}.json"
    rp.write_text(json.dumps(recipe))
    through = timed_build([str(rp), "--no-report", "-q"], work / f"through_{name}")
    res = {"name": name, "through_rc": through.rc, "through_wall_s": through.wall_s}
    res.update(killed_then_resumed(rp, work / f"resumed_{name}", kill_after))
    a, b = output_digests(work / f"through_{name}"), output_digests(work / f"resumed_{name}")
    res.update(files=len(a), same_bytes=a == b and bool(a),
               differing=sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))[:10])
    print(json.dumps(res), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--clips", type=int, default=32)
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--kill-after", type=int, default=24, help="output files (.pt / .tar) before the kill")
    ap.add_argument("--cpu", action="store_true", help="tiny models, small clips (a dry run)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    procs = os.cpu_count() or 4
    h, w = (64, 96) if args.cpu else (512, 768)
    make_clips(args.work / "clips", args.clips, h, w, procs)
    results = [check("video", video_recipe(args.work / "clips", h, w, 4, args.cpu), args.work, args.kill_after)]
    make_photos(args.work / "photos", args.images // 2, 288, 640, procs)
    add_copies(args.work / "photos", 2)
    recipe = image_recipe(args.work / "photos", args.cpu)
    recipe["outputs"][0]["samples_per_shard"] = 64
    results.append(check("images", recipe, args.work, 8))
    args.out.write_text(json.dumps(results, indent=1))
    return 0 if all(r.get("same_bytes") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
