"""Where does a shardsmith build spend time and memory? (diagnostics for bench/RESULTS-reshard.md)

Builds ``--n`` photos (default 500, 300..800 px, workers=1) and prints
- per-phase wall / CPU time (ms per image) and VmRSS / VmHWM at phase boundaries, by wrapping
  ``make_plan``, ``WdsSampleMaker.__call__``, ``WdsSink.write_unit``, ``_manifest`` ...;
- a cProfile of a second build (``--profile``; cProfile does not see the planner's threads).

    /work/venv/bin/python bench/profile_build.py --n 500 --work /tmp/ss-prof [--profile]
    /work/venv/bin/python bench/profile_build.py --photos /tmp/ss-rss/set_50000   # RSS per phase
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _media import real_photos  # noqa: E402


def status_mib(key: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--photos", default=None, help="use this folder instead of generating --n photos")
    ap.add_argument("--work", default="/tmp/ss-prof")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    work = Path(args.work)
    photos = Path(args.photos) if args.photos else work / f"photos_{args.n}"
    if not args.photos:
        real_photos(photos, args.n, seed=0, min_side=300, max_side=800)
    n = sum(1 for _ in photos.glob("*.jpg"))

    import shardsmith.build as B
    import shardsmith.sinks.wds as W
    import shardsmith.transform.samples as S
    from shardsmith.recipe import recipe_from_dict

    stats: dict[str, list[float]] = {}
    marks: list[tuple[str, float, float]] = []

    def wrap(owner, name, mark=False):
        orig = getattr(owner, name)

        def wrapper(*a, **k):
            if mark:
                marks.append((f"{name} start", status_mib("VmRSS"), status_mib("VmHWM")))
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return orig(*a, **k)
            finally:
                s = stats.setdefault(name, [0.0, 0.0, 0])
                s[0] += time.perf_counter() - t0
                s[1] += time.process_time() - c0
                s[2] += 1
                if mark:
                    marks.append((f"{name} end", status_mib("VmRSS"), status_mib("VmHWM")))
        setattr(owner, name, wrapper)

    for name in ("open_sources", "make_plan", "_run_output", "_manifest"):
        wrap(B, name, mark=True)
    wrap(S.WdsSampleMaker, "__call__")
    wrap(W.WdsSink, "write_unit")
    wrap(W.WdsSink, "finalize")

    recipe = recipe_from_dict({"sources": [{"path": str(photos)}],
                               "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 1000,
                                            "image": {"format": "jpg", "quality": 95, "max_side": 256}}]},
                              base_dir=".")
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    marks.append(("before build", status_mib("VmRSS"), status_mib("VmHWM")))
    t0, c0 = time.perf_counter(), time.process_time()
    B.build(recipe, out, quiet=True, workers=1)
    tw, tc = time.perf_counter() - t0, time.process_time() - c0
    print(f"n={n}: build wall {1e3 * tw / n:.3f} ms/img, CPU {1e3 * tc / n:.3f} ms/img "
          "(CPU includes the planner's threads)")
    print(f"{'phase':<20} {'wall ms/img':>12} {'CPU ms/img':>11} {'calls':>7}")
    for name, (w, c, k) in sorted(stats.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:<20} {1e3 * w / n:12.3f} {1e3 * c / n:11.3f} {k:7d}")
    print(f"{'phase boundary':<24} {'VmRSS MiB':>10} {'VmHWM MiB':>10}")
    for label, rss, hwm in marks:
        print(f"{label:<24} {rss:10.1f} {hwm:10.1f}")
    if args.profile:
        shutil.rmtree(out, ignore_errors=True)
        pr = cProfile.Profile()
        pr.enable()
        B.build(recipe, out, quiet=True, workers=1)
        pr.disable()
        st = pstats.Stats(pr)
        st.sort_stats("cumtime").print_stats(30)
        st.sort_stats("tottime").print_stats(20)
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
