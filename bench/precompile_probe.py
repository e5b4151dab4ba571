"""What a warm compile costs a fresh process, against loading a saved precompiled encoder (a diagnostic for
BENCHMARKS.md §10, not a goal figure).

A build with ``models.compile: on`` and a warm Inductor cache still spends seconds before its first compiled
batch: Dynamo traces the encoder again, and Inductor finds its kernels in the cache. torch's precompile
(``torch.compile(...).aot_compile``, saved with ``save_compiled_function`` and read back with
``torch.compiler.load_compiled_function``) keeps the traced and compiled result, so a later process skips both.
Each step below runs in a fresh interpreter sharing one Inductor cache (``TORCHINDUCTOR_CACHE_DIR``), with the
published config's random weights in the build's dtype and the build's cuDNN mode:

- ``eager``: no compile (the reference for the bytes and the batch time);
- ``tc``: ``encoder.compile(mode=...)`` and its first call (the first run fills the cache: cold; later ones warm);
- ``save``: ``aot_compile`` of the encoder's forward under ``no_grad``, saved to a file;
- ``load``: that file loaded and called on the same module.

Each prints the seconds to the model (imports and build), to the first compiled batch, one more batch, the median of
six more, and the output's SHA-256 (the same bytes in every process? the loaded function the same kernels as
``torch.compile``'s?). ``--deterministic`` sets ``TORCHINDUCTOR_DETERMINISTIC=1`` and
``torch.use_deterministic_algorithms(True, warn_only=True)`` (Inductor then picks its kernels without timing them on
the device; Dynamo sets Inductor's flag back to torch's after each trace, so the env alone does not hold); ``--cache`` names a fresh cache to measure a cold compile.

    PYTHONPATH=src:bench python3 bench/precompile_probe.py --steps tc,tc,save,load,load,tc --out r.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

T0 = time.perf_counter()


def step(kind: str, family: str, config: str, shape: list[int], dtype: str, mode: str, path: str) -> dict:
    import torch

    from shardsmith.encode.vae import load_vae

    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True  # the build's mode
    if os.environ.get("TORCHINDUCTOR_DETERMINISTIC") == "1":  # Dynamo resets Inductor's flag to this one after tracing
        torch.use_deterministic_algorithms(True, warn_only=True)
    t_torch = time.perf_counter() - T0
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    vae = load_vae(family, config=config, dtype=dtype, device=dev)
    enc = vae.model.encoder
    g = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.rand(*shape, generator=g) * 2 - 1).to(device=dev, dtype=vae.torch_dtype)
    t_model = time.perf_counter() - T0
    if kind == "eager":
        run = lambda: enc(x)  # noqa: E731
        ctx = torch.inference_mode
    elif kind == "tc":
        enc.compile(dynamic=False, mode=mode)
        run = lambda: enc(x)  # noqa: E731
        ctx = torch.inference_mode
    elif kind == "save":
        opts = dict(torch._inductor.list_mode_options(mode or "default"))  # the mode's options, and the filter
        opts["guard_filter_fn"] = torch.compiler.keep_portable_guards_unsafe  # (serialisable guards only)
        c = torch.compile(type(enc).forward, fullgraph=True, dynamic=False, options=opts)
        with torch.no_grad():
            fn = c.aot_compile(((enc, x), {}))
        fn.save_compiled_function(path)
        run = lambda: fn(enc, x)  # noqa: E731
        ctx = torch.no_grad
    else:
        with open(path, "rb") as f:
            fn = torch.compiler.load_compiled_function(f)
        run = lambda: fn(enc, x)  # noqa: E731
        ctx = torch.no_grad
    with ctx():
        out = run()
        if dev == "cuda":
            torch.cuda.synchronize()
        t_first = time.perf_counter() - T0
        out = run()
        if dev == "cuda":
            torch.cuda.synchronize()
        t_second = time.perf_counter() - T0
        batch_s = []
        for _ in range(6):
            t = time.perf_counter()
            run()
            if dev == "cuda":
                torch.cuda.synchronize()
            batch_s.append(time.perf_counter() - t)
    sha = hashlib.sha256(out.float().cpu().numpy().tobytes()).hexdigest()[:16]
    return {"step": kind, "torch_s": round(t_torch, 2), "model_s": round(t_model, 2), "first_s": round(t_first, 2),
            "first_after_model_s": round(t_first - t_model, 2), "second_batch_s": round(t_second - t_first, 4),
            "median_batch_s": round(sorted(batch_s)[len(batch_s) // 2], 4), "sha": sha,
            "inductor_deterministic": bool(getattr(torch._inductor.config, "deterministic", None))
            if kind != "eager" else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", default="tc,tc,save,load,load,tc")
    ap.add_argument("--family", default="sd")
    ap.add_argument("--config", default="published")
    ap.add_argument("--shape", default="64,3,256,256")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--mode", default="max-autotune-no-cudagraphs")
    ap.add_argument("--file", default="/tmp/precompiled_encoder.bin")
    ap.add_argument("--deterministic", action="store_true", help="TORCHINDUCTOR_DETERMINISTIC=1 (no on-device "
                    "benchmarking in Inductor)")
    ap.add_argument("--cache", default="/tmp/precompile_probe_cache", help="TORCHINDUCTOR_CACHE_DIR")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    shape = [int(v) for v in a.shape.split(",")]
    mode = None if a.mode == "default" else a.mode
    if a.one:
        print(json.dumps(step(a.one, a.family, a.config, shape, a.dtype, mode, a.file)), flush=True)
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = a.cache
    if a.deterministic:
        os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1"
    rows = []
    for kind in a.steps.split(","):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "--one", kind, "--family", a.family, "--config", a.config, "--shape", a.shape,
                            "--dtype", a.dtype, "--mode", a.mode, "--file", a.file], capture_output=True, text=True)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        row = json.loads(line[-1]) if line else {"step": kind, "error": p.stderr[-1500:]}
        row["process_s"] = round(time.perf_counter() - t, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"family": a.family, "config": a.config, "shape": shape, "dtype": a.dtype, "mode": a.mode,
                       "deterministic": a.deterministic, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
