"""Audio preprocessing through ``shardsmith build`` vs the audio encoder alone (issue 17), one lease.

Dataset: ``--files`` audio files of real speech (espeak-ng, padded with silence to 4.5-9.5 s), half AAC ``.m4a`` stereo at 48 kHz, half FLAC mono at 44.1 kHz, so every file is
decoded, down-mixed / duplicated, resampled to the encoder's 16 kHz and cut to a duration bucket
(``--durations``, LTX's ``--audio-durations``). Made once per folder (outside every timing), then
``os.sync()`` (untimed, ``sync_s``): the build reads files at rest, not files still being written back.

1. **build**: ``shardsmith build recipe.yaml --out OUT --no-report -q`` in a subprocess, wall time from
   the command to its exit (the manifest is the build's last write): interpreter start, plan, model
   build (random weights of LTX-2's published audio VAE: ``config: published``), decode workers,
   mel + encode on the GPU, ``audio_latent.pth`` shards.
2. **encoder alone**: in the same lease, a fresh process builds the same model, decodes the same files
   (``--alone-items``: the first N of them; default all) to the same waveforms (not timed), then times the
   encoder over those items in the build's batches (``--batch`` items of one audio length a batch, as the
   build queues them), after one warm-up batch, ``torch.cuda.synchronize`` around, three ways, each the
   faster of two passes:
   - ``sync``: ``AudioVae.encode`` (stack, upload, mel + encode, copy back, batch after batch);
   - ``pipelined``: the build's own device path, ``AudioVae.launch`` of batches staged beforehand in
     page-locked memory, queued back to back (upload, mel + encode, copy back);
   - ``resident``: mel + VAE encode of batches already on the GPU, nothing copied (the GPU's pace).
   A diagnostic beside them (not a baseline): ``resident_with_resampling_items_per_s``, the same items as
   ``audio.resampler: sinc`` sends them (at their source's rate, mono kept), duplicated and resampled on the
   device before the mel: what the device work of a build costs.
Ratio = the build's items/s (written ÷ wall) ÷ the fastest of the three (``encoder_alone.items_per_s``);
``ratio_sync`` divides by ``sync`` (the only baseline before the twelfth session). Goal ≥ 0.9.
Diagnostics beside it, from the build's ``audio_steady_state``: ``fixed_s`` (the build's wall time outside
its stream of batches, first batch done to last), ``stream_vs_alone`` (the stream's items/s ÷ the fastest
alone) and ``ceiling_at_this_size`` (the ratio if every batch ran at the encoder's pace, the fixed cost
as measured: what this many files can reach at best).

``--distinct D`` makes D recordings and the other files remuxed copies of them (``_copy``: the same
packets, a different title tag, so every file has its own bytes and is decoded in full by the build);
making 60,000 files from scratch would take minutes of a lease.

Usage (GPU machine): ``PYTHONPATH=src:tests python3 bench/audio_build.py --work /tmp/ab --out $OUT/audio.json``
CPU check of the code paths: ``... --files 24 --config tiny --device cpu``
On a machine without espeak-ng, ``SHARDSMITH_SPEECH_DIR`` names a folder of espeak-ng WAVs made elsewhere
(``espeak-ng -w s0.wav "..."``), which the files are made from instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

def _carried_speech(duration: float, rate: int = 16000, text: str = ""):
    """Real speech from ``$SHARDSMITH_SPEECH_DIR/*.wav`` (espeak-ng WAVs made where espeak-ng exists
    and carried to a machine without it), one per call in turn, resampled and padded to ``duration``."""
    import wave

    import numpy as np

    files = sorted(Path(os.environ["SHARDSMITH_SPEECH_DIR"]).glob("*.wav"))
    f = files[_carried_speech.calls % len(files)]
    _carried_speech.calls += 1
    with wave.open(str(f)) as wf:
        sr, x = wf.getframerate(), np.frombuffer(wf.readframes(wf.getnframes()), "<i2").astype(np.float32) / 32768
    x = np.interp(np.arange(int(len(x) * rate / sr)) * sr / rate, np.arange(len(x)), x).astype(np.float32)
    out = np.zeros(int(round(duration * rate)), np.float32)
    out[: min(len(out), len(x))] = x[: len(out)]
    return out


_carried_speech.calls = 0


def _one(args) -> str:
    """Write file ``i`` (picklable for the pool): real speech (espeak-ng) padded to its duration."""
    i, folder = args
    import video_factory
    from video_factory import audio_file

    if os.environ.get("SHARDSMITH_SPEECH_DIR") and not shutil.which("espeak-ng"):
        _carried_speech.calls = i
        video_factory.speech_wave = _carried_speech

    dur = round(4.5 + (i * 0.00125) % 5.0, 5)  # distinct bytes for each file (no exact duplicates to drop)
    path = Path(folder) / (f"s{i:05d}.m4a" if i % 2 else f"s{i:05d}.flac")
    audio_file(path, kind="speech", duration=dur, rate=48000 if i % 2 else 44100,
               layout="stereo" if i % 2 else "mono")
    return path.name


def _name(i: int) -> str:
    return f"s{i:05d}.m4a" if i % 2 else f"s{i:05d}.flac"


def _copy(args) -> str:
    """File ``i`` as a copy of recording ``i % distinct`` (picklable for the pool): its packets remuxed,
    untouched, into a new file whose title tag differs, so its bytes (and sha256) are its own while its
    decoded audio is the recording's."""
    import av

    i, distinct, folder = args
    src, dst = Path(folder) / _name(i % distinct), Path(folder) / _name(i)
    with av.open(str(src)) as inp, av.open(str(dst), "w", format="ipod" if dst.suffix == ".m4a" else "flac",
                                           options={"fflags": "+bitexact"}) as out:
        out.metadata["title"] = f"copy {i}"
        s = out.add_stream_from_template(inp.streams.audio[0])
        for pkt in inp.demux(inp.streams.audio[0]):
            if pkt.dts is None:
                continue
            pkt.stream = s
            out.mux(pkt)
    return dst.name


def make_dataset(folder: Path, n: int, distinct: int | None = None) -> None:
    """``n`` files: ``distinct`` recordings (all of them when None) and remuxed copies of them (``_copy``)."""
    distinct = n if distinct is None else min(n, distinct)
    marker = folder / ".made"
    if marker.exists() and marker.read_text() == f"{n} {distinct} v3":
        return
    folder.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(_one, [(i, str(folder)) for i in range(distinct)], chunksize=16))
        list(pool.map(_copy, [(i, distinct, str(folder)) for i in range(distinct, n)], chunksize=64))
    for p in folder.iterdir():  # files of an older recipe of this dataset
        if p.suffix in (".m4a", ".flac") and int(p.stem[1:]) >= n:
            p.unlink()
    marker.write_text(f"{n} {distinct} v3")


def recipe(src: Path, args) -> dict:
    """The build's recipe. ``--device cuda`` leaves ``models.device`` at its default (``auto``), as a user's
    recipe does; the build's manifest must then say ``cuda`` (checked in :func:`run_build`)."""
    models = {"audio_vae": {"family": "ltx2_audio", "config": args.config}, "batch_size": args.batch}
    if args.device != "cuda":
        models["device"] = args.device
    return {"sources": [{"path": str(src)}], "models": models,
            "audio": {"durations": args.durations},
            "outputs": [{"format": "latent_wds", "dir": "audio", "samples_per_shard": 1000}]}


def run_build(src: Path, out: Path, args) -> dict:
    import shutil

    import yaml

    shutil.rmtree(out, ignore_errors=True)
    rec = out.parent / "recipe.yaml"
    rec.write_text(yaml.safe_dump(recipe(src, args)))
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "shardsmith", "build", str(rec), "--out", str(out), "--no-report", "-q"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])})
    wall = time.perf_counter() - t0
    ended = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the build and its workers (all waited for)
    cpu = {"user_s": round(after.ru_utime - before.ru_utime, 1), "sys_s": round(after.ru_stime - before.ru_stime, 1)}
    if r.returncode != 0:
        raise SystemExit(f"build failed ({r.returncode}):\n{r.stderr[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())
    if m["models"].get("device") != args.device:
        raise SystemExit(f"the build ran on {m['models'].get('device')}, not on {args.device}")
    return {"wall_s": round(wall, 3), "written": m["counts"]["written"], "timings": m.get("timings"), "cpu": cpu,
            # the process's life after its manifest was written (interpreter teardown, unless it left at once)
            "after_manifest_s": round(ended - (out / "manifest.json").stat().st_mtime, 3),
            "models": {k: m["models"].get(k) for k in ("device", "batch_size", "seconds", "steady_state",
                                                       "audio_steady_state")}}


def _alone_wave(args):
    """The build's waveform of one file (picklable for the pool), or None when no bucket takes it."""
    from shardsmith.transform.audio import choose_duration, decode_audio, probe_audio

    path, durations, rate = args
    name = Path(path).name
    d = choose_duration(probe_audio(path, name).duration, [float(x) for x in durations.split(";")])
    if d is None:
        return None
    at_source = decode_audio(path, name, rate=None, duration=d, keep_mono=True)  # as audio.resampler: sinc sends it
    return decode_audio(path, name, rate=rate, duration=d).wave, (at_source.wave, at_source.rate)


def encoder_alone(src: Path, args) -> dict:
    """Runs in a fresh process (``--encoder-alone``): the build's batches through the encoder, three ways."""
    import numpy as np
    import torch

    from shardsmith.encode.audio_vae import load_audio_vae

    t0 = time.perf_counter()
    vae = load_audio_vae("ltx2_audio", config=args.config, device=args.device, vocoder=False)
    load_s = time.perf_counter() - t0  # (without the vocoder, as the build's encode stage)
    files = sorted(p for p in src.iterdir() if p.suffix in (".m4a", ".flac"))[:args.alone_items or None]
    with ProcessPoolExecutor(os.cpu_count()) as pool:  # (not timed)
        both = [w for w in pool.map(_alone_wave, [(str(p), args.durations, vae.spec.sample_rate) for p in files],
                                    chunksize=32) if w is not None]
    waves = [w for w, _ in both]
    by_length: dict[int, list] = {}  # the build's queues: one per audio length, batches of --batch
    for w in waves:
        by_length.setdefault(w.shape[-1], []).append(w)
    batches = [q[i:i + args.batch] for q in by_length.values() for i in range(0, len(q), args.batch)]
    by_source: dict[tuple, list] = {}  # the same files as the build sends them: at their rate, mono kept
    for _, (w, rate) in both:
        by_source.setdefault((rate, *w.shape), []).append(w)
    source_batches = [(key[0], q[i:i + args.batch]) for key, q in by_source.items()
                      for i in range(0, len(q), args.batch)]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    vae.encode(batches[0])  # warm-up (cuDNN plans), as the build's warm-up
    sync()

    def best_of_two(run) -> float:  # seconds of the faster pass over every batch
        times = []
        for _ in range(2):
            sync()
            t0 = time.perf_counter()
            run()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)

    staged = [vae.stage(b) for b in batches]  # page-locked on a GPU (not timed)
    resident = [torch.from_numpy(np.stack(b)).to(vae.device) for b in batches]  # (not timed)
    at_source = [(rate, torch.from_numpy(np.stack(b)).to(vae.device)) for rate, b in source_batches]  # (not timed)
    with torch.inference_mode():
        vae._latents(at_source[0][1], at_source[0][0])  # (its resampling kernels, once)
        secs = {"sync": best_of_two(lambda: [vae.encode(b) for b in batches]),
                "pipelined": best_of_two(lambda: [vae.launch(s) for s in staged]),
                "resident": best_of_two(lambda: [vae._latents(x, vae.spec.sample_rate) for x in resident])}
        # a diagnostic, not a baseline: the same items from the source's rate, mono duplicated and resampled
        # on the device first (audio.resampler: sinc's device work)
        with_resampling = best_of_two(lambda: [vae._latents(x, rate) for rate, x in at_source])
    rates = {k: round(len(waves) / v, 1) for k, v in secs.items()}
    fastest = max(rates, key=rates.get)
    return {"items": len(waves), "encode_s": round(secs[fastest], 3), "items_per_s": rates[fastest],
            "fastest": fastest, "items_per_s_by_way": rates, "load_s": round(load_s, 3), "batch": args.batch,
            "resident_with_resampling_items_per_s": round(len(waves) / with_resampling, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--config", default="published")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--durations", default="4.0;8.0")
    ap.add_argument("--distinct", type=int, default=None,
                    help="distinct recordings (default: every file); the other files are remuxed copies of them")
    ap.add_argument("--alone-items", type=int, default=None,
                    help="items the encoder alone is timed on (the first files; default: every file)")
    ap.add_argument("--encoder-alone", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    src = args.work / "src"
    if args.encoder_alone:
        print(json.dumps(encoder_alone(src, args)))
        return
    t0 = time.perf_counter()
    make_dataset(src, args.files, args.distinct)
    dataset_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    os.sync()  # (untimed) the files at rest before the build, as a user's are: not still being written back to disk
    res = {"files": args.files, "distinct": args.distinct or args.files, "dataset_s": round(dataset_s, 1),
           "sync_s": round(time.perf_counter() - t0, 1), "config": args.config,
           "device": args.device, "batch": args.batch, "durations": args.durations}
    res["build"] = run_build(src, args.work / "out", args)
    r = subprocess.run([sys.executable, __file__, "--encoder-alone", "--work", str(args.work), "--batch",
                        str(args.batch), "--config", args.config, "--device", args.device, "--durations",
                        args.durations, *(["--alone-items", str(args.alone_items)] if args.alone_items else [])],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-3000:])
    res["encoder_alone"] = json.loads(r.stdout.strip().splitlines()[-1])
    res["build_items_per_s"] = round(res["build"]["written"] / res["build"]["wall_s"], 1)
    alone = res["encoder_alone"]
    res["ratio"] = round(res["build_items_per_s"] / alone["items_per_s"], 3)  # items/s: build ÷ the fastest alone
    res["ratio_sync"] = round(res["build_items_per_s"] / alone["items_per_s_by_way"]["sync"], 3)
    ss = res["build"]["models"].get("audio_steady_state")
    if ss:  # diagnostics: where the ratio goes (a GPU build's launched batches)
        res["fixed_s"] = round(res["build"]["wall_s"] - (ss["last_batch_done_s"] - ss["first_batch_done_s"]), 2)
        res["stream_vs_alone"] = round(ss["items_per_s"] / alone["items_per_s"], 3)
        work = res["build"]["written"] / alone["items_per_s"]
        res["ceiling_at_this_size"] = round(work / (work + res["fixed_s"]), 3)
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
