"""Deterministic mode's plan (pure): which rank-worker slot reads which samples of which shard,
from ``shard_count.json`` and ``ignore_index.json`` alone (rules in :mod:`shardsmith.loaders.wds`).
"""

from __future__ import annotations

from shardsmith.formats.wds import IGNORE_INDEX_FILE, SHARD_COUNT_FILE
from shardsmith.loaders.shard_reader import sort_shard_names

Slot = tuple[int, int]  # (rank, worker)


def shard_table(shard_counts: dict[str, int], ignore: dict[str, list[str]]) -> list[tuple[str, int, int]]:
    """``[(shard, effective_count, global_offset)]`` in loader order."""
    rows, off = [], 0
    for s in sort_shard_names(shard_counts):
        n = int(shard_counts[s]) - len(set(ignore.get(s, ())))
        if n < 0:
            raise ValueError(f"{IGNORE_INDEX_FILE} ignores more keys in {s} than {SHARD_COUNT_FILE} counts")
        rows.append((s, n, off))
        off += n
    return rows


def plan_slots(shard_counts: dict[str, int], ignore: dict[str, list[str]], world: int, workers: int,
               start_index: int = 0) -> dict[Slot, list[tuple[str, int]]]:
    """Pure: ``{(rank, worker): [(shard, skip_n), ...]}`` for every rank-worker.

    ``workers=0`` (loading in the main process) counts as one worker, ``0``. Sample ``g``
    (global, after ignores, see the module docstring) with ``g >= start_index % total``
    goes to slot ``(g - start) % S`` with ``S = world * max(workers, 1)`` and slot
    ``rank * max(workers, 1) + worker``. A slot's list holds only shards with at least one
    of its samples; ``skip_n`` non-ignored samples of that shard are passed over, then
    every ``S``-th is taken. Empty slots get an empty list (see :func:`empty_slots`).
    """
    if world < 1 or workers < 0 or start_index < 0:
        raise ValueError(f"need world >= 1, workers >= 0, start_index >= 0 (got {world}, {workers}, {start_index})")
    nw = max(workers, 1)
    n_slots = world * nw
    rows = shard_table(shard_counts, ignore)
    total = sum(n for _, n, _ in rows)
    plan: dict[Slot, list[tuple[str, int]]] = {(r, w): [] for r in range(world) for w in range(nw)}
    if total == 0:
        return plan
    start = start_index % total
    for shard, n, off in rows:
        lo, hi = max(off, start), off + n
        if lo >= hi:
            continue
        for s in range(n_slots):
            g0 = lo + (s - (lo - start)) % n_slots
            if g0 < hi:
                plan[divmod(s, nw)].append((shard, g0 - off))
    return plan


def slot_sample_counts(shard_counts, ignore, world, workers, start_index=0) -> dict[Slot, int]:
    """Pure: how many samples each slot gets in a pass (before any drop)."""
    nw = max(workers, 1)
    n_slots = world * nw
    eff = {s: n for s, n, _ in shard_table(shard_counts, ignore)}
    plan = plan_slots(shard_counts, ignore, world, workers, start_index)
    return {slot: sum(-(-(eff[sh] - skip) // n_slots) for sh, skip in lst) for slot, lst in plan.items()}


def fastgen_validation_empty(n_shards: int, world: int, workers: int) -> int:
    """Rank-workers left without a shard by FastGen's validation split (``train=False``):
    shard ``i`` goes to rank ``i % world``, then webdataset's ``split_by_worker`` deals that
    rank's shards to its workers; each empty one raises "No samples found" there."""
    world, workers = max(1, world), max(1, workers)
    return sum(max(0, workers - len(range(r, n_shards, world))) for r in range(world))


def empty_slots(shard_counts, ignore, world, workers, start_index=0) -> list[tuple[int, int, str]]:
    """Pure: ``[(rank, worker, reason)]`` for every rank-worker that gets no sample, e.g.
    ``(2, 1, "3 shards, 9 samples for 16 rank-workers")``."""
    rows = shard_table(shard_counts, ignore)
    total = sum(n for _, n, _ in rows)
    n_slots = world * max(workers, 1)
    remaining = total - (start_index % total) if total else 0
    reason = f"{len(rows)} shards, {remaining} samples for {n_slots} rank-workers"
    if total and start_index % total:
        reason += f" (resuming at sample {start_index % total} of {total})"
    counts = slot_sample_counts(shard_counts, ignore, world, workers, start_index)
    return [(r, w, reason) for (r, w), n in sorted(counts.items()) if n == 0]



def fastgen_partial_drops(n_samples: int, world: int, workers: int, batch_size: int) -> dict[Slot, tuple[int, int]]:
    """Pure: ``{(rank, worker): (samples, dropped)}`` for one pass of FastGen v0.1.0's
    deterministic loader (``DeterministicWDS``, ``train=False``) over ``n_samples`` (after the
    ignore index). Rank-worker ``(r, w)`` reads ``slice(w + workers * r, None, workers * world)``
    of the samples in order and batches them itself; with ``partial=False`` (FastGen's default)
    its last incomplete batch, ``samples % batch_size`` samples, is dropped. ``workers=0`` is
    one worker (the loader's main process)."""
    nw, world, b = max(workers, 1), max(world, 1), max(batch_size, 1)
    out: dict[Slot, tuple[int, int]] = {}
    for r in range(world):
        for w in range(nw):
            n = len(range(w + nw * r, n_samples, nw * world))
            out[(r, w)] = (n, n % b)
    return out
