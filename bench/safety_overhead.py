"""Benchmark: what issue 14's safety work costs a whole CPU build, through the CLI.

Builds one folder of real photos into a WebDataset and an EDM ZIP with ``shardsmith build``
(a fresh interpreter, a fresh ``--out``), alternately with the code of two checkouts (a
baseline ``src`` and this one), ``--repeats`` times each, and reports the median wall time of
each and their ratio. The baseline is another checkout's ``src`` folder (``git worktree add
/tmp/base <rev>``), put first on ``PYTHONPATH``.

    python bench/safety_overhead.py --base-src /tmp/base/src --images 3000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def _recipe(root: Path, photos: Path) -> Path:
    import yaml

    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "sources": [{"path": str(photos)}], "split": {"holdout": 0.05, "seed": 1},
        "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 500, "image": {"max_side": 128}},
                    {"format": "zip", "path": "c64.zip", "resolution": 64, "upscale": True}]}))
    return path


def _build(src: Path, recipe: Path, out: Path, workers: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "shardsmith", "build", str(recipe), "--out", str(out), "--quiet",
                    "--workers", str(workers)], env=env, check=True)
    assert (out / "manifest.json").exists()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-src", type=Path, required=True)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from media_factory import real_photos

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        real_photos(root / "photos", a.images, seed=7, min_side=96, max_side=320)
        recipe = _recipe(root, root / "photos")
        times: dict[str, list[float]] = {"base": [], "this": []}
        for i in range(a.repeats):
            for name, src in (("base", a.base_src), ("this", REPO / "src")):
                times[name].append(round(_build(src, recipe, root / f"{name}{i}", a.workers), 3))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({"images": a.images, "workers": a.workers, "seconds": times, "median_s": med,
                          "ratio_this_over_base": round(med["this"] / med["base"], 3)}, indent=1))


if __name__ == "__main__":
    main()
