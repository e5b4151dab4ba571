"""Image latent builds through the CLI as a user runs them, against the encoder alone, in one lease.

For each workload: generate the JPEGs (real photos: seeded random crops of scikit-image's samples),
time the SD-VAE encoder alone (``shardsmith``'s own loader, published config with random weights,
bf16, a resident batch, eager), then run ``python -m shardsmith build recipe.yaml --out DIR`` for
each ``images.decoder`` asked (``auto``: nvJPEG on a GPU; ``cpu``: Pillow in the decode workers),
interleaved, and report wall time from the command to its exit (the manifest is the last file
written), items/s, whole build / encoder alone, and the manifest's steady state and GPU idle
breakdown (diagnostics, labelled so).

The ``text`` workload (issue 20's text goal): ``--prompts`` distinct captions that fill ``--text-len`` tokens, in
a captions-only JSONL table, through ``build`` into a ``prompt_wds`` output with T5-XXL embeddings (published
config, random weights, bf16, batch ``--text-batch``); the encoder alone is a resident token batch of the same
size (``TextEncoder``'s own forward), and % of bf16 peak is the build's prompts/s x the FLOPs of one prompt
(``torch.utils.flop_counter``) / 790 TFLOP/s.

Usage (on a GPU machine):
  PYTHONPATH=src:tests python3 bench/cli_gpu_build.py --work /tmp/bench --out r.json \\
      --small 10240 --small-copies 4 --big 1024 --big-copies 8 --decoders auto,cpu
  CPU check of the text workload's code paths: ... --workloads text --prompts 24 --text-config tiny --text-len 32 \\
      --text-batch 8 --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _cli import subset_build, timed_build
from _media import make_clips

REPO = Path(__file__).resolve().parent.parent


def _photos(args: tuple[Path, int, int, int, int]) -> int:
    from media_factory import real_photos

    dest, n, seed, lo, hi = args
    return len(real_photos(dest, n, seed=seed, min_side=lo, max_side=hi))


def make_photos(dest: Path, n: int, lo: int, hi: int, procs: int) -> float:
    """``n`` JPEGs with sides in [lo, hi] under ``dest`` (sub-folders of seeded chunks); seconds taken."""
    t = time.perf_counter()
    per = -(-n // procs)
    jobs = [(dest / f"c{i:02d}", min(per, n - i * per), 1000 + i, lo, hi) for i in range(procs) if n - i * per > 0]
    with ProcessPoolExecutor(procs) as ex:
        assert sum(ex.map(_photos, jobs)) == n
    return time.perf_counter() - t


def add_copies(dest: Path, k: int) -> int:
    """``k - 1`` more copies of every JPEG, each with 8 bytes after its end-of-image marker (same pixels,
    distinct files for the planner)."""
    files = sorted(dest.rglob("*.jpg"))
    for j in range(1, k):
        for f in files:
            f.with_name(f"{f.stem}_copy{j:02d}.jpg").write_bytes(f.read_bytes() + j.to_bytes(8, "little"))
    return len(files) * k


def batch_seconds(run, n: int) -> list[float]:
    """Seconds of each of ``n`` calls of ``run`` (one batch on the GPU), each waited for on the device."""
    import torch

    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        run()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return out


def encoder_alone(size: int, batch: int, repeats: int, family: str = "sd", frames: tuple[int, int, int] | None = None,
                  compiled: bool = False) -> dict:
    """The encoder (published config, random weights) on a resident bf16 batch: SD-VAE on [batch, 3, size,
    size] (what the image build's batches run), or ``family`` on ``frames`` = (F, H, W) clips; eager, or
    ``compiled`` as the build compiles it (same mode, same persistent cache). cuDNN's autotuner on (the build
    runs cuDNN's deterministic heuristics: the baseline is the faster of the two). An image batch in the build's
    layout (contiguous: encode/staging.py) and channels-last, each timed; the baseline is the faster (on one H100
    host channels-last ran 0.112 s a batch against 0.092 s contiguous: BENCHMARKS.md §10, twenty-fifth session)."""
    import torch

    from shardsmith.encode.vae import load_vae

    t = time.perf_counter()
    vae = load_vae(family, config="published", dtype="bfloat16", device="cuda")
    load_s = time.perf_counter() - t
    torch.backends.cudnn.benchmark = True
    shape = (3, *frames) if frames else (3, size, size)
    x = torch.rand(batch, *shape, device="cuda", dtype=torch.bfloat16) * 2 - 1
    layouts = {"contiguous": x}
    if frames is None and not compiled:
        layouts["channels_last"] = x.contiguous(memory_format=torch.channels_last)
    compile_s = None
    if compiled:
        from shardsmith.encode import compile as cc
        from shardsmith.encode import packaged_encoder
        from shardsmith.recipe import Recipe

        cc.use_cache_dir()
        if frames is None:  # as the image build runs it: the AOTInductor package of this model and shape
            rec = Recipe.model_validate(image_recipe(Path("."), size, "auto", batch, "on"))
            packaged_encoder.attach(vae, rec, "cuda")
        vae.compile(mode=cc.COMPILE_MODE, backend="inductor")
        t = time.perf_counter()
        vae.encode(x)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t  # the first compiled batch: compile (or package load) included
    meds = {}
    for name, xs in layouts.items():
        for _ in range(3):
            vae.encode(xs)
        meds[name] = statistics.median(batch_seconds(lambda: vae.encode(xs), repeats))  # noqa: B023
    med = min(meds.values())
    packages = vae.packages.describe() if getattr(vae, "packages", None) is not None else None
    vae = None  # (its memory back to the cache, emptied below)
    torch.cuda.empty_cache()
    return {"family": family, "shape": list(shape), "batch": batch, "compiled": compiled, "median_batch_s": med,
            "median_batch_s_by_layout": meds,
            "items_per_s": batch / med, "load_s": load_s, "first_compiled_batch_s": compile_s, "packages": packages}


BARE = """
import sys
import torch
from shardsmith.encode.vae import load_vae
vae = load_vae(sys.argv[1], config="published", dtype="bfloat16", device="cuda")
torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
x = torch.rand(*[int(v) for v in sys.argv[2].split(",")], device="cuda", dtype=torch.bfloat16) * 2 - 1
vae.encode(x)
torch.cuda.synchronize()
"""


def bare_start(family: str, shape: tuple[int, ...], repeats: int = 2) -> dict:
    """The least any build pays before its first batch: a fresh interpreter that imports torch and the
    encoder's library, builds the model on the GPU and encodes one batch of the build's shape (cuDNN as the
    build sets it), then exits; seconds from the command to its exit, median of ``repeats`` (the first
    run is extra, untimed: files in the page cache, as for the builds after it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-c", BARE, family, ",".join(str(v) for v in shape)]
    ts = []
    for i in range(repeats + 1):
        t = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, env=env)
        if i:
            ts.append(time.perf_counter() - t)
    return {"family": family, "shape": list(shape), "seconds": ts, "median_s": statistics.median(ts)}


def pixel_parity(src: Path, size: int, n: int) -> dict:
    """The GPU path's pixels (nvJPEG + orient + antialiased bicubic + crop) against the CPU path's
    (Pillow), the same geometry, over ``n`` of the workload's JPEGs: |difference| in 0..255 levels."""
    import numpy as np
    import torch

    from shardsmith.encode.gpu_decode import StagedImages, decode_rows
    from shardsmith.recipe import ImageRules
    from shardsmith.records import PlannedItem
    from shardsmith.transform.buckets import parse_buckets
    from shardsmith.transform.latent_pixels import LatentPixelMaker

    files = sorted(src.rglob("*.jpg"))[:n]
    cpu = LatentPixelMaker(parse_buckets([f"{size}x{size}x1"]), ImageRules(upscale=True))
    gpu = LatentPixelMaker(parse_buckets([f"{size}x{size}x1"]), ImageRules(upscale=True), decoder="gpu")
    diffs = []
    for i, f in enumerate(files):
        item = PlannedItem(idx=i, item_id=f.name, key=f"k{i}", source=0, path=str(f), relpath=f.name, caption=None,
                           label=None, label_name=None, meta={}, sha256=None, size_bytes=f.stat().st_size, kind="image",
                           width=None, height=None, image_format="JPEG", mode="RGB", split="train", plan_status="ok")
        a, b = cpu(item), gpu(item)
        got = decode_rows(StagedImages([b.pixels]), "cuda")[0].cpu().numpy().astype(int)
        diffs.append(np.abs(got - a.pixels[0].astype(int)).ravel())
    torch.cuda.synchronize()
    d = np.concatenate(diffs)
    return {"images": len(files), "mean_abs": float(d.mean()), "p99_abs": float(np.percentile(d, 99)),
            "max_abs": int(d.max()), "share_equal": float((d == 0).mean()), "share_within_1": float((d <= 1).mean())}


def image_recipe(src: Path, size: int, decoder: str, batch: int, compile_: str) -> dict:
    return {"sources": [{"path": str(src)}], "geometry": {"buckets": [f"{size}x{size}x1"]},
            "images": {"decoder": decoder, "upscale": True},
            "models": {"vae": {"family": "sd", "config": "published", "dtype": "bfloat16"}, "batch_size": batch,
                       "compile": compile_},
            "outputs": [{"format": "latent_wds", "dir": "lat"}]}


def video_recipe(src: Path, h: int, w: int, frames: int, compile_: str) -> dict:
    """The issue's LTX-2 workload: ``.precomputed/`` (latents + conditions), the LTX-2 VAE (published config,
    random weights, bf16) at one bucket, the tiny T5 for the captions, one clip a batch."""
    return {"sources": [{"path": str(src)}], "geometry": {"buckets": [f"{w}x{h}x{frames}"]},
            "models": {"vae": {"family": "ltx2", "config": "published", "dtype": "bfloat16"},
                       "text": {"family": "t5", "config": "tiny"}, "batch_size": 1, "compile": compile_},
            "outputs": [{"format": "precomputed"}]}


def text_recipe(table: Path, config: str, length: int, batch: int, device: str) -> dict:
    """Prompt-only shards with T5 embeddings: the text encoder alone is loaded (no VAE, no buckets)."""
    return {"sources": [{"path": str(table), "columns": {"caption": "prompt"}}],
            "models": {"text": {"family": "t5", "config": config, "max_length": length, "dtype": "bfloat16"},
                       "batch_size": batch, "device": device},
            "outputs": [{"format": "prompt_wds", "dir": "prompts", "text_dtype": "bfloat16"}]}


def make_prompt_table(dest: Path, n: int, length: int) -> Path:
    """``n`` distinct captions of at least ``length`` words (so they fill ``length`` tokens) as a JSONL table."""
    from gpu_encode import make_prompts

    dest.mkdir(parents=True, exist_ok=True)
    table = dest / "prompts.jsonl"
    table.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in make_prompts(n, min_words=length)))
    return table


