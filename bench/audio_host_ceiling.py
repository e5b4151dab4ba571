"""Host ceiling of the audio build (issue 17): the real ``build()`` of ``bench/audio_build.py``'s recipe with the
audio encoder's model work replaced by a free stand-in (latents of the right shape, zeros, on the model's
device), so what is left is the host side: probing, decode workers, result transport, waveform staging,
serialisation, shard writes, the ledger.

If this rate is not well above the encoder alone (``bench/audio_build.py``'s ``encoder_alone``), the host side
is the limit of the whole build. Also reported: the main thread's CPU per item (``time.thread_time``; the
decode workers are other processes), and, with ``--profile``, a cProfile of the main thread.

Usage (a diagnostic, not a goal figure): ``SHARDSMITH_SPEECH_DIR=... PYTHONPATH=src:tests:bench python3
bench/audio_host_ceiling.py --work /tmp/ahc --files 8000 --distinct 400 --device cuda --out r.json``
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import time
from pathlib import Path


def null_latents(self, x, rate: int):
    """Stand-in for ``AudioVae._latents``: zeros of the latents' shape on ``x``'s device, no arithmetic."""
    import torch

    from shardsmith.encode.resample import resampled_length

    c, t, f = self.settings.latent_shape(resampled_length(x.shape[-1], rate, self.settings.sample_rate))
    return torch.zeros(x.shape[0], c, t, f, device=x.device)


def main() -> int:
    from audio_build import make_dataset, recipe

    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--distinct", type=int, default=None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--config", default="published")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--durations", default="4.0;8.0")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from shardsmith.build import build
    from shardsmith.encode import audio_vae
    from shardsmith.recipe import recipe_from_dict

    src = args.work / "src"
    make_dataset(src, args.files, args.distinct)
    os.sync()  # the files at rest, as in bench/audio_build.py
    audio_vae.AudioVae._latents = null_latents
    out = args.work / "out"
    shutil.rmtree(out, ignore_errors=True)
    prof = cProfile.Profile() if args.profile else None
    t, cpu0 = time.perf_counter(), time.thread_time()
    if prof:
        prof.enable()
    m = build(recipe_from_dict(recipe(src, args)), out, quiet=True, workers=args.workers)
    if prof:
        prof.disable()
    wall, main_cpu = time.perf_counter() - t, time.thread_time() - cpu0
    n = m["counts"]["written"]
    ss = m["models"].get("audio_steady_state") or {}
    res = {"files": args.files, "written": n, "device": args.device, "batch": args.batch,
           "workers": args.workers, "wall_s": round(wall, 3), "items_per_s": round(n / wall, 1),
           "main_thread_cpu_s": round(main_cpu, 3),  # the build's fixed part included (imports, forks, manifest)
           "main_thread_cpu_ms_per_item": round(main_cpu / max(n, 1) * 1e3, 3),
           "steady_items_per_s": ss.get("items_per_s"), "gpu_idle": ss.get("gpu_idle"), "timings": m["timings"],
           "stage_seconds": m["models"]["seconds"], "label": "host ceiling: the audio encoder replaced by zeros"}
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        res["profile_main_thread"] = s.getvalue()
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
