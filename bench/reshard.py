"""Benchmark: shardsmith ``build`` vs a plain ``webdataset.ShardWriter`` loop.

Both do the same per-image work: decode (PIL open + load, EXIF transpose, RGB), resize
with LANCZOS so the longer side is 256 (no upscaling), JPEG q95 encode, and write
``jpg`` + ``json`` members into 1000-sample tar shards. shardsmith additionally plans
(sha256 + header probe of every file into a SQLite ledger), re-checks the sha256 before
decoding, writes richer per-sample json, fsyncs every shard and keeps the ledger.

Noise control: inputs are generated once and pre-read (warm page cache); every variant
gets one untimed warm-up on a small subset; in each repeat all variants run back to back,
in forward order on even repeats and reversed order on odd ones (A B C | C B A | ...), so
slow drift cancels; each run writes into a fresh folder that is deleted afterwards (outside
the timed region). The ratio ``variant throughput / baseline throughput`` is computed per
repeat (same repeat = adjacent in time) and summarised by its median (and min..max).

    /work/venv/bin/python bench/reshard.py --n 2000 --repeats 5 --workers 1,2 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import resource
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _media import cpu_now, machine_info, real_photos, system_busy, wait_quiet  # noqa: E402

MAX_SIDE = 256
QUALITY = 95
PER_SHARD = 1000


# --------------------------------------------------------------------------- baseline
def run_baseline(files: list[Path], out: Path) -> None:
    import webdataset as wds
    from PIL import Image, ImageOps

    out.mkdir(parents=True)
    with wds.ShardWriter(str(out / "%05d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for p in files:  # already sorted
            with Image.open(p) as im:
                im.load()
                orig = im.size
                img = ImageOps.exif_transpose(im)
            if img.mode != "RGB":
                img = img.convert("RGB")
            w, h = img.size
            if max(w, h) > MAX_SIDE:
                s = MAX_SIDE / max(w, h)
                img = img.resize((max(1, round(w * s)), max(1, round(h * s))), Image.Resampling.LANCZOS)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=QUALITY)
            sink.write({"__key__": p.stem, "jpg": buf.getvalue(),
                        "json": json.dumps({"original_size": list(orig)}).encode()})


def count_baseline(out: Path) -> int:
    n = 0
    for t in sorted(out.glob("*.tar")):
        with tarfile.open(t) as tf:
            n += sum(1 for m in tf.getmembers() if m.name.endswith(".jpg"))
    return n


# --------------------------------------------------------------------------- shardsmith
def make_recipe(photos: Path):
    from shardsmith.recipe import recipe_from_dict

    return recipe_from_dict({"sources": [{"path": str(photos)}],
                             "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": PER_SHARD,
                                          "image": {"format": "jpg", "quality": QUALITY, "max_side": MAX_SIDE}}]},
                            base_dir=".")


def run_shardsmith(recipe, out: Path, workers: int) -> None:
    from shardsmith.build import build

    build(recipe, out, quiet=True, workers=workers)


def count_shardsmith(out: Path) -> int:
    return sum(json.loads((out / "wds" / "shard_count.json").read_text()).values())


# --------------------------------------------------------------------------- harness


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="number of images (default 2000)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats per variant (default 5)")
    ap.add_argument("--workers", default="1,2", help="shardsmith worker counts, comma separated (default 1,2)")
    ap.add_argument("--work", default=None, help="work folder (default: a temporary folder, removed at the end)")
    ap.add_argument("--json", default=None, help="write raw results as JSON here")
    ap.add_argument("--min-side", type=int, default=300)
    ap.add_argument("--max-side", type=int, default=800)
    ap.add_argument("--settle", type=float, default=15.0,
                    help="before each timed run wait up to this many seconds for other processes to go quiet")
    args = ap.parse_args(argv)

    tmp = None
    if args.work is None:
        tmp = tempfile.mkdtemp(prefix="shardsmith-bench-")
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
    photos_dir = work / f"photos_{args.n}_{args.min_side}-{args.max_side}"
    files = real_photos(photos_dir, args.n, seed=0, min_side=args.min_side, max_side=args.max_side)
    assert len(files) == args.n, (len(files), args.n)
    total_bytes = sum(p.stat().st_size for p in files)
    for p in files:  # warm the page cache for every variant alike
        p.read_bytes()
    print(f"# inputs: {args.n} JPEGs, {total_bytes / 1e6:.1f} MB, sides {args.min_side}..{args.max_side} px")

    recipe = make_recipe(photos_dir)
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    variants: list[tuple[str, callable, callable]] = [
        ("baseline (wds.ShardWriter, 1 proc)", lambda out, fl=files: run_baseline(fl, out), count_baseline)]
    for w in workers:
        variants.append((f"shardsmith workers={w}", lambda out, w=w: run_shardsmith(recipe, out, w),
                         count_shardsmith))

    # untimed warm-up on a small subset (imports, code paths, pool start-up)
    warm_dir = work / "warm_photos"
    warm_dir.mkdir(exist_ok=True)
    for p in files[:64]:
        q = warm_dir / p.name
        if not q.exists():
            os.link(p, q)
    warm_recipe = make_recipe(warm_dir)
    for i, (name, _fn, _count) in enumerate(variants):
        out = work / f"warm_out_{i}"
        shutil.rmtree(out, ignore_errors=True)
        if i == 0:
            run_baseline(sorted(warm_dir.glob("*.jpg")), out)
        else:
            run_shardsmith(warm_recipe, out, workers[i - 1])
        shutil.rmtree(out)

    load0 = os.getloadavg()
    times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    cpus: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    foreign: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for r in range(args.repeats):
        order = list(range(len(variants)))
        if r % 2:
            order.reverse()
        for i in order:
            name, fn, count = variants[i]
            out = work / f"out_{i}"
            shutil.rmtree(out, ignore_errors=True)
            gc.collect()
            waited = wait_quiet(args.settle) if args.settle > 0 else 0.0
            b0, c0, t0 = system_busy(), cpu_now(), time.perf_counter()
            fn(out)
            dt, dc, db = time.perf_counter() - t0, cpu_now() - c0, system_busy() - b0
            fo = max(0.0, db - dc) / dt  # cores used by *other* processes during the run
            got = count(out)
            if got != args.n:
                raise SystemExit(f"{name}: wrote {got} samples, expected {args.n}")
            shutil.rmtree(out)
            times[name].append(dt)
            cpus[name].append(dc)
            foreign[name].append(fo)
            print(f"# repeat {r + 1}/{args.repeats}  {name:<36} {dt:7.2f} s  {args.n / dt:7.1f} img/s  "
                  f"cpu {dc:6.2f} s  other-load {fo:4.2f} cores (waited {waited:4.1f} s)  samples={got}",
                  flush=True)
    load1 = os.getloadavg()

    base = variants[0][0]
    rows = []
    for name, _, _ in variants:
        ts = times[name]
        ratios = [b / t for b, t in zip(times[base], ts)]  # throughput ratio = t_base / t_variant, per repeat
        cpu_ratios = [b / c for b, c in zip(cpus[base], cpus[name])]
        rows.append({"variant": name, "times_s": ts, "cpu_s": cpus[name], "other_load_cores": foreign[name],
                     "cpu_ratios": cpu_ratios, "median_cpu_ratio": statistics.median(cpu_ratios),
                     "median_s": statistics.median(ts),
                     "min_s": min(ts), "max_s": max(ts), "img_per_s": args.n / statistics.median(ts),
                     "cpu_ms_per_img": 1000 * statistics.median(cpus[name]) / args.n,
                     "ratios": ratios, "median_ratio": statistics.median(ratios)})

    print()
    print(f"n={args.n} images, repeats={args.repeats}, order alternates forward/reversed per repeat; "
          f"loadavg(1m) before {load0[0]:.2f}, after {load1[0]:.2f}")
    print()
    print("| variant | median s | min..max s | images/s (median) | ratio vs baseline (median) "
          "| ratio min..max | CPU ms/img | CPU-efficiency ratio | other load (cores, max) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['variant']} | {row['median_s']:.2f} | {row['min_s']:.2f}..{row['max_s']:.2f} "
              f"| {row['img_per_s']:.1f} | {row['median_ratio']:.3f} "
              f"| {min(row['ratios']):.3f}..{max(row['ratios']):.3f} | {row['cpu_ms_per_img']:.2f} "
              f"| {row['median_cpu_ratio']:.3f} | {max(row['other_load_cores']):.2f} |")
    print()
    print("ratio = (variant images/s) / (baseline images/s), computed within each repeat (adjacent runs), "
          "median over repeats. CPU = user+sys of the benchmark process and its joined children; "
          "CPU-efficiency ratio = baseline CPU s / variant CPU s (per repeat, median). "
          "other load = CPU used by unrelated processes during the run (from /proc/stat), in cores.")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "n": args.n, "repeats": args.repeats,
                                               "input_bytes": total_bytes, "loadavg_before": load0,
                                               "loadavg_after": load1, "variants": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
