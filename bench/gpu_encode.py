"""GPU encode benchmark (H200 via the device tool): end to end vs encoder alone vs naive loop.

One run measures, on the same GPU and the same random-weight published architectures:
- images, SD-VAE (AutoencoderKL, published config) at 256x256, bf16:
  * encoder alone: a resident [B,3,256,256] bf16 batch, cudnn.benchmark, median of timed runs;
  * naive loop: EDM2 dataset_tool style - PIL decode + resize/crop, fp32, batch 1, one torch.save per item;
  * shardsmith end to end: JPEG files on disk -> latent WebDataset shards (``build`` with a latent_wds
    output, bucket 256x256x1, CPU decode workers), images/s over the whole build;
- video, LTX-Video VAE (published config) at F x H x W (default 121x512x768), bf16:
  * encoder alone and shardsmith end to end (mp4 files -> .precomputed latents).
FLOPs per item come from torch.utils.flop_counter; % of peak uses 790 TFLOP/s dense bf16.

Usage (on the GPU machine): PYTHONPATH=src:tests python3 bench/gpu_encode.py --out $OUT/gpu.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

PEAK_TFLOPS = 790.0


def flops_of(fn) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return float(fc.get_total_flops())


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return out


def encoder_alone(vae, shape, batch: int, repeats: int) -> dict:
    x = torch.randn(batch, *shape, device="cuda", dtype=vae.torch_dtype).clamp_(-1, 1)
    for _ in range(3):
        vae.encode(x)
    ts = timed(lambda: vae.encode(x), repeats)
    med = statistics.median(ts)
    one = flops_of(lambda: vae.encode(x[:1]))
    rate = batch / med
    return {"batch": batch, "median_s": med, "items_per_s": rate, "gflop_per_item": one / 1e9,
            "pct_peak": 100 * rate * one / 1e12 / PEAK_TFLOPS}


def naive_images(files, vae_family: str, n: int) -> dict:
    """EDM2 dataset_tool encode style: per item PIL decode, center crop+resize, fp32 batch 1, torch.save."""
    from PIL import Image

    from shardsmith.encode.vae import load_vae

    vae = load_vae(vae_family, config="published", dtype="float32", device="cuda")
    tmp = Path(tempfile.mkdtemp())
    torch.backends.cudnn.benchmark = False
    t = time.perf_counter()
    for i, f in enumerate(files[:n]):
        img = Image.open(f).convert("RGB")
        s = min(img.size)
        img = img.crop(((img.width - s) // 2, (img.height - s) // 2, (img.width + s) // 2, (img.height + s) // 2))
        img = img.resize((256, 256), Image.Resampling.LANCZOS)
        x = torch.from_numpy(np.asarray(img)).permute(2, 0, 1)[None].float().cuda() / 127.5 - 1
        z = vae.encode(x)
        torch.save(z.cpu(), tmp / f"{i:08d}.pt")
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    shutil.rmtree(tmp)
    return {"items": n, "seconds": dt, "items_per_s": n / dt}


def end_to_end(src: Path, out: Path, recipe: dict, workers: int) -> dict:
    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict

    rec = recipe_from_dict(recipe)
    if out.exists():
        shutil.rmtree(out)
    t = time.perf_counter()
    m = build(rec, out, quiet=True, workers=workers)
    dt = time.perf_counter() - t
    return {"items": m["counts"]["written"], "seconds": dt, "items_per_s": m["counts"]["written"] / dt,
            "failed": m["counts"]["failed"], "skipped": m["counts"]["skipped"],
            "encode_stage_seconds": m["models"]["seconds"], "steady_state": m["models"]["steady_state"]}


def write_pan_clip(path: Path, frames: int, h: int, w: int, i: int) -> None:
    """A real-content clip: a pan across an upscaled real photo, libx264 at 24 fps."""
    import av
    from PIL import Image
    from skimage import data

    photo = [data.astronaut, data.chelsea, data.coffee, data.rocket][i % 4]()
    photo = np.roll(photo, 17 * i, axis=1)  # every clip distinct (the build drops exact duplicates)
    big = np.asarray(Image.fromarray(photo).resize((w * 2, h * 2), Image.Resampling.BICUBIC))
    with av.open(str(path), mode="w") as c:
        s = c.add_stream("libx264", rate=24)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for k in range(frames):
            x = int((big.shape[1] - w) * k / max(1, frames - 1))
            y = int((big.shape[0] - h) * k / max(1, frames - 1))
            fr = av.VideoFrame.from_ndarray(np.ascontiguousarray(big[y:y + h, x:x + w]), format="rgb24")
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--naive", type=int, default=300)
    ap.add_argument("--clips", type=int, default=12)
    ap.add_argument("--video", default="121x512x768", help="FxHxW")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--skip-video", action="store_true")
    args = ap.parse_args()
    from media_factory import real_photos

    from shardsmith.encode.vae import load_vae

    res: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cpus": os.cpu_count(),
                 "workers": args.workers}
    work = Path(tempfile.mkdtemp(prefix="gpubench-"))
    t = time.perf_counter()
    files = real_photos(work / "photos", args.images, seed=0, min_side=256, max_side=480)
    res["gen_images_s"] = time.perf_counter() - t
    print("generated", len(files), "photos", flush=True)

    torch.backends.cudnn.benchmark = True
    vae = load_vae("sd", config="published", dtype="bfloat16", device="cuda")
    res["sd_encoder_alone"] = encoder_alone(vae, (3, 256, 256), args.batch, 20)
    print("sd alone", res["sd_encoder_alone"], flush=True)
    del vae
    torch.cuda.empty_cache()
    res["sd_naive_fp32_b1"] = naive_images(files, "sd", args.naive)
    print("naive", res["sd_naive_fp32_b1"], flush=True)
    torch.backends.cudnn.benchmark = True
    recipe = {"sources": [{"path": str(work / "photos")}], "geometry": {"buckets": ["256x256x1"]},
              "models": {"vae": {"family": "sd", "config": "published", "dtype": "bfloat16"},
                         "batch_size": args.batch},
              "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 1000,
                           "latent_dtype": "bfloat16"}]}
    res["sd_end_to_end"] = end_to_end(work / "photos", work / "out_img", recipe, args.workers)
    print("e2e", res["sd_end_to_end"], flush=True)
    res["sd_encoder_alone_after"] = encoder_alone(load_vae("sd", config="published", dtype="bfloat16",
                                                           device="cuda"), (3, 256, 256), args.batch, 20)
    print("sd alone (after)", res["sd_encoder_alone_after"], flush=True)
    a, e = res["sd_encoder_alone"], res["sd_end_to_end"]
    res["sd_ratio_e2e_vs_alone"] = e["items_per_s"] / a["items_per_s"]
    res["sd_ratio_e2e_vs_naive"] = e["items_per_s"] / res["sd_naive_fp32_b1"]["items_per_s"]
    res["sd_e2e_pct_peak"] = 100 * e["items_per_s"] * a["gflop_per_item"] / 1e3 / PEAK_TFLOPS

    if not args.skip_video:
        f, h, w = (int(v) for v in args.video.split("x"))
        t = time.perf_counter()
        from concurrent.futures import ProcessPoolExecutor

        (work / "clips").mkdir()
        with ProcessPoolExecutor(max_workers=args.workers) as ex:
            list(ex.map(write_pan_clip, [work / "clips" / f"clip_{i:03d}.mp4" for i in range(args.clips)],
                        [f] * args.clips, [h] * args.clips, [w] * args.clips, range(args.clips)))
        res["gen_clips_s"] = time.perf_counter() - t
        vae = load_vae("ltx", config="published", dtype="bfloat16", device="cuda")
        res["ltx_encoder_alone"] = encoder_alone(vae, (3, f, h, w), 1, 5)
        print("ltx alone", res["ltx_encoder_alone"], flush=True)
        del vae
        torch.cuda.empty_cache()
        recipe = {"sources": [{"path": str(work / "clips")}], "geometry": {"buckets": [f"{w}x{h}x{f}"]},
                  "models": {"vae": {"family": "ltx", "config": "published", "dtype": "bfloat16"}, "batch_size": 1},
                  "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 100,
                               "latent_dtype": "bfloat16"}]}
        res["ltx_end_to_end"] = end_to_end(work / "clips", work / "out_vid", recipe, min(args.workers, 8))
        res["ltx_ratio_e2e_vs_alone"] = res["ltx_end_to_end"]["items_per_s"] / res["ltx_encoder_alone"]["items_per_s"]
        print("ltx e2e", res["ltx_end_to_end"], flush=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
