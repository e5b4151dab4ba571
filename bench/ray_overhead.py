"""The Ray engine's CPU-side overhead against the local engine on the same build (issue 21).

One dataset (``--photos`` real photos with captions, tiny SD VAE, MiniLM text, ``latent_wds`` +
``prompt_wds``), built with ``--gpus 2`` and two CPU "devices" (``SHARDSMITH_WORKER_DEVICES=cpu,cpu``)
by each engine, interleaved, ``--repeats`` times: ``shardsmith build recipe.yaml --out OUT --gpus 2
--engine local|ray --no-report -q`` in a subprocess, wall time from the command to its exit (for Ray: the
local cluster's start and stop included, as a user without a cluster meets it). Ratio = median Ray wall /
median local wall (goal <= 1.1); the bytes of both are compared too.

Usage: ``PYTHONPATH=src:tests python3 bench/ray_overhead.py --work /tmp/ro --out ro.json``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

from _cli import output_digests, timed_build  # noqa: E402


def _dataset(work: Path, n: int) -> Path:
    import yaml

    from media_factory import real_photos

    photos = work / "photos"
    if not photos.is_dir():
        for i, p in enumerate(real_photos(photos, n, seed=5, min_side=64, max_side=160)):
            p.with_suffix(".txt").write_text(f"a photo, number {i % 50}")
    recipe = work / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": str(photos)}], "geometry": {"buckets": ["64x64x1", "64x48x1"]},
        "models": {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"}, "device": "cpu",
                   "batch_size": 8},
        "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 32},
                    {"format": "prompt_wds", "dir": "prompts", "samples_per_shard": 64}]}))
    return recipe


def _run(recipe: Path, out: Path, engine: str) -> float:
    r = timed_build([str(recipe), "--gpus", "2", "--engine", engine, "--no-report", "-q", "--workers", "2"], out,
                    env={"HF_HUB_OFFLINE": "1", "SHARDSMITH_WORKER_DEVICES": "cpu,cpu"})
    if r.rc:
        raise SystemExit(f"{engine} build failed:\n{r.stderr_tail}")
    return r.exit_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--photos", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    recipe = _dataset(args.work, args.photos)
    walls: dict[str, list[float]] = {"local": [], "ray": []}
    for _ in range(args.repeats):
        for engine in ("local", "ray"):
            walls[engine].append(round(_run(recipe, args.work / engine, engine), 2))
            print(engine, walls[engine][-1], flush=True)
    same = output_digests(args.work / "local") == output_digests(args.work / "ray")
    med = {k: statistics.median(v) for k, v in walls.items()}
    res = {"photos": args.photos, "walls_s": walls, "median_s": med, "ratio": round(med["ray"] / med["local"], 3),
           "same_bytes": same, "cpus": os.cpu_count()}
    args.out.write_text(json.dumps(res, indent=2))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