def text_alone(config: str, length: int, batch: int, repeats: int, device: str) -> dict:
    """The text encoder (shardsmith's loader, random weights, bf16) on a resident token batch of ``batch``
    captions that fill ``length`` tokens: median seconds of its forward, prompts/s, FLOPs of one prompt and
    % of the H200's dense bf16 peak."""
    import torch
    from gpu_encode import _text_forward, flops_of, make_prompts, pct_peak

    from shardsmith.encode.text import load_text_encoder

    t = time.perf_counter()
    enc = load_text_encoder("t5", config=config, max_length=length, dtype="bfloat16", device=device)
    load_s = time.perf_counter() - t
    ids, mask, _ = enc.tokenize(make_prompts(batch, min_words=length, seed=1))
    ids, mask = ids.to(device), mask.to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def fwd():
        with torch.inference_mode():
            return _text_forward(enc, ids, mask)

    for _ in range(3):
        fwd()
    sync()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fwd()
        sync()
        ts.append(time.perf_counter() - t)
    with torch.inference_mode():
        one = flops_of(lambda: _text_forward(enc, ids[:1], mask[:1]))
    med = statistics.median(ts)
    enc = ids = mask = None  # the model's memory back before the build
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"family": "t5", "config": config, "tokens": length, "batch": batch, "median_batch_s": med,
            "items_per_s": batch / med, "tflop_per_item": one / 1e12, "pct_peak": pct_peak(batch / med, one),
            "load_s": load_s}


