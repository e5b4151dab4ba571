"""GPU encode benchmark (H200 via the device tool): end to end vs encoder alone vs naive loop.

One run measures, on the same GPU and the same random-weight published architectures:
- images, SD-VAE (AutoencoderKL, published config) at 256x256, bf16:
  * encoder alone: a resident [B,3,256,256] bf16 batch, cudnn.benchmark, median of timed runs;
  * naive loop: EDM2 dataset_tool style - PIL decode + resize/crop, fp32, batch 1, one torch.save per item;
  * shardsmith end to end: JPEG files on disk -> latent WebDataset shards (``build`` with a latent_wds
    output, bucket 256x256x1, CPU decode workers), images/s over the whole build;
- video, LTX-Video (``--video-family ltx``, default) or LTX-2 (``ltx2``) VAE (published config) at
  F x H x W (default 121x512x768), bf16:
  * encoder alone and shardsmith end to end (mp4 files -> latents);
- text, T5-XXL (``--text-family t5 --text-config xxl``, default; umt5 for umT5-XXL) at 512 tokens, bf16:
  * encoder alone: a resident [64, 512] token batch, median of timed forward passes;
  * the pipeline's text path: ``EncodeStage.text`` on N distinct prompts that fill 512 tokens
    (tokenisation, encode, copies to the host, cache) around the same loaded encoder;
  * with ``--text-build``: a whole build of N captioned images (tiny VAE, so the text encoder is the
    work) into ``txt_emb.pth`` shards, whole-build and steady-state prompts/s.
``--copies K`` builds from K x ``--images`` files (distinct bytes, same pixels), for whole-build
ratios of long runs. With ``--compile --ab-sync`` the compiled image build runs a second time with every batch waited for
at launch (the behaviour before launch-ahead batches), for the ratio between the two; with
``--compile --ab-plan-ahead`` it runs a second time with the whole plan before the first batch
(no plan ahead; ``--ab-in-flight 2 --ab-switch-s 0.0005`` also with 2 batches in flight and a
0.5 ms GIL switch interval, as before run 20), for the ratio of whole-build times.
FLOPs per item come from torch.utils.flop_counter; % of peak uses 790 TFLOP/s dense bf16.
Sections run in the order image, text, video; the JSON is rewritten after each section, and a
section that fails is recorded under ``errors`` (exit status 1) without stopping the others.

``--compile-cache-out F`` saves torch.compile's cache artifacts after the cold compile (gzip; ~80 KB for the
tiny CPU model); ``--compile-cache-in F`` loads them in a later lease (carry F in an ignored folder), so
the compiled section starts from a cache hit instead of the minutes of a cold max-autotune compile.

Usage (on the GPU machine): PYTHONPATH=src:tests python3 bench/gpu_encode.py --out $OUT/gpu.json
  text + LTX-2 only: ... --skip-image --video-family ltx2 --clips 12
  CPU check of every code path (tiny configs, tiny sizes): ... --cpu-dry-run
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from _media import write_pan_clip

PEAK_TFLOPS = 790.0
DEV = "cuda"  # "cpu" under --cpu-dry-run


def sync() -> None:
    """torch.cuda.synchronize, a no-op without CUDA (--cpu-dry-run)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free_cache() -> None:
    gc.collect()  # models held by reference cycles go now, not at some later collection
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def flops_of(fn) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return float(fc.get_total_flops())


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return out


