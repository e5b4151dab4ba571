"""Why does the compiled SD-VAE encoder run at eager speed inside EncodeStage? (issue 4 probe)

Times, on one compiled VAE: encode(resident randn), encode(_to_input(host)), encode_staged(host),
and profiles one call of each (top CUDA kernels). Usage: PYTHONPATH=src python3 bench/compile_probe.py
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch

sys.path.insert(0, "bench")
from gpu_encode import median_ms as timed  # noqa: E402

from shardsmith.encode import compile as cc
from shardsmith.encode.stage import EncodeStage
from shardsmith.encode.vae import load_vae

B, S = 64, 256
mode = sys.argv[1] if len(sys.argv) > 1 else cc.COMPILE_MODE


def prof(name, fn):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    print(f"---- profile: {name}")
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))


torch.backends.cudnn.benchmark = True
vae = load_vae("sd", config="published", dtype="bfloat16", device="cuda")
st = EncodeStage(vae, None, batch_size=B, device="cuda", compile="off")
rng = np.random.default_rng(0)
host = st.stage([rng.integers(0, 256, (1, S, S, 3), dtype=np.uint8) for _ in range(B)])
x = torch.randn(B, 3, S, S, device="cuda", dtype=torch.bfloat16).clamp_(-1, 1)
xi = st._to_input(host)
print("x", x.shape, x.stride(), x.dtype, "xi", xi.shape, xi.stride(), xi.dtype, xi.storage_offset(), flush=True)
cases = {
    "encode(randn)": lambda: vae.encode(x),
    "encode(_to_input(host)) fresh": lambda: vae.encode(st._to_input(host)),
    "encode(xi) reused": lambda: vae.encode(xi),
    "encode(randn).to(cpu)": lambda: vae.encode(x).detach().to("cpu"),
    "encode_staged(host)": lambda: st.encode_staged(host),
    "encoder(randn) only": lambda: vae.model.encoder(x),
    "encoder(xi) only": lambda: vae.model.encoder(xi),
}
res = {}
for k, f in cases.items():
    with torch.inference_mode():
        pass
    res["eager " + k] = timed(f)
    print("eager", k, res["eager " + k], "ms", flush=True)
t = time.perf_counter()
vae.compile(mode=None if mode == "default" else mode)
vae.encode(x)
torch.cuda.synchronize()
print(f"compile ({mode}) {time.perf_counter() - t:.1f} s", flush=True)
for k, f in cases.items():
    res["compiled " + k] = timed(f)
    print("compiled", k, res["compiled " + k], "ms", flush=True)
from torch._dynamo.utils import counters

print({k: dict(v) for k, v in counters.items() if k in ("frames", "stats", "recompiles", "graph_break")})
prof("compiled encode(randn)", cases["encode(randn)"])
prof("compiled encode_staged(host)", cases["encode_staged(host)"])
prof("compiled encoder(xi) only", cases["encoder(xi) only"])
