"""Harness-internal probe: does torchvision's nvJPEG decode wait for GPU work queued on other streams?
Prints host seconds of one decode call behind 200 queued matmuls on (a) the default stream, (b) a
non-default torch stream."""
import json, sys, time
from pathlib import Path
import torch
from torchvision.io import ImageReadMode, decode_jpeg

files = sorted(Path(sys.argv[1]).glob("**/*.jpg"))[:64]
datas = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
for _ in range(2):
    decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda")
torch.cuda.synchronize()
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
res = {}
for name in ("default", "side"):
    s = torch.cuda.Stream() if name == "side" else torch.cuda.default_stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        for _ in range(300):
            a @ a
    t = time.perf_counter()
    out = decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda")
    res[f"matmuls_on_{name}_host_s"] = time.perf_counter() - t
    torch.cuda.synchronize()
    res[f"matmuls_on_{name}_total_s"] = time.perf_counter() - t
print(json.dumps(res))
