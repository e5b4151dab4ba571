"""Benchmark: ``shardsmith.verify.runner.verify`` on a latent WDS vs a plain read of its bytes.

Dataset: ``--n`` samples of ``latent.pth`` (float32 [4,32,32]) + ``txt_emb.pth`` (bfloat16
[77,64]) (``--shape sdxl``: float32 [4,128,128] + bfloat16 [77,2048], 578 kB a sample) written with ``webdataset.TarWriter``, 1000 per shard, + ``shard_count.json`` +
``neg_prompt_emb.npy`` (shared with bench/loader.py, see bench/loader_common.py).

Variants, each repeat runs all of them back to back (forward order on even repeats,
reversed on odd ones), page cache warm (a plain read of every shard first):

* ``plain read (warm)``: open each tar and read it fully in 8 MiB chunks, one process (cat-like)
* ``plain read (cold)``: the same right after ``posix_fadvise(DONTNEED)`` on OUR shards only
  (other files on the machine are not touched)
* ``verify world=W (cold)``: the first world's verify, also right after evicting our shards
* ``verify world=W``: ``verify(path, preset="image_latent", world=W, workers=2,
  batch_size=64, contract_in="workers")`` (``auto``'s choice from 4 workers; batches cross to the ranks; the
  workers record the statistics; the ranks check every batch's structure and re-read 1 in 16);
  the report must say ok and every sample seen once
* ``verify world=W contract-in-rank``: the same with ``contract_in="rank"`` (the rank passes over
  every value: the default before 2026-12-03's sixth session)
* ``verify world=W workers-only``: ``contract_in="workers-only"`` (the workers send only ids and
  statistics; the batches do not cross)
* ``verify tiny world=W``: the same on a 1-shard dataset of max(10, W x workers) samples: the fixed start-up
  cost (spawning W rank processes that import torch, building the loader, forking workers,
  collecting results); subtracted to give the "excluding start-up" ratios
* ``decode floor``: one process reads every shard with ``tarfile`` (streaming) and
  ``torch.load``s every member: the least work a verify that decodes everything must do
  (information only)

Ratios are computed per repeat (adjacent runs) and reported as medians:
``verify / plain read (warm)``, including and excluding the start-up cost (goal <= 1.5;
judge it on the ratio INCLUDING start-up: that is what a user waits for).

Sizes: the 20000-sample dataset is prepared, but by default only its first 4 shards (4000
samples) are timed (``--shards 0`` for all): on this 2-core machine a 20k-sample verify takes
about a minute per call, which does not fit 5 interleaved repeats into the time budget.
Start-up is a fixed cost, so the "including start-up" ratio gets smaller with size; the
"excluding start-up" ratio does not depend on size much.

    /work/venv/bin/python bench/verify_speed.py --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loader_common import (DEFAULT_WORK, Meter, dataset_bytes, evict, header, machine_info, median,  # noqa: E402
                           plain_read, prepare_latents, shard_paths, subset, wait_quiet)

PRESET = "image_latent"
WORKERS = 2
BATCH = 64


def run_verify(folder: Path, world: int, total: int, contract_in: str = "workers") -> dict:
    from shardsmith.verify.runner import verify

    rep = verify(folder, preset=PRESET, world=world, workers=WORKERS, batch_size=BATCH, contract_in=contract_in)
    assert rep["ok"], [c for c in rep["checks"] if not c["ok"]]
    assert rep["coverage"]["unique"] == rep["coverage"]["seen"] == total, rep["coverage"]
    return rep


def decode_floor(paths: list[Path]) -> int:
    import torch

    n = 0
    for p in paths:
        with tarfile.open(p, "r|") as tf:
            for info in tf:
                if info.isfile() and info.name.endswith(".pth"):
                    torch.load(io.BytesIO(tf.extractfile(info).read()), map_location="cpu", weights_only=True)
                    n += 1
    return n


def breakdown(folder: Path, total: int) -> list[tuple[str, float, float]]:
    """Where a verify's time goes, measured once in THIS process (information only):
    ``[(phase, wall s, cpu s)]``."""
    import queue as _q

    from shardsmith.loaders.presets import preset_config
    from shardsmith.loaders.wds import WdsLoader
    from shardsmith.verify.contract import ContractRecorder
    from shardsmith.verify.accounting import expected_wds as _expected_wds
    from shardsmith.verify.ranks import rank_main as _rank_main

    out = []
    import torch

    torch.set_num_threads(1)  # as in a rank process (verify's _rank_main): a 16-thread pool here spun 7x the CPU

    def timed(name, fn):
        with Meter() as m:
            r = fn()
        out.append((name, m.dt, m.cpu))
        return r

    timed("parent: _expected_wds (walk every tar header, serial, before the ranks start)",
          lambda: _expected_wds(folder))
    cfg = preset_config(PRESET, folder, batch_size=BATCH, num_workers=WORKERS).model_copy(
        update={"deterministic": True, "partial": True, "shuffle_size": 0, "constants_as_views": True})
    n = timed(f"loader only: WdsLoader deterministic pass, workers={WORKERS}, batch {BATCH} (batches dropped)",
              lambda: sum(len(b["__key__"]) for b in WdsLoader(cfg)))
    assert n == total

    def contract():  # batches are not kept: 20k SDXL samples would be 11.7 GB
        rec = ContractRecorder()
        seen = []
        for b in WdsLoader(cfg):
            seen += [f"{s}/{k}" for s, k in zip(b["__shard__"], b["__key__"])]
            rec.add(b, set(cfg.files_map))
        return rec

    timed("loader + ContractRecorder.add + seen ids, in this process", contract)
    spec = {"kind": "wds", "config": cfg.model_dump(mode="json", exclude={"rank", "world_size"}), "world": 1,
            "batches": None}
    qq = _q.Queue()
    timed("one rank in-process (_rank_main, world=1: loader + contract), no spawn/import",
          lambda: _rank_main(0, spec, qq))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=DEFAULT_WORK)
    ap.add_argument("--n", type=int, default=20000, help="samples of the prepared latent dataset (default 20000)")
    ap.add_argument("--shape", choices=["small", "sdxl"], default="small",
                    help="latent sizes (loader_common.LATENT_SHAPES): small 33 kB a sample, sdxl 578 kB")
    ap.add_argument("--shards", type=int, default=4,
                    help="time on the first K shards (1000 samples each) only, to fit the time budget; 0 = all")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true",
                    help="leave out the cold reads, the decode floor and the in-process breakdown")
    ap.add_argument("--workers", type=int, default=WORKERS,
                    help=f"loader workers per rank (default {WORKERS}; a many-core machine can take more)")
    args = ap.parse_args(argv)
    globals()["WORKERS"] = args.workers  # read by run_verify and the loader-only timing

    info = machine_info()
    print(header(info), flush=True)
    full = prepare_latents(args.work, args.n, shape=args.shape)
    folder = subset(full, args.shards)
    worlds = [int(w) for w in args.worlds.split(",") if w]
    # the start-up probe: one shard with a sample for every rank-worker (fewer would be an empty split)
    n_tiny = max(10, max(worlds) * max(WORKERS, 1))
    tiny = prepare_latents(args.work, n_tiny, per_shard=n_tiny, name=f"latents_tiny{n_tiny}")
    paths, tiny_paths = shard_paths(folder), shard_paths(tiny)
    total = sum(json.loads((folder / "shard_count.json").read_text()).values())
    nbytes = dataset_bytes(folder)
    print(f"# prepared: {full} {len(shard_paths(full))} shards; timed on: {folder} {len(paths)} shards, {total} samples, {nbytes / 1e6:.1f} MB; "
          f"tiny: {tiny} 1 shard, {n_tiny} samples", flush=True)

    variants: list[tuple[str, callable]] = [("plain read (warm)", lambda: plain_read(paths))]
    for w in worlds:
        variants.append((f"verify world={w}", lambda w=w: run_verify(folder, w, total)))
        variants.append((f"verify world={w} contract-in-rank", lambda w=w: run_verify(folder, w, total, "rank")))
        variants.append((f"verify world={w} workers-only", lambda w=w: run_verify(folder, w, total, "workers-only")))
        variants.append((f"verify tiny world={w}", lambda w=w: run_verify(tiny, w, n_tiny)))
    if not args.quick:
        variants.append(("decode floor (1 proc)", lambda: decode_floor(paths)))
        variants.append(("plain read (cold)", None))
        variants.append((f"verify world={worlds[0]} (cold)", None))

    def run(name, fn):
        if fn is None:  # cold: evict our files first (the run leaves the cache warm again)
            evict(paths)
            fn = (lambda: plain_read(paths)) if name.startswith("plain") else \
                (lambda: run_verify(folder, worlds[0], total))
        with Meter() as m:
            out = fn()
        if name.startswith("plain"):
            assert out == nbytes, (out, nbytes)
        if name.startswith("decode"):
            assert out == 2 * total, out
        return m

    t_start = time.perf_counter()
    plain_read(paths)
    plain_read(tiny_paths)
    for name, fn in variants:  # untimed warm-up
        if name.startswith("verify world") or name.endswith("(cold)"):
            continue  # the full verify is long; its code paths are warmed by the tiny one
        run(name, fn)
    print(f"# warm-up done in {time.perf_counter() - t_start:.1f}s", flush=True)

    load0 = os.getloadavg()
    res: dict[str, list] = {name: [] for name, _ in variants}
    for r in range(args.repeats):
        order = variants if r % 2 == 0 else variants[::-1]
        for name, fn in order:
            gc.collect()
            waited = wait_quiet(args.settle) if args.settle > 0 else 0.0
            m = run(name, fn)
            res[name].append({"s": m.dt, "cpu_s": m.cpu, "other_cores": m.other, "waited": waited})
            print(f"# repeat {r + 1}/{args.repeats} {name:<24} {m.dt:8.3f} s  cpu {m.cpu:6.2f} s  "
                  f"other-load {m.other:4.2f} cores (waited {waited:3.1f} s)", flush=True)
    load1 = os.getloadavg()

    t = {name: [x["s"] for x in xs] for name, xs in res.items()}
    plain = t["plain read (warm)"]
    print()
    print(f"dataset {total} samples, {len(paths)} shards, {nbytes / 1e6:.1f} MB; verify preset={PRESET} "
          f"workers={WORKERS} batch_size={BATCH}; repeats {args.repeats}; loadavg(1m) before {load0[0]:.2f}, "
          f"after {load1[0]:.2f}; timed part {time.perf_counter() - t_start:.0f}s")
    print()
    print("| variant | median s | min..max s | MB/s | samples/s | CPU s (median) | other load cores (max) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, xs in res.items():
        ts = t[name]
        n = n_tiny if "tiny" in name else total
        mb = (nbytes / 1e6 / median(ts)) if "tiny" not in name else float("nan")
        print(f"| {name} | {median(ts):.3f} | {min(ts):.3f}..{max(ts):.3f} | {mb:.0f} | {n / median(ts):.0f} "
              f"| {median([x['cpu_s'] for x in xs]):.2f} | {max(x['other_cores'] for x in xs):.2f} |")
    print()
    print("| ratio (per repeat, median; min..max) | world=" + " | world=".join(map(str, worlds)) + " |")
    print("|---|" + "---:|" * len(worlds))
    rows = {}

    def ratio_row(label, fn):
        cells = []
        for w in worlds:
            rs = [fn(w, i) for i in range(args.repeats)]
            rows.setdefault(label, {})[w] = rs
            cells.append(f"{median(rs):.2f} ({min(rs):.2f}..{max(rs):.2f})")
        print(f"| {label} | " + " | ".join(cells) + " |")

    ratio_row("verify / plain read warm, INCLUDING start-up (goal <= 1.5)",
              lambda w, i: t[f"verify world={w}"][i] / plain[i])
    ratio_row("verify --contract-in rank / plain read warm",
              lambda w, i: t[f"verify world={w} contract-in-rank"][i] / plain[i])
    ratio_row("verify --contract-in workers-only / plain read warm",
              lambda w, i: t[f"verify world={w} workers-only"][i] / plain[i])
    ratio_row("verify (--contract-in workers) / verify --contract-in rank",
              lambda w, i: t[f"verify world={w}"][i] / t[f"verify world={w} contract-in-rank"][i])
    ratio_row("verify / plain read warm, EXCLUDING start-up (verify - tiny verify)",
              lambda w, i: (t[f"verify world={w}"][i] - t[f"verify tiny world={w}"][i]) / plain[i])
    ratio_row("start-up (tiny verify) seconds", lambda w, i: t[f"verify tiny world={w}"][i])
    bd = None
    if args.quick:
        print("\n(--quick: no cold reads, decode floor or breakdown)")
    else:
        ratio_row("verify / plain read COLD (our shards evicted first), including start-up",
                  lambda w, i: t[f"verify world={w}"][i] / t["plain read (cold)"][i])
        ratio_row(f"verify COLD / plain read COLD (world={worlds[0]} verify in every column)",
                  lambda w, i: t[f"verify world={worlds[0]} (cold)"][i] / t["plain read (cold)"][i])
        ratio_row("verify / decode floor (1 proc), including start-up",
                  lambda w, i: t[f"verify world={w}"][i] / t["decode floor (1 proc)"][i])
        ratio_row("verify / decode floor (1 proc), excluding start-up",
                  lambda w, i: (t[f"verify world={w}"][i] - t[f"verify tiny world={w}"][i])
                  / t["decode floor (1 proc)"][i])
        print()
        print(f"start-up = the same verify call on a 1-shard, {n_tiny}-sample dataset (spawned rank processes import "
              "torch, build the loader, fork workers). The goal should be judged on the ratio INCLUDING start-up.")
        print()
        print("Phase breakdown (measured once, in-process, information only):")
        print()
        print("| phase | wall s | CPU s |")
        print("|---|---:|---:|")
        bd = breakdown(folder, total)
        for name, wall, cpu in bd:
            print(f"| {name} | {wall:.2f} | {cpu:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "samples": total, "breakdown": bd, "bytes": nbytes,
                                         "results": res, "ratios": rows, "loadavg_before": load0,
                                         "loadavg_after": load1, "workers": WORKERS, "quick": args.quick},
                                        indent=1, default=str))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