def cli_build(recipe: dict, work: Path, name: str, decoder: str, compile_: str, src: Path | None = None) -> dict:
    rp = work / f"{name}.yaml"
    rp.write_text(json.dumps(recipe))
    r = timed_build([str(rp), "--no-report"], work / f"out_{name}", src=src)
    if r.rc != 0:
        return {"name": name, "rc": r.rc, "stderr": r.stderr_tail}
    m = r.manifest
    written = m["counts"]["written"]
    ss = m["models"].get("steady_state") or {}
    return {"name": name, "decoder": decoder, "compile": compile_, "code": "alt" if src else "this checkout",
            "rc": 0, "wall_s": r.wall_s, "exit_s": r.exit_s,
            "written": written,
            "items_per_s": written / r.wall_s, "failed": m["counts"]["failed"], "skipped": m["counts"]["skipped"],
            "image_decoder": m["models"].get("image_decoder", "pil"),
            "first_batch_done_s": ss.get("first_batch_done_s"),
            "diagnostics": {"steady_state": ss, "seconds": m["models"].get("seconds"),
                            "compile": m["models"].get("compile"), "warm_up": m["models"].get("warm_up"),
                            "timings": m.get("timings")}}


def text_workload(args) -> dict:
    """The text workload (module doc): the encoder alone, then the build through the CLI, same process tree."""
    sys.path.insert(0, str(REPO / "bench"))
    t = time.perf_counter()
    table = make_prompt_table(args.work / "src_text", args.prompts, args.text_len)
    w: dict = {"name": "text", "prompts": args.prompts, "gen_s": time.perf_counter() - t,
               "encoder_alone": text_alone(args.text_config, args.text_len, args.text_batch, 10, args.device)}
    print(json.dumps(w), flush=True)
    b = cli_build(text_recipe(table, args.text_config, args.text_len, args.text_batch, args.device), args.work,
                  "text", "-", "off")
    if b.get("rc") == 0:
        alone = w["encoder_alone"]
        b["ratio_to_encoder_alone"] = b["items_per_s"] / alone["items_per_s"]
        b["pct_peak"] = alone["pct_peak"] * b["ratio_to_encoder_alone"]
    w["builds"] = [b]
    print(json.dumps({k: v for k, v in b.items() if k != "diagnostics"}), flush=True)
    subprocess.run(["rm", "-rf", str(args.work / "src_text"), str(args.work / "out_text")])
    return w


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workloads", default="small,big", help="of small, big, video, text")
    ap.add_argument("--small", type=int, default=10240)
    ap.add_argument("--small-copies", type=int, default=4)
    ap.add_argument("--big", type=int, default=1024)
    ap.add_argument("--big-copies", type=int, default=8)
    ap.add_argument("--clips", type=int, default=240)
    ap.add_argument("--video", default="512x768x121", help="HxWxF of the video bucket (clips are 121-137 frames)")
    ap.add_argument("--decoders", default="auto")
    ap.add_argument("--small-decoders", default=None, help="decoders of the small workload (default: --decoders)")
    ap.add_argument("--compile", default="off", help="models.compile of the builds (on: an untimed build of "
                    "--warm files first fills the persistent compile cache, and the encoder alone is compiled)")
    ap.add_argument("--warm", type=int, default=256, help="files of the untimed cache-filling build (on; auto with "
                    "--warm above 0: the builds then find the cache warm, and the encoder alone is compiled)")
    ap.add_argument("--parity", action="store_true", help="also the GPU decoder's pixels against Pillow's")
    ap.add_argument("--no-bare", action="store_true", help="leave out the bare start (fresh interpreter to first batch)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--alt-src", type=Path, default=None, help="a src folder of other code (the code before a "
                    "change): each repeat builds with this checkout's code, then with it (same encoder alone)")
    ap.add_argument("--prompts", type=int, default=8192, help="captions of the text workload")
    ap.add_argument("--text-config", default="xxl", help="T5 config of the text workload (xxl: T5 v1.1 XXL)")
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--text-batch", type=int, default=64)
    ap.add_argument("--device", default="cuda", help="the text workload's device (cpu: a check of its code paths)")
    args = ap.parse_args()
    compiled_alone = args.compile == "on" or (args.compile == "auto" and args.warm > 0)  # (see --warm)
    procs = os.cpu_count() or 4
    res: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "cpus": procs, "workloads": []}
    args.work.mkdir(parents=True, exist_ok=True)
    wanted = args.workloads.split(",")
    h, w_, f = (int(v) for v in args.video.split("x"))
    loads = [("small", args.small, 288, 640, 256, args.small_copies), ("big", args.big, 1500, 3500, 512, args.big_copies),
             ("video", args.clips, 0, 0, 0, 1)]
    if "text" in wanted and args.prompts > 0:
        res["workloads"].append(text_workload(args))
        args.out.write_text(json.dumps(res, indent=1))
    for name, n, lo, hi, size, copies in loads:
        if n <= 0 or name not in wanted:
            continue
        src = args.work / f"src_{name}"
        w: dict = {"name": name, "size": size}
        t = time.perf_counter()
        if name == "video":
            make_clips(src, n, h, w_, procs)
            w["gen_s"], w["files"] = time.perf_counter() - t, n
            w["encoder_alone"] = encoder_alone(0, 1, 5, family="ltx2", frames=(f, h, w_), compiled=compiled_alone)
            if not args.no_bare:
                w["bare_start"] = bare_start("ltx2", (1, 3, f, h, w_))
        else:
            w["gen_s"] = make_photos(src, n, lo, hi, procs)
            w["files"] = add_copies(src, copies) if copies > 1 else n
            w["encoder_alone"] = encoder_alone(size, 64, 20, compiled=compiled_alone)
            if not args.no_bare:
                w["bare_start"] = bare_start("sd", (64, 3, size, size))
        if args.parity and name != "video":
            try:
                w["pixel_parity"] = pixel_parity(src, size, 200)
            except Exception as exc:  # noqa: BLE001 - a diagnostic: the builds still run
                w["pixel_parity"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({k: v for k, v in w.items()}), flush=True)
        w["builds"] = []
        decs = ["auto"] if name == "video" else (
            args.small_decoders if name == "small" and args.small_decoders else args.decoders).split(",")
        if compiled_alone:
            rec = video_recipe(src, h, w_, f, "on") if name == "video" else image_recipe(src, size, decs[0], 64, "on")
            w["warm_cache_build_s"] = subset_build(rec, src, args.work, args.warm)
            print(json.dumps({"warm_cache_build_s": w["warm_cache_build_s"]}), flush=True)
        for rep in range(args.repeats):
            for dec, code in ((d, c) for d in decs for c in ([None, args.alt_src] if args.alt_src else [None])):
                rec = video_recipe(src, h, w_, f, args.compile) if name == "video" else image_recipe(
                    src, size, dec, 64, args.compile)
                b = cli_build(rec, args.work, f"{name}_{dec}_{rep}" + ("_alt" if code else ""), dec, args.compile,
                              code)
                if b.get("rc") == 0:
                    b["ratio_to_encoder_alone"] = b["items_per_s"] / w["encoder_alone"]["items_per_s"]
                w["builds"].append(b)
                print(json.dumps({k: v for k, v in b.items() if k != "diagnostics"}), flush=True)
        res["workloads"].append(w)
        args.out.write_text(json.dumps(res, indent=1))
        subprocess.run(["rm", "-rf", str(src)] + [str(p) for p in args.work.glob(f"out_{name}_*")])
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
