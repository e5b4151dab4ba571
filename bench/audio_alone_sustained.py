"""Whether the audio encoder alone keeps its pace over a whole build's worth of batches, and under the build's
cuDNN modes (a diagnostic for BENCHMARKS.md §7, thirty-third session).

``bench/audio_build.py`` times the encoder alone as the faster of two passes over the first ``--alone-items``
files (about 5 s of GPU work, torch's default cuDNN modes); the build runs for 90 s with
``cudnn.deterministic`` on (encode/stage.py). If the GPU lowers its clocks under sustained load, or the modes
choose other kernels, the baseline is not the build's yardstick. This runs, on the files ``bench/audio_build.py``
left in ``--work``/src (or, where there are none, ``--alone-items`` files made as it makes them):

- ``short``: the bench's own figure (best of two passes, resident batches), in torch's default modes and in
  the build's;
- ``sustained``: the same resident batches cycled back to back until ``--items`` items (the build's 64,000),
  in the build's modes, CUDA events per batch: items/s over all, the first and last tenth, the median batch
  by shape, with ``nvidia-smi``'s SM clock, power, temperature and throttle reasons sampled during.

Prints one JSON object. On a GPU machine, after ``bench/audio_build.py --work /tmp/ab``:
    PYTHONPATH=src:bench python3 bench/audio_alone_sustained.py --work /tmp/ab --items 64000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import shutil
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def clocks() -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    q = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()


def main() -> None:
    import numpy as np
    import torch

    from audio_build import _alone_wave, make_dataset

    from shardsmith.encode.audio_vae import load_audio_vae

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--items", type=int, default=64000)
    ap.add_argument("--alone-items", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--durations", default="4.0;8.0")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (with --config tiny)")
    ap.add_argument("--config", default="published")
    args = ap.parse_args()
    vae = load_audio_vae("ltx2_audio", config=args.config, device=args.device, vocoder=False)
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    class HostEvent:  # the CPU's stand-in for a CUDA event (a smoke test)
        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3

    event = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else HostEvent
    if not (args.work / "src").is_dir():  # a call of its own, on a machine without the bench's files
        make_dataset(args.work / "src", args.alone_items, min(args.alone_items, 4000))
    files = sorted(p for p in (args.work / "src").iterdir() if p.suffix in (".m4a", ".flac"))[:args.alone_items]
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        waves = [w for w, _ in (r for r in pool.map(_alone_wave, [(str(p), args.durations, vae.spec.sample_rate)
                                                                  for p in files], chunksize=32) if r is not None)]
    by_length: dict[int, list] = {}
    for w in waves:
        by_length.setdefault(w.shape[-1], []).append(w)
    batches = [torch.from_numpy(np.stack(q[i:i + args.batch])).to(args.device)
               for q in by_length.values() for i in range(0, len(q), args.batch)]
    rate = vae.spec.sample_rate
    out: dict = {"items_per_pass": len(waves), "batches_per_pass": len(batches)}

    def one_pass() -> None:
        for x in batches:
            vae._latents(x, rate)

    def best_of_two() -> float:
        times = []
        for _ in range(2):
            sync()
            t0 = time.perf_counter()
            one_pass()
            sync()
            times.append(time.perf_counter() - t0)
        return round(len(waves) / min(times), 1)

    with torch.inference_mode():
        for label, det in (("default_modes", False), ("build_modes", True), ("default_modes_again", False)):
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, det
            one_pass()  # warm-up in these modes
            sync()
            out[f"short_{label}_items_per_s"] = best_of_two()
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True  # the build's
        seen: list[str] = [clocks()]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(10.0):
                seen.append(clocks())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        times: list[tuple[int, int, float]] = []  # (items, length, seconds) per batch, in order
        events = []
        done = 0
        sync()
        t0 = time.perf_counter()
        while done < args.items:
            for x in batches:
                a, b = event(), event()
                a.record()
                vae._latents(x, rate)
                b.record()
                events.append((x.shape[0], x.shape[-1], a, b))
                done += x.shape[0]
                if len(events) > 8:  # keep a few batches queued, read the oldest
                    n, length, ea, eb = events.pop(0)
                    eb.synchronize()
                    times.append((n, length, ea.elapsed_time(eb) / 1e3))
                if done >= args.items:
                    break
        for n, length, ea, eb in events:
            eb.synchronize()
            times.append((n, length, ea.elapsed_time(eb) / 1e3))
        sync()
        wall = time.perf_counter() - t0
        stop.set()
        seen.append(clocks())
    tenth = max(1, len(times) // 10)
    rate_of = lambda part: round(sum(n for n, _, _ in part) / sum(s for _, _, s in part), 1)  # noqa: E731
    by_length = {}
    for n, length, s in times:
        if n == args.batch:
            by_length.setdefault(length, []).append(s)
    out["sustained"] = {"items": done, "batches": len(times), "wall_s": round(wall, 2),
                        "items_per_s_wall": round(done / wall, 1), "items_per_s_events": rate_of(times),
                        "first_tenth_items_per_s": rate_of(times[:tenth]),
                        "last_tenth_items_per_s": rate_of(times[-tenth:]),
                        "median_full_batch_s_by_length": {str(k): round(statistics.median(v), 5)
                                                          for k, v in sorted(by_length.items())},
                        "clocks": seen}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
