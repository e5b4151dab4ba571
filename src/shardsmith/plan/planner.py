"""Plan: enumerate every source, probe every item once, give it a key and a split, and
record it in the ledger. Nothing is derived yet.

Every role of an item is probed (:func:`~shardsmith.plan.probe.probe_item`) and recorded in
the row's ``media``; the key, the dedup and the flat probe fields are the target's. A
captions-only item (no media) is planned ``ok`` with kind ``text`` and no sha256.

Items stream through in batches (bounded memory); probing keeps source order and runs on
the build's worker processes when it has them (identifying an image header is Python work
that a thread pool would serialise on the GIL), else on a thread pool (hashing and file reads
release the GIL). Duplicates (same sha256) after the
first copy become ``skipped:duplicate`` when ``split.dedup`` is on, and always share the
first copy's split. A recipe's ``lora_trigger`` is prepended to every caption here
(:func:`with_trigger`), so every output and the ledger see the same caption.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shardsmith import formats
from shardsmith.plan.ledger import Ledger
from shardsmith.plan.probe import probe_item
from shardsmith.records import Item, PlannedItem, SourceInfo
from shardsmith.recipe import MODE_TARGETS, Recipe
from shardsmith.split import assign

BATCH = 256
PROBE_CHUNK = 32


def with_trigger(caption: str | None, trigger: str | None) -> str | None:
    """``caption`` with the recipe's ``lora_trigger`` in front, exactly as the LTX trainer's
    ``process_captions.py`` prepends ``--lora-trigger``: ``f"{trigger.strip()} " + caption``. The
    one place a trigger reaches captions: every output reads the planned caption. An item with
    no caption keeps none."""
    if caption is None or not trigger:
        return caption
    return f"{trigger.strip()} {caption}"


class Prober:
    """``probe_item`` with the recipe's pixel limit (and, when an output writes audio, the audio
    probe), picklable for worker processes."""

    def __init__(self, max_pixels: int, audio: bool = False, mode: tuple[str, tuple[str, ...]] | None = None):
        self.max_pixels, self.audio, self.mode = max_pixels, audio, mode

    def __call__(self, item: Item):
        extra = {k: v for k, v in (("audio", self.audio), ("mode", self.mode)) if v}  # only what is asked
        return probe_item(item, self.max_pixels, **extra)


def make_plan(recipe: Recipe, ledger: Ledger, sources: list[tuple[SourceInfo, Callable[[], Iterator[Item]]]],
              on_item: Callable[[], None] = lambda: None, workers=None,
              on_batch: Callable[[int], None] = lambda next_idx: None) -> int:
    """Fill the ledger's ``items`` table; returns the number of items planned. ``workers``: the
    build's :class:`~shardsmith.parallel.Workers` (probing runs there when it has processes).
    ``on_batch(next_idx)`` runs after each batch is committed: every row below ``next_idx`` is
    final then (an item's key, split and status depend only on the items before it), except
    the splits of a count-based holdout, which are assigned once every item is planned."""
    split = recipe.split
    count_mode = split.holdout >= 1
    idx = 0
    mode = (recipe.mode, MODE_TARGETS[recipe.mode]) if recipe.mode else None
    prober = Prober(recipe.images.max_pixels, audio=bool(recipe.audio_outputs()), mode=mode)
    pool = None
    if workers is not None and workers.pool is not None:
        def probed(items: Iterator[Item]) -> Iterator[tuple[Item, Any]]:
            # one stream, in order (no pause at batch boundaries); a probe takes tens of microseconds,
            # so items travel in larger chunks than decode work does
            return workers.map(prober, items, chunk_size=PROBE_CHUNK)
    else:
        pool = ThreadPoolExecutor(max_workers=4)

        def probed(items: Iterator[Item]) -> Iterator[tuple[Item, Any]]:
            while batch := list(itertools.islice(items, BATCH)):
                yield from zip(batch, pool.map(prober, batch))
    try:
        # an unfinished plan is redone from scratch: its batches need no fsync each
        with ledger.relaxed_sync():
            for info, items in sources:
                # keys carry the source's name only where two sources could give the same key
                prefix = info.name if len(sources) > 1 else None
                stream = probed(iter(items()))
                while pairs := list(itertools.islice(stream, BATCH)):
                    rows: list[PlannedItem] = []
                    bases = [formats.key_base(prefix, item.relpath, item.item_id) for item, _ in pairs]
                    keys = ledger.existing_keys(set(bases))  # earlier batches, then this one as it goes
                    shas = ledger.firsts_with_sha({pr.sha256 for _, pr in pairs if pr.status == "ok" and pr.sha256})
                    for (item, pr), key in zip(pairs, bases):
                        if key in keys:
                            key = formats.unique_key(key, item.item_id)
                        keys.add(key)
                        status, detail, dup_of = pr.status, pr.detail, None
                        sp = assign.TRAIN if count_mode else assign.by_fraction(item.item_id, split.seed, split.holdout)
                        if status == "ok" and pr.sha256:
                            first = shas.get(pr.sha256)
                            if first is not None:
                                dup_of, sp = first
                                if split.dedup:
                                    status = "skipped:duplicate"
                                    detail = f"{item.item_id} has the same bytes as {first[0]}; only the first copy is used"
                            else:
                                shas[pr.sha256] = (item.item_id, sp)
                        rows.append(PlannedItem(
                            idx=idx, item_id=item.item_id, key=key, source=info.index, path=item.path,
                            relpath=item.relpath, caption=with_trigger(item.caption, recipe.lora_trigger),
                            label=item.label, label_name=item.label_name,
                            meta=item.meta, sha256=pr.sha256, size_bytes=pr.size_bytes, kind=pr.kind, width=pr.width,
                            height=pr.height, image_format=pr.image_format, mode=pr.mode, split=sp, plan_status=status,
                            detail=detail, dup_of=dup_of, media=pr.media))
                        idx += 1
                        on_item()
                    if recipe.one_sample:  # the first usable item only, always in train
                        rows = [r for r in rows if r.plan_status == "ok"][:1]
                        for r in rows:
                            r.split = assign.TRAIN
                    with ledger.transaction():
                        ledger.add_items(rows)
                    on_batch(idx)
                    if recipe.one_sample and rows:
                        break
                if recipe.one_sample and idx and ledger.count_items():
                    break
                walked = getattr(getattr(items, "__self__", None), "passed_over", None)  # a folder source's walk
                ignored = walked.to_json() if walked is not None else None
                if ignored is not None:
                    ledger.set_meta(f"ignored:{info.index}", ignored)
    finally:
        if pool is not None:
            pool.shutdown()
    if count_mode:
        _assign_by_count(ledger, recipe)
    ledger.set_meta("plan_complete", True)
    return idx


def _assign_by_count(ledger: Ledger, recipe: Recipe) -> None:
    seed, n = recipe.split.seed, int(recipe.split.holdout)
    firsts = (r[0] for r in ledger.db.execute("SELECT item_id FROM items WHERE plan_status='ok' AND dup_of IS NULL"))
    thr = assign.count_threshold(firsts, seed, n)
    with ledger.transaction():
        rows = ledger.db.execute("SELECT idx, item_id FROM items WHERE dup_of IS NULL").fetchall()
        ledger.db.executemany("UPDATE items SET split=? WHERE idx=?",
                              [(assign.by_threshold(i, seed, thr), idx) for idx, i in rows])
        ledger.db.execute("UPDATE items SET split=(SELECT s.split FROM items s WHERE s.item_id=items.dup_of) "
                          "WHERE dup_of IS NOT NULL")
