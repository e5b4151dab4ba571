"""Benchmark: shardsmith ``WdsLoader`` vs webdataset's own pipeline on the SAME shards.

Two datasets (prepared once, cached under ``--work``; see ``bench/loader_common.py``):

* **A, images**: ``--n-images`` real photos (tests/media_factory.real_photos, sides
  200..400 px) with a ``.txt`` caption sidecar each, built by ``shardsmith.build`` into WDS
  shards (250 samples/shard, jpg, max_side 256). key_map ``{"real": "jpg", "condition": "txt"}``.
  Decoding on both sides: jpg -> float32 CHW in [-1, 1] at 128x128 (resize so the image
  covers 128x128 keeping its aspect, bicubic, center crop), txt -> stripped str.
* **B, latents**: ``--n-latents`` samples of ``latent.pth`` (float32 [4,32,32]) +
  ``txt_emb.pth`` (bfloat16 [77,64]) written with ``webdataset.TarWriter`` (1000/shard) +
  ``shard_count.json``. Decoding on both sides: ``torch.load(weights_only=True)``.

Variants, batch size 32, 2 DataLoader workers on both sides:

* deterministic pass (each sample once), timed over the full pass:
  - shardsmith: ``WdsLoader(WdsLoaderConfig(deterministic=True, partial=True, ...))``
  - webdataset: ``wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node,
    workersplitter=wds.split_by_worker).map(decode).batched(32)`` in
    ``wds.WebLoader(ds, batch_size=None, num_workers=2)``
* training (infinite, shuffled), timed from ``iter()`` to the N-th batch (buffer fill and
  worker start-up included on both sides):
  - shardsmith: ``deterministic=False, shuffle_size=1000``
  - webdataset: ``wds.WebDataset(urls, resampled=True, shardshuffle=False).shuffle(1000)
    .map(decode).batched(32)`` (``shardshuffle`` is ignored -with a warning- when
    ``resampled=True`` in webdataset 1.0.2, so it is passed as False).

The webdataset decode functions are written independently (idiomatic user code), and are
checked to give bit-identical tensors/strings to shardsmith's decoders on the first batch
of each dataset (single process, same order) before anything is timed. Every timed run
asserts the batch contract (keys, shapes, dtypes) and the sample count (deterministic:
every sample exactly once; training: N*32 samples).

Noise control (same scheme as bench/reshard.py): the shards are read once (warm page
cache) and every variant gets one untimed warm-up run; in each repeat all variants run back
to back, in forward order on even repeats and reversed order on odd ones; the ratio
``shardsmith samples/s / webdataset samples/s`` is computed per repeat (adjacent runs) and
summarised by its median (and min..max). CPU load of other processes during each run is
recorded (from /proc/stat).

    /work/venv/bin/python bench/loader.py --repeats 5
    /work/venv/bin/python bench/loader.py --profile            # cProfile, num_workers=0
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loader_common import (DEFAULT_WORK, Meter, dataset_bytes, header, machine_info, median,  # noqa: E402
                           plain_read, prepare_images, prepare_latents, shard_paths, subset, wait_quiet)

BS = 32
IMAGE_SIZE = 128
SHUFFLE = 1000

KEY_MAPS = {"images": {"real": "jpg", "condition": "txt"},
            "latents": {"real": "latent.pth", "condition": "txt_emb.pth"}}


# --------------------------------------------------------------------------- webdataset side
def _wds_image(data: bytes) -> torch.Tensor:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB")
    w, h = im.size
    s = max(IMAGE_SIZE / h, IMAGE_SIZE / w)
    nw, nh = max(IMAGE_SIZE, round(w * s)), max(IMAGE_SIZE, round(h * s))
    if (nw, nh) != (w, h):
        im = im.resize((nw, nh), Image.BICUBIC)
    left, top = (nw - IMAGE_SIZE) // 2, (nh - IMAGE_SIZE) // 2
    im = im.crop((left, top, left + IMAGE_SIZE, top + IMAGE_SIZE))
    t = torch.from_numpy(np.array(im, dtype=np.float32)).permute(2, 0, 1)
    return (t / 127.5 - 1.0).contiguous()


def wds_decode_images(s: dict) -> dict:
    return {"__key__": s["__key__"], "__shard__": os.path.basename(s["__url__"]),
            "real": _wds_image(s["jpg"]), "condition": s["txt"].decode("utf-8").strip()}


def wds_decode_latents(s: dict) -> dict:
    return {"__key__": s["__key__"], "__shard__": os.path.basename(s["__url__"]),
            "real": torch.load(io.BytesIO(s["latent.pth"]), map_location="cpu", weights_only=True),
            "condition": torch.load(io.BytesIO(s["txt_emb.pth"]), map_location="cpu", weights_only=True)}


DECODERS = {"images": wds_decode_images, "latents": wds_decode_latents}


def make_wds(folder: Path, kind: str, mode: str, workers: int):
    import webdataset as wds

    urls = [str(p) for p in shard_paths(folder)]
    if mode == "det":
        ds = wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node,
                            workersplitter=wds.split_by_worker, empty_check=False)
    else:
        ds = wds.WebDataset(urls, resampled=True, shardshuffle=False, nodesplitter=wds.split_by_node)
        ds = ds.shuffle(SHUFFLE)
    ds = ds.map(DECODERS[kind]).batched(BS)
    if workers == 0:
        return ds
    return wds.WebLoader(ds, batch_size=None, num_workers=workers)


# --------------------------------------------------------------------------- shardsmith side
def make_ss(folder: Path, kind: str, mode: str, workers: int):
    from shardsmith.loaders.wds import WdsLoader, WdsLoaderConfig

    kw = dict(shards=folder, key_map=KEY_MAPS[kind], batch_size=BS, num_workers=workers,
              image_size=IMAGE_SIZE if kind == "images" else None)
    if mode == "det":
        cfg = WdsLoaderConfig(**kw, deterministic=True, partial=True)
    else:
        cfg = WdsLoaderConfig(**kw, deterministic=False, shuffle_size=SHUFFLE)
    return WdsLoader(cfg)


MAKERS = {"shardsmith": make_ss, "webdataset": make_wds}


# --------------------------------------------------------------------------- checks
def signature(batch: dict) -> dict:
    out = {}
    for k in ("real", "condition"):
        v = batch[k]
        if isinstance(v, torch.Tensor):
            out[k] = ("tensor", tuple(v.shape[1:]), str(v.dtype))
        else:
            out[k] = (type(v).__name__, type(v[0]).__name__)
    return out


def expected_signature(kind: str) -> dict:
    if kind == "images":
        return {"real": ("tensor", (3, IMAGE_SIZE, IMAGE_SIZE), "torch.float32"), "condition": ("list", "str")}
    return {"real": ("tensor", (4, 32, 32), "torch.float32"),
            "condition": ("tensor", (77, 64), "torch.bfloat16")}


def check_equivalence(folder: Path, kind: str) -> str:
    """Single process, same order: the first batch of both sides must be identical."""
    a = next(iter(make_ss(folder, kind, "det", 0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = next(iter(make_wds(folder, kind, "det", 0)))
    assert a["__key__"] == b["__key__"], (a["__key__"][:3], b["__key__"][:3])
    assert a["__shard__"] == b["__shard__"]
    for k in ("real", "condition"):
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, (k, a[k].shape, b[k].shape)
            assert torch.equal(a[k], b[k]), f"{kind}/{k}: decoded tensors differ"
        else:
            assert list(a[k]) == list(b[k]), f"{kind}/{k}: decoded values differ"
    assert signature(a) == signature(b) == expected_signature(kind), (signature(a), signature(b))
    return (f"{kind}: first batch identical on both sides ({len(a['__key__'])} samples, "
            f"{', '.join(f'{k}={v}' for k, v in signature(a).items())})")


# --------------------------------------------------------------------------- one run
def run_once(impl: str, folder: Path, kind: str, mode: str, workers: int, n_batches: int,
             total: int, steady_from: int = 0) -> dict:
    """One timed run. Deterministic: the full pass. Training: ``iter()`` to the ``n_batches``-th
    batch; ``steady_sps`` is the rate over batches ``steady_from+1 .. n_batches`` (after both
    shuffle buffers are full), ``first_s`` the time to the first batch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = MAKERS[impl](folder, kind, mode, workers)
    samples, first = 0, None
    ids: set = set()
    stamps: list[tuple[float, int]] = []
    with Meter() as m:
        it = iter(loader)
        for i, batch in enumerate(it):
            if first is None:
                first = signature(batch)
            n = len(batch["__key__"])
            samples += n
            stamps.append((time.perf_counter() - m.t0, samples))
            if mode == "det":
                ids.update(zip(batch["__shard__"], batch["__key__"]))
            elif i + 1 >= n_batches:
                break
        m.stop()
        if hasattr(it, "close"):
            it.close()  # shuts the DataLoader workers down (joined -> their CPU is counted)
        del it, loader
        gc.collect()
    assert first == expected_signature(kind), (impl, kind, mode, first)
    if mode == "det":
        assert samples == total == len(ids), (impl, kind, samples, len(ids), total)
    else:
        assert samples == n_batches * BS, (impl, kind, samples)
    out = {"s": m.dt, "samples": samples, "sps": samples / m.dt, "cpu_s": m.cpu, "other_cores": m.other,
           "first_s": stamps[0][0]}
    if mode == "train" and 0 < steady_from < n_batches:
        (t0, n0), (t1, n1) = stamps[steady_from - 1], stamps[-1]
        out["steady_sps"] = (n1 - n0) / (t1 - t0)
    return out