def median_ms(fn, repeats: int = 10, warmup: int = 2) -> float:
    """Median wall milliseconds of ``fn`` (synchronised), after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    return round(statistics.median(timed(fn, repeats)) * 1e3, 2)


def pct_peak(items_per_s: float, flop_per_item: float) -> float:
    return 100 * items_per_s * flop_per_item / 1e12 / PEAK_TFLOPS


def encoder_alone(vae, shape, batch: int, repeats: int, gflop_per_item: float | None = None) -> dict:
    """Median time of ``vae.encode`` on a resident batch. FLOPs are counted on one item unless
    given: pass them for a compiled model, because a call under FlopCounterMode leaves the
    compiled encoder running eagerly from then on (probe 2026-12-03: 40 -> 87 ms a batch)."""
    x = torch.randn(batch, *shape, device=DEV, dtype=vae.torch_dtype).clamp_(-1, 1)
    for _ in range(3):
        vae.encode(x)
    ts = timed(lambda: vae.encode(x), repeats)
    med = statistics.median(ts)
    one = gflop_per_item * 1e9 if gflop_per_item else flops_of(lambda: vae.encode(x[:1]))
    rate = batch / med
    return {"batch": batch, "median_s": med, "items_per_s": rate, "gflop_per_item": one / 1e9,
            "pct_peak": pct_peak(rate, one)}


def stage_alone(vae, size: int, batch: int, repeats: int) -> dict:
    """The build's own encode call (``EncodeStage.stage`` + ``encode_staged``: uint8 host batch ->
    pinned -> GPU -> [-1, 1] -> encoder -> latents on the host) on resident real-size batches, timed
    in the main thread and in a worker thread (where the build runs it): what the encoder costs
    inside the build without reading, decoding or writing."""
    from concurrent.futures import ThreadPoolExecutor

    from shardsmith.encode.stage import EncodeStage

    st = EncodeStage(vae, None, batch_size=batch, device=DEV, compile="off")
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (1, size, size, 3), dtype=np.uint8) for _ in range(batch)]
    host = st.stage(frames)

    def run() -> list[float]:
        for _ in range(3):
            st.encode_staged(host)
        return timed(lambda: st.encode_staged(host), repeats)

    main = run()
    with ThreadPoolExecutor(1, thread_name_prefix="bench-encode") as ex:
        thread = ex.submit(run).result()
    return {"batch": batch, "main_thread_median_s": statistics.median(main),
            "main_thread_items_per_s": batch / statistics.median(main),
            "encode_thread_median_s": statistics.median(thread),
            "encode_thread_items_per_s": batch / statistics.median(thread)}


def save_compile_artifacts(path: Path) -> dict:
    """torch.compile's cache artifacts of this process (compiled graphs, kernels, autotuning), gzipped
    to ``path``: carried into the next lease (``--compile-cache-in``), a run skips the minutes of a
    cold max-autotune compile. Returns what was written."""
    import gzip

    got = torch.compiler.save_cache_artifacts()
    if got is None:
        return {"saved": False}
    blob = gzip.compress(got[0], compresslevel=6)
    path.write_bytes(blob)
    return {"saved": True, "path": str(path), "bytes": len(got[0]), "gzip_bytes": len(blob)}


def load_compile_artifacts(path: Path) -> dict:
    """Load artifacts written by :func:`save_compile_artifacts` before compiling (a missing file is
    a cold compile, said so in the result). Gzip or xz, told by the magic bytes: the gzip that comes
    back from a lease (~18 MB for the SD-VAE encoder) recompresses to ~5 MB with ``xz -9``, small
    enough to carry beside the wheels."""
    import gzip
    import lzma

    if not path.exists():
        return {"loaded": False, "why": f"{path} does not exist"}
    blob = path.read_bytes()
    raw = lzma.decompress(blob) if blob[:6] == b"\xfd7zXZ\x00" else gzip.decompress(blob)
    torch.compiler.load_cache_artifacts(raw)
    return {"loaded": True, "path": str(path), "compressed_bytes": len(blob), "bytes": len(raw)}


def dynamo_counters() -> dict:
    """torch._dynamo's counters (frames compiled, unique graphs, recompiles, graph breaks)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover
        return {}
    return {k: {str(kk): vv for kk, vv in v.items()} for k, v in counters.items() if v}


def distinct_copies(files: list[Path], k: int) -> list[Path]:
    """``k`` copies of every JPEG with 8 bytes appended after its end-of-image marker: decoders
    stop at the marker (same pixels), the planner sees distinct files (no duplicate skipped)."""
    out = []
    for j in range(1, k + 1):
        for f in files:
            c = f.with_name(f"{f.stem}_copy{j:03d}{f.suffix}")
            c.write_bytes(f.read_bytes() + j.to_bytes(8, "little"))
            out.append(c)
    return out


def naive_prompts(prompts: list[str], family: str, n: int, max_length: int, config: str) -> dict:
    """The naive text loop: one prompt at a time, float32, one torch.save per embedding."""
    from shardsmith.encode.text import load_text_encoder

    enc = load_text_encoder(family, config=config, max_length=max_length, dtype="float32", device=DEV)
    tmp = Path(tempfile.mkdtemp())
    enc.encode(prompts[:1])  # first call outside the timing (cuBLAS set-up)
    sync()
    t = time.perf_counter()
    for i, p in enumerate(prompts[:n]):
        te = enc.encode([p], device="cpu")
        torch.save(te.emb[0].clone(), tmp / f"{i:08d}.pt")
    sync()
    dt = time.perf_counter() - t
    shutil.rmtree(tmp)
    del enc
    free_cache()
    return {"items": n, "seconds": dt, "items_per_s": n / dt}


def naive_vae_loop(files, vae_family: str, n: int, read, config: str = "published") -> dict:
    """EDM2 dataset_tool encode style: per item ``read(path)`` gives uint8 ``[H, W, 3]`` (an image)
    or ``[F, H, W, 3]`` (a clip); float32, batch 1, one ``torch.save`` per item."""
    from shardsmith.encode.vae import load_vae

    vae = load_vae(vae_family, config=config, dtype="float32", device=DEV)
    tmp = Path(tempfile.mkdtemp())
    torch.backends.cudnn.benchmark = False
    t = time.perf_counter()
    for i, f in enumerate(files[:n]):
        a = torch.from_numpy(read(f))
        x = (a.permute(2, 0, 1) if a.ndim == 3 else a.permute(3, 0, 1, 2))[None].float().to(DEV) / 127.5 - 1
        z = vae.encode(x)
        torch.save(z.cpu(), tmp / f"{i:08d}.pt")
    sync()
    dt = time.perf_counter() - t
    shutil.rmtree(tmp)
    return {"items": n, "seconds": dt, "items_per_s": n / dt}


