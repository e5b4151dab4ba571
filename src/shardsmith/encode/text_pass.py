"""The text pass of ``models.offload: text-first``: every caption the build will ask for, encoded once into
the build's text cache; then the text encoder is freed, before the VAE loads.

Contract
- :func:`plan_captions(recipe, run)`: the captions of the planned ``ok`` items of the sources whose outputs
  use text (``""`` for none, as the encode stage asks), in plan order, read in windows of :data:`WINDOW`
  rows through the pass's own ledger connection (host memory stays bounded whatever the plan's size),
  then each output's and ``distill``'s negative prompt. It waits for the plan: the plan running ahead
  (``run.ahead``) is followed as it commits; else the ledger's ``plan_complete`` (``run.planned`` set with
  the plan incomplete is an error: the build stopped).
- :func:`text_first(load, recipe, run, decision, device, batch)`: loads the text encoder (``load()``), encodes
  every caption of :func:`plan_captions` not already in the cache (a resumed build encodes only what it
  lacks), in batches of ``batch`` distinct captions (padded to ``batch`` rows, the stage's text batch shape
  on any device: the same bits; out of memory: halved, ``text_memory``), frees the
  encoder (its last reference, ``gc``, the CUDA cache) and returns ``(CachedText, counts, memory)``:
  ``counts`` (captions read, distinct captions encoded now, entries the cache held before and after, seconds);
  the captions read are counted on ``run.progress`` (the build's display) when given and the text encoder's
  :class:`~shardsmith.encode.memory_plan.ModelMemory` (its peak measured on a GPU).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from typing import Any, Callable, Iterator

import torch

from shardsmith.encode.memory_plan import ModelMemory, param_bytes
from shardsmith.encode.model_identity import clean_config, model_identity
from shardsmith.encode.text_cache import TEXT_CACHE_DIR, CachedText, TextCache
from shardsmith.encode.text_memory import encode_halving

log = logging.getLogger(__name__)

WINDOW = 2048  # ledger rows read at once


def _text_sources(recipe) -> list[int] | None:
    """The sources of the outputs that write text embeddings (None: every source)."""
    from shardsmith.outputs import kind_of

    ids: set[int] = set()
    for o in recipe.outputs:
        if "text" in kind_of(o).encoders_for(o, recipe):
            ids.update(recipe.source_ids(o))
    return sorted(ids) if ids else None


def _wait_for_plan(ledger, run) -> None:
    while not ledger.get_meta("plan_complete"):
        run.check_cancelled()
        if run.planned is not None and run.planned.wait(0.2) and not ledger.get_meta("plan_complete"):
            raise RuntimeError("the plan stopped before it was complete; the text pass (models.offload: text-first) "
                               "needs every caption")


def plan_captions(recipe, run) -> Iterator[str]:
    from shardsmith.plan.ledger import Ledger
    from shardsmith.split.assign import TRAIN

    ledger = Ledger(run.ledger_path)
    try:
        srcs = _text_sources(recipe)
        seen_train = False
        if run.ahead is not None:  # the train rows as the plan commits them, then the rest
            for item in run.ahead.items(ledger, split=TRAIN, sources=srcs or list(range(len(recipe.sources))),
                                        check=run.check_cancelled):
                yield item.caption or ""
            seen_train = True
        _wait_for_plan(ledger, run)
        top = ledger.db.execute("SELECT COALESCE(MAX(idx), -1) FROM items").fetchone()[0]
        for lo in range(0, top + 1, WINDOW):
            rows = list(ledger.items(status="ok", sources=srcs, idx_range=(lo, lo + WINDOW)))
            for item in rows:
                if not (seen_train and item.split == TRAIN):
                    yield item.caption or ""
    finally:
        ledger.close()
    for o in recipe.outputs:
        neg = getattr(o, "negative_prompt", None)
        if isinstance(neg, str):
            yield neg
    if getattr(recipe, "distill", None) is not None:
        yield recipe.distill.negative_prompt


def _identity(enc) -> dict[str, Any]:
    prov = enc.provenance.to_dict()
    prov["config"] = clean_config(prov.get("config") or {})
    return model_identity({"spec": enc.spec.to_dict(), "provenance": prov})


def _fill(enc, cache: TextCache, captions: Iterator[str], rows: int, counter: list[int],
          tick=None, check=None) -> dict[str, int]:
    read = encoded = 0
    window: list[str] = []

    def run(window: list[str]) -> int:
        todo = cache.missing(window)
        for i in range(0, len(todo), rows):
            chunk = todo[i:i + rows]
            cache.put(chunk, encode_halving(enc, chunk, device="cpu", counter=counter, rows=rows))
        cache.flush()  # committed before the next window asks what is missing
        return len(todo)

    for c in captions:
        if check is not None:
            check()
        read += 1
        window.append(c)
        if len(window) >= WINDOW:
            encoded += run(window)
            if tick is not None:
                tick.advance(len(window))
            window = []
    encoded += run(window)
    if tick is not None:
        tick.advance(len(window))
    return {"captions": read, "encoded": encoded}


def text_first(load: Callable[[], Any], recipe, run, device: str, batch: int,
               counter: list[int] | None = None) -> tuple[CachedText, dict[str, Any], ModelMemory]:
    """See the module contract. ``load`` is the only holder of the encoder besides this function, so that
    the encoder is gone once this returns."""
    t0 = time.perf_counter()
    enc = load()
    spec, prov = enc.spec, enc.provenance
    cache = TextCache(run.root / TEXT_CACHE_DIR, _identity(enc))
    before = len(cache)
    base = 0
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    rows = max(1, batch)  # the stage's text batch shape (CaptionCache.text_rows): the same bits as it gives
    with contextlib.ExitStack() as stack:
        tick = None
        if getattr(run, "progress", None) is not None:
            tick = stack.enter_context(run.progress.task("text pass: captions (models.offload text-first)", None))
        counts = _fill(enc, cache, plan_captions(recipe, run), rows, counter if counter is not None else [0], tick,
                       check=run.check_cancelled)
    peak = None
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    params = param_bytes(enc.model)
    labels = [prov.config_name, prov.weights, getattr(spec, "quantize", None)]
    what = f"{spec.family} ({', '.join(x for x in labels if x)}) {spec.max_length} tokens, text pass"
    memory = ModelMemory("text", what, batch, params, None if peak is None else params + peak)
    del enc  # the last reference: the weights go now, before the VAE is built
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    counts.update(cached_before=before, cached=len(cache), seconds=round(time.perf_counter() - t0, 3))
    log.info("text pass: %s", counts)
    return CachedText(spec, prov, cache), counts, memory
