"""Text encoding that survives a full GPU: on out-of-memory, the prompts in halves, down to one.

Contract
- ``encode_halving(encoder, prompts, **kw)`` returns ``encoder.encode(prompts, **kw)``; when that runs
  out of memory it encodes each half the same way (non-blocking copies off: the halves are joined on
  the host at once) and joins the results in order: the same embeddings as a pass of their own for an
  encoder whose prompts do not see each other (every family here). ``retries`` counts the halvings.
- One prompt that still does not fit is a :class:`TextMemoryError` naming the model, the memory the
  failed allocation asked for, the model's own size and what to set; never a traceback.
- ``rows=R`` (the stage's :meth:`~shardsmith.encode.caption_cache.CaptionCache.text_rows`): the prompts go in passes of
  exactly ``R`` rows, the last padded with ``""`` and the result cut back, so every text batch has one shape
  and a prompt's embedding does not depend on its batch-mates (a GEMM of another shape may round
  differently, on CUDA and on a CPU's MKL alike); the text pass of ``models.offload: text-first`` and the
  stage then give the same bits, and so do a build and its resume.
"""

from __future__ import annotations

import re
from dataclasses import fields, replace

import torch

from shardsmith.errors import UserError


class TextMemoryError(UserError):
    """The text encoder does not fit on its device even for one prompt."""


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _join(parts):
    """Concatenate :class:`~shardsmith.encode.text.TextEmbeddings` along the batch, in order."""
    first = parts[0]
    out = {}
    for f in fields(first):
        values = [getattr(p, f.name) for p in parts]
        if values[0] is None:
            out[f.name] = None
        elif torch.is_tensor(values[0]):
            out[f.name] = torch.cat(values)
        else:
            out[f.name] = [v for part in values for v in part]
    return replace(first, **out)


def _model_bytes(encoder) -> int:
    model = getattr(encoder, "model", None)
    return sum(p.numel() * p.element_size() for p in model.parameters()) if model is not None else 0


def _cut(te, n: int):
    """The first ``n`` prompts of a batch of :class:`~shardsmith.encode.text.TextEmbeddings`."""
    return replace(te, **{f.name: getattr(te, f.name)[:n] for f in fields(te) if getattr(te, f.name) is not None})


def encode_halving(encoder, prompts: list[str], *, counter: list[int] | None = None, rows: int | None = None, **kw):
    if rows is not None and len(prompts) > rows:
        kw = {**kw, "non_blocking": False} if "non_blocking" in kw else kw  # joined on the host at once
        return _join([encode_halving(encoder, prompts[i:i + rows], counter=counter, rows=rows, **kw)
                      for i in range(0, len(prompts), rows)])
    if rows is not None and 0 < len(prompts) < rows:
        n = len(prompts)
        return _cut(encode_halving(encoder, list(prompts) + [""] * (rows - n), counter=counter, **kw), n)
    try:
        return encoder.encode(prompts, **kw)
    except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried
        if not is_oom(exc):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if len(prompts) <= 1:
            spec, prov = encoder.spec, encoder.provenance
            asked = re.search(r"[Tt]ried to allocate ([\d.]+ [KMGT]i?B)", str(exc))
            size = _model_bytes(encoder)
            raise TextMemoryError(
                f"models.text ({spec.family}, {prov.path_or_repo or prov.weights}, {spec.dtype}) ran out of memory "
                f"on a single prompt (max_length {spec.max_length})"
                + (f": it asked for {asked.group(1)} more" if asked else "")
                + (f", beside its own {size / 2**30:.2f} GiB of weights" if size else "")
                + "; free the GPU of other work, set models.text.dtype: bfloat16, a smaller models.text.max_length, "
                "or models.device: cpu (the text encoder then runs on the CPU)") from None
        if counter is not None:
            counter[0] += 1
        kw = {**kw, "non_blocking": False} if "non_blocking" in kw else kw
        half = len(prompts) // 2
        return _join([encode_halving(encoder, prompts[:half], counter=counter, **kw),
                      encode_halving(encoder, prompts[half:], counter=counter, **kw)])
