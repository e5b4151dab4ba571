"""Benchmark: peak RSS of a shardsmith build, verify, scan, inspect and repair as the item count grows (goal: 200k/2k <= 1.05, issue 24).

Every build runs in a fresh interpreter (``python -c``) that builds a folder of small real
JPEGs (32..64 px sides) into a fresh output folder and reports
``getrusage(RUSAGE_SELF).ru_maxrss`` (the parent's peak) and ``getrusage(RUSAGE_CHILDREN)
.ru_maxrss`` (the largest peak of any joined worker process; 0 with workers=1). A
separate interpreter that only imports shardsmith gives the fixed start-up footprint.
The two sizes run interleaved (small, large, small, large ...); the median of the repeats
is reported.

    /work/venv/bin/python bench/rss.py --sizes 2000,50000 --repeats 3 --workers 1,2
    python bench/rss.py --tiny --sizes 2000,50000,200000 --repeats 3 --workers 2   # issue 24
    python bench/rss.py --tiny --sizes 2000,50000,200000 --repeats 3 --commands verify,scan
    python bench/rss.py --tiny --sizes 2000,50000,200000 --repeats 3 --commands inspect,repair

``--commands verify,scan``: the CLI's ``shardsmith verify DATASET --quiet`` (world 2 x workers 2, on
the wds dataset one untimed build made of each set) and ``shardsmith scan SET --quiet``, each in a
fresh interpreter that reports its own ``VmHWM`` and ``ru_maxrss`` at exit (the main process; verify's
ranks and their workers are its children), interleaved and the median of the repeats as for build.

``--commands inspect,repair``: ``shardsmith inspect DATASET`` and ``shardsmith repair DATASET --quiet`` on
the same built wds dataset as verify (a healthy dataset: repair only reads it and finds nothing to change),
measured the same way.

``--tiny``: distinct 8x8 random-pixel PNGs instead of photos (200k in about a minute; the build's
per-item cost, not its pixel work, is what grows the parent).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _media import machine_info  # noqa: E402  (stdlib only: keeps this driver's RSS small, see below)

# Media are generated in a separate interpreter: on Linux a child's ru_maxrss starts from the
# peak of the process image it was exec'd from (the forked driver), so a driver bloated by
# image generation would inflate every measured child's ru_maxrss. The children also report
# VmHWM from /proc/self/status, which belongs to the exec'd image only.
GEN = r"""
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from _media import link_subset, real_photos
work, big, lo, hi = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if lo == 0:  # --tiny
    import numpy as np
    from PIL import Image
    d = work / f"tiny_{big}"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    files = []
    for i in range(big):
        files.append(d / f"{i:07d}.png")
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(files[-1])
else:
    files = real_photos(work / f"small_{big}_{lo}-{hi}", big, seed=0, min_side=lo, max_side=hi)
for n in map(int, sys.argv[6].split(",")):
    assert len(link_subset(files[:n], work / f"set_{n}")) == n
"""

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from shardsmith.recipe import recipe_from_dict
from shardsmith.build import build
src, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
after_import = hwm()
recipe = recipe_from_dict({"sources": [{"path": src}],
                           "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 1000,
                                        "image": {"format": "jpg", "quality": 95, "max_side": 256}}]},
                          base_dir=".")
t0 = time.perf_counter()
build(recipe, out, quiet=True, workers=workers)
dt = time.perf_counter() - t0
written = sum(json.loads((Path(out) / "wds" / "shard_count.json").read_text()).values())
print(json.dumps({"self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "self_hwm_kib": hwm(),
                  "children_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                  "after_import_kib": after_import, "seconds": dt, "written": written}))
"""

# one CLI command (sys.argv[1:]) in this interpreter; its peaks are printed to stderr at exit
CLI_CHILD = r"""
import atexit, json, os, resource, sys, time
t0 = time.perf_counter()
def peaks():
    hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
    os.write(2, ("PEAKS " + json.dumps({"self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                 "self_hwm_kib": hwm, "children_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                 "seconds": time.perf_counter() - t0}) + "\n").encode())
atexit.register(peaks)
sys.argv = ["shardsmith", *sys.argv[1:]]
from shardsmith.cli import app
app()
"""

IMPORT_ONLY = r"""
import json, resource
import shardsmith.build, shardsmith.recipe
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({"self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "self_hwm_kib": hwm}))
"""


