"""What a decode worker spends per audio file, by ``audio.resampler``, and what its waveform's trip costs.

Diagnostic for BENCHMARKS.md §7 (not a whole build): the files of ``bench/audio_build.py`` (half AAC 48 kHz
stereo, half FLAC 44.1 kHz mono, real speech), each cut to its duration bucket exactly as the build's
workers cut it (``AudioCutter``'s decode), in one process:

- CPU time per file (``time.process_time``), ``ffmpeg`` (FFmpeg resamples to 16 kHz) against ``sinc``
  (cut at the source's rate, mono kept one channel), and ``sinc`` with FFmpeg's resampler converting the
  samples to float at the same rate (what ``sinc`` did before it converted them itself), rounds
  interleaved, median of ``--rounds``;
- bytes per file, and one item's trip through shared memory (packed in a chunk of 8, then unpacked and
  stacked as the build does) for 4 s waveforms of each shape.

Usage: ``python bench/audio_decode_cost.py --work /tmp/adc --files 400 [--out result.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

import audio_build


def worker_cost(src: Path, rounds: int) -> dict:
    from shardsmith.transform import audio
    from shardsmith.transform.audio import choose_duration, probe_audio
    from shardsmith.transform.audio_samples import AudioCutter

    own = dict(audio._TO_FLOAT)  # the formats decode_audio converts itself at the source's rate
    files = sorted(p for p in src.iterdir() if p.suffix in (".m4a", ".flac"))
    plan = [(str(p), choose_duration(probe_audio(str(p), p.name).duration, [4.0, 8.0])) for p in files]
    out: dict = {}
    for _ in range(rounds):
        for way, resampler, converts in (("ffmpeg", "ffmpeg", own), ("sinc, swresample converts", "sinc", {}),
                                         ("sinc", "sinc", own)):
            audio._TO_FLOAT.clear()
            audio._TO_FLOAT.update(converts)
            cutter = AudioCutter(16000, resampler=resampler)
            for suffix in (".m4a", ".flac"):
                chosen = [(p, d) for p, d in plan if p.endswith(suffix) and d]
                t, nbytes = time.process_time(), 0
                for p, d in chosen:
                    nbytes += cutter.decode(p, p, 0.0, d).wave.nbytes
                row = out.setdefault(f"{way} {suffix}", {"ms": [], "files": len(chosen)})
                row["ms"].append((time.process_time() - t) / len(chosen) * 1e3)
                row["mb_per_file"] = round(nbytes / len(chosen) / 1e6, 3)
    audio._TO_FLOAT.update(own)
    for row in out.values():
        row["median_ms"] = round(statistics.median(row["ms"]), 3)
        row["ms"] = [round(x, 3) for x in row["ms"]]
    return out


def trip_cost(items: int = 800) -> dict:
    import torch

    from shardsmith import shm_transfer

    folder = shm_transfer.ResultFolder.create()
    shapes = {"16 kHz stereo (ffmpeg)": (2, 64000), "48 kHz stereo (sinc)": (2, 192000),
              "44.1 kHz mono (sinc)": (1, 176400)}
    out: dict = {}
    try:
        for _ in range(2):
            for label, shape in shapes.items():
                chunk = [np.random.rand(*shape).astype(np.float32) for _ in range(8)]
                t0 = time.perf_counter()
                packs = [shm_transfer.pack(chunk, str(folder.path) if folder else None) for _ in range(items // 8)]
                t1 = time.perf_counter()
                host = torch.empty((8, *shape), dtype=torch.float32)
                for p in packs:
                    arrays = shm_transfer.unpack(p)
                    torch.stack([torch.from_numpy(a) for a in arrays], out=host)
                    del arrays
                t2 = time.perf_counter()
                row = out.setdefault(label, {"mb": round(np.prod(shape) * 4 / 1e6, 3), "pack_ms": [], "unpack_ms": []})
                row["pack_ms"].append(round((t1 - t0) / items * 1e3, 3))
                row["unpack_ms"].append(round((t2 - t1) / items * 1e3, 3))
    finally:
        if folder is not None:
            folder.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/adc")
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    src = Path(args.work) / "src"
    audio_build.make_dataset(src, args.files, args.files)
    res = {"worker": worker_cost(src, args.rounds), "trip": trip_cost()}
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
