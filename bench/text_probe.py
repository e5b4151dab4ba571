"""Where T5-XXL's time goes at [64, 512] in bf16 (issue 4 probe): top CUDA kernels of one forward,
and the same forward with the attention mask left out (all prompts fill 512 tokens)."""
from __future__ import annotations

import statistics
import sys
import time

import torch

sys.path.insert(0, "bench")
from gpu_encode import make_prompts  # noqa: E402

from shardsmith.encode.text import load_text_encoder  # noqa: E402

B, L = 64, 512
enc = load_text_encoder("t5", config="xxl", max_length=L, dtype="bfloat16", device="cuda")
print({n: str(p.dtype) for n, p in list(enc.model.named_parameters())[:3]},
      sorted({str(p.dtype) for p in enc.model.parameters()}), enc.model.config._attn_implementation, flush=True)
ids, mask, _ = enc.tokenize(make_prompts(B, min_words=L, seed=0))
ids, mask = ids.cuda(), mask.cuda()


def t(fn, n=5):
    for _ in range(2):
        fn()
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        s = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - s)
    return round(statistics.median(out) * 1e3, 1)


with torch.inference_mode():
    f_mask = lambda: enc.model(input_ids=ids, attention_mask=mask).last_hidden_state  # noqa: E731
    f_nomask = lambda: enc.model(input_ids=ids).last_hidden_state  # noqa: E731
    print("with mask ms", t(f_mask), "no mask ms", t(f_nomask), flush=True)
    x = torch.randn(B * L, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(10240, 4096, device="cuda", dtype=torch.bfloat16)
    ms = t(lambda: x @ w.t(), 10)
    print("gemm 32768x4096x10240 ms", ms, "TFLOP/s", round(2 * B * L * 4096 * 10240 / ms / 1e9, 1), flush=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        f_mask()
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=90))