def naive_images(files, vae_family: str, n: int, size: int = 256, config: str = "published") -> dict:
    """The naive image loop: PIL decode, center crop + Lanczos resize to ``size``."""
    from PIL import Image

    def read(f):
        img = Image.open(f).convert("RGB")
        s = min(img.size)
        img = img.crop(((img.width - s) // 2, (img.height - s) // 2, (img.width + s) // 2, (img.height + s) // 2))
        return np.asarray(img.resize((size, size), Image.Resampling.LANCZOS))

    return naive_vae_loop(files, vae_family, n, read, config)


def naive_clips(files, vae_family: str, n: int, config: str = "published") -> dict:
    """The naive video loop: PyAV decode of every frame of each clip."""
    import av

    def read(f):
        with av.open(str(f)) as c:
            return np.stack([fr.to_ndarray(format="rgb24") for fr in c.decode(video=0)])

    return naive_vae_loop(files, vae_family, n, read, config)


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
            "encode_stage_seconds": m["models"]["seconds"], "steady_state": m["models"]["steady_state"],
            "compile": m["models"].get("compile"), "warm_up": m["models"].get("warm_up"), "timings": m.get("timings")}


# ------------------------------------------------------------------------------------------ text

_SUBJECTS = ["an elderly fisherman", "a young woman in a yellow raincoat", "a golden retriever", "two children",
             "a street musician", "a red vintage convertible", "a hummingbird", "a chef in a white apron",
             "a lone hiker", "a ballet dancer", "a grey tabby cat", "a fleet of sailboats", "a steam locomotive",
             "a barista", "an astronaut", "a herd of wild horses", "a potter at her wheel", "a skateboarder",
             "a paper lantern", "a glass of iced tea", "a snow leopard", "a cyclist in a blue jersey"]
_ACTIONS = ["walks slowly along", "pauses at the edge of", "turns to look across", "runs through", "drifts above",
            "sits quietly beside", "leans against", "moves carefully across", "glides over", "waits near",
            "laughs while crossing", "rests in the middle of", "spins gracefully through", "reaches toward"]
_PLACES = ["a crowded night market", "a misty pine forest", "an empty subway platform", "a sunlit wheat field",
           "a narrow cobblestone alley", "a rocky coastline", "a rooftop garden", "a frozen lake",
           "a busy harbour", "a desert canyon", "an old library with tall shelves", "a neon-lit arcade",
           "a flower market after the rain", "a mountain village", "a quiet suburban street at dawn"]
_LIGHT = ["soft morning light", "warm golden-hour sunlight", "cold blue twilight", "flickering candlelight",
          "harsh midday sun", "diffuse overcast light", "colourful neon reflections", "low backlight with haze",
          "dappled light through leaves", "the glow of street lamps"]
_CAMERA = ["The camera slowly pushes in", "The camera pans from left to right", "A handheld camera follows",
           "The camera cranes up to reveal the scene", "A static wide shot holds", "The camera orbits around",
           "A low-angle tracking shot moves alongside", "The camera pulls back steadily",
           "A close-up racks focus from the foreground"]
_DETAILS = ["fine dust hangs in the air", "puddles mirror the sky", "a gentle breeze moves the grass",
            "distant traffic hums", "steam rises from a cup", "petals fall in slow motion",
            "shadows stretch across the ground", "waves break softly in the background",
            "birds scatter from a rooftop", "reflections shimmer on wet stone", "the fabric ripples in the wind",
            "a dog barks somewhere out of frame", "lanterns sway overhead", "snowflakes catch the light"]
_STYLE = ["shot on 35mm film with natural grain", "cinematic, shallow depth of field",
          "documentary style, realistic colours", "high dynamic range, crisp detail", "muted pastel palette",
          "anamorphic lens flares, widescreen framing", "soft contrast, gentle colour grading"]


def make_prompts(n: int, min_words: int, seed: int = 0) -> list[str]:
    """``n`` distinct, realistic video-caption style prompts of at least ``min_words`` words each.
    Every whitespace-separated word is at least one token, so ``min_words >= max_length`` fills
    the whole context (they are truncated there)."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        parts: list[str] = []
        words = 0
        while words < min_words:
            c = rng.random()
            if c < 0.4:
                sent = (f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_ACTIONS)} {rng.choice(_PLACES)} "
                        f"in {rng.choice(_LIGHT)}.")
            elif c < 0.65:
                sent = f"{rng.choice(_CAMERA)} as {rng.choice(_DETAILS)} and {rng.choice(_DETAILS)}."
            elif c < 0.85:
                sent = (f"In the background {rng.choice(_SUBJECTS)} {rng.choice(_ACTIONS)} {rng.choice(_PLACES)}, "
                        f"while {rng.choice(_DETAILS)}.")
            else:
                sent = f"The scene is {rng.choice(_STYLE)}, lit by {rng.choice(_LIGHT)}."
            parts.append(sent)
            words += len(sent.split())
        p = " ".join(parts)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def _text_forward(enc, ids, mask):
    """The model call of ``TextEncoder.encode`` for its family (no tokenisation, no copies)."""
    fam = enc.spec.family
    if fam == "clip":
        return enc.model(input_ids=ids).last_hidden_state
    if fam == "gemma":
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        return enc.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
    return enc.model(input_ids=ids, attention_mask=mask).last_hidden_state


def text_section(args, res: dict, config: str) -> None:
    from shardsmith.encode.stage import EncodeStage
    from shardsmith.encode.text import load_text_encoder
    from shardsmith.encode.vae import load_vae

    fam, L, B, N = args.text_family, args.text_len, args.text_batch, args.prompts
    t = time.perf_counter()
    enc = load_text_encoder(fam, config=config, max_length=L, dtype="bfloat16", device=DEV)
    sync()
    build_s = time.perf_counter() - t
    n_params = sum(p.numel() for p in enc.model.parameters())
    print(f"{fam} text encoder ({config}, {n_params / 1e9:.2f}B params) built in {build_s:.1f} s", flush=True)
    res[f"{fam}_text_model"] = {"config": config, "params": n_params, "build_s": build_s, "dim": enc.spec.dim,
                                "max_length": L, "attn_implementation": getattr(enc.model.config,
                                                                                "_attn_implementation", None),
                                "notes": enc.provenance.notes}

    t = time.perf_counter()
    prompts = make_prompts(N, min_words=L, seed=0)
    gen_s = time.perf_counter() - t

    # (a) encoder alone: a resident token batch of the first B prompts
    t = time.perf_counter()
    ids, mask, truncated = enc.tokenize(prompts[:B])
    tok_s = time.perf_counter() - t
    ids_d, mask_d = ids.to(DEV), mask.to(DEV)

    def fwd():
        with torch.inference_mode():
            return _text_forward(enc, ids_d, mask_d)

    for _ in range(3):
        fwd()
    ts = timed(fwd, args.text_repeats)
    med = statistics.median(ts)
    with torch.inference_mode():
        one = flops_of(lambda: _text_forward(enc, ids_d[:1], mask_d[:1]))
    rate = B / med
    alone = {"batch": B, "tokens": L, "median_s": med, "min_s": min(ts), "items_per_s": rate,
             "tflop_per_item": one / 1e12, "pct_peak": pct_peak(rate, one),
             "token_fill": float(mask.float().mean()), "truncated_frac": sum(truncated) / len(truncated),
             "tokenize_batch_s": tok_s}
    res[f"{fam}_text_alone"] = alone
    print(f"{fam} alone", alone, flush=True)

    # (b) the pipeline's text path: EncodeStage.text around the same encoder, captions in calls of B
    vae = load_vae("sd", config="tiny", device=DEV)  # EncodeStage needs a VAE; the text path never uses it
    stage = EncodeStage(vae, enc, batch_size=max(1, B // 4), device=DEV)  # text chunks of batch_size * 4
    sync()
    t = time.perf_counter()
    got = []
    for i in range(0, N, B):
        got += stage.text(prompts[i:i + B])
    sync()
    dt = time.perf_counter() - t
    emb0, mask0 = got[0]
    assert len(got) == N and tuple(emb0.shape) == (L, enc.spec.dim) and emb0.device.type == "cpu", emb0.shape
    assert emb0.dtype == torch.bfloat16 and int(mask0.sum()) == int(mask[0].sum())
    prate = N / dt
    pipe = {"prompts": N, "captions_per_call": B, "stage_text_chunk": stage.batch_size * 4, "seconds": dt,
            "items_per_s": prate, "pct_peak": pct_peak(prate, one),
            "stage_text_seconds": stage.seconds["text"], "gen_prompts_s": gen_s}
    res[f"{fam}_text_pipeline"] = pipe
    res[f"{fam}_ratio_pipeline_vs_alone"] = prate / rate
    res[f"{fam}_pipeline_pct_peak"] = pipe["pct_peak"]
    print(f"{fam} pipeline", pipe, flush=True)

    # (c) TextEncoder.encode(..., device="cpu") on fresh batches: tokenise + forward + one host copy
    # per batch, i.e. what the stage's text path costs without its per-item copies
    calls = prompts[:B * min(4, max(1, N // B))]
    enc.encode(calls[:B], device="cpu")
    sync()
    t = time.perf_counter()
    for i in range(0, len(calls), B):
        enc.encode(calls[i:i + B], device="cpu")
    sync()
    dt = time.perf_counter() - t
    crate = len(calls) / dt
    res[f"{fam}_text_encode_cpu_out"] = {"prompts": len(calls), "batch": B, "seconds": dt, "items_per_s": crate,
                                         "pct_peak": pct_peak(crate, one), "ratio_vs_alone": crate / rate}
    print(f"{fam} encode(device='cpu')", res[f"{fam}_text_encode_cpu_out"], flush=True)
    del stage, enc, vae, got, ids_d, mask_d
    free_cache()

    # (d) the naive loop: one prompt at a time, float32, one torch.save each
    if args.naive_prompts:
        res[f"{fam}_text_naive_fp32_b1"] = nv = naive_prompts(prompts, fam, args.naive_prompts, L, config)
        res[f"{fam}_ratio_alone_vs_naive"] = rate / nv["items_per_s"]
        print(f"{fam} naive", nv, flush=True)

    # (e) end to end: a build of N captioned images (tiny VAE at 64x64, so the text encoder is
    # the work) -> latent shards with one txt_emb.pth [L, D] per sample, from files on disk
    if args.text_build:
        from media_factory import real_photos

        work = Path(tempfile.mkdtemp(prefix="textbuild-"))
        files = real_photos(work / "src", N, seed=1, min_side=64, max_side=96)
        for f, p in zip(files, prompts):
            f.with_suffix(".txt").write_text(p, encoding="utf-8")
        recipe = {"sources": [{"path": str(work / "src")}], "geometry": {"buckets": ["64x64x1"]},
                  "models": {"vae": {"family": "sd", "config": "tiny", "dtype": "bfloat16"},
                             "text": {"family": fam, "config": config, "max_length": L, "dtype": "bfloat16"},
                             "batch_size": B, "compile": "off"},
                  "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 256,
                               "latent_dtype": "bfloat16", "text_dtype": "bfloat16"}]}
        if args.text_shard_mib:  # shards bounded by bytes: less queued for the disk after the last batch
            recipe["outputs"][0]["max_shard_bytes"] = args.text_shard_mib << 20
        e = end_to_end(work / "src", work / "out", recipe, args.workers)
        steady = (e.get("steady_state") or {}).get("items_per_s")
        e.update(pct_peak=pct_peak(e["items_per_s"], one), ratio_vs_alone=e["items_per_s"] / rate,
                 steady_pct_peak=pct_peak(steady, one) if steady else None,
                 steady_ratio_vs_alone=steady / rate if steady else None)
        nv = res.get(f"{fam}_text_naive_fp32_b1")
        if nv and steady:
            e["steady_vs_naive"] = steady / nv["items_per_s"]
        res[f"{fam}_text_build"] = e
        print(f"{fam} text build", e, flush=True)
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------ main

def main() -> int:
    global DEV
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--copies", type=int, default=1,
                    help="build from COPIES x --images files (copies with distinct bytes, same pixels): a long "
                         "run for the whole-build ratio without generating more photos")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--naive", type=int, default=300)
    ap.add_argument("--image-size", type=int, default=256)
    ap.add_argument("--clips", type=int, default=12)
    ap.add_argument("--video", default="121x512x768", help="FxHxW")
    ap.add_argument("--video-family", choices=["ltx", "ltx2"], default="ltx")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--skip-image", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="image section: also the torch.compile'd encoder alone and the build with models.compile=on")
    ap.add_argument("--skip-video", action="store_true")
    ap.add_argument("--skip-eager-build", action="store_true",
                    help="with --compile: skip the eager build (and the encoder alone after it), to fit a long "
                         "compiled build into one call")
    ap.add_argument("--ab-sync", action="store_true",
                    help="with --compile: also run the compiled build with each batch waited for at launch")
    ap.add_argument("--ab-plan-ahead", action="store_true",
                    help="with --compile: also run the compiled build with the plan first (no plan ahead)")
    ap.add_argument("--ab-in-flight", type=int, default=None,
                    help="with --ab-plan-ahead: that second build also keeps at most N batches in flight")
    ap.add_argument("--ab-switch-s", type=float, default=None,
                    help="with --ab-plan-ahead: that second build also runs with this GIL switch interval")
    ap.add_argument("--compile-cache-out", default=None,
                    help="with --compile: write torch.compile's cache artifacts (gzip) here after the cold compile")
    ap.add_argument("--compile-cache-in", default=None,
                    help="with --compile: load artifacts written by --compile-cache-out before compiling")
    ap.add_argument("--compile-mode", default=None,
                    help="with --compile: torch.compile mode for the encoder alone and the build (default "
                         "shardsmith's, max-autotune-no-cudagraphs); e.g. max-autotune (CUDA graphs: one launch "
                         "a batch instead of one per kernel, so the encoder thread holds the GIL far less)")
    ap.add_argument("--cpp-wrapper", action="store_true",
                    help="with --compile: Inductor's C++ wrapper (kernels launched from C++, not Python)")
    ap.add_argument("--text-shard-mib", type=int, default=None,
                    help="--text-build: bound its shards to this many MiB (default: 256 samples, ~1 GiB for T5-XXL)")
    ap.add_argument("--skip-text", action="store_true")
    ap.add_argument("--text-family", choices=["t5", "umt5", "clip", "gemma"], default="t5")
    ap.add_argument("--text-config", default=None,
                    help="random-weight config; default 'xxl' for t5/umt5 (T5 v1.1 XXL / umT5-XXL), else 'published'")
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--text-batch", type=int, default=64)
    ap.add_argument("--text-repeats", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=1024)
    ap.add_argument("--naive-prompts", type=int, default=32,
                    help="prompts through the naive text loop (float32, one at a time; 0: skip)")
    ap.add_argument("--naive-clips", type=int, default=2,
                    help="clips through the naive video loop (float32, batch 1; 0: skip)")
    ap.add_argument("--text-build", action="store_true",
                    help="also time a whole build of --prompts captioned images whose work is the text encoder")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="every selected section on CPU with tiny configs and tiny sizes (proves the code paths)")
    args = ap.parse_args()
    config = "published"
    text_config = args.text_config or ("xxl" if args.text_family in ("t5", "umt5") else "published")
    if args.cpu_dry_run:
        DEV, config, text_config = "cpu", "tiny", "tiny"
        args.images, args.batch, args.naive, args.image_size = 8, 4, 4, 64
        args.clips, args.video = 2, "9x64x64"
        args.prompts, args.text_len, args.text_batch, args.text_repeats = 8, 32, 4, 2
        args.naive_prompts, args.naive_clips = 2, 1
        args.workers = min(args.workers, 2)
    elif not torch.cuda.is_available():
        print("no CUDA device: use --cpu-dry-run to check the code paths on CPU", file=sys.stderr)
        return 2
    from shardsmith.encode import compile as cc
    from shardsmith.encode.vae import load_vae

    if args.compile_mode:  # the stage reads the module's mode (and keys its compile cache with it)
        cc.COMPILE_MODE = args.compile_mode
    if args.cpp_wrapper:
        import torch._inductor.config as inductor_config

        inductor_config.cpp_wrapper = True
    res: dict = {"compile_mode": cc.COMPILE_MODE, "cpp_wrapper": bool(args.cpp_wrapper),
                 "device": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (dry run)",
                 "torch": torch.__version__, "cpus": os.cpu_count(), "workers": args.workers,
                 "dry_run": args.cpu_dry_run, "errors": {}}
    out_path = Path(args.out)

    def save() -> None:
        out_path.write_text(json.dumps(res, indent=2, default=str))

    def section(name: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - record it, run the other sections
            traceback.print_exc()
            res["errors"][name] = f"{type(e).__name__}: {e}"
        finally:
            res[f"section_{name}_s"] = time.perf_counter() - t0
            free_cache()
            save()

    work = Path(tempfile.mkdtemp(prefix="gpubench-"))
    torch.backends.cudnn.benchmark = True
    S = args.image_size

    def image() -> None:
        from media_factory import real_photos

        t = time.perf_counter()
        files = real_photos(work / "photos", args.images, seed=0, min_side=256, max_side=480)
        if args.copies > 1:  # a long run without generating more photos: distinct bytes, same pixels
            files += distinct_copies(files, args.copies - 1)
        res["images_in_build"] = len(files)
        res["gen_images_s"] = time.perf_counter() - t
        print("generated", len(files), "photos", flush=True)
        torch.backends.cudnn.benchmark = True
        vae = load_vae("sd", config=config, dtype="bfloat16", device=DEV)
        res["sd_encoder_alone"] = encoder_alone(vae, (3, S, S), args.batch, 20)
        print("sd alone", res["sd_encoder_alone"], flush=True)
        del vae
        free_cache()
        res["sd_naive_fp32_b1"] = naive_images(files, "sd", args.naive, S, config)
        print("naive", res["sd_naive_fp32_b1"], flush=True)
        torch.backends.cudnn.benchmark = True
        recipe = {"sources": [{"path": str(work / "photos")}], "geometry": {"buckets": [f"{S}x{S}x1"]},
                  "models": {"vae": {"family": "sd", "config": config, "dtype": "bfloat16"},
                             "batch_size": args.batch, "compile": "off"},
                  "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 1000,
                               "latent_dtype": "bfloat16"}]}
        if args.skip_eager_build and args.compile:
            res["sd_end_to_end"] = "skipped (--skip-eager-build)"
        else:
            res["sd_end_to_end"] = end_to_end(work / "photos", work / "out_img", recipe, args.workers)
            print("e2e", res["sd_end_to_end"], flush=True)
            res["sd_encoder_alone_after"] = encoder_alone(load_vae("sd", config=config, dtype="bfloat16",
                                                                   device=DEV), (3, S, S), args.batch, 20)
            print("sd alone (after)", res["sd_encoder_alone_after"], flush=True)
            a, e = res["sd_encoder_alone"], res["sd_end_to_end"]
            res["sd_ratio_e2e_vs_alone"] = e["items_per_s"] / a["items_per_s"]
            res["sd_ratio_e2e_vs_naive"] = e["items_per_s"] / res["sd_naive_fp32_b1"]["items_per_s"]
            res["sd_e2e_pct_peak"] = 100 * e["items_per_s"] * a["gflop_per_item"] / 1e3 / PEAK_TFLOPS
            steady = (e.get("steady_state") or {}).get("items_per_s")
            if steady:
                res["sd_ratio_steady_vs_alone"] = steady / a["items_per_s"]
                res["sd_steady_pct_peak"] = pct_peak(steady, a["gflop_per_item"] * 1e9)
        save()
        if args.compile:
            compiled_section(recipe)

    def compiled_section(recipe: dict) -> None:
        """torch.compile (max-autotune-no-cudagraphs, shardsmith's cache dir): the encoder alone
        compiled (its first call = the cold compile), then the build with models.compile=on
        (which finds the cache warm), then the compiled encoder alone again."""
        from shardsmith.encode import compile as cc

        cc.use_cache_dir()
        if args.compile_cache_in:
            res["compile_cache_in"] = load_compile_artifacts(Path(args.compile_cache_in))
        vae = load_vae("sd", config=config, dtype="bfloat16", device=DEV)
        vae.compile(mode=cc.COMPILE_MODE)
        x = torch.randn(args.batch, 3, S, S, device=DEV, dtype=vae.torch_dtype).clamp_(-1, 1)
        t = time.perf_counter()
        vae.encode(x)
        sync()
        res["sd_compile_cold_s"] = time.perf_counter() - t  # warm when --compile-cache-in was loaded
        print(f"compiled ({'from carried artifacts' if args.compile_cache_in else 'cold'}) in "
              f"{res['sd_compile_cold_s']:.1f} s", flush=True)
        if args.compile_cache_out:
            res["compile_cache_out"] = save_compile_artifacts(Path(args.compile_cache_out))
        res["sd_encoder_alone_compiled"] = encoder_alone(vae, (3, S, S), args.batch, 20,
                                                         res["sd_encoder_alone"]["gflop_per_item"])
        print("sd alone compiled", res["sd_encoder_alone_compiled"], flush=True)
        res["sd_stage_compiled"] = stage_alone(vae, S, args.batch, 20)
        print("sd stage compiled (uint8 host batches, main thread / encode thread)", res["sd_stage_compiled"],
              flush=True)
        del vae
        free_cache()
        save()
        rc = json.loads(json.dumps(recipe))
        rc["models"]["compile"] = "on"
        e = end_to_end(work / "photos", work / "out_img_compiled", rc, args.workers)
        e["dynamo"] = dynamo_counters()
        res["sd_end_to_end_compiled"] = e
        print("e2e compiled", e, flush=True)
        if args.ab_sync:  # the same build with every batch waited for at launch (the previous behaviour)
            from shardsmith.encode.stage import EncodeStage

            launch = EncodeStage.launch

            def launch_sync(self, host, n=None, captions=None, **kw):
                p = launch(self, host, n, captions, **kw)
                p.result()
                return p

            EncodeStage.launch = launch_sync
            try:
                e_sync = end_to_end(work / "photos", work / "out_img_compiled_sync", rc, args.workers)
            finally:
                EncodeStage.launch = launch
            res["sd_end_to_end_compiled_sync_launch"] = e_sync
            s_sync = (e_sync.get("steady_state") or {}).get("items_per_s")
            s_async = (e.get("steady_state") or {}).get("items_per_s")
            res["sd_compiled_steady_async_vs_sync_launch"] = s_async / s_sync if s_sync and s_async else None
            print("e2e compiled, synchronous launch", e_sync, flush=True)
        if args.ab_plan_ahead:  # the same build with the whole plan before the first batch (the previous order)
            import shardsmith.build as build_mod

            from shardsmith.encode.finisher import LatentFinisher

            import shardsmith.encode.stage as stage_mod

            depth, switch = dict(LatentFinisher.MAX_IN_FLIGHT), stage_mod.GIL_SWITCH_S
            build_mod.PLAN_AHEAD = False
            if args.ab_in_flight:
                LatentFinisher.MAX_IN_FLIGHT = {k: args.ab_in_flight for k in depth}
            if args.ab_switch_s:
                stage_mod.GIL_SWITCH_S = args.ab_switch_s
                sys.setswitchinterval(args.ab_switch_s)
            try:
                e_first = end_to_end(work / "photos", work / "out_img_compiled_plan_first", rc, args.workers)
            finally:
                build_mod.PLAN_AHEAD = True
                LatentFinisher.MAX_IN_FLIGHT, stage_mod.GIL_SWITCH_S = depth, switch
                sys.setswitchinterval(switch)
            e_first["max_in_flight"] = args.ab_in_flight or depth
            e_first["switch_interval_s"] = args.ab_switch_s or switch
            res["sd_end_to_end_compiled_plan_first"] = e_first
            res["sd_compiled_plan_ahead_speedup"] = e_first["seconds"] / e["seconds"]
            print("e2e compiled, plan first", e_first, flush=True)
        a = res["sd_encoder_alone_compiled"]
        steady = (e.get("steady_state") or {}).get("items_per_s")
        res["sd_compiled_ratio_e2e_vs_alone"] = e["items_per_s"] / a["items_per_s"]
        res["sd_compiled_e2e_pct_peak"] = pct_peak(e["items_per_s"], a["gflop_per_item"] * 1e9)
        res["sd_compiled_e2e_vs_naive"] = e["items_per_s"] / res["sd_naive_fp32_b1"]["items_per_s"]
        if steady:
            res["sd_compiled_ratio_steady_vs_alone"] = steady / a["items_per_s"]
            res["sd_compiled_steady_pct_peak"] = pct_peak(steady, a["gflop_per_item"] * 1e9)
            res["sd_compiled_steady_vs_naive"] = steady / res["sd_naive_fp32_b1"]["items_per_s"]
            res["sd_compiled_steady_vs_eager_alone"] = steady / res["sd_encoder_alone"]["items_per_s"]

    def video() -> None:
        from concurrent.futures import ProcessPoolExecutor

        fam = args.video_family
        f, h, w = (int(v) for v in args.video.split("x"))
        t = time.perf_counter()
        (work / "clips").mkdir()
        with ProcessPoolExecutor(max_workers=max(1, min(args.workers, args.clips))) as ex:
            list(ex.map(write_pan_clip, [work / "clips" / f"clip_{i:03d}.mp4" for i in range(args.clips)],
                        [f] * args.clips, [h] * args.clips, [w] * args.clips, range(args.clips)))
        res["gen_clips_s"] = time.perf_counter() - t
        print(f"generated {args.clips} clips {f}x{h}x{w} in {res['gen_clips_s']:.1f} s", flush=True)
        t = time.perf_counter()
        vae = load_vae(fam, config=config, dtype="bfloat16", device=DEV)
        sync()
        res[f"{fam}_build_s"] = time.perf_counter() - t
        res[f"{fam}_encoder_alone"] = encoder_alone(vae, (3, f, h, w), 1, 5)
        print(f"{fam} alone", res[f"{fam}_encoder_alone"], flush=True)
        del vae
        free_cache()
        save()
        recipe = {"sources": [{"path": str(work / "clips")}], "geometry": {"buckets": [f"{w}x{h}x{f}"]},
                  "models": {"vae": {"family": fam, "config": config, "dtype": "bfloat16"}, "batch_size": 1,
                             "compile": "off"},
                  "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 100,
                               "latent_dtype": "bfloat16"}]}
        if args.naive_clips:
            res[f"{fam}_naive_fp32_b1"] = naive_clips(sorted((work / "clips").glob("*.mp4")), fam,
                                                      args.naive_clips, config)
            print(f"{fam} naive", res[f"{fam}_naive_fp32_b1"], flush=True)
            free_cache()
        e2e = end_to_end(work / "clips", work / "out_vid", recipe, min(args.workers, 8))
        res[f"{fam}_end_to_end"] = e2e
        alone_rate = res[f"{fam}_encoder_alone"]["items_per_s"]
        res[f"{fam}_ratio_e2e_vs_alone"] = e2e["items_per_s"] / alone_rate
        steady = (e2e.get("steady_state") or {}).get("items_per_s")
        res[f"{fam}_ratio_steady_vs_alone"] = steady / alone_rate if steady else None
        if args.naive_clips and steady:
            res[f"{fam}_ratio_steady_vs_naive"] = steady / res[f"{fam}_naive_fp32_b1"]["items_per_s"]
        print(f"{fam} e2e", e2e, flush=True)

    if not args.skip_image:
        section("image", image)
    if not args.skip_text:  # before video: cheap, and a long video section cannot cost its numbers
        section("text", lambda: text_section(args, res, text_config))
    if not args.skip_video:
        section("video", video)
    save()
    print(json.dumps(res, indent=2, default=str))
    shutil.rmtree(work, ignore_errors=True)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
