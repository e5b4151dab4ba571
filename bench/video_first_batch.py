"""Benchmark (CPU): when does the encoder get its first video clip, and how long does the build take,
with clips sent to the decode workers one at a time (``LatentPixelMaker.is_heavy``) vs in chunks of 8
(the pool's default for cheap items, what every item got before).

Dataset: ``--clips`` real-content pan clips (``tests/video_factory.pan_video``, libx264) of
``--frames`` frames at ``--size``; build: one ``latent_wds`` output, the tiny random-weight LTX-2 VAE
on the CPU, bucket ``WxHxF``, ``--workers`` decode workers. Variants alternate (ABBA) over
``--repeats``; each reports the manifest's ``models.steady_state.first_batch_done_s`` (seconds
after the models were loaded until the first batch was encoded) and the ``build()`` wall time.

    PYTHONPATH=src:tests /work/venv/bin/python bench/video_first_batch.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=16)
    ap.add_argument("--frames", type=int, default=49)
    ap.add_argument("--size", default="256x256", help="WxH")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from video_factory import pan_video

    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict
    from shardsmith.transform.latent_pixels import LatentPixelMaker

    w, h = (int(v) for v in args.size.split("x"))
    work = Path(tempfile.mkdtemp(prefix="vfb-"))
    photos = ["astronaut", "coffee", "chelsea", "rocket"]
    (work / "clips").mkdir()
    for i in range(args.clips):
        pan_video(work / "clips" / f"clip_{i:03d}.mp4", frames=args.frames, size=(w, h), photo=photos[i % 4],
                  fps=24 + i)  # distinct bytes per clip (the build drops exact duplicates)
    recipe = {"sources": [{"path": str(work / "clips")}], "geometry": {"buckets": [f"{w}x{h}x{args.frames}"]},
              "models": {"vae": {"family": "ltx2", "config": "tiny"}, "batch_size": 1, "compile": "off"},
              "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 100}]}
    heavy = LatentPixelMaker.__dict__["is_heavy"]  # the method as the class holds it

    def run(alone: bool) -> dict:
        LatentPixelMaker.is_heavy = heavy if alone else None
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        m = build(recipe_from_dict(recipe), out, quiet=True, workers=args.workers)
        dt = time.perf_counter() - t
        assert m["counts"]["written"] == args.clips, m["counts"]
        ss = m["models"]["steady_state"]
        return {"build_s": dt, "first_batch_done_s": ss["first_batch_done_s"], "timings": m["timings"]}

    names = {True: "clips one at a time", False: "chunks of 8 (before)"}
    res: dict[str, list] = {names[True]: [], names[False]: []}
    run(True)  # warm-up (imports, first model build)
    for r in range(args.repeats):
        for alone in ((True, False) if r % 2 == 0 else (False, True)):
            x = run(alone)
            res[names[alone]].append(x)
            print(f"# repeat {r + 1} {names[alone]:<22} build {x['build_s']:6.2f} s  first batch "
                  f"{x['first_batch_done_s']:6.2f} s", flush=True)
    LatentPixelMaker.is_heavy = heavy
    print(f"\n{args.clips} clips {args.frames}x{h}x{w}, {args.workers} workers, tiny LTX-2 on CPU, "
          f"{args.repeats} repeats\n")
    print("| variant | build s (median) | first batch done s (median) |")
    print("|---|---:|---:|")
    for name, xs in res.items():
        print(f"| {name} | {statistics.median(x['build_s'] for x in xs):.2f} | "
              f"{statistics.median(x['first_batch_done_s'] for x in xs):.2f} |")
    ratio = [a["build_s"] / b["build_s"] for a, b in zip(res[names[True]], res[names[False]])]
    first = [a["first_batch_done_s"] / b["first_batch_done_s"] for a, b in zip(res[names[True]], res[names[False]])]
    print(f"\nratio one-at-a-time / chunks, per repeat (median; min..max): build {statistics.median(ratio):.2f} "
          f"({min(ratio):.2f}..{max(ratio):.2f}), first batch {statistics.median(first):.2f} "
          f"({min(first):.2f}..{max(first):.2f})")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