def run_child(code: str, *args: str) -> dict:
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"child failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def mib(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2000,50000", help="item counts, comma separated (first = reference)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--work", default=None, help="work folder (default: a temporary folder, removed at the end)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--min-side", type=int, default=32)
    ap.add_argument("--max-side", type=int, default=64)
    ap.add_argument("--tiny", action="store_true", help="8x8 random-pixel PNGs (fast to make and build)")
    ap.add_argument("--commands", default="build", help="build, verify, scan, inspect, repair (comma separated)")
    args = ap.parse_args(argv)
    tmp = None
    if args.work is None:
        tmp = tempfile.mkdtemp(prefix="shardsmith-rss-")
        work = Path(tmp)
    else:
        work = Path(args.work).resolve()
        work.mkdir(parents=True, exist_ok=True)
    try:
        return _bench(args, work)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _bench(args, work: Path) -> int:
    info = machine_info()
    print(f"# machine: nproc={info['nproc']} cpu={info['cpu']!r} ram={info['ram_gib']} GiB "
          f"python={info['python']} date={info['date']}")
    print(f"# shardsmith under test: {info['shardsmith']['path']} ({info['shardsmith']['files']} .py files, "
          f"sha256 {info['shardsmith']['sha256']})")
    sizes = [int(s) for s in args.sizes.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    # one set of the largest size; the smaller sets are hard-linked prefixes of it
    big = max(sizes)
    lo, hi = (0, 0) if args.tiny else (args.min_side, args.max_side)
    subprocess.run([sys.executable, "-c", GEN, str(BENCH), str(work), str(big), str(lo),
                    str(hi), ",".join(map(str, sizes))], check=True)
    dirs = {n: work / f"set_{n}" for n in sizes}
    commands = args.commands.split(",")
    cli_rows = [row for c in commands if c != "build" for row in _bench_cli(args, work, dirs, sizes, c)]
    if "build" not in commands:
        if args.json:
            Path(args.json).write_text(json.dumps({"machine": info, "sizes": sizes, "repeats": args.repeats,
                                                   "cli_rows": cli_rows}, indent=2))
        return 0
    base_imp = [run_child(IMPORT_ONLY)["self_kib"] for _ in range(args.repeats)]
    imp = statistics.median(base_imp)
    print(f"# import-only interpreter peak RSS: {mib(imp)} MiB (median of {len(base_imp)}); "
          f"driver ru_maxrss so far {mib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)} MiB")

    res: dict[tuple[int, int], list[dict]] = {(w, n): [] for w in workers for n in sizes}
    for r in range(args.repeats):
        for w in workers:
            order = sizes if (r % 2 == 0) else list(reversed(sizes))
            for n in order:
                out = work / f"out_{w}_{n}"
                shutil.rmtree(out, ignore_errors=True)
                t0 = time.perf_counter()
                d = run_child(CHILD, str(dirs[n]), str(out), str(w))
                shutil.rmtree(out)
                if d["written"] != n:
                    raise SystemExit(f"workers={w} n={n}: wrote {d['written']} samples, expected {n}")
                res[(w, n)].append(d)
                print(f"# repeat {r + 1}/{args.repeats} workers={w} n={n:>6}: parent {mib(d['self_kib'])} MiB "
                      f"(VmHWM {mib(d['self_hwm_kib'])}, after imports {mib(d['after_import_kib'])}), "
                      f"max child {mib(d['children_kib'])} MiB, build {d['seconds']:.1f} s "
                      f"(wall incl. start-up {time.perf_counter() - t0:.1f} s)", flush=True)

    ref = sizes[0]
    print()
    media = "8x8 px PNGs" if args.tiny else f"images {args.min_side}..{args.max_side} px"
    print(f"peak RSS, median of {args.repeats} fresh-interpreter builds; {media}; "
          f"ratio = value at n / value at n={ref}")
    print()
    print("| workers | n | parent peak MiB | ratio | parent peak above import-only MiB | ratio "
          "| max child peak MiB | ratio | build s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary = []
    for w in workers:
        p_ref = statistics.median(d["self_kib"] for d in res[(w, ref)])
        c_ref = statistics.median(d["children_kib"] for d in res[(w, ref)])
        for n in sizes:
            p = statistics.median(d["self_kib"] for d in res[(w, n)])
            c = statistics.median(d["children_kib"] for d in res[(w, n)])
            s = statistics.median(d["seconds"] for d in res[(w, n)])
            row = {"workers": w, "n": n, "parent_kib": p, "parent_ratio": p / p_ref,
                   "parent_above_import_kib": p - imp, "parent_above_import_ratio": (p - imp) / max(1, p_ref - imp),
                   "child_kib": c, "child_ratio": (c / c_ref) if c_ref else None, "seconds": s,
                   "raw": res[(w, n)]}
            summary.append(row)
            cr = f"{row['child_ratio']:.3f}" if row["child_ratio"] is not None else "-"
            print(f"| {w} | {n} | {mib(p)} | {row['parent_ratio']:.3f} | {mib(p - imp)} "
                  f"| {row['parent_above_import_ratio']:.3f} | {mib(c) if c else '-'} | {cr} | {s:.1f} |")
    print()
    print(f"import-only interpreter: {mib(imp)} MiB. Goal: ratio (largest/smallest) <= 1.05 (issue 24).")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "sizes": sizes, "repeats": args.repeats,
                                               "import_only_kib": base_imp, "rows": summary,
                                               "cli_rows": cli_rows}, indent=2))
    return 0


