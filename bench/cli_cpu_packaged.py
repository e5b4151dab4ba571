"""A compiled image build that loads its encoder's AOTInductor package against the same build eager, through the
CLI on this machine's CPU (BENCHMARKS.md §10, twenty-second session): ``shardsmith build recipe.yaml --out DIR``
from the command to the manifest, ``models.compile: off`` and ``on`` alternating, after one untimed ``on`` build
that compiles the package into a fresh cache (its time is reported too). Also whether the ``on`` builds imported
diffusers (they should not: ``model_built`` in the manifest). ``--route program``: the cache's verdict on this
machine's package loader is set to broken first, so the ``on`` builds run the exported program with
``torch.compile`` instead (what a machine whose loader crashes does).

    python bench/cli_cpu_packaged.py --work /tmp/pk --out bench/results/cli_cpu_packaged.json [--route program]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def timed_build(recipe: dict, work: Path, name: str, env: dict) -> dict:
    rp, out = work / f"{name}.yaml", work / f"out_{name}"
    rp.write_text(json.dumps(recipe))
    subprocess.run(["rm", "-rf", str(out)], check=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "shardsmith", "build", str(rp), "--out", str(out), "-q", "--no-report"],
                   check=True, env=env)
    wall = time.perf_counter() - t
    m = json.loads((out / "manifest.json").read_text())
    return {"name": name, "wall_s": wall, "written": m["counts"]["written"], "compile": m["models"]["compile"],
            "first_batch_done_s": (m["models"].get("steady_state") or {}).get("first_batch_done_s"),
            "load_models_s": m["timings"].get("load_models_s")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--config", default="tiny", help="models.vae.config of the SD VAE")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--route", choices=("package", "program"), default="package")
    args = ap.parse_args()
    from media_factory import real_photos

    args.work.mkdir(parents=True, exist_ok=True)
    src = args.work / "src"
    if not src.is_dir():
        real_photos(src, args.images, seed=1, min_side=args.size, max_side=4 * args.size)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(args.work / "cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(["rm", "-rf", str(args.work / "cache")], check=True)
    if args.route == "program":  # this machine's loader marked broken: no package, the exported program instead
        sys.path.insert(0, str(REPO / "src"))
        from shardsmith.encode import aot_package, packaged_encoder

        loader = aot_package.loader_path(args.work / "cache", packaged_encoder._device_name("cpu"))
        loader.parent.mkdir(parents=True)
        loader.write_text(json.dumps({"ok": False, "why": "marked broken by bench/cli_cpu_packaged.py --route program"}))

    def recipe(compile_: str) -> dict:
        return {"sources": [{"path": str(src)}], "geometry": {"buckets": [f"{args.size}x{args.size}x1"]},
                "images": {"upscale": True}, "split": {"holdout": 0},
                "models": {"vae": {"family": "sd", "config": args.config}, "batch_size": 16, "compile": compile_,
                           "device": "cpu"},
                "outputs": [{"format": "latent_wds", "dir": "lat"}]}

    res: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "cpus": os.cpu_count(),
                 "cold": timed_build(recipe("on"), args.work, "cold", env), "builds": []}
    for i in range(args.repeats):
        for c in ("off", "on"):
            res["builds"].append(timed_build(recipe(c), args.work, f"{c}_{i}", env))
            print(json.dumps({k: v for k, v in res["builds"][-1].items() if k != "compile"}), flush=True)
    off = [b["wall_s"] for b in res["builds"] if b["name"].startswith("off")]
    on = [b["wall_s"] for b in res["builds"] if b["name"].startswith("on")]
    res["median_off_s"], res["median_on_s"] = statistics.median(off), statistics.median(on)
    res["eager_over_packaged"] = res["median_off_s"] / res["median_on_s"]
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("median_off_s", "median_on_s", "eager_over_packaged")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
