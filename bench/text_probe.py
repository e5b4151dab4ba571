"""Where T5-XXL's time goes at [64, 512] in bf16 (issue 4 probe). Run 1 (2026-12-03) showed fp32
GEMMs, a float softmax and big elementwise kernels next to the bf16 GEMMs: SDPA falling back to
its math backend. This run times the attention variants:
sdpa as loaded / sdpa without the math backend (errors say why a backend was refused) / eager."""
from __future__ import annotations

import sys
import warnings

import torch

sys.path.insert(0, "bench")
from gpu_encode import make_prompts, median_ms  # noqa: E402

from shardsmith.encode.text import load_text_encoder  # noqa: E402

B, L = 64, 512
enc = load_text_encoder("t5", config="xxl", max_length=L, dtype="bfloat16", device="cuda")
print(sorted({str(p.dtype) for p in enc.model.parameters()}), enc.model.config._attn_implementation, flush=True)
ids, mask, _ = enc.tokenize(make_prompts(B, min_words=L, seed=0))
ids, mask = ids.cuda(), mask.cuda()


orig = torch.nn.functional.scaled_dot_product_attention
seen = {}


def spy(q, k, v, attn_mask=None, *a, **kw):
    seen.setdefault("q", (tuple(q.shape), str(q.dtype), q.stride()))
    if attn_mask is not None:
        seen.setdefault("mask", (tuple(attn_mask.shape), str(attn_mask.dtype), attn_mask.stride()))
    seen.setdefault("kw", {k2: (v2 if not torch.is_tensor(v2) else tuple(v2.shape)) for k2, v2 in kw.items()})
    return orig(q, k, v, attn_mask, *a, **kw)


torch.nn.functional.scaled_dot_product_attention = spy
with torch.inference_mode():
    ref = enc.model(input_ids=ids, attention_mask=mask).last_hidden_state
    print("sdpa call", seen, flush=True)
    print("sdpa as loaded ms", median_ms(lambda: enc.model(input_ids=ids, attention_mask=mask), 4), flush=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backends in [("efficient", [SDPBackend.EFFICIENT_ATTENTION]), ("cudnn", [SDPBackend.CUDNN_ATTENTION])]:
        try:
            with warnings.catch_warnings(record=True) as w, sdpa_kernel(backends):
                warnings.simplefilter("always")
                out = enc.model(input_ids=ids, attention_mask=mask).last_hidden_state
                ms = median_ms(lambda: enc.model(input_ids=ids, attention_mask=mask), 4)
            print(name, "ms", ms, "max abs diff vs as-loaded", float((out.float() - ref.float()).abs().max()), flush=True)
        except Exception as e:  # noqa: BLE001
            print(name, "refused:", type(e).__name__, str(e)[:300], [str(x.message)[:300] for x in w], flush=True)
    enc.model.config._attn_implementation = "eager"
    for m in enc.model.modules():
        if hasattr(m, "config") and hasattr(m.config, "_attn_implementation"):
            m.config._attn_implementation = "eager"
    try:
        out = enc.model(input_ids=ids, attention_mask=mask).last_hidden_state
        print("eager ms", median_ms(lambda: enc.model(input_ids=ids, attention_mask=mask), 4),
              "max abs diff", float((out.float() - ref.float()).abs().max()), flush=True)
    except Exception as e:  # noqa: BLE001
        print("eager failed", type(e).__name__, str(e)[:300], flush=True)