# --------------------------------------------------------------------------- profile
def _consume(loader, n_batches: int | None) -> int:
    samples = 0
    for i, batch in enumerate(loader):
        samples += len(batch["__key__"])
        if n_batches is not None and i + 1 >= n_batches:
            break
    return samples


def profile(datasets: dict, n_batches: dict, out_dir: Path, workers: int, top: int = 35) -> list[str]:
    """cProfile both sides in THIS process (no DataLoader processes), doing exactly what ONE
    DataLoader worker does:

    * deterministic: worker 0 of ``workers`` (``torch.utils.data.get_worker_info`` is patched to
      say so, which both shardsmith's plan and webdataset's ``split_by_worker`` consult), over
      the same shards as the timed runs; the shardsmith loader is built for ``workers``;
    * training: ``num_workers=0`` (one stream), ``n_batches`` batches.

    ``torch.set_num_threads(1)`` first, as in a DataLoader worker.
    """
    import cProfile
    import pstats
    import types

    import torch.utils.data as tud

    out_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    # a DataLoader worker runs torch with ONE intra-op thread (torch sets it in every worker);
    # in-process the default (2 here) makes small tensor ops spin on this busy 2-core machine
    torch.set_num_threads(1)
    real_gwi = tud.get_worker_info
    for kind, (folder, total) in datasets.items():
        for mode in ("det", "train"):
            for impl in ("shardsmith", "webdataset"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if mode == "det":
                        obj = MAKERS[impl](folder, kind, mode, workers)
                        it_src = obj.dataset if impl == "shardsmith" else make_wds(folder, kind, mode, 0)
                        tud.get_worker_info = lambda: types.SimpleNamespace(id=0, num_workers=workers, seed=0)
                        nb, what = None, f"worker 0 of {workers}"
                    else:
                        it_src = MAKERS[impl](folder, kind, mode, 0)
                        nb, what = n_batches[kind], f"num_workers=0, {n_batches[kind]} batches"
                    try:
                        pr = cProfile.Profile()
                        t0 = time.perf_counter()
                        pr.enable()
                        n = _consume(it_src if not (impl == "shardsmith" and mode == "det")
                                     else (b for b in it_src if "__stats__" not in b), nb)
                        pr.disable()
                        dt = time.perf_counter() - t0
                    finally:
                        tud.get_worker_info = real_gwi
                path = out_dir / f"loader_profile_{kind}_{mode}_{impl}.txt"
                line = (f"{impl} {kind} {'deterministic' if mode == 'det' else 'training'} ({what}): {n} samples "
                        f"in {dt:.2f}s = {1e3 * dt / n:.3f} ms/sample under cProfile")
                with open(path, "w") as f:
                    f.write(f"# {line}\n")
                    st = pstats.Stats(pr, stream=f)
                    st.sort_stats("tottime").print_stats(top)
                    st.sort_stats("cumulative").print_stats(top)
                lines.append(line + f" -> {path.name}")
                print("# profile " + lines[-1], flush=True)
    return lines


# --------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=DEFAULT_WORK, help=f"cache folder (default {DEFAULT_WORK})")
    ap.add_argument("--n-images", type=int, default=3000)
    ap.add_argument("--n-latents", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--image-shards", type=int, default=6,
                    help="use only the first K image shards (250 samples each) for the timed runs; 0 = all")
    ap.add_argument("--latent-shards", type=int, default=2,
                    help="use only the first K latent shards (1000 samples each) for the timed runs; 0 = all")
    ap.add_argument("--train-batches-images", type=int, default=100)
    ap.add_argument("--train-batches-latents", type=int, default=100)
    ap.add_argument("--steady-from", type=int, default=70,
                    help="training: steady-state rate measured after this many batches (both shuffle buffers full)")
    ap.add_argument("--datasets", default="images,latents")
    ap.add_argument("--modes", default="det,train")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="before each timed run wait up to this many seconds for other processes to go quiet")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--profile", action="store_true", help="cProfile both sides with num_workers=0 instead")
    ap.add_argument("--profile-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args(argv)

    info = machine_info()
    print(header(info), flush=True)
    kinds = [k for k in args.datasets.split(",") if k]
    datasets = {}
    if "images" in kinds:
        f = subset(prepare_images(args.work, args.n_images), args.image_shards)
        datasets["images"] = (f, sum(json.loads((f / "shard_count.json").read_text()).values()))
    if "latents" in kinds:
        f = subset(prepare_latents(args.work, args.n_latents), args.latent_shards)
        datasets["latents"] = (f, sum(json.loads((f / "shard_count.json").read_text()).values()))
    for kind, (f, total) in datasets.items():
        print(f"# dataset {kind}: {f} {len(shard_paths(f))} shards, {total} samples, "
              f"{dataset_bytes(f) / 1e6:.1f} MB", flush=True)
        plain_read(shard_paths(f))  # warm page cache
        print("# check: " + check_equivalence(f, kind), flush=True)
    n_batches = {"images": args.train_batches_images, "latents": args.train_batches_latents}
    if args.profile:
        profile(datasets, n_batches, args.profile_dir, args.workers)
        return 0

    modes = [m for m in args.modes.split(",") if m]
    variants = [(kind, mode, impl) for kind in datasets for mode in modes for impl in ("shardsmith", "webdataset")]
    t_start = time.perf_counter()
    # untimed warm-up: page cache + one short deterministic pass of each side on 2 shards
    # (imports and decoder code paths; the decoders already ran in-process in check_equivalence)
    for kind, (f, total) in datasets.items():
        plain_read(shard_paths(f))
        g = subset(f, 2) if len(shard_paths(f)) > 2 else f
        n = sum(json.loads((g / "shard_count.json").read_text()).values())
        for impl in ("shardsmith", "webdataset"):
            run_once(impl, g, kind, "det", args.workers, 0, n)
    print(f"# warm-up done in {time.perf_counter() - t_start:.1f}s", flush=True)

    load0 = os.getloadavg()
    res: dict = {v: [] for v in variants}
    for r in range(args.repeats):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            kind, mode, impl = v
            f, total = datasets[kind]
            gc.collect()
            waited = wait_quiet(args.settle) if args.settle > 0 else 0.0
            x = run_once(impl, f, kind, mode, args.workers, n_batches[kind], total, args.steady_from)
            x["waited"] = waited
            res[v].append(x)
            print(f"# repeat {r + 1}/{args.repeats} {kind:<7} {mode:<5} {impl:<10} {x['s']:7.2f} s "
                  f"{x['sps']:8.1f} samples/s  cpu {x['cpu_s']:6.2f} s  other-load {x['other_cores']:4.2f} cores "
                  f"(waited {waited:3.1f} s) samples={x['samples']} first-batch {x['first_s']:5.2f} s"
                  + (f" steady {x['steady_sps']:6.1f}/s" if "steady_sps" in x else ""), flush=True)
    load1 = os.getloadavg()

    rows = []
    for kind in datasets:
        for mode in modes:
            ss, wd = res[(kind, mode, "shardsmith")], res[(kind, mode, "webdataset")]
            metrics = [("sps", "samples/s over the timed run" if mode == "det" else
                        f"samples/s, iter() to batch {n_batches[kind]} (buffer fill incl.)")]
            if mode == "train" and "steady_sps" in ss[0]:
                metrics.append(("steady_sps", f"samples/s steady state, batches {args.steady_from + 1}.."
                                              f"{n_batches[kind]}"))
            for key, label in metrics:
                ratios = [a[key] / b[key] for a, b in zip(ss, wd)]
                rows.append({"dataset": kind, "mode": mode, "metric": label, "samples": ss[0]["samples"],
                             "shardsmith": [a[key] for a in ss], "webdataset": [b[key] for b in wd],
                             "ratios": ratios, "median_ratio": median(ratios),
                             "cpu_ratios": [b["cpu_s"] / a["cpu_s"] for a, b in zip(ss, wd)],
                             "first_s": (median([a["first_s"] for a in ss]), median([b["first_s"] for b in wd])),
                             "other": max(x["other_cores"] for x in ss + wd)})
    print()
    print(f"batch {BS}, workers {args.workers}, repeats {args.repeats}, image_size {IMAGE_SIZE}, shuffle {SHUFFLE}; "
          f"train batches: images {n_batches['images']}, latents {n_batches['latents']}; "
          f"loadavg(1m) before {load0[0]:.2f}, after {load1[0]:.2f}; timed part {time.perf_counter() - t_start:.0f}s")
    print()
    print("| dataset | mode | samples/run | metric | shardsmith (median) | webdataset (median) "
          "| ratio ss/wds (median of per-repeat) | ratio min..max | CPU-eff. wds/ss | first batch s ss / wds "
          "| other load cores (max) |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['dataset']} | {'deterministic' if row['mode'] == 'det' else 'training'} | {row['samples']} "
              f"| {row['metric']} | {median(row['shardsmith']):.1f} | {median(row['webdataset']):.1f} "
              f"| **{row['median_ratio']:.3f}** | {min(row['ratios']):.3f}..{max(row['ratios']):.3f} "
              f"| {median(row['cpu_ratios']):.3f} | {row['first_s'][0]:.2f} / {row['first_s'][1]:.2f} "
              f"| {row['other']:.2f} |")
    print()
    print("ratio = shardsmith / webdataset samples/s within one repeat (adjacent runs), median over repeats "
          "(goal >= 1.0). CPU-eff. = webdataset CPU s / shardsmith CPU s per run (main process + joined "
          "DataLoader workers, whole run; >1 = shardsmith uses less CPU). other load = cores used by unrelated "
          "processes during the run (machine has 2).")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "args": {k: str(v) for k, v in vars(args).items()},
                                         "loadavg_before": load0, "loadavg_after": load1, "rows": rows},
                                        indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