def run_cli(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CLI_CHILD, *args], capture_output=True, text=True)
    got = [ln for ln in p.stderr.splitlines() if ln.startswith("PEAKS ")]
    if p.returncode != 0 or not got:
        raise SystemExit(f"shardsmith {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-4000:]}")
    cov = [ln.strip() for ln in p.stdout.splitlines() if "] coverage:" in ln]
    lines = p.stdout.splitlines()
    check = ""
    if args[0] == "inspect" and lines:  # "<folder>: S shard(s), N sample(s), M member(s)"
        check = lines[0].rsplit(": ", 1)[-1].split(", ")[1] + (" OK" if "OK" in lines else " problems")
    elif args[0] == "repair":
        changed = [ln for ln in lines[1:] if ln.startswith("  ") and " unchanged " not in ln]
        check = f"{sum(' unchanged ' in ln for ln in lines)} shard(s) unchanged, {len(changed)} other line(s)"
    return {**json.loads(got[-1][6:]), "coverage": cov[0] if cov else "", "check": check}


DATASET_COMMANDS = ("verify", "inspect", "repair")


def _expected_check(command: str, n: int) -> str:
    """What a healthy dataset of ``n`` samples (1000 per shard) prints, as :func:`run_cli` condenses it."""
    if command == "inspect":
        return f"{n} sample(s) OK"
    return f"{-(-n // 1000)} shard(s) unchanged, 0 other line(s)"


def _bench_cli(args, work: Path, dirs: dict[int, Path], sizes: list[int], command: str) -> list[dict]:
    """``shardsmith verify`` / ``scan`` / ``inspect`` / ``repair`` at each size: main-process peak, median of
    the repeats."""
    targets = {}
    for n in sizes:
        if command in DATASET_COMMANDS:  # the dataset they read: one untimed build of the set
            out = work / f"verify_{n}"
            if not (out / "wds" / "shard_count.json").is_file():
                shutil.rmtree(out, ignore_errors=True)
                run_child(CHILD, str(dirs[n]), str(out), "2")
            targets[n] = out / "wds"
        else:
            targets[n] = dirs[n]
    res: dict[int, list[dict]] = {n: [] for n in sizes}
    for r in range(args.repeats):
        for n in (sizes if r % 2 == 0 else list(reversed(sizes))):
            d = run_cli(command, str(targets[n]), *(() if command == "inspect" else ("--quiet",)))
            if command == "verify" and f"{n} of {n} samples seen exactly once" not in d["coverage"]:
                raise SystemExit(f"verify n={n}: {d['coverage']!r}")
            if command in ("inspect", "repair") and d["check"] != _expected_check(command, n):
                raise SystemExit(f"{command} n={n}: {d['check']!r}")
            res[n].append(d)
            print(f"# {command} repeat {r + 1}/{args.repeats} n={n:>6}: main {mib(d['self_kib'])} MiB "
                  f"(VmHWM {mib(d['self_hwm_kib'])}), largest child {mib(d['children_kib'])} MiB, "
                  f"{d['seconds']:.1f} s", flush=True)
    ref = sizes[0]
    p_ref = statistics.median(d["self_hwm_kib"] for d in res[ref])
    print()
    print(f"{command}: main-process peak (VmHWM), median of {args.repeats}; ratio = value at n / value at n={ref}")
    print()
    print("| command | n | main peak MiB | ratio | bytes per item above n=" + str(ref) + " | largest child MiB | s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for n in sizes:
        p = statistics.median(d["self_hwm_kib"] for d in res[n])
        c = statistics.median(d["children_kib"] for d in res[n])
        s = statistics.median(d["seconds"] for d in res[n])
        per = (p - p_ref) * 1024 / (n - ref) if n != ref else 0.0
        rows.append({"command": command, "n": n, "main_hwm_kib": p, "ratio": p / p_ref, "bytes_per_item": per,
                     "child_kib": c, "seconds": s, "raw": res[n]})
        print(f"| {command} | {n} | {mib(p)} | {p / p_ref:.3f} | {per:.1f} | {mib(c)} | {s:.1f} |")
    print()
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
