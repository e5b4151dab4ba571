"""Where the video build's ~9 ms a batch over the encoder alone may go: the staged uint8 batch turned into the VAE's
input on the GPU (a diagnostic for BENCHMARKS.md §10, twenty-ninth session).

The encoder-alone baseline feeds a resident bf16 batch; a build converts each staged ``[B, F, H, W, 3]`` uint8
batch to ``[B, 3, F, H, W]`` bf16 in ``[-1, 1]`` first (``encode/staging.py``: a permuted copy, then ``div_`` and
``sub_``). Moving that work to a side stream changed nothing (the GPU was busy either way), so its cost is the
kernels themselves. This times them, and other orders of the same per-element arithmetic (``bf16(u8) / 127.5 - 1``,
each step rounded to bf16 as the build does), each checked to give the build's bytes: median of ``--repeats`` CUDA
event timings at the LTX-2 workload's shape, beside one forward of the published LTX-2 VAE for scale.

On a GPU machine:
    PYTHONPATH=src:/tmp/site python3 bench/input_convert_probe.py
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def build_way(x: torch.Tensor) -> torch.Tensor:
    """``HostStaging._to_input``'s conversion, as the build runs it."""
    return x.permute(0, 4, 1, 2, 3).to(torch.bfloat16, memory_format=torch.contiguous_format).div_(127.5).sub_(1.0)


def scale_then_permute(x: torch.Tensor) -> torch.Tensor:
    """Converted and scaled in the staged layout (contiguous passes), then one permuted copy of bf16."""
    return x.to(torch.bfloat16).div_(127.5).sub_(1.0).permute(0, 4, 1, 2, 3).contiguous()


def per_channel(x: torch.Tensor) -> torch.Tensor:
    """Each channel copied (a stride-3 read, a contiguous write), then scaled in place."""
    b, f, h, w, c = x.shape
    out = torch.empty((b, c, f, h, w), dtype=torch.bfloat16, device=x.device)
    for i in range(c):
        out[:, i].copy_(x[..., i])
    return out.div_(127.5).sub_(1.0)


WAYS = {"build": build_way, "scale_then_permute": scale_then_permute, "per_channel": per_channel}


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1x121x512x768", help="BxFxHxW of the staged batch")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--no-vae", action="store_true", help="skip the LTX-2 forward timed for scale")
    args = ap.parse_args()
    b, f, h, w = (int(v) for v in args.shape.split("x"))
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(0, 256, (b, f, h, w, 3), dtype=torch.uint8, device="cuda", generator=g)
    want = build_way(x)
    out = {"shape": [b, f, h, w, 3], "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name, way in WAYS.items():
        way(x)  # (first call: kernels loaded)
        out[name] = {"median_s": round(timed(lambda: way(x), args.repeats), 6), "same_bytes": torch.equal(way(x), want)}
    if not args.no_vae:
        from shardsmith.encode.vae import load_vae

        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True  # the build's modes
        vae = load_vae("ltx2", config="published", dtype="bfloat16", device="cuda")
        with torch.no_grad():
            vae.encode(want)
            out["ltx2_forward_median_s"] = round(timed(lambda: vae.encode(want), max(3, args.repeats // 4)), 6)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
