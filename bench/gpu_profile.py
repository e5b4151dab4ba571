"""Where does end-to-end image encoding time go on the GPU machine? (diagnostic, not a benchmark)

Prints: decode-worker capacity alone (items/s of LatentPixelMaker over N processes), the build's phase
times (plan, model load, output), and a cProfile of the main thread during the build.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch


def _decode(path: str):
    from shardsmith.recipe import ImageRules
    from shardsmith.transform.buckets import parse_buckets
    from shardsmith.transform.image import decode_image
    from shardsmith.transform.buckets import resize_crop
    from shardsmith.transform.video import resize_crop_frames
    import numpy as np

    data = open(path, "rb").read()
    dec = decode_image(data, name=path, max_pixels=10**9)
    w, h = dec.image.size
    rc = resize_crop(w, h, 256, 256)
    return resize_crop_frames(np.asarray(dec.image)[None], rc)


def main() -> int:
    from media_factory import real_photos

    from shardsmith.build import build
    import shardsmith.build as B
    from shardsmith.recipe import recipe_from_dict

    n, workers = int(sys.argv[1]), int(sys.argv[2])
    work = Path(tempfile.mkdtemp())
    files = [str(p) for p in real_photos(work / "photos", n, seed=0, min_side=256, max_side=480)]
    for w in (workers, workers // 2):
        with ProcessPoolExecutor(w) as ex:
            list(ex.map(_decode, files[:64], chunksize=4))
            t = time.perf_counter()
            list(ex.map(_decode, files, chunksize=8))
            print(f"decode capacity, {w} procs: {n / (time.perf_counter() - t):.0f} items/s", flush=True)
    phases = {}
    for name in ("make_plan", "_run_output", "_manifest"):
        f = getattr(B, name)

        def wrap(*a, _f=f, _n=name, **k):
            t = time.perf_counter()
            r = _f(*a, **k)
            phases[_n] = phases.get(_n, 0) + time.perf_counter() - t
            return r
        setattr(B, name, wrap)
    import shardsmith.encode.stage as S
    f0 = S.EncodeStage.from_recipe.__func__

    def load(cls, recipe):
        t = time.perf_counter()
        r = f0(cls, recipe)
        phases["load_models"] = time.perf_counter() - t
        return r
    S.EncodeStage.from_recipe = classmethod(load)
    enc0 = S.EncodeStage._encode

    def enc(self, frames):
        t = time.perf_counter()
        r = enc0(self, frames)
        phases["encode_thread_s"] = phases.get("encode_thread_s", 0) + time.perf_counter() - t
        return r
    S.EncodeStage._encode = enc
    rec = recipe_from_dict({"sources": [{"path": str(work / "photos")}], "geometry": {"buckets": ["256x256x1"]},
                            "models": {"vae": {"family": "sd", "config": "published", "dtype": "bfloat16"},
                                       "batch_size": 64},
                            "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 1000,
                                         "latent_dtype": "bfloat16"}]})
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    build(rec, work / "out", quiet=True, workers=workers)
    prof.disable()
    total = time.perf_counter() - t
    print(f"build total {total:.2f}s for {n}: {n / total:.0f} items/s; phases {phases}", flush=True)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
